//! The multicast groups of one device: which QPs are attached to which group (IBA 10.5.2.4,
//! the "multicast group" of a channel adapter), within the device's limits.
//!
//! Attachments come from device commands only, never from the wire, and every count is
//! bounded by [`McastLimits`]; a packet to a group costs one lookup and a walk over at most
//! `qps_per_group` numbers.

use std::collections::HashMap;

use portverbs_hal::error::{CommandError, mcast_resource};
use portverbs_hal::types::Gid;

/// The QP number a datagram to a multicast group carries as its destination (IBA 10.5.2.4:
/// the permissive QPN, 0xFFFFFF).
pub const MCAST_QPN: u32 = 0x00ff_ffff;

/// A device's multicast limits (what it reports as `max_mcast_grp`, `max_mcast_qp_attach`
/// and `max_total_mcast_qp_attach`); all zero for a device without multicast.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct McastLimits {
    /// Groups the device holds at once.
    pub groups: u32,
    /// QPs attached to one group.
    pub qps_per_group: u32,
    /// Attachments over all groups.
    pub total: u32,
}

/// What an attach or detach changed for the device as a whole, so that it can join or leave
/// the group on its network (the fabric, an IP multicast group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Membership {
    /// Nothing changed for the device (another QP of it was attached already, or still is;
    /// or the QP was attached already).
    Unchanged,
    /// The device's first QP joined the group.
    Joined,
    /// The device's last QP left the group.
    Left,
}

/// The group table.
#[derive(Debug, Default)]
pub(crate) struct McastTable {
    groups: HashMap<Gid, Vec<u32>>,
    total: usize,
    pub(crate) limits: McastLimits,
}

impl McastTable {
    #[cfg(test)]
    pub(crate) fn new(limits: McastLimits) -> Self {
        Self {
            groups: HashMap::new(),
            total: 0,
            limits,
        }
    }

    /// Attaches `qpn` to `gid`; attaching again is a no-op.
    pub(crate) fn attach(&mut self, qpn: u32, gid: Gid) -> Result<Membership, CommandError> {
        let l = self.limits;
        if l.groups == 0 {
            return Err(CommandError::Unsupported {
                what: "multicast groups",
            });
        }
        let exhausted = |resource| CommandError::ResourceExhausted { resource };
        match self.groups.get(&gid) {
            Some(qps) if qps.contains(&qpn) => return Ok(Membership::Unchanged),
            Some(qps) if qps.len() >= l.qps_per_group as usize => {
                return Err(exhausted(mcast_resource::QPS_PER_GROUP));
            }
            None if self.groups.len() >= l.groups as usize => {
                return Err(exhausted(mcast_resource::GROUPS));
            }
            _ => {}
        }
        if self.total >= l.total as usize {
            return Err(exhausted(mcast_resource::ATTACHMENTS));
        }
        let qps = self.groups.entry(gid).or_default();
        qps.push(qpn);
        self.total += 1;
        Ok(if qps.len() == 1 {
            Membership::Joined
        } else {
            Membership::Unchanged
        })
    }

    /// Detaches `qpn` from `gid`.
    pub(crate) fn detach(&mut self, qpn: u32, gid: Gid) -> Result<Membership, CommandError> {
        let not_attached = || CommandError::NoSuchObject {
            object: "multicast attachment of QP",
            number: qpn,
        };
        let qps = self.groups.get_mut(&gid).ok_or_else(not_attached)?;
        let at = qps
            .iter()
            .position(|&q| q == qpn)
            .ok_or_else(not_attached)?;
        qps.swap_remove(at);
        self.total -= 1;
        if qps.is_empty() {
            self.groups.remove(&gid);
            Ok(Membership::Left)
        } else {
            Ok(Membership::Unchanged)
        }
    }

    /// Detaches `qpn` from every group; returns the groups the device left.
    pub(crate) fn forget_qp(&mut self, qpn: u32) -> Vec<Gid> {
        let groups: Vec<Gid> = self
            .groups
            .iter()
            .filter(|(_, qps)| qps.contains(&qpn))
            .map(|(g, _)| *g)
            .collect();
        groups
            .into_iter()
            .filter(|g| self.detach(qpn, *g) == Ok(Membership::Left))
            .collect()
    }

    /// The QPs attached to `gid` (empty when none).
    pub(crate) fn members(&self, gid: &Gid) -> &[u32] {
        self.groups.get(gid).map_or(&[], Vec::as_slice)
    }

    /// The groups with at least one QP attached.
    pub(crate) fn groups(&self) -> impl Iterator<Item = &Gid> {
        self.groups.keys()
    }

    pub(crate) fn clear(&mut self) {
        self.groups.clear();
        self.total = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: u8) -> Gid {
        let mut b = [0u8; 16];
        b[0] = 0xff;
        b[15] = n;
        Gid(b)
    }

    #[test]
    fn attach_is_idempotent_and_limits_hold() {
        let mut t = McastTable::new(McastLimits {
            groups: 2,
            qps_per_group: 2,
            total: 3,
        });
        assert_eq!(t.attach(1, g(1)), Ok(Membership::Joined));
        assert_eq!(t.attach(1, g(1)), Ok(Membership::Unchanged));
        assert_eq!(t.attach(2, g(1)), Ok(Membership::Unchanged));
        assert_eq!(
            t.attach(3, g(1)),
            Err(CommandError::ResourceExhausted {
                resource: mcast_resource::QPS_PER_GROUP
            })
        );
        assert_eq!(t.attach(1, g(2)), Ok(Membership::Joined));
        assert_eq!(
            t.attach(1, g(3)),
            Err(CommandError::ResourceExhausted {
                resource: mcast_resource::GROUPS
            })
        );
        assert_eq!(
            t.attach(2, g(2)),
            Err(CommandError::ResourceExhausted {
                resource: mcast_resource::ATTACHMENTS
            })
        );
        assert!(t.detach(3, g(1)).is_err());
        assert_eq!(t.detach(2, g(1)), Ok(Membership::Unchanged));
        let mut left = t.forget_qp(1);
        left.sort();
        assert_eq!(left, vec![g(1), g(2)]);
        assert_eq!(t.groups().count(), 0);
        assert_eq!(t.total, 0);
    }

    #[test]
    fn a_device_without_multicast_refuses() {
        let mut t = McastTable::default();
        assert!(matches!(
            t.attach(1, g(1)),
            Err(CommandError::Unsupported { .. })
        ));
    }
}

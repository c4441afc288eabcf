//! Multicast attach and detach through the HCA's multicast group (MCG) table, as Linux's
//! mlx4 does it (`drivers/net/ethernet/mellanox/mlx4/mcg.c`, `mlx4_qp_attach_common` and
//! `mlx4_qp_detach_common`, B0 steering): MGID_HASH names the group's hash bucket, READ_MCG
//! walks the bucket's chain of entries (`next_gid_index`) to the group's entry, WRITE_MCG
//! writes it back with the QP added or removed. A group that finds its bucket taken gets an
//! overflow entry (AMGM) from the driver's free list, linked at the end of the chain; a
//! group's last QP leaving frees its entry (a bucket takes over the next entry of its chain).
//!
//! The limits advertised are ones every attach within them meets, whatever the hash does:
//! `max_mcast_grp` is the number of overflow entries (each group has a bucket or an overflow
//! entry of its own), `max_mcast_qp_attach` what one entry holds (and the firmware allows),
//! `max_total_mcast_qp_attach` their product (Linux's mlx4_ib advertises buckets plus
//! overflow entries, a bound an unlucky hash may not reach). Attaching a QP that is in the
//! group already changes nothing, as in `mlx4_qp_attach_common`. Every entry read back is
//! checked (a count beyond the entry, a link outside the table, a chain longer than the
//! table): a table the driver cannot trust fails the command, it never panics.
//!
//! Table operations are serialised (Linux's `mcg_table.mutex`): one at a time, the others
//! yield until it is done.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use portverbs_hal::error::{CommandError, mcast_resource};
use portverbs_hal::types::Gid;

use super::Mlx4Device;
use super::commands::no;
use crate::caps::DevCaps;
use crate::cmd::{Cmd, yield_now};
use crate::icm::{LOG_MCG_ENTRY, Profile};
use crate::layout::mcg::{Mgm, PROT_IB_IPV6, members_per_entry};
use crate::layout::opcode;

/// The table's shape and the limits it gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Bytes of an entry.
    entry: usize,
    /// Hash buckets (the first entries).
    buckets: u32,
    /// All entries.
    entries: u32,
    /// QPs one entry lists.
    pub(crate) per_group: u32,
    /// Groups every attach within the limits finds room for.
    pub(crate) max_groups: u32,
}

impl Geometry {
    /// The table of profile `p` (`None`: no table, no multicast).
    pub(crate) fn of(caps: &DevCaps, p: &Profile) -> Option<Self> {
        if p.log_mcg == 0 {
            return None;
        }
        let entry = 1usize << LOG_MCG_ENTRY;
        let per_group = (members_per_entry(entry) as u32).min(1u32 << caps.log_max_qp_mcg.min(16));
        let buckets = 1u32 << (p.log_mcg - 1);
        Some(Self {
            entry,
            buckets,
            entries: 1 << p.log_mcg,
            per_group,
            max_groups: buckets,
        })
    }
}

/// The driver's side of the table: which overflow entries are in use, the counts the limits
/// are checked against, and each QP's groups (detached when the QP is destroyed).
#[derive(Debug, Default)]
pub(crate) struct McgState {
    /// Overflow entry `buckets + i` is in use.
    amgm_used: Vec<bool>,
    groups: u32,
    total: u32,
    by_qp: HashMap<u32, Vec<Gid>>,
}

/// Held while a table operation runs.
struct Busy<'a>(&'a AtomicBool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Where a group is in the table.
enum Found {
    /// At `index` (its entry, or its empty bucket), `prev` the entry before it in the chain.
    At {
        index: u32,
        prev: Option<u32>,
        mgm: Mgm,
    },
    /// Not there; `last` ends its bucket's chain.
    Missing { last: u32 },
}

fn corrupt(index: u32, why: &str) -> CommandError {
    CommandError::InvalidArgument {
        what: format!("MCG entry {index:#x} read back {why}"),
    }
}

impl Mlx4Device {
    fn mcg_geometry(&self) -> Result<Geometry, CommandError> {
        Geometry::of(&self.0.caps, &self.0.profile).ok_or(CommandError::Unsupported {
            what: "multicast groups (no MCG table)",
        })
    }

    async fn mcg_busy(&self) -> Busy<'_> {
        while self.0.mcg_busy.swap(true, Ordering::AcqRel) {
            yield_now().await;
        }
        Busy(&self.0.mcg_busy)
    }

    fn mcg_state(&self) -> std::sync::MutexGuard<'_, McgState> {
        self.0.mcg.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn read_mcg(&self, g: &Geometry, index: u32) -> Result<Mgm, CommandError> {
        let mut buf = vec![0u8; g.entry];
        self.0
            .hcr
            .exec_out(Cmd::new(opcode::READ_MCG).in_mod(index), &mut buf)
            .await?;
        let m = Mgm::decode(&buf).ok_or_else(|| corrupt(index, "with a bad member count"))?;
        if m.next >= g.entries || (m.next != 0 && m.next < g.buckets) {
            return Err(corrupt(index, "linking outside the overflow entries"));
        }
        Ok(m)
    }

    async fn write_mcg(&self, g: &Geometry, index: u32, m: &Mgm) -> Result<(), CommandError> {
        let mut buf = vec![0u8; g.entry];
        if !m.encode(&mut buf) {
            return Err(corrupt(index, "too full to write"));
        }
        self.0
            .hcr
            .exec_in(Cmd::new(opcode::WRITE_MCG).in_mod(index), &buf)
            .await?;
        Ok(())
    }

    /// `find_entry`: the group's entry, its empty bucket, or the end of its bucket's chain.
    async fn find_mcg(&self, g: &Geometry, gid: Gid) -> Result<Found, CommandError> {
        let hash = self
            .0
            .hcr
            .exec_in(Cmd::new(opcode::MGID_HASH), &gid.0)
            .await?;
        let bucket = (hash as u32) & (g.buckets - 1);
        let mut index = bucket;
        let mut prev = None;
        for _ in 0..g.entries {
            let mgm = self.read_mcg(g, index).await?;
            if mgm.members.is_empty() {
                if index != bucket {
                    return Err(corrupt(index, "empty inside a chain"));
                }
                return Ok(Found::At { index, prev, mgm });
            }
            if mgm.gid == gid.0 && mgm.prot == PROT_IB_IPV6 {
                return Ok(Found::At { index, prev, mgm });
            }
            if mgm.next == 0 {
                return Ok(Found::Missing { last: index });
            }
            prev = Some(index);
            index = mgm.next;
        }
        Err(corrupt(bucket, "as a chain longer than the table"))
    }

    pub(super) async fn do_attach_mcast(&self, qpn: u32, gid: Gid) -> Result<(), CommandError> {
        self.0.check_alive()?;
        let g = self.mcg_geometry()?;
        let hw_qpn = self.hw_qpn(qpn)?;
        let _busy = self.mcg_busy().await;
        {
            let st = self.mcg_state();
            if st.by_qp.get(&qpn).is_some_and(|v| v.contains(&gid)) {
                return Ok(());
            }
            if st.total >= g.max_groups * g.per_group {
                return Err(CommandError::ResourceExhausted {
                    resource: mcast_resource::ATTACHMENTS,
                });
            }
        }
        let groups_full = self.mcg_state().groups >= g.max_groups;
        let exhausted = |resource| CommandError::ResourceExhausted { resource };
        let (index, mut mgm, link, new_group) = match self.find_mcg(&g, gid).await? {
            Found::At { index, mgm, .. } if mgm.members.is_empty() => {
                if groups_full {
                    return Err(exhausted(mcast_resource::GROUPS));
                }
                let fresh = Mgm {
                    next: mgm.next,
                    prot: PROT_IB_IPV6,
                    gid: gid.0,
                    members: Vec::new(),
                };
                (index, fresh, None, true)
            }
            Found::At { index, mgm, .. } => (index, mgm, None, false),
            Found::Missing { last } => {
                if groups_full {
                    return Err(exhausted(mcast_resource::GROUPS));
                }
                let mut st = self.mcg_state();
                if st.amgm_used.len() < (g.entries - g.buckets) as usize {
                    st.amgm_used.resize((g.entries - g.buckets) as usize, false);
                }
                let Some(free) = st.amgm_used.iter().position(|u| !u) else {
                    return Err(exhausted(mcast_resource::GROUPS));
                };
                st.amgm_used[free] = true;
                let fresh = Mgm {
                    next: 0,
                    prot: PROT_IB_IPV6,
                    gid: gid.0,
                    members: Vec::new(),
                };
                (g.buckets + free as u32, fresh, Some(last), true)
            }
        };
        let release = |dev: &Self| {
            if link.is_some() {
                if let Some(u) = dev
                    .mcg_state()
                    .amgm_used
                    .get_mut((index - g.buckets) as usize)
                {
                    *u = false;
                }
            }
        };
        if mgm.qpns().any(|q| q == hw_qpn) {
            // Listed already (the driver's record lost it?): nothing to write.
        } else {
            if mgm.members.len() >= g.per_group as usize {
                release(self);
                return Err(exhausted(mcast_resource::QPS_PER_GROUP));
            }
            mgm.members.push(hw_qpn & crate::layout::mcg::QPN_MASK);
            if let Err(e) = self.write_mcg(&g, index, &mgm).await {
                release(self);
                return Err(e);
            }
            if let Some(last) = link {
                let linked = async {
                    let mut tail = self.read_mcg(&g, last).await?;
                    tail.next = index;
                    self.write_mcg(&g, last, &tail).await
                };
                if let Err(e) = linked.await {
                    release(self);
                    return Err(e);
                }
            }
        }
        let mut st = self.mcg_state();
        st.groups += u32::from(new_group);
        st.total += 1;
        st.by_qp.entry(qpn).or_default().push(gid);
        Ok(())
    }

    pub(super) async fn do_detach_mcast(&self, qpn: u32, gid: Gid) -> Result<(), CommandError> {
        let g = self.mcg_geometry()?;
        let not_attached = || no("multicast attachment of QP", qpn);
        let _busy = self.mcg_busy().await;
        if !self
            .mcg_state()
            .by_qp
            .get(&qpn)
            .is_some_and(|v| v.contains(&gid))
        {
            return Err(not_attached());
        }
        let hw_qpn = self.hw_qpn(qpn)?;
        let (index, prev, mut mgm) = match self.find_mcg(&g, gid).await? {
            Found::At { index, prev, mgm } if !mgm.members.is_empty() => (index, prev, mgm),
            _ => return Err(not_attached()),
        };
        let Some(loc) = mgm.qpns().position(|q| q == hw_qpn) else {
            return Err(not_attached());
        };
        mgm.members.swap_remove(loc);
        let mut freed = None;
        let mut group_gone = false;
        if !mgm.members.is_empty() {
            self.write_mcg(&g, index, &mgm).await?;
        } else {
            group_gone = true;
            match prev {
                None => {
                    // A bucket: the next entry of its chain moves into it, or it empties.
                    let next = mgm.next;
                    let moved = if next != 0 {
                        freed = Some(next);
                        self.read_mcg(&g, next).await?
                    } else {
                        Mgm::default()
                    };
                    self.write_mcg(&g, index, &moved).await?;
                }
                Some(prev) => {
                    // An overflow entry: unlinked from its chain, then free.
                    let mut before = self.read_mcg(&g, prev).await?;
                    before.next = mgm.next;
                    self.write_mcg(&g, prev, &before).await?;
                    freed = Some(index);
                }
            }
        }
        let mut st = self.mcg_state();
        if let Some(i) = freed.and_then(|f| f.checked_sub(g.buckets)) {
            if let Some(u) = st.amgm_used.get_mut(i as usize) {
                *u = false;
            }
        }
        st.groups = st.groups.saturating_sub(u32::from(group_gone));
        st.total = st.total.saturating_sub(1);
        if let Some(v) = st.by_qp.get_mut(&qpn) {
            v.retain(|x| *x != gid);
            if v.is_empty() {
                st.by_qp.remove(&qpn);
            }
        }
        Ok(())
    }

    /// Detaches QP `qpn` from every group it is in (it is being destroyed).
    pub(super) async fn detach_all_mcast(&self, qpn: u32) -> Result<(), CommandError> {
        let groups = self
            .mcg_state()
            .by_qp
            .get(&qpn)
            .cloned()
            .unwrap_or_default();
        for gid in groups {
            self.do_detach_mcast(qpn, gid).await?;
        }
        Ok(())
    }
}

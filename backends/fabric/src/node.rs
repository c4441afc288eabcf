//! Nodes: the devices on the fabric. The soft device and the mlx4 model are each an
//! [`crate::EngineNode`] (an [`portverbs_transport::Engine`] around the device's own
//! [`crate::DeviceSide`]: its queues and what its kicks mean), attach it with
//! [`Fabric::attach`], and get back a typed [`NodeHandle`] through which they reach their own
//! state again — the fabric keeps a `dyn Node` for routing and stepping, the handle keeps the
//! concrete type; nothing is downcast. The UDP port is a [`Node`] of its own.
//!
//! A node sits in the simulation like any other: its engine runs in the same
//! [`Fabric::step`] (stepped mode, on virtual time, under the same seeded faults) or on the
//! engine thread (free-running mode). The handle kicks it without a lock
//! ([`NodeHandle::kicker`]), runs commands under the fabric lock ([`NodeHandle::with`]), and
//! changes its GID routes while it runs (a driver programs its port's GID table at run time).

use std::fmt::{self, Debug};
use std::sync::Arc;

use parking_lot::Mutex;

use portverbs_hal::types::Gid;
use portverbs_transport::Packet;

use crate::kick::Kicker;
use crate::sim::{Groups, NodeId, Routes, Sim, Slot, lock};
use crate::{Fabric, FabricError, Mode};

/// A device on the fabric, as the fabric drives it. Every method runs with the fabric lock
/// held and must not block (a node may raise interrupts: its interrupt sinks must not block
/// either); packets it produces go into `out`, which the fabric routes afterwards.
///
/// The fabric calls these once per kick, per delivered packet and per phase of a step, through
/// dynamic dispatch; inside, a node drives its engine with its own concrete `Hca`, so the
/// transport's per-WQE and per-byte paths stay monomorphic.
pub trait Node: Send + Debug + 'static {
    /// A kick sent through this node's [`Kicker`] arrived; `what` is the value given there
    /// (the node decides what it means: the soft device sends a QP or CQ number, the mlx4
    /// model the UAR page and QPN of a send doorbell).
    fn kick(&mut self, now: u64, what: u32, out: &mut Vec<Packet>);

    /// The lock-free kick channel overflowed and some kicks were lost: look at every queue
    /// once.
    fn rescan(&mut self, now: u64, out: &mut Vec<Packet>);

    /// Runs the transport work that is scheduled, and any the device finds by watching host
    /// memory rather than through a doorbell. Returns whether it did anything.
    fn run_work(&mut self, now: u64, out: &mut Vec<Packet>) -> bool;

    /// A packet routed to `port` of this node.
    fn receive(&mut self, now: u64, port: u8, pkt: &Packet, out: &mut Vec<Packet>);

    /// End of a step: sends the ACKs coalesced during it and fires the timers due at `now`.
    /// Returns whether a timer fired.
    fn run_timers(&mut self, now: u64, out: &mut Vec<Packet>) -> bool;

    /// The earliest time a timer of this node is due.
    fn next_deadline(&self) -> Option<u64>;

    /// Packets of one message that may travel as one train on this fabric's links (1 when
    /// the links have faults or a bottleneck); the fabric calls it at attach time and when
    /// faults or the bottleneck change.
    fn set_max_train(&mut self, n: u32);

    /// Sends what the node batched for a wire of its own (a port's datagrams). The fabric
    /// calls it at the end of every step when free-running or stepped; on a manual fabric
    /// when a dispatch ends (a poll, a wait), so that everything the application posted
    /// between two of its polls leaves in one batch. A node with no such wire ignores it.
    fn flush(&mut self) {}

    /// The first port of this fabric joined multicast group `gid` (`joined`), or the last one
    /// left it ([`NodeCtx::join_mcast`], [`NodeCtx::leave_mcast`]). Only the fabric's uplink
    /// is told: a node that leads onto a real network joins or leaves the group there (an IP
    /// multicast group, for a UDP port), so that the group's packets from the network reach
    /// the fabric. A node with no network ignores it.
    ///
    /// # Errors
    /// The network refused the join; the attach that asked for it fails with the reason.
    fn mcast_membership(&mut self, gid: Gid, joined: bool) -> Result<(), String> {
        let _ = (gid, joined);
        Ok(())
    }
}

/// What [`Fabric::attach`] tells the code that builds a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Joining {
    /// Nodes of the same kind attached to this fabric before this one (the `N` of a default
    /// name such as `softN`).
    pub ordinal: usize,
    /// The train length to give the node's engine now (see [`Node::set_max_train`]).
    pub max_train: u32,
    /// The seed of the node's identifiers (memory keys, QP numbers: `portverbs_hal::rng`):
    /// on a stepped fabric derived from the fabric's seed and the node's place, so that the
    /// run repeats; on a free-running one drawn from the OS. A device's own configuration
    /// may pin another.
    pub seed: u64,
}

/// How a node joins the fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeConfig {
    /// Name (shown by [`Fabric::gids`]).
    pub name: String,
    /// GIDs routed to the node from the start, with their port (1-based); later ones are added
    /// with [`NodeCtx::add_route`].
    pub routes: Vec<(u8, Gid)>,
}

impl Fabric {
    /// Attaches a node. `kind` names the kind of device (`"soft"`, `"mlx4-model"` …);
    /// `build` makes the node and its configuration, under the fabric lock, once the node's
    /// ordinal among those of its kind is known.
    ///
    /// # Errors
    /// [`FabricError::TooManyDevices`] past 65535 nodes, [`FabricError::DuplicateAddress`]
    /// when one of the GIDs is already routed.
    pub fn attach<T: Node>(
        &self,
        kind: &'static str,
        build: impl FnOnce(Joining) -> (NodeConfig, T),
    ) -> Result<NodeHandle<T>, FabricError> {
        let mut sim = self.shared.lock();
        let id = sim.nodes.len();
        let kick_id = u16::try_from(id).map_err(|_| FabricError::TooManyDevices)?;
        let joining = Joining {
            ordinal: sim.kinds.iter().filter(|k| **k == kind).count(),
            max_train: sim.max_train(),
            seed: sim
                .node_seed
                .map_or_else(portverbs_hal::rng::os_random, |s| {
                    portverbs_hal::rng::derive(s, id as u64)
                }),
        };
        let (config, node) = build(joining);
        for (_, gid) in &config.routes {
            if sim.routes.contains_key(gid) {
                return Err(FabricError::DuplicateAddress(gid.to_ip()));
            }
        }
        let node = Arc::new(Mutex::new(node));
        sim.nodes.push(Some(Slot {
            name: config.name,
            node: node.clone(),
        }));
        sim.kinds.push(kind);
        for &(port, gid) in &config.routes {
            sim.routes.insert(gid, (id, port));
        }
        Ok(NodeHandle {
            fabric: self.clone(),
            id,
            node,
            kicker: self.shared.kicker(kick_id),
        })
    }
}

/// What [`NodeHandle::with`] hands to its closure: the node, the time, the packet buffer
/// (routed when the closure returns), and the node's routes.
pub struct NodeCtx<'a, T> {
    /// The node's state.
    pub node: &'a mut T,
    /// Current time in nanoseconds (virtual in stepped mode).
    pub now: u64,
    /// Packets produced; the fabric routes them after the closure.
    pub out: &'a mut Vec<Packet>,
    routes: &'a mut Routes,
    groups: &'a mut Groups,
    nodes: &'a [Option<Slot>],
    uplink: &'a mut Option<(NodeId, u8)>,
    id: NodeId,
}

impl<T: Debug> Debug for NodeCtx<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeCtx")
            .field("node", &self.node)
            .field("now", &self.now)
            .field("out", &self.out.len())
            .finish_non_exhaustive()
    }
}

impl<T> NodeCtx<'_, T> {
    /// Routes `gid` to `port` of this node.
    ///
    /// # Errors
    /// [`FabricError::DuplicateAddress`] when another node or port owns the GID.
    pub fn add_route(&mut self, port: u8, gid: Gid) -> Result<(), FabricError> {
        match self.routes.get(&gid) {
            Some(&(n, p)) if (n, p) == (self.id, port) => Ok(()),
            Some(_) => Err(FabricError::DuplicateAddress(gid.to_ip())),
            None => {
                self.routes.insert(gid, (self.id, port));
                Ok(())
            }
        }
    }

    /// Stops routing `gid` here; false when it was not this node's.
    pub fn remove_route(&mut self, gid: Gid) -> bool {
        match self.routes.get(&gid) {
            Some(&(n, _)) if n == self.id => {
                self.routes.remove(&gid);
                true
            }
            _ => false,
        }
    }

    /// Makes `port` of this node the fabric's uplink: packets for GIDs that no node owns go
    /// there instead of being dropped as unroutable (a port onto a real network takes
    /// everything that is not local, as a host's default route does).
    ///
    /// # Errors
    /// [`FabricError::UplinkTaken`] when another node or port holds it.
    pub fn claim_uplink(&mut self, port: u8) -> Result<(), FabricError> {
        match *self.uplink {
            Some(owner) if owner != (self.id, port) => Err(FabricError::UplinkTaken),
            _ => {
                *self.uplink = Some((self.id, port));
                Ok(())
            }
        }
    }

    /// Joins `port` of this node to multicast group `gid`: packets any node sends to the
    /// group reach the port from now on (its own included). Joining twice is a no-op. The
    /// first port of the fabric to join makes the uplink join the group on its network
    /// ([`Node::mcast_membership`]).
    ///
    /// # Errors
    /// [`FabricError::McastJoin`] when the uplink could not join; nothing changed.
    pub fn join_mcast(&mut self, port: u8, gid: Gid) -> Result<(), FabricError> {
        let me = (self.id, port);
        let members = self.groups.get(&gid);
        if members.is_some_and(|m| m.contains(&me)) {
            return Ok(());
        }
        if members.is_none_or(|m| m.is_empty()) {
            self.tell_uplink(gid, true)?;
        }
        self.groups.entry(gid).or_default().push(me);
        Ok(())
    }

    /// Takes `port` of this node out of multicast group `gid`; false when it was not in it.
    /// The last port of the fabric to leave makes the uplink leave the group on its network.
    pub fn leave_mcast(&mut self, port: u8, gid: Gid) -> bool {
        let me = (self.id, port);
        let Some(members) = self.groups.get_mut(&gid) else {
            return false;
        };
        let Some(at) = members.iter().position(|m| *m == me) else {
            return false;
        };
        members.swap_remove(at);
        if members.is_empty() {
            self.groups.remove(&gid);
            // Leaving cannot usefully fail: a group the network kept is only traffic the
            // fabric drops.
            let _ = self.tell_uplink(gid, false);
        }
        true
    }

    /// Tells the fabric's uplink that the fabric joined or left `gid`, unless this node is
    /// the uplink itself (it is the one being driven) or there is none.
    fn tell_uplink(&mut self, gid: Gid, joined: bool) -> Result<(), FabricError> {
        let Some((up, _)) = *self.uplink else {
            return Ok(());
        };
        if up == self.id {
            return Ok(());
        }
        let Some(Some(slot)) = self.nodes.get(up) else {
            return Ok(());
        };
        lock(&*slot.node)
            .mcast_membership(gid, joined)
            .map_err(|reason| FabricError::McastJoin {
                group: gid.to_ip(),
                reason,
            })
    }

    /// This node's routes, sorted.
    pub fn routes(&self) -> Vec<(u8, Gid)> {
        let mut v: Vec<_> = self
            .routes
            .iter()
            .filter(|(_, (n, _))| *n == self.id)
            .map(|(g, &(_, p))| (p, *g))
            .collect();
        v.sort();
        v
    }
}

/// A node's typed handle on its fabric: the way back to the node's own state. Cheap to clone.
pub struct NodeHandle<T> {
    fabric: Fabric,
    id: NodeId,
    node: Arc<Mutex<T>>,
    kicker: Kicker,
}

impl<T> Clone for NodeHandle<T> {
    fn clone(&self) -> Self {
        Self {
            fabric: self.fabric.clone(),
            id: self.id,
            node: self.node.clone(),
            kicker: self.kicker.clone(),
        }
    }
}

impl<T> Debug for NodeHandle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeHandle")
            .field("id", &self.id)
            .field("mode", &self.fabric.mode())
            .finish_non_exhaustive()
    }
}

impl<T: Node> NodeHandle<T> {
    /// The fabric the node is on.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// The node's doorbell (to hand to its queues).
    pub fn kicker(&self) -> &Kicker {
        &self.kicker
    }

    /// Sends the node a kick without taking the fabric lock (see [`Kicker::kick`]).
    pub fn kick(&self, what: u32) {
        self.kicker.kick(what);
    }

    /// Runs `f` on the node's state with the fabric lock held, then routes the packets it
    /// produced. It runs after [`NodeHandle::detach`] too: the state lives as long as its
    /// handles do.
    pub fn with<R>(&self, f: impl FnOnce(&mut NodeCtx<'_, T>) -> R) -> R {
        let r = {
            let mut sim = self.fabric.shared.lock();
            self.run(&mut sim, f)
        };
        self.after_command();
        r
    }

    /// Manual mode: what a command left to do (its packets, kicks that found the lock taken)
    /// is stepped now, on this thread.
    fn after_command(&self) {
        if self.fabric.mode() == Mode::Manual {
            self.fabric.shared.drive_inline(false);
        }
    }

    /// [`NodeHandle::with`], refused once the node was detached.
    ///
    /// # Errors
    /// [`FabricError::Detached`] after [`NodeHandle::detach`].
    pub fn try_with<R>(&self, f: impl FnOnce(&mut NodeCtx<'_, T>) -> R) -> Result<R, FabricError> {
        let r = {
            let mut sim = self.fabric.shared.lock();
            if !matches!(sim.nodes.get(self.id), Some(Some(_))) {
                return Err(FabricError::Detached);
            }
            self.run(&mut sim, f)
        };
        self.after_command();
        Ok(r)
    }

    fn run<R>(&self, sim: &mut Sim, f: impl FnOnce(&mut NodeCtx<'_, T>) -> R) -> R {
        if self.fabric.mode() != Mode::Stepped {
            sim.now = self.fabric.shared.real_now();
        }
        let r = {
            let Sim {
                now,
                routes,
                groups,
                nodes,
                uplink,
                out,
                ..
            } = &mut *sim;
            let mut node = lock(&*self.node);
            f(&mut NodeCtx {
                node: &mut node,
                now: *now,
                out,
                routes,
                groups,
                nodes,
                uplink,
                id: self.id,
            })
        };
        sim.route_out();
        r
    }

    /// Whether the node is still on the fabric.
    pub fn is_attached(&self) -> bool {
        matches!(self.fabric.shared.lock().nodes.get(self.id), Some(Some(_)))
    }

    /// Takes the node off the fabric: its routes go, kicks and packets for it are ignored from
    /// now on, and the fabric drops its reference to the node (the state itself goes with the
    /// last handle).
    pub fn detach(&self) {
        let slot = {
            let mut sim = self.fabric.shared.lock();
            let me = self.id;
            sim.routes.retain(|_, (n, _)| *n != me);
            if sim.uplink.is_some_and(|(n, _)| n == me) {
                sim.uplink = None;
            }
            // Its multicast memberships go too; a group no port is left in is left on the
            // uplink's network.
            let mut emptied = Vec::new();
            sim.groups.retain(|gid, members| {
                members.retain(|(n, _)| *n != me);
                if members.is_empty() {
                    emptied.push(*gid);
                }
                !members.is_empty()
            });
            if let Some((up, _)) = sim.uplink {
                if let Some(Some(slot)) = sim.nodes.get(up) {
                    let mut uplink = lock(&*slot.node);
                    for gid in emptied {
                        let _ = uplink.mcast_membership(gid, false);
                    }
                }
            }
            sim.nodes.get_mut(self.id).and_then(Option::take)
        };
        // Dropped outside the lock: the node may release memory or handles of its own.
        drop(slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FabricConfig, LinkFaults};

    /// A node with no engine: it records what the fabric asks of it.
    #[derive(Debug, Default)]
    struct Probe {
        kicks: Vec<u32>,
        rescans: u32,
        steps: u32,
        max_train: u32,
        deadline: Option<u64>,
        flushes: u32,
    }

    impl Node for Probe {
        fn kick(&mut self, _now: u64, what: u32, _out: &mut Vec<Packet>) {
            self.kicks.push(what);
        }
        fn rescan(&mut self, _now: u64, _out: &mut Vec<Packet>) {
            self.rescans += 1;
        }
        fn run_work(&mut self, _now: u64, _out: &mut Vec<Packet>) -> bool {
            self.steps += 1;
            false
        }
        fn receive(&mut self, _now: u64, _port: u8, _pkt: &Packet, _out: &mut Vec<Packet>) {}
        fn run_timers(&mut self, now: u64, _out: &mut Vec<Packet>) -> bool {
            let due = self.deadline.is_some_and(|t| t <= now);
            if due {
                self.deadline = None;
            }
            due
        }
        fn next_deadline(&self) -> Option<u64> {
            self.deadline
        }
        fn set_max_train(&mut self, n: u32) {
            self.max_train = n;
        }
        fn flush(&mut self) {
            self.flushes += 1;
        }
    }

    fn gid(ip: &str) -> Gid {
        Gid::parse(ip).unwrap()
    }

    fn probe(fabric: &Fabric, kind: &'static str, ip: &str) -> (NodeHandle<Probe>, Joining) {
        let mut seen = None;
        let h = fabric
            .attach(kind, |j| {
                seen = Some(j);
                let config = NodeConfig {
                    name: format!("{kind}{}", j.ordinal),
                    routes: vec![(1, gid(ip))],
                };
                let node = Probe {
                    max_train: j.max_train,
                    ..Probe::default()
                };
                (config, node)
            })
            .unwrap();
        (h, seen.unwrap())
    }

    #[test]
    fn nodes_are_numbered_per_kind_and_routed() {
        let fabric = Fabric::stepped(1);
        let (_a, ja) = probe(&fabric, "a", "10.0.0.1");
        let (_b, jb) = probe(&fabric, "b", "10.0.0.2");
        let (_a1, ja1) = probe(&fabric, "a", "10.0.0.3");
        assert_eq!((ja.ordinal, jb.ordinal, ja1.ordinal), (0, 0, 1));
        assert_eq!(ja.max_train, crate::sim::MAX_TRAIN);
        assert_eq!(
            fabric.gids(),
            vec![
                ("a0".to_string(), 1, gid("10.0.0.1")),
                ("a1".to_string(), 1, gid("10.0.0.3")),
                ("b0".to_string(), 1, gid("10.0.0.2")),
            ]
        );
        let dup = fabric.attach("a", |_| {
            let config = NodeConfig {
                name: "dup".into(),
                routes: vec![(1, gid("10.0.0.2"))],
            };
            (config, Probe::default())
        });
        assert_eq!(
            dup.unwrap_err(),
            FabricError::DuplicateAddress("10.0.0.2".parse().unwrap())
        );
    }

    /// A manual fabric sends its nodes' batches when a dispatch ends, or with a kick unless
    /// it flushed a moment ago; `flush_owed` (a device going away) flushes at once, with no
    /// dispatch. A stepped fabric's clock is the test's: there it does nothing.
    #[test]
    fn flush_owed_flushes_every_node_at_once() {
        let fabric = Fabric::manual();
        let (a, _) = probe(&fabric, "a", "10.0.2.1");
        let (c, _) = probe(&fabric, "c", "10.0.2.3");
        let before = [&a, &c].map(|n| n.with(|x| x.node.flushes));
        fabric.flush_owed();
        let after = [&a, &c].map(|n| n.with(|x| x.node.flushes));
        // (Attaching or reaching a node of a manual fabric may step and flush it too.)
        for (b, a) in before.into_iter().zip(after) {
            assert!(a > b, "flushes {before:?} -> {after:?}");
        }

        let stepped = Fabric::stepped(1);
        let (b, _) = probe(&stepped, "b", "10.0.2.2");
        b.kick(4);
        stepped.flush_owed();
        assert_eq!(b.with(|c| (c.node.kicks.len(), c.node.flushes)), (0, 0));
    }

    #[test]
    fn kicks_reach_their_node_on_the_next_step_and_timers_advance_time() {
        let fabric = Fabric::stepped(1);
        let (a, _) = probe(&fabric, "a", "10.0.1.1");
        let (b, _) = probe(&fabric, "a", "10.0.1.2");
        a.kick(7);
        b.kick(8);
        a.kick(9);
        assert!(a.with(|c| c.node.kicks.is_empty()), "not before a step");
        assert!(fabric.step());
        assert_eq!(a.with(|c| c.node.kicks.clone()), vec![7, 9]);
        assert_eq!(b.with(|c| c.node.kicks.clone()), vec![8]);
        assert!(!fabric.step(), "nothing left");
        b.with(|c| c.node.deadline = Some(c.now + 1_000));
        fabric.run_until_idle().unwrap();
        assert_eq!(fabric.now_ns(), 1_000);
        assert_eq!(b.with(|c| c.node.deadline), None);
        fabric.set_faults(LinkFaults::lossy(0.1));
        assert_eq!(a.with(|c| c.node.max_train), 1);
    }

    #[test]
    fn a_detached_node_keeps_its_state_but_leaves_the_fabric() {
        let fabric = Fabric::new(FabricConfig {
            mode: Mode::Stepped,
            seed: 3,
            faults: LinkFaults::NONE,
            capture: None,
            bottleneck: None,
        });
        let (a, _) = probe(&fabric, "a", "10.0.2.1");
        a.try_with(|c| c.add_route(2, gid("10.0.2.9")).unwrap())
            .unwrap();
        assert_eq!(fabric.gids().len(), 2);
        a.detach();
        assert!(!a.is_attached());
        assert!(fabric.gids().is_empty());
        assert_eq!(a.try_with(|_| ()), Err(FabricError::Detached));
        a.kick(1);
        fabric.run_until_idle().unwrap();
        assert!(a.with(|c| c.node.kicks.is_empty()), "kicks are ignored");
    }
}

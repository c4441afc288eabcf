//! [`EngineNode`]: the one [`Node`] of the devices that run the transport engine. The soft
//! device and the emulated ConnectX-3 both step the same [`Engine`] the same way (scheduled
//! work, received packets, coalesced ACKs, timers); what differs between them — their queue
//! formats, what a kick means, what they find by watching host memory — is their
//! [`DeviceSide`].

use std::fmt::Debug;

use portverbs_transport::{Engine, Hca, Packet};

use crate::Node;

/// The device side of an [`EngineNode`]: the queues the engine reads WQEs from and writes
/// completions and events to (its [`Hca`]), and what the device does with the fabric's kicks.
/// Every method runs with the fabric lock held and must not block.
pub trait DeviceSide: Hca + Send + Debug + 'static {
    /// A kick arrived ([`Node::kick`]); `what` is the device's own encoding of which queue
    /// rang. The device hands the engine the doorbells it stands for.
    fn kick(&mut self, engine: &mut Engine, now: u64, what: u32, out: &mut Vec<Packet>);

    /// Kicks were lost ([`Node::rescan`]): look at every queue once.
    fn rescan(&mut self, engine: &mut Engine, now: u64, out: &mut Vec<Packet>);

    /// Work the device finds by watching host memory rather than through a doorbell, looked
    /// for on every step after the engine's scheduled work. Returns whether it did anything.
    /// None by default.
    fn watch(&mut self, engine: &mut Engine, now: u64, out: &mut Vec<Packet>) -> bool {
        let _ = (engine, now, out);
        false
    }
}

/// A device on the fabric that runs the transport engine: the engine, the device side it
/// drives (`hw`), and bookkeeping of the device's own that the fabric never looks at
/// (`state`). The device attaches it with [`crate::Fabric::attach`] and reaches its fields
/// again through [`crate::NodeHandle::with`].
#[derive(Debug)]
pub struct EngineNode<H, S = ()> {
    /// The transport engine.
    pub engine: Engine,
    /// The device side: queues, kicks, watched memory.
    pub hw: H,
    /// The device's own bookkeeping.
    pub state: S,
}

impl<H: DeviceSide, S: Send + Debug + 'static> Node for EngineNode<H, S> {
    #[inline]
    fn kick(&mut self, now: u64, what: u32, out: &mut Vec<Packet>) {
        self.hw.kick(&mut self.engine, now, what, out);
    }

    fn rescan(&mut self, now: u64, out: &mut Vec<Packet>) {
        self.hw.rescan(&mut self.engine, now, out);
    }

    #[inline]
    fn run_work(&mut self, now: u64, out: &mut Vec<Packet>) -> bool {
        let scheduled = self.engine.has_work();
        if scheduled {
            self.engine.run_work(now, &mut self.hw, out);
        }
        scheduled | self.hw.watch(&mut self.engine, now, out)
    }

    #[inline]
    fn receive(&mut self, now: u64, port: u8, pkt: &Packet, out: &mut Vec<Packet>) {
        self.engine.receive(now, port, pkt, &mut self.hw, out);
    }

    #[inline]
    fn run_timers(&mut self, now: u64, out: &mut Vec<Packet>) -> bool {
        self.engine.flush_acks(out);
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now, &mut self.hw, out);
            true
        } else {
            false
        }
    }

    fn next_deadline(&self) -> Option<u64> {
        self.engine.poll_timeout()
    }

    fn set_max_train(&mut self, n: u32) {
        self.engine.set_max_train(n);
    }
}

#[cfg(test)]
mod tests {
    use portverbs_hal::event::DeviceEvent;
    use portverbs_hal::types::QpType;
    use portverbs_hal::wc::Cqe;
    use portverbs_transport::{EngineConfig, RecvSource, RecvWqe, SendWqe, VecHca, WqeFault};

    use super::*;
    use crate::{Fabric, NodeConfig};

    /// A device side with vectors for queues that records what the fabric made it do.
    #[derive(Debug, Default)]
    struct Recorder {
        hca: VecHca,
        kicks: Vec<u32>,
        rescans: u32,
        watched: u32,
        /// Steps on which `watch` still finds something to do.
        finds: u32,
    }

    impl Hca for Recorder {
        fn sq_head(&self, qpn: u32) -> Option<u32> {
            self.hca.sq_head(qpn)
        }
        fn read_send_wqe(&mut self, qpn: u32, c: u32, out: &mut SendWqe) -> Result<(), WqeFault> {
            self.hca.read_send_wqe(qpn, c, out)
        }
        fn take_recv_wqe(&mut self, s: RecvSource, out: &mut RecvWqe) -> Result<bool, WqeFault> {
            self.hca.take_recv_wqe(s, out)
        }
        fn recv_posted(&self, source: RecvSource) -> u32 {
            self.hca.recv_posted(source)
        }
        fn post_completion(&mut self, cqn: u32, cqe: &Cqe, solicited: bool) -> bool {
            self.hca.post_completion(cqn, cqe, solicited)
        }
        fn post_event(&mut self, event: DeviceEvent) {
            self.hca.post_event(event);
        }
        fn qp_error(&mut self, qpn: u32) {
            self.hca.qp_error(qpn);
        }
        fn reset_queues(&mut self, qpn: u32, qp_type: QpType) {
            self.hca.reset_queues(qpn, qp_type);
        }
    }

    impl DeviceSide for Recorder {
        fn kick(&mut self, _engine: &mut Engine, _now: u64, what: u32, _out: &mut Vec<Packet>) {
            self.kicks.push(what);
        }
        fn rescan(&mut self, _engine: &mut Engine, _now: u64, _out: &mut Vec<Packet>) {
            self.rescans += 1;
        }
        fn watch(&mut self, _engine: &mut Engine, _now: u64, _out: &mut Vec<Packet>) -> bool {
            self.watched += 1;
            let found = self.finds > 0;
            self.finds = self.finds.saturating_sub(1);
            found
        }
    }

    #[test]
    fn the_fabric_reaches_the_device_side_through_the_engine_node() {
        let fabric = Fabric::stepped(1);
        let h = fabric
            .attach("recorder", |j| {
                let mut engine = Engine::new(EngineConfig::default(), Vec::new());
                engine.set_max_train(j.max_train);
                let config = NodeConfig {
                    name: "recorder0".into(),
                    routes: Vec::new(),
                };
                let node = EngineNode {
                    engine,
                    hw: Recorder::default(),
                    state: "own bookkeeping",
                };
                (config, node)
            })
            .unwrap();
        assert!(
            !fabric.step(),
            "an idle engine and nothing watched: no work"
        );
        assert_eq!(h.with(|c| c.node.hw.watched), 1, "watched on every step");

        h.kick(0x1234);
        fabric.step();
        assert_eq!(h.with(|c| c.node.hw.kicks.clone()), vec![0x1234]);

        // What the device finds by watching counts as work, with no engine work at all.
        h.with(|c| c.node.hw.finds = 2);
        assert!(fabric.step());
        assert!(fabric.step());
        assert!(!fabric.step());
        assert_eq!(h.with(|c| c.node.hw.finds), 0);

        h.with(|c| {
            assert_eq!(Node::next_deadline(&*c.node), None, "no timer armed");
            Node::rescan(c.node, c.now, c.out);
            assert_eq!(c.node.hw.rescans, 1);
            assert_eq!(c.node.state, "own bookkeeping");
        });
    }
}

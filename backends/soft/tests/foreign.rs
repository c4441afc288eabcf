//! Another kind of node on the fabric: a toy `Hca` whose queues are plain Rust collections,
//! with its own engine, implements `portverbs_fabric::Node` and talks RC and UD to a soft
//! device, on a stepped fabric with and without faults; routes change at run time; detaching
//! takes it off the fabric. The toy reaches its own state through its typed handle.

use std::sync::Arc;

use portverbs_fabric::{Node, NodeConfig, NodeHandle};
use portverbs_hal::DmaMemory;
use portverbs_hal::attr::{AddressVector, QpCaps};
use portverbs_hal::queue::{RecvQueue, SendQueue};
use portverbs_hal::types::{AccessFlags, Gid, Mtu, QpType};
use portverbs_hal::wc::{WcOpcode, WcStatus};
use portverbs_hal::wr::{SendFlags, SendOp, SendWr, Sge, UdDest};
use portverbs_soft::{
    DeviceConfig, Fabric, FabricConfig, FabricError, LinkFaults, Mode, SoftDevice, SoftDma,
};
use portverbs_test_support::{HalPeer, RtsParams, drain, to_rts};
use portverbs_transport::memory::MrSpec;
use portverbs_transport::{
    Engine, EngineConfig, Packet, PortInfo, QpInit, RecvWqe, SendWqe, UdTarget, VecHca,
};

/// A device that is nothing but an engine: the transport's [`VecHca`] (queues as vectors),
/// plus what the fabric's kicks brought.
#[derive(Debug, Default)]
struct Toy {
    hca: VecHca,
    kicks: Vec<u32>,
    rescans: u32,
}

impl std::ops::Deref for Toy {
    type Target = VecHca;

    fn deref(&self) -> &VecHca {
        &self.hca
    }
}

impl std::ops::DerefMut for Toy {
    fn deref_mut(&mut self) -> &mut VecHca {
        &mut self.hca
    }
}

/// The toy on the fabric: its engine and its queues.
#[derive(Debug)]
struct ToyNode {
    engine: Engine,
    toy: Toy,
}

impl Node for ToyNode {
    fn kick(&mut self, now: u64, what: u32, out: &mut Vec<Packet>) {
        self.toy.kicks.push(what);
        self.engine.doorbell(now, what, &mut self.toy.hca, out);
    }

    fn rescan(&mut self, now: u64, out: &mut Vec<Packet>) {
        self.toy.rescans += 1;
        self.engine.doorbell(now, TOY_QPN, &mut self.toy.hca, out);
    }

    fn run_work(&mut self, now: u64, out: &mut Vec<Packet>) -> bool {
        let work = self.engine.has_work();
        if work {
            self.engine.run_work(now, &mut self.toy.hca, out);
        }
        work
    }

    fn receive(&mut self, now: u64, port: u8, pkt: &Packet, out: &mut Vec<Packet>) {
        self.engine.receive(now, port, pkt, &mut self.toy.hca, out);
    }

    fn run_timers(&mut self, now: u64, out: &mut Vec<Packet>) -> bool {
        self.engine.flush_acks(out);
        let due = self.engine.poll_timeout().is_some_and(|t| t <= now);
        if due {
            self.engine.handle_timeout(now, &mut self.toy.hca, out);
        }
        due
    }

    fn next_deadline(&self) -> Option<u64> {
        self.engine.poll_timeout()
    }

    fn set_max_train(&mut self, n: u32) {
        self.engine.set_max_train(n);
    }
}

type ToyHandle = NodeHandle<ToyNode>;

/// Attaches a toy with `ports` (routing the GIDs they have).
fn attach_node(
    fabric: &Fabric,
    name: &str,
    ports: Vec<PortInfo>,
) -> Result<ToyHandle, FabricError> {
    fabric.attach("toy", |joining| {
        let routes = ports
            .iter()
            .enumerate()
            .flat_map(|(i, p)| p.gids.iter().map(move |g| ((i + 1) as u8, *g)))
            .collect();
        let mut engine = Engine::new(EngineConfig::default(), ports);
        engine.set_max_train(joining.max_train);
        let config = NodeConfig {
            name: name.into(),
            routes,
        };
        (
            config,
            ToyNode {
                engine,
                toy: Toy::default(),
            },
        )
    })
}

const TOY_QPN: u32 = 0x48;
/// The toy's MR: an mlx4-style key chosen by the device (MPT index 0x21, tag 0x77).
const TOY_KEY: u32 = 0x2177;
const TOY_VA: u64 = 0x7000_0000;

fn with_toy<R>(
    h: &ToyHandle,
    f: impl FnOnce(&mut Toy, &mut Engine, u64, &mut Vec<Packet>) -> R,
) -> R {
    h.with(|ctx| {
        let ToyNode { engine, toy } = &mut *ctx.node;
        f(toy, engine, ctx.now, ctx.out)
    })
}

fn gid(ip: &str) -> Gid {
    Gid::parse(ip).unwrap()
}

fn attach_toy(fabric: &Fabric, ip: &str) -> (ToyHandle, Arc<SoftDma>) {
    let h = attach_node(
        fabric,
        "toy0",
        vec![PortInfo {
            gids: vec![gid(ip)],
            mtu: Mtu::Mtu1024,
            active: true,
        }],
    )
    .unwrap();
    let mem = SoftDma::alloc(1 << 16).unwrap();
    with_toy(&h, |_, engine, _, _| {
        engine
            .memory_mut()
            .register_at(
                TOY_KEY,
                MrSpec {
                    pd: 1,
                    access: AccessFlags::LOCAL_WRITE,
                    va: TOY_VA,
                    len: 1 << 16,
                    mem: mem.clone(),
                    mem_offset: 0,
                },
            )
            .unwrap();
    });
    (h, mem)
}

/// The bring-up both ends of these tests use.
fn rts_params(dest_qp: u32, dgid: Gid) -> RtsParams {
    RtsParams {
        access: AccessFlags::REMOTE_WRITE,
        rd_atomic: 1,
        timeout: 10,
        ..RtsParams::new(dest_qp, dgid, 7)
    }
}

fn soft(fabric: &Fabric, ip: &str, qp_type: QpType) -> HalPeer {
    HalPeer::new(fabric, ip, qp_type)
}

fn toy_qp(h: &ToyHandle, qp_type: QpType, dest_qp: u32, dgid: Gid) {
    with_toy(h, |toy, engine, now, out| {
        engine
            .create_qp(
                TOY_QPN,
                QpInit {
                    qp_type,
                    pd: 1,
                    send_cqn: 1,
                    recv_cqn: 1,
                    srqn: None,
                    sq_entries: 64,
                    caps: QpCaps::default(),
                },
            )
            .unwrap();
        to_rts(qp_type, &rts_params(dest_qp, dgid), |a, m| {
            engine
                .modify_qp(now, TOY_QPN, &a, m, &mut toy.hca, out)
                .unwrap();
        });
    });
}

fn soft_qp(s: &HalPeer, dest_qp: u32, dgid: Gid) {
    s.to_rts(&rts_params(dest_qp, dgid));
}

fn send_wqe(op: SendOp, sge: Sge, ud: Option<UdTarget>) -> SendWqe {
    let mut w = SendWqe {
        op,
        signaled: true,
        ud,
        ..SendWqe::default()
    };
    w.sges.push(sge);
    w
}

/// RC both ways between the toy and a soft device, over a lossy, reordering link.
fn rc_exchange(fabric: &Fabric) {
    let (h, mem) = attach_toy(fabric, "10.0.0.1");
    let mut s = soft(fabric, "10.0.0.2", QpType::Rc);
    toy_qp(&h, QpType::Rc, s.qp.qpn, gid("10.0.0.2"));
    soft_qp(&s, TOY_QPN, gid("10.0.0.1"));

    // Toy → soft: a 3000-byte SEND (three packets at MTU 1024).
    let payload: Vec<u8> = (0..3000u32).map(|i| (i * 7) as u8).collect();
    mem.write(0, &payload).unwrap();
    let rq = s.qp.rq.as_mut().unwrap();
    let recv = Sge {
        addr: s.addr,
        length: 4096,
        lkey: s.lkey,
    };
    rq.write_wqe(0, &[recv]).unwrap();
    rq.ring_doorbell(1);
    with_toy(&h, |toy, _, _, _| {
        toy.sq.push(send_wqe(
            SendOp::Send,
            Sge {
                addr: TOY_VA,
                length: 3000,
                lkey: TOY_KEY,
            },
            None,
        ));
    });
    h.kick(TOY_QPN);
    fabric.run_until_idle().unwrap();
    let got = drain(&mut s.cq);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].wc.status, got[0].wc.byte_len),
        (WcStatus::Success, 3000)
    );
    let mut back = vec![0u8; 3000];
    s.buf.read(0, &mut back).unwrap();
    assert_eq!(back, payload);

    // Soft → toy: a SEND with immediate into the toy's receive WQE.
    s.buf.write(8192, b"hello, foreign device").unwrap();
    let mut w = RecvWqe::default();
    w.sges.push(Sge {
        addr: TOY_VA + 4096,
        length: 64,
        lkey: TOY_KEY,
    });
    with_toy(&h, |toy, _, _, _| toy.rq.push_back(w));
    let sge = [Sge {
        addr: s.addr + 8192,
        length: 21,
        lkey: s.lkey,
    }];
    s.qp.sq
        .write_wqe(
            0,
            &SendWr::new(1, SendOp::SendWithImm { imm: 0xabcd }).sges(&sge),
            true,
        )
        .unwrap();
    s.qp.sq.ring_doorbell(0, 1);
    fabric.run_until_idle().unwrap();
    let mut got = [0u8; 21];
    mem.read(4096, &mut got).unwrap();
    assert_eq!(&got, b"hello, foreign device");
    let toy_cqes = with_toy(&h, |toy, _, _, _| {
        assert_eq!(toy.kicks, vec![TOY_QPN]);
        std::mem::take(&mut toy.cqes)
    });
    assert_eq!(toy_cqes.len(), 2, "{toy_cqes:?}");
    assert!(toy_cqes[0].wqe.is_send && toy_cqes[0].wc.status == WcStatus::Success);
    assert_eq!(toy_cqes[1].wc.opcode, WcOpcode::Recv);
    assert_eq!(
        (toy_cqes[1].wc.imm_data, toy_cqes[1].wc.byte_len),
        (0xabcd, 21)
    );
    let sent = drain(&mut s.cq);
    assert!(sent.len() == 1 && sent[0].wqe.is_send && sent[0].wc.status == WcStatus::Success);
}

#[test]
fn rc_between_a_foreign_device_and_a_soft_device() {
    rc_exchange(&Fabric::stepped(3));
}

#[test]
fn rc_with_a_foreign_device_survives_loss_and_reordering() {
    let mut hit = 0;
    for seed in 1..9 {
        let fabric = Fabric::new(FabricConfig {
            mode: Mode::Stepped,
            seed,
            faults: LinkFaults {
                loss: 0.2,
                reorder: 0.2,
                duplicate: 0.1,
                reorder_window_ns: 50_000,
                ..LinkFaults::NONE
            },
            capture: None,
            bottleneck: None,
        });
        rc_exchange(&fabric);
        let st = fabric.stats();
        hit += st.lost + st.reordered + st.duplicated;
    }
    assert!(hit > 0, "the faults never struck");
}

#[test]
fn ud_from_a_foreign_device_to_a_soft_device() {
    let fabric = Fabric::stepped(9);
    let (h, mem) = attach_toy(&fabric, "10.0.1.1");
    let mut s = soft(&fabric, "10.0.1.2", QpType::Ud);
    toy_qp(&h, QpType::Ud, 0, Gid::ZERO);
    soft_qp(&s, 0, Gid::ZERO);
    let rq = s.qp.rq.as_mut().unwrap();
    rq.write_wqe(
        0,
        &[Sge {
            addr: s.addr,
            length: 1024,
            lkey: s.lkey,
        }],
    )
    .unwrap();
    rq.ring_doorbell(1);
    mem.write(0, b"datagram").unwrap();
    let target = UdTarget {
        av: AddressVector {
            dgid: gid("10.0.1.2"),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AddressVector::default()
        },
        remote_qpn: s.qp.qpn,
        remote_qkey: 0x1111,
    };
    with_toy(&h, |toy, _, _, _| {
        toy.sq.push(send_wqe(
            SendOp::Send,
            Sge {
                addr: TOY_VA,
                length: 8,
                lkey: TOY_KEY,
            },
            Some(target),
        ));
    });
    h.kick(TOY_QPN);
    fabric.run_until_idle().unwrap();
    let got = drain(&mut s.cq);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].wc.status, WcStatus::Success);
    assert_eq!((got[0].wc.byte_len, got[0].wc.src_qp), (40 + 8, TOY_QPN));
    let mut back = [0u8; 8];
    s.buf.read(40, &mut back).unwrap();
    assert_eq!(&back, b"datagram");
    // And back, soft → toy, with the soft device's UD send path.
    let mut w = RecvWqe::default();
    w.sges.push(Sge {
        addr: TOY_VA + 4096,
        length: 256,
        lkey: TOY_KEY,
    });
    with_toy(&h, |toy, _, _, _| toy.rq.push_back(w));
    let av = AddressVector {
        dgid: gid("10.0.1.1"),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..AddressVector::default()
    };
    let wr = SendWr::new(2, SendOp::Send)
        .inline(b"reply")
        .flags(SendFlags::SIGNALED)
        .ud(UdDest {
            ah_pd: None,
            av: &av,
            remote_qpn: TOY_QPN,
            remote_qkey: 0x1111,
        });
    s.qp.sq.write_wqe(0, &wr, true).unwrap();
    s.qp.sq.ring_doorbell(0, 1);
    fabric.run_until_idle().unwrap();
    let cqes = with_toy(&h, |toy, _, _, _| std::mem::take(&mut toy.cqes));
    let recv: Vec<_> = cqes.iter().filter(|c| !c.wqe.is_send).collect();
    assert_eq!(recv.len(), 1, "{cqes:?}");
    assert_eq!((recv[0].wc.byte_len, recv[0].wc.src_qp), (40 + 5, s.qp.qpn));
    let mut back = [0u8; 5];
    mem.read(4096 + 40, &mut back).unwrap();
    assert_eq!(&back, b"reply");
}

#[test]
fn routes_change_at_run_time_and_detach_takes_the_device_off() {
    let fabric = Fabric::stepped(1);
    let _s = soft(&fabric, "10.0.2.2", QpType::Rc);
    let h = attach_node(
        &fabric,
        "toy7",
        vec![
            PortInfo {
                gids: vec![],
                mtu: Mtu::Mtu4096,
                active: false,
            };
            2
        ],
    )
    .unwrap();
    assert_eq!(
        fabric.gids().len(),
        1,
        "no GID until the driver programs one"
    );
    let g1 = gid("10.0.2.1");
    h.try_with(|ctx| {
        ctx.add_route(2, g1).unwrap();
        ctx.add_route(2, g1).unwrap(); // idempotent
        assert_eq!(
            ctx.add_route(1, gid("10.0.2.2")),
            Err(FabricError::DuplicateAddress("10.0.2.2".parse().unwrap())),
            "the soft device owns it"
        );
        assert_eq!(
            ctx.add_route(1, g1),
            Err(FabricError::DuplicateAddress("10.0.2.1".parse().unwrap())),
            "port 2 owns it"
        );
        assert!(!ctx.remove_route(gid("10.0.2.2")), "not ours");
        assert_eq!(ctx.routes(), vec![(2, g1)]);
    })
    .unwrap();
    assert!(fabric.gids().contains(&("toy7".to_string(), 2, g1)));
    // Kicks are delivered by the next step, not before.
    h.kick(5);
    assert_eq!(with_toy(&h, |t, _, _, _| t.kicks.len()), 0);
    assert!(fabric.step());
    assert_eq!(with_toy(&h, |t, _, _, _| t.kicks.clone()), vec![5]);
    h.try_with(|ctx| assert!(ctx.remove_route(g1))).unwrap();
    assert_eq!(fabric.gids().len(), 1);
    h.try_with(|ctx| ctx.add_route(1, g1).unwrap()).unwrap();
    assert!(h.is_attached());
    h.detach();
    assert!(!h.is_attached());
    assert_eq!(fabric.gids().len(), 1, "detach removes the routes");
    assert_eq!(h.try_with(|_| ()), Err(FabricError::Detached));
    h.kick(1);
    fabric.run_until_idle().unwrap();
    // Attaching checks addresses (the fabric) and ports (the soft device).
    let bad = |ports: Vec<PortInfo>| attach_node(&fabric, "bad", ports).unwrap_err();
    assert!(matches!(
        bad(vec![PortInfo {
            gids: vec![gid("10.0.2.2")],
            mtu: Mtu::Mtu1024,
            active: true,
        }]),
        FabricError::DuplicateAddress(_)
    ));
    let no_ports = DeviceConfig {
        name: None,
        ports: vec![],
        seed: None,
        congestion: None,
    };
    assert_eq!(
        SoftDevice::attach(&fabric, no_ports).unwrap_err(),
        FabricError::BadPortCount(0)
    );
}

#[test]
fn a_threaded_fabric_runs_the_toy_kicks_on_its_engine_thread() {
    let fabric = Fabric::threaded();
    let (h, mem) = attach_toy(&fabric, "10.0.3.1");
    let mut s = soft(&fabric, "10.0.3.2", QpType::Rc);
    toy_qp(&h, QpType::Rc, s.qp.qpn, gid("10.0.3.2"));
    soft_qp(&s, TOY_QPN, gid("10.0.3.1"));
    let rq = s.qp.rq.as_mut().unwrap();
    rq.write_wqe(
        0,
        &[Sge {
            addr: s.addr,
            length: 64,
            lkey: s.lkey,
        }],
    )
    .unwrap();
    rq.ring_doorbell(1);
    mem.write(0, b"threaded").unwrap();
    with_toy(&h, |toy, _, _, _| {
        toy.sq.push(send_wqe(
            SendOp::Send,
            Sge {
                addr: TOY_VA,
                length: 8,
                lkey: TOY_KEY,
            },
            None,
        ));
    });
    h.kick(TOY_QPN);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let got = loop {
        let got = drain(&mut s.cq);
        if !got.is_empty() || std::time::Instant::now() > deadline {
            break got;
        }
        std::thread::yield_now();
    };
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].wc.status, WcStatus::Success);
}

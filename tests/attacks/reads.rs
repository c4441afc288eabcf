//! RDMA READ as an amplifier: a 32-byte request asks the responder for up to 2 GiB, and the
//! requester decides how many it sends. The attacker here is the victim's connected peer
//! (it knows the QPN, the PSN and an R_Key for REMOTE_READ: everything RoCE asks of a peer),
//! so the READs themselves are legitimate; what the suite holds the responder to is the cost
//! of answering them (IBA 9.5.3, 9.7.4.1.3):
//!
//! * a READ's responses are generated as the link drains them, so the memory one READ costs is
//!   bounded whatever its size;
//! * a requester may have at most `max_dest_rd_atomic` READs and atomics outstanding at the
//!   responder: one more, while every resource is still answering, is refused with a NAK
//!   (invalid request) rather than queued;
//! * a duplicate READ (a retransmission) is answered again from its saved resource, never
//!   as a second copy alongside the first.

use std::net::IpAddr;

use portverbs::prelude::*;
use portverbs::udp_port::UdpConfig;
use portverbs::verbs::ContextOptions;
use portverbs_wire::{AethSyndrome, NakCode};

use super::attacker::{FabricAttacker, Forge, Forged, UdpImpostor};
use super::rss::{Rss, turn};
use crate::conformance::env::{Backend, Env};

/// The impostor's QP number and the victim's first expected PSN.
const IMPOSTOR_QPN: u32 = 0x4242;
const PSN0: u32 = 0x0012_3456;
const MIB: u32 = 1 << 20;

/// What the victim's QP is given: an RC QP connected to the impostor, allowing `depth` READs
/// outstanding (`max_dest_rd_atomic`), and an MR of `len` bytes with remote read.
struct Victim {
    qp: Qp,
    mr: Mr,
    _cq: Cq,
    _pd: Pd,
}

impl Victim {
    fn new(ctx: &Context, impostor: IpAddr, len: usize, depth: u8, mtu: Mtu) -> Self {
        let pd = ctx.alloc_pd_blocking().unwrap();
        let cq = ctx
            .create_cq_blocking(CqInit {
                entries: 64,
                ..CqInit::default()
            })
            .unwrap();
        let mut init = QpInit::new(QpType::Rc, &cq);
        init.caps.max_send_wr = 16;
        init.caps.max_recv_wr = 16;
        let qp = pd.create_qp_blocking(init).unwrap();
        // Zeroed pages the READs only read: they cost no resident memory of their own.
        let mr = pd
            .reg_vec_blocking(
                vec![0u8; len],
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ,
            )
            .unwrap();
        let opts = ConnectOptions {
            psn: 0x77,
            mtu: Some(mtu),
            access: AccessFlags::REMOTE_READ,
            max_dest_rd_atomic: depth,
            ..ConnectOptions::default()
        };
        let remote = QpEndpoint {
            lid: 0,
            qpn: IMPOSTOR_QPN,
            psn: PSN0,
            gid: Gid::from_ip(impostor),
        };
        qp.connect_rc_blocking(&remote, &opts).unwrap();
        Self {
            qp,
            mr,
            _cq: cq,
            _pd: pd,
        }
    }

    /// `n` READ requests of `len` bytes each, one after another in PSN order.
    fn reads(&self, f: &Forge, n: u32, len: u32, mtu: u32) -> Vec<Forged> {
        let (va, rkey) = (self.mr.addr(), self.mr.rkey().unwrap());
        let npsn = len.div_ceil(mtu);
        (0..n)
            .map(|i| f.read(self.qp.qp_num(), PSN0 + i * npsn, va, rkey, len))
            .collect()
    }
}

/// A UDP-bound software device on `ip` (free-running, as an application has it).
fn udp_victim(name: &str, ip: IpAddr) -> (portverbs::UdpDevice, Context) {
    let dev = portverbs::udp_device(name, UdpConfig::new(ip)).unwrap();
    let ctx = Context::open_blocking(dev.any(), ContextOptions::default()).unwrap();
    (dev, ctx)
}

const MTU: u32 = 4096;

/// One READ of 256 MiB, one of 128 MiB followed by three duplicates, and four of 64 MiB
/// where one was granted, against a UDP-bound device. The bound, 32 MiB over the victim's
/// size before the attack: the port's pool of receive chunks (at most 16 MiB, and only the
/// attacker's few small requests arrive here), one engine turn of responses serialised for
/// `sendmmsg` (at most 64 trains of 64 packets, 16 MiB, and normally far less), and the
/// socket buffers the kernel charges to the process. Before responses were generated as the
/// port drained them, the one READ alone grew the victim by 270 MiB and kept it.
#[test]
fn reads_of_hundreds_of_mib_cost_bounded_memory_over_udp() {
    let _turn = turn();
    let (victim_ip, impostor_ip): (IpAddr, IpAddr) =
        ("127.66.0.1".parse().unwrap(), "127.66.0.2".parse().unwrap());
    let (dev, ctx) = udp_victim("hostile_reads", victim_ip);
    let to = dev.port().local_addr();
    let impostor = UdpImpostor::bind(impostor_ip);
    let f = Forge::new(impostor_ip, victim_ip);

    // One READ of 256 MiB.
    let v = Victim::new(&ctx, impostor_ip, 256 << 20, 1, Mtu::Mtu4096);
    let rss = Rss::start();
    impostor.send(to, &v.reads(&f, 1, 256 * MIB, MTU));
    let got = impostor.drain(u64::from(256 * MIB / MTU));
    println!(
        "  {got} responses arrived; {:?} {:?}",
        dev.port().stats(),
        dev.device().engine_stats()
    );
    rss.check("one READ of 256 MiB over UDP", 32.0);
    assert!(
        rss.held_growth_mib() <= 16.0,
        "the victim keeps {:.1} MiB after the READ",
        rss.held_growth_mib()
    );
    drop(v);

    // A READ and three duplicates of it (a requester retransmitting, or pretending to).
    let v = Victim::new(&ctx, impostor_ip, 128 << 20, 1, Mtu::Mtu4096);
    let rss = Rss::start();
    let read = v.reads(&f, 1, 128 * MIB, MTU);
    for _ in 0..4 {
        impostor.send(to, &read);
    }
    impostor.drain(u64::from(4 * 128 * MIB / MTU));
    rss.check("one READ of 128 MiB and three duplicates over UDP", 32.0);
    assert_eq!(
        v.qp.state(),
        QpState::Rts,
        "duplicates are legitimate retransmissions"
    );
    drop(v);

    // Four READs where the QP grants one outstanding.
    let v = Victim::new(&ctx, impostor_ip, 64 << 20, 1, Mtu::Mtu4096);
    let rss = Rss::start();
    impostor.send(to, &v.reads(&f, 4, 64 * MIB, MTU));
    impostor.drain(u64::from(4 * 64 * MIB / MTU));
    rss.check(
        "four READs of 64 MiB beyond a granted depth of one, over UDP",
        32.0,
    );
    // The NAK itself waits behind the first READ's 16 384 responses and may be lost on the
    // way into the impostor's socket; the responder's side of it is certain: its QP is in
    // ERR and its application heard IBV_EVENT_QP_REQ_ERR.
    assert_refused(&ctx, &v);
}

/// The responder refused a READ beyond its grant: the QP is in ERR on the device and the
/// application hears the invalid-request error (IBV_EVENT_QP_REQ_ERR) for it. Over UDP the
/// victim's progress thread, busy sending the first READ's responses, may take the READs
/// beyond the grant only after the impostor stopped draining (seen once on a loaded machine):
/// the state is waited for (bounded), not sampled.
fn assert_refused(ctx: &Context, v: &Victim) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut state = v.qp.query_blocking().unwrap().qp_state;
    while state != QpState::Err && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
        state = v.qp.query_blocking().unwrap().qp_state;
    }
    assert_eq!(state, QpState::Err, "the requester broke its grant");
    let event = ctx
        .wait_async_event(Some(std::time::Duration::from_secs(30)))
        .expect("an async event");
    assert_eq!(event.kind, portverbs::verbs::AsyncEventKind::QpReqErr);
    assert_eq!(
        event.element,
        portverbs::verbs::EventElement::Qp(v.qp.qp_num())
    );
}

/// On the in-process fabric: a READ of 64 MiB is answered a turn at a time (never more than
/// one engine burst of trains, 64 × 64 packets, per fabric step), and a second READ while the
/// first still answers, on a QP granting one, draws a NAK invalid request.
fn reads_are_answered_a_turn_at_a_time_and_bounded_by_depth(backend: Backend) {
    let _turn = turn();
    let env = Env::new(backend);
    let impostor_ip: IpAddr = "10.0.0.66".parse().unwrap();
    let attacker = FabricAttacker::join(&env.fabric, &[impostor_ip]);
    let f = Forge::new(impostor_ip, env.ips[0]);
    let v = Victim::new(env.a(), impostor_ip, 64 << 20, 1, Mtu::Mtu1024);
    let rss = Rss::start();
    attacker.send(&v.reads(&f, 2, 64 * MIB, 1024));
    let mut most = 0;
    let mut last = 0;
    for _ in 0..100_000 {
        if !env.fabric.step() {
            break;
        }
        let n = attacker.received();
        most = most.max(n - last);
        last = n;
    }
    env.settle();
    rss.check("two READs of 64 MiB on the fabric", 16.0);
    assert!(
        most <= 64 * 64,
        "{most} READ response packets in one fabric step"
    );
    let naks: Vec<_> = attacker
        .seen
        .lock()
        .unwrap()
        .iter()
        .filter_map(|p| p.hdr.aeth.map(|a| a.syndrome))
        .filter(|s| matches!(s, AethSyndrome::Nak(_)))
        .collect();
    assert!(
        naks.contains(&AethSyndrome::Nak(NakCode::InvalidRequest)),
        "{naks:?}"
    );
    assert_refused(env.a(), &v);
    drop(v);
    drop(attacker);
}

mod soft {
    #[test]
    fn reads_are_answered_a_turn_at_a_time_and_bounded_by_depth() {
        super::reads_are_answered_a_turn_at_a_time_and_bounded_by_depth(super::Backend::Soft);
    }
}

mod mlx4 {
    #[test]
    fn reads_are_answered_a_turn_at_a_time_and_bounded_by_depth() {
        super::reads_are_answered_a_turn_at_a_time_and_bounded_by_depth(super::Backend::Mlx4);
    }
}

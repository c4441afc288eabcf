//! Attacks on the RC transport by a peer that is not on the connection's path, or claims to
//! be: garbage, resealed mutations, spoofed sources, requests outside the receive window,
//! and responses (ACK, NAK, RNR NAK, reserved syndromes) for PSNs the requester has nothing
//! outstanding for. Each runs on the software device and the emulated ConnectX-3 (stepped
//! in-process fabric, the attacker a node of its own) and on two UDP-bound devices (the
//! attacker raw sockets on loopback), while a legitimate transfer runs; each asserts that the
//! transfer completes with its data, that no byte of either MR changes other than the
//! transfer's own, and what the attack cost in memory.

use portverbs::prelude::*;
use portverbs::soft::LinkFaults;
use portverbs_wire::{AethSyndrome, NakCode};

use super::attacker::{FabricAttacker, Forge, Forged, Rng, UdpAttacker, Wire, psn_add, stale_psn};
use super::rss::{Rss, turn};
use crate::conformance::env::{Backend, Env};
use crate::conformance::util::{FULL_ACCESS, Pair, Params, pattern};

/// Both directions' first PSN: far from 0, so "behind" and "ahead" both exist near it.
const PSN0: u32 = 0x00A0_0000;
/// A one-way link delay, so that the transfer is still in flight when the attacker strikes.
const DELAY_NS: u64 = 20_000;
/// An address no device owns (the attacker's own, where it does not spoof).
const STRANGER: [u8; 4] = [10, 9, 9, 9];

/// Layout of each side's 64 KiB: what the legitimate transfer touches.
const WRITES: usize = 8;
const CHUNK: usize = 4096;
const READ_AT: usize = 0x8000; // b: the READ's source; a: its destination
const READ_LEN: usize = 0x2000;
const RECV_AT: usize = 0xA000; // b: the SEND's receive buffer; a: the SEND's source
const SEND_LEN: usize = 3000;
const MR_LEN: usize = 1 << 16;
/// More PSNs than the transfer uses at any path MTU (at 1024 bytes: 32 for the WRITEs, 8 for
/// the READ, 3 for the SEND).
const TRANSFER_PSNS: u32 = 64;

/// A connected pair under attack.
struct Scene {
    // Field order is drop order: the pair's objects go before the environment checks that
    // nothing is left.
    pair: Pair,
    wire: Wire,
    env: Env,
    /// The address the legitimate requester (a) and responder (b) have.
    ip_a: std::net::IpAddr,
    ip_b: std::net::IpAddr,
    stranger: std::net::IpAddr,
    /// What each MR must hold when the transfer is done.
    image_a: Vec<u8>,
    image_b: Vec<u8>,
}

impl Scene {
    fn new(backend: Backend) -> Self {
        let faults = LinkFaults {
            delay_ns: DELAY_NS,
            ..LinkFaults::NONE
        };
        let env = Env::with_faults(backend, 0x5eed, faults);
        let p = Params {
            psn: PSN0,
            ..Params::default()
        };
        let pair = Pair::with(&env, QpType::Rc, &p, FULL_ACCESS);
        let (ip_a, ip_b) = (env.ips[0], env.ips[1]);
        let (wire, stranger) = match env.udp_addr(1) {
            Some(addr) => {
                // On loopback the stranger shares the pair's /24 (any 127/8 address is local).
                let std::net::IpAddr::V4(v4) = ip_b else {
                    unreachable!("the UDP backend uses IPv4 loopback")
                };
                let o = v4.octets();
                let s = std::net::IpAddr::from([o[0], o[1], o[2], 250]);
                (Wire::Udp(UdpAttacker::new(addr.port())), s)
            }
            None => {
                let s = std::net::IpAddr::from(STRANGER);
                (Wire::Fabric(FabricAttacker::join(&env.fabric, &[s])), s)
            }
        };
        // The images: a's sources and b's READ source are set now; the rest starts zero.
        let mut image_a = vec![0u8; MR_LEN];
        let mut image_b = vec![0u8; MR_LEN];
        for i in 0..WRITES {
            image_a[i * CHUNK..(i + 1) * CHUNK].copy_from_slice(&pattern(i as u8, CHUNK));
        }
        image_a[RECV_AT..RECV_AT + SEND_LEN].copy_from_slice(&pattern(0x55, SEND_LEN));
        image_b[READ_AT..READ_AT + READ_LEN].copy_from_slice(&pattern(0x77, READ_LEN));
        pair.a.mr.write(0, &image_a).unwrap();
        pair.b.mr.write(0, &image_b).unwrap();
        Self {
            env,
            pair,
            wire,
            ip_a,
            ip_b,
            stranger,
            image_a,
            image_b,
        }
    }

    /// Sends forged packets and makes the UDP backend's settling wait for them.
    fn inject(&self, packets: &[Forged]) {
        let n = self.wire.send(packets);
        if matches!(self.wire, Wire::Udp(_)) {
            self.env.expect_foreign(n as u64);
        }
    }

    /// Posts the legitimate transfer: WRITEs a → b, a READ of b into a, a SEND a → b.
    fn post_transfer(&mut self) {
        let (a, b) = (&self.pair.a, &self.pair.b);
        b.post_recv(100, RECV_AT as u64, SEND_LEN as u32);
        let mut wrs = Vec::new();
        let sges: Vec<[Sge; 1]> = (0..WRITES)
            .map(|i| [a.sge((i * CHUNK) as u64, CHUNK as u32)])
            .collect();
        for (i, sge) in sges.iter().enumerate() {
            wrs.push(
                SendWr::new(
                    i as u64,
                    SendOp::RdmaWrite {
                        remote: b.remote((i * CHUNK) as u64),
                    },
                )
                .sges(sge)
                .flags(SendFlags::SIGNALED),
            );
        }
        let read_sge = [a.sge(READ_AT as u64, READ_LEN as u32)];
        wrs.push(
            SendWr::new(
                50,
                SendOp::RdmaRead {
                    remote: b.remote(READ_AT as u64),
                },
            )
            .sges(&read_sge)
            .flags(SendFlags::SIGNALED),
        );
        let send_sge = [a.sge(RECV_AT as u64, SEND_LEN as u32)];
        wrs.push(
            SendWr::new(60, SendOp::Send)
                .sges(&send_sge)
                .flags(SendFlags::SIGNALED),
        );
        a.qp.post_send(&wrs).unwrap();
        // What the transfer leaves behind.
        for i in 0..WRITES {
            let (lo, hi) = (i * CHUNK, (i + 1) * CHUNK);
            self.image_b[lo..hi].copy_from_slice(&self.image_a[lo..hi]);
        }
        let read = self.image_b[READ_AT..READ_AT + READ_LEN].to_vec();
        self.image_a[READ_AT..READ_AT + READ_LEN].copy_from_slice(&read);
        let sent = self.image_a[RECV_AT..RECV_AT + SEND_LEN].to_vec();
        self.image_b[RECV_AT..RECV_AT + SEND_LEN].copy_from_slice(&sent);
    }

    /// Settles and checks the transfer: every request and the receive completed successfully,
    /// and both MRs hold exactly their images.
    fn check_transfer(&self) {
        let (a, b) = (&self.pair.a, &self.pair.b);
        for (who, cq, n) in [("a", &a.cq, WRITES + 2), ("b", &b.cq, 1)] {
            let wcs = self.env.poll(cq, n);
            let seen: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
            assert!(
                wcs.len() == n && wcs.iter().all(|w| w.status == WcStatus::Success),
                "{who}'s completions: {seen:?}"
            );
        }
        let mut got = vec![0u8; MR_LEN];
        a.mr.read(0, &mut got).unwrap();
        assert!(got == self.image_a, "a's MR differs from the transfer's");
        b.mr.read(0, &mut got).unwrap();
        assert!(got == self.image_b, "b's MR differs from the transfer's");
    }

    /// a's next PSN window start is somewhere in [PSN0, PSN0 + packets sent).
    fn forge_as_b(&self) -> Forge {
        Forge::new(self.ip_b, self.ip_a)
    }

    fn forge_as_a(&self) -> Forge {
        Forge::new(self.ip_a, self.ip_b)
    }

    fn run_for(&self, ns: u64) {
        self.env.run_for(ns);
    }
}

/// Every response an attacker can forge without knowing a PSN the requester has in flight:
/// sequence NAK, RNR NAK with the longest timer, each error NAK and reserved syndromes.
fn stale_responses(f: &Forge, rng: &mut Rng, qpn: u32, window: u32) -> Vec<Forged> {
    let syndromes = [
        AethSyndrome::Nak(NakCode::PsnSequenceError),
        AethSyndrome::RnrNak { timer: 31 },
        AethSyndrome::Nak(NakCode::RemoteAccessError),
        AethSyndrome::Nak(NakCode::InvalidRequest),
        AethSyndrome::Nak(NakCode::RemoteOperationalError),
        AethSyndrome::Nak(NakCode::InvalidRdRequest),
        AethSyndrome::Reserved(0x80),
        AethSyndrome::Reserved(0x40),
        AethSyndrome::Ack { credits: 0x1f },
    ];
    syndromes
        .iter()
        .map(|&s| f.ack(qpn, stale_psn(rng, window), s))
        .collect()
}

/// Point 1, spoofed: responses for PSNs from the stale half of the space, claiming to come
/// from the responder, while the requester has a transfer in flight. rxe drops them (its
/// completer's PSN check); IBTA 9.7 has a requester act only on responses for what it has
/// outstanding. None may fail a WQE, stall the send queue or cost a retry.
fn stale_naks_neither_fail_nor_stall_nor_cost_a_retry(backend: Backend) {
    let _turn = turn();
    let mut s = Scene::new(backend);
    let rss = Rss::start();
    let mut rng = Rng::new(1);
    let f = s.forge_as_b();
    let qpn = s.pair.a.qp.qp_num();
    s.post_transfer();
    let mut sent = 0;
    for _ in 0..5 {
        s.run_for(DELAY_NS / 4);
        let pkts = stale_responses(&f, &mut rng, qpn, PSN0);
        sent += pkts.len() as u64;
        s.inject(&pkts);
    }
    s.check_transfer();
    let stats = s.env.devs[0].engine_stats();
    // An RNR NAK obeyed, or a NAK acted on, rewinds the send queue: the packets sent again
    // are counted as retransmissions.
    assert_eq!(stats.retransmits, 0, "{stats:?}");
    assert_eq!(stats.timeouts, 0, "{stats:?}");
    assert!(stats.psn_out_of_window >= sent, "{sent} forged: {stats:?}");
    rss.check("stale NAK/RNR/reserved responses", 8.0);
}

/// Point 1, on a benign network: a sequence NAK (or an RNR NAK) delivered late, after the
/// requester went back, retransmitted and moved on, is for PSNs already acknowledged. It must
/// neither fail the connection nor cost a retry: eight of them in a row used to exhaust
/// `retry_cnt` = 7 and end the QP in RETRY_EXC_ERR.
fn a_delayed_duplicate_nak_costs_nothing(backend: Backend) {
    let _turn = turn();
    let mut s = Scene::new(backend);
    let f = s.forge_as_b();
    let qpn = s.pair.a.qp.qp_num();
    // A first transfer completes: its PSNs are acknowledged.
    s.post_transfer();
    s.check_transfer();
    let before = s.env.devs[0].engine_stats();
    // The second one is in flight when NAKs for the first one's PSNs arrive.
    s.post_transfer();
    s.run_for(DELAY_NS / 2);
    let late: Vec<Forged> = (0..8)
        .flat_map(|i| {
            let p = psn_add(PSN0, 1 + i);
            [
                f.ack(qpn, p, AethSyndrome::Nak(NakCode::PsnSequenceError)),
                f.ack(qpn, p, AethSyndrome::RnrNak { timer: 1 }),
            ]
        })
        .collect();
    s.inject(&late);
    s.check_transfer();
    let after = s.env.devs[0].engine_stats();
    assert_eq!(after.retransmits, before.retransmits, "{after:?}");
    assert_eq!(after.timeouts, before.timeouts, "{after:?}");
}

/// Requests claiming to come from the requester (a's address, the real R_Key and address of
/// b's MR) with PSNs just ahead of and just behind b's receive window: ahead draws one
/// sequence NAK per gap, behind is a duplicate (SEND and WRITE re-acknowledged, never
/// executed again; a READ or atomic answered only from a saved resource that matches). No
/// byte of b's MR may change: without the exact PSN, key and address, RoCE lets nothing in.
///
/// "Ahead" starts past the whole transfer's PSNs: a requester under congestion control sends
/// the transfer over several round trips, so a PSN inside its range may be exactly the one b
/// expects when the forgery lands — a correct guess, which RoCE cannot tell from the real
/// packet.
fn requests_outside_the_window_change_no_byte(backend: Backend) {
    let _turn = turn();
    let mut s = Scene::new(backend);
    let rss = Rss::start();
    let f = s.forge_as_a();
    let b = &s.pair.b;
    let (qpn, va, rkey) = (b.qp.qp_num(), b.mr.addr(), b.mr.rkey().unwrap());
    let mut pkts = Vec::new();
    for d in 1..=16u32 {
        for p in [
            psn_add(PSN0, TRANSFER_PSNS + d),
            PSN0.wrapping_sub(d) & 0xFF_FFFF,
        ] {
            pkts.push(f.write(qpn, p, va + 0xC000, rkey, b"hostile write!!!"));
            pkts.push(f.fetch_add(qpn, p, va + 0xC000, rkey, 0x4242));
            pkts.push(f.read(qpn, p, va, rkey, 4096));
        }
    }
    s.post_transfer();
    s.run_for(DELAY_NS / 2);
    s.inject(&pkts);
    s.check_transfer();
    rss.check("requests outside the receive window", 8.0);
}

/// Garbage and resealed mutations of well-formed packets (a WRITE, a READ, an atomic, a SEND
/// to b; ACKs and NAKs to a; a MAD to QP1) from the peer's address and from a stranger's,
/// with their PSNs kept outside the window (see `Forge::mutate`), while the transfer runs.
/// Over UDP also raw bytes of every length and packets with a bad ICRC.
fn garbage_and_mutations_change_nothing(backend: Backend) {
    let _turn = turn();
    let mut s = Scene::new(backend);
    let rss = Rss::start();
    let mut rng = Rng::new(7);
    let (a, b) = (&s.pair.a, &s.pair.b);
    let (qa, qb) = (a.qp.qp_num(), b.qp.qp_num());
    let (va, rkey) = (b.mr.addr(), b.mr.rkey().unwrap());
    let templates: Vec<(bool, Vec<u8>)> = {
        let to_b = s.forge_as_a();
        let to_a = s.forge_as_b();
        vec![
            (true, to_b.write(qb, 0, va, rkey, &[0xAB; 64]).ib),
            (true, to_b.read(qb, 0, va, rkey, 1 << 20).ib),
            (true, to_b.fetch_add(qb, 0, va + 8, rkey, 1).ib),
            (
                true,
                to_b.packet(
                    portverbs_wire::TransportHdr::new(super::attacker::bth(
                        portverbs_wire::Opcode::SendOnly,
                        qb,
                        0,
                    )),
                    &[0xCD; 200],
                )
                .ib,
            ),
            (true, to_b.mad(&[0u8; 256]).ib),
            (
                false,
                to_a.ack(qa, 0, AethSyndrome::Nak(NakCode::RemoteAccessError))
                    .ib,
            ),
            (false, to_a.ack(qa, 0, AethSyndrome::Ack { credits: 31 }).ib),
        ]
    };
    let mut rounds = Vec::new();
    for _ in 0..4 {
        let mut pkts = Vec::new();
        for _ in 0..250 {
            let (to_b, t) = &templates[rng.below(templates.len() as u64) as usize];
            let spoof = rng.chance(0.7);
            let (src, dst) = match (to_b, spoof) {
                (true, true) => (s.ip_a, s.ip_b),
                (false, true) => (s.ip_b, s.ip_a),
                (true, false) => (s.stranger, s.ip_b),
                (false, false) => (s.stranger, s.ip_a),
            };
            let psn = if rng.chance(0.5) {
                stale_psn(&mut rng, PSN0)
            } else {
                // Far ahead of anything the transfer reaches.
                psn_add(PSN0, (1 << 20) + rng.below(1 << 21) as u32)
            };
            pkts.push(Forge::new(src, dst).mutate(&mut rng, t, psn));
        }
        rounds.push(pkts);
    }
    s.post_transfer();
    for pkts in &rounds {
        s.run_for(DELAY_NS / 4);
        s.inject(pkts);
        if let Wire::Udp(u) = &s.wire {
            // Garbage of every length, and a well-formed packet with a bad ICRC.
            for len in [0usize, 1, 7, 11, 12, 13, 20, 40, 64, 300, 1500, 4200] {
                u.send_raw(s.stranger, s.ip_b, &rng.bytes(len));
                u.send_raw(s.ip_a, s.ip_b, &rng.bytes(len));
            }
            let mut bad = pkts[0].ib.clone();
            bad.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
            u.send_raw(s.ip_a, s.ip_b, &bad);
            s.env.expect_foreign(25);
        }
    }
    s.check_transfer();
    let dropped = s.env.devs[1].engine_stats().dropped + s.env.devs[0].engine_stats().dropped;
    assert!(
        dropped > 0,
        "nothing was dropped: the attack did not arrive"
    );
    rss.check("garbage and resealed mutations", 16.0);
}

/// Declares each listed attack as a test on the soft device, the emulated ConnectX-3 and the
/// UDP port.
macro_rules! attacks {
    ($($name:ident),* $(,)?) => {
        mod soft {
            $(#[test] fn $name() { super::$name(super::Backend::Soft); })*
        }
        mod mlx4 {
            $(#[test] fn $name() { super::$name(super::Backend::Mlx4); })*
        }
        #[cfg(target_os = "linux")]
        mod udp {
            $(#[test] fn $name() { super::$name(super::Backend::Udp); })*
        }
    };
}

attacks!(
    stale_naks_neither_fail_nor_stall_nor_cost_a_retry,
    a_delayed_duplicate_nak_costs_nothing,
    requests_outside_the_window_change_no_byte,
    garbage_and_mutations_change_nothing,
);

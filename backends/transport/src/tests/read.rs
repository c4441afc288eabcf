//! RDMA READ responses as the link drains them: the responder keeps a READ in progress in
//! its responder resource (IBA 9.5.3) and emits at most `burst` packets (or trains) of it per
//! engine call, whatever the READ's size; a duplicate READ (IBA 9.9.2.2) moves that
//! resource's cursor instead of answering a second time; more READs and atomics owing
//! responses than `max_dest_rd_atomic` granted are an invalid request; what the responder
//! sends for later requests waits behind the responses before it; a QP state change, or the
//! MR going away, ends the READ in progress.

use portverbs_hal::event::QpEventKind;
use portverbs_hal::types::{Mtu, QpState};
use portverbs_hal::wc::{WcOpcode, WcStatus};
use portverbs_hal::wr::{RemoteAddr, SendOp};

use super::super::{EngineConfig, Packet};
use super::harness::{
    MTU, Pair, RQ_PSN, Setup, Side, VA, bth, from_peer, pattern, request, summary, syndrome,
};
use crate::wire::{AethSyndrome, AtomicEth, NakCode, Opcode, Reth, TransportHdr};

/// The default burst: packets (or trains) one QP may emit per engine call.
const BURST: usize = 64;

#[test]
fn the_default_burst_is_the_one_these_tests_count_with() {
    assert_eq!(EngineConfig::default().burst as usize, BURST);
}

/// 256 KiB: 256 responses at the 1 KiB path MTU, four turns' worth.
const BIG: u32 = 256 << 10;

/// A responder with a 1 MiB buffer, the first `BIG` bytes a known pattern.
fn responder(setup: Setup) -> Side {
    let s = Side::with(Setup {
        buf: 1 << 20,
        ..setup
    });
    s.write_mem(0, &pattern(BIG as usize, 7));
    s
}

/// A READ request from the peer for buffer bytes `[off, off + len)` at PSN `psn`.
fn read_req(s: &Side, psn: u32, off: u64, len: u32) -> Packet {
    let mut hdr = TransportHdr::new(bth(Opcode::ReadRequest, psn, true));
    hdr.reth = Some(Reth {
        va: VA + off,
        rkey: s.key,
        dma_len: len,
    });
    from_peer(hdr, &[])
}

/// Work turns until the engine has none left, each within the burst; every packet, in order.
fn drain(s: &mut Side) -> Vec<Packet> {
    let mut all = Vec::new();
    for _ in 0..10_000 {
        if !s.engine.has_work() {
            return all;
        }
        let out = s.turn();
        assert!(out.len() <= BURST, "{} packets in one turn", out.len());
        all.extend(out);
    }
    panic!("the work never ends");
}

/// Opcodes and PSNs of a few packets, for a failure message.
fn head(pkts: &[Packet]) -> String {
    format!(
        "{} packets: {:?}",
        pkts.len(),
        summary(&pkts[..pkts.len().min(8)])
    )
}

fn psns(pkts: &[Packet]) -> Vec<u32> {
    pkts.iter().map(|p| p.hdr.bth.psn).collect()
}

/// The bytes the responses carry, in order.
fn bytes(pkts: &[Packet]) -> Vec<u8> {
    pkts.iter()
        .flat_map(|p| p.payload.to_vec().expect("readable"))
        .collect()
}

fn naked(out: &[Packet], psn: u32, code: NakCode) -> bool {
    out.len() == 1
        && out[0].hdr.bth.opcode == Opcode::Acknowledge
        && out[0].hdr.bth.psn == psn
        && syndrome(&out[0]) == Some(AethSyndrome::Nak(code))
}

#[test]
fn a_256_mib_read_is_answered_burst_by_burst_and_lands_whole() {
    const LEN: usize = 256 << 20;
    const PAGE: usize = 4096;
    let mut p = Pair::new(Setup {
        buf: LEN,
        path_mtu: Mtu::Mtu4096,
        ..Setup::rc()
    });
    // A marker at the start of every page: one READ response each at this MTU.
    let marker = |page: usize| {
        (page as u64)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .to_le_bytes()
    };
    for page in 0..LEN / PAGE {
        p.b.write_mem((page * PAGE) as u64, &marker(page));
    }
    let remote = RemoteAddr {
        addr: VA,
        rkey: p.b.key,
    };
    let out =
        p.a.post(p.a.wqe(SendOp::RdmaRead { remote }, 0, LEN as u32));
    p.to_b.extend(out);
    let mut rounds = 0;
    while p.round(&mut |_, _| true) {
        assert!(
            p.to_a.len() <= BURST,
            "round {rounds}: {} responses at once",
            p.to_a.len()
        );
        rounds += 1;
        assert!(rounds < 10_000, "the READ never ends");
    }
    assert!(rounds >= LEN / PAGE / BURST, "{rounds} rounds");
    let cqes = p.a.take_cqes();
    assert_eq!(cqes.len(), 1);
    assert_eq!(
        (cqes[0].wc.status, cqes[0].wc.opcode, cqes[0].wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaRead, LEN as u32)
    );
    for page in 0..LEN / PAGE {
        assert_eq!(
            p.a.read_mem((page * PAGE) as u64, 8),
            marker(page),
            "page {page}"
        );
    }
    assert_eq!(p.b.engine.stats().tx_packets, (LEN / PAGE) as u64);
}

#[test]
fn reads_beyond_max_dest_rd_atomic_are_an_invalid_request() {
    let mut s = responder(Setup {
        max_dest_rd_atomic: 1,
        ..Setup::rc()
    });
    let reads: Vec<Packet> = (0..4)
        .map(|i| read_req(&s, RQ_PSN + i * 256, 0, BIG))
        .collect();
    // The second READ finds the only resource still owing all its responses: the requester
    // has more outstanding than it was granted.
    let out = s.burst(&reads);
    assert!(
        naked(&out, RQ_PSN + 256, NakCode::InvalidRequest),
        "{}",
        head(&out)
    );
    assert_eq!(s.state(), QpState::Err);
    assert!(s.has_event(QpEventKind::RequestError));
    assert!(drain(&mut s).is_empty(), "the READ in progress ended");
}

#[test]
fn a_read_after_the_last_one_was_answered_reuses_its_resource() {
    let mut s = responder(Setup {
        max_dest_rd_atomic: 1,
        ..Setup::rc()
    });
    for i in 0..4 {
        s.feed(read_req(&s, RQ_PSN + i * 4, 0, 4 * MTU as u32));
        let out = drain(&mut s);
        assert_eq!(
            psns(&out),
            (0..4).map(|k| RQ_PSN + i * 4 + k).collect::<Vec<_>>()
        );
    }
    assert_eq!(s.state(), QpState::Rts);
}

#[test]
fn a_read_and_three_duplicates_are_answered_once_more_from_the_duplicates_psn() {
    let mut s = responder(Setup::rc());
    let out = s.feed(read_req(&s, RQ_PSN, 0, BIG));
    assert!(out.is_empty(), "{} responses at once", out.len());
    let first = s.turn();
    assert_eq!(
        psns(&first),
        (RQ_PSN..RQ_PSN + BURST as u32).collect::<Vec<_>>()
    );
    // The requester lost everything from the 11th response on, and asked three times.
    let skip = 10u32;
    let dup = read_req(
        &s,
        RQ_PSN + skip,
        u64::from(skip) * MTU as u64,
        BIG - skip * MTU as u32,
    );
    let dups = s.engine.stats().duplicates;
    let out = s.burst(&[dup.clone(), dup.clone(), dup]);
    assert!(out.is_empty(), "a duplicate only moves the cursor");
    assert_eq!(s.engine.stats().duplicates, dups + 3);
    let rest = drain(&mut s);
    assert_eq!(
        psns(&rest),
        (RQ_PSN + skip..RQ_PSN + 256).collect::<Vec<_>>()
    );
    assert_eq!(
        bytes(&rest),
        &pattern(BIG as usize, 7)[skip as usize * MTU..]
    );
    assert_eq!(rest[0].hdr.bth.opcode, Opcode::ReadResponseMiddle);
    assert_eq!(
        rest.last().map(|p| p.hdr.bth.opcode),
        Some(Opcode::ReadResponseLast)
    );
}

#[test]
fn a_duplicate_read_with_another_rkey_or_outside_the_original_is_dropped() {
    let mut s = responder(Setup::rc());
    let len = 4 * MTU as u32;
    s.feed(read_req(&s, RQ_PSN, 0, len));
    assert_eq!(drain(&mut s).len(), 4);
    let m = MTU as u64;
    let mut other_key = read_req(&s, RQ_PSN + 1, m, len - MTU as u32);
    if let Some(r) = other_key.hdr.reth.as_mut() {
        r.rkey ^= 0x100;
    }
    let bad = [
        other_key,
        // Not where the PSN's response starts.
        read_req(&s, RQ_PSN + 1, m + 8, len - MTU as u32 - 8),
        read_req(&s, RQ_PSN + 1, 0, len),
        // Past the end of the original.
        read_req(&s, RQ_PSN + 1, m, len),
        read_req(&s, RQ_PSN, 0, len + 1),
    ];
    let dups = s.engine.stats().duplicates;
    for (i, d) in bad.into_iter().enumerate() {
        let mut out = s.feed(d);
        out.extend(drain(&mut s));
        assert!(out.is_empty(), "duplicate {i}: {}", head(&out));
    }
    assert_eq!(s.engine.stats().duplicates, dups + 5);
    assert_eq!(s.state(), QpState::Rts);
    // The right one is answered from its PSN.
    s.feed(read_req(&s, RQ_PSN + 2, 2 * m, len - 2 * MTU as u32));
    assert_eq!(psns(&drain(&mut s)), [RQ_PSN + 2, RQ_PSN + 3]);
}

#[test]
fn deregistering_the_mr_mid_read_ends_it_with_a_remote_access_nak() {
    let mut s = responder(Setup::rc());
    assert!(s.feed(read_req(&s, RQ_PSN, 0, BIG)).is_empty());
    assert_eq!(s.turn().len(), BURST);
    s.engine.memory_mut().deregister(s.key).unwrap();
    let out = drain(&mut s);
    assert!(
        naked(&out, RQ_PSN, NakCode::RemoteAccessError),
        "{}",
        head(&out)
    );
    assert_eq!(s.state(), QpState::Err);
    assert!(s.has_event(QpEventKind::AccessError));
}

#[test]
fn an_error_a_reset_or_a_destroy_drops_the_read_in_progress() {
    for to in [QpState::Err, QpState::Reset] {
        let mut s = responder(Setup::rc());
        assert!(s.feed(read_req(&s, RQ_PSN, 0, BIG)).is_empty());
        assert_eq!(s.turn().len(), BURST);
        let attr = s.attr;
        s.modify(to, &attr, portverbs_hal::attr::QpAttrMask::empty())
            .unwrap();
        assert!(drain(&mut s).is_empty(), "{to}");
        assert!(
            s.qp().resp.resources.iter().all(Option::is_none),
            "{to}: nothing kept"
        );
    }
    let mut s = responder(Setup::rc());
    assert!(s.feed(read_req(&s, RQ_PSN, 0, BIG)).is_empty());
    assert_eq!(s.turn().len(), BURST);
    s.engine.destroy_qp(s.qpn).unwrap();
    assert!(!s.engine.has_work());
}

#[test]
fn read_responses_travel_as_trains_at_most_burst_trains_a_turn() {
    let mut s = responder(Setup {
        cfg: EngineConfig {
            burst: 4,
            ..EngineConfig::default()
        },
        ..Setup::rc()
    });
    s.engine.set_max_train(16);
    assert!(s.feed(read_req(&s, RQ_PSN, 0, BIG)).is_empty());
    let mut turns = Vec::new();
    while s.engine.has_work() {
        turns.push(s.turn());
    }
    assert_eq!(
        turns.iter().map(Vec::len).collect::<Vec<_>>(),
        [4, 4, 4, 4],
        "256 responses: 16 trains of 16, four a turn"
    );
    let trains: Vec<Packet> = turns.into_iter().flatten().collect();
    assert!(trains.iter().all(|t| t.psn_count() == 16));
    assert_eq!(bytes(&trains), pattern(BIG as usize, 7));
    let parts: Vec<Packet> = trains.into_iter().flat_map(Packet::split).collect();
    assert_eq!(psns(&parts), (RQ_PSN..RQ_PSN + 256).collect::<Vec<_>>());
}

#[test]
fn an_ack_a_nak_and_an_atomic_ack_wait_behind_the_read_responses_before_them() {
    let mut s = responder(Setup::rc());
    s.post_recv(BIG as u64, 64);
    let mut atomic = TransportHdr::new(bth(Opcode::FetchAdd, RQ_PSN + 256, true));
    atomic.atomic = Some(AtomicEth {
        va: VA + u64::from(BIG),
        rkey: s.key,
        swap_add: 1,
        compare: 0,
    });
    let out = s.burst(&[
        read_req(&s, RQ_PSN, 0, BIG),
        from_peer(atomic, &[]),
        request(Opcode::SendOnly, RQ_PSN + 257, true, &[1; 8]),
        // A gap: the sequence NAK too waits for its turn.
        request(Opcode::SendOnly, RQ_PSN + 259, true, &[1; 8]),
    ]);
    assert!(out.is_empty(), "{}", head(&out));
    let out = drain(&mut s);
    let n = out.len();
    assert_eq!(n, 256 + 3);
    assert!(
        out[..256]
            .iter()
            .all(|p| p.hdr.bth.opcode.is_read_response())
    );
    assert_eq!(
        summary(&out[256..]),
        [
            (Opcode::AtomicAcknowledge, RQ_PSN + 256),
            (Opcode::Acknowledge, RQ_PSN + 257),
            (Opcode::Acknowledge, RQ_PSN + 258)
        ]
    );
    assert_eq!(syndrome(&out[257]), Some(AethSyndrome::ACK_UNLIMITED));
    assert_eq!(
        syndrome(&out[258]),
        Some(AethSyndrome::Nak(NakCode::PsnSequenceError))
    );
    assert_eq!(s.state(), QpState::Rts);
}

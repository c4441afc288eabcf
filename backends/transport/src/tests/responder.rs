//! The responder: in-order execution of SEND, RDMA WRITE, READ and atomics with coalesced
//! ACKs, duplicates (re-ACKed, READs answered again, atomics replayed), one sequence NAK per PSN
//! gap, RNR NAKs, remote access and length errors, and UC/UD reception.

use portverbs_hal::event::QpEventKind;
use portverbs_hal::types::{QpState, QpType};
use portverbs_hal::wc::{WcFlags, WcOpcode, WcStatus};

use super::super::Packet;
use super::harness::{
    MIN_RNR_TIMER, MTU, QKEY, RQ_PSN, Setup, Side, VA, bth, from_peer, pattern, request, summary,
    syndrome,
};
use crate::wire::{AethSyndrome, AtomicEth, Deth, NakCode, Opcode, Reth, TransportHdr};

/// A packet with a RETH naming buffer bytes `[off, off + len)` of `s`.
fn with_reth(s: &Side, opcode: Opcode, psn: u32, off: u64, len: u32, payload: &[u8]) -> Packet {
    let mut hdr = TransportHdr::new(bth(opcode, psn, true));
    hdr.reth = Some(Reth {
        va: VA + off,
        rkey: s.key,
        dma_len: len,
    });
    from_peer(hdr, payload)
}

/// An atomic request on the 8 bytes at buffer offset `off`.
fn atomic(s: &Side, opcode: Opcode, psn: u32, off: u64, swap_add: u64, compare: u64) -> Packet {
    let mut hdr = TransportHdr::new(bth(opcode, psn, true));
    hdr.atomic = Some(AtomicEth {
        va: VA + off,
        rkey: s.key,
        swap_add,
        compare,
    });
    from_peer(hdr, &[])
}

fn acked(out: &[Packet], psn: u32) -> bool {
    out.len() == 1
        && out[0].hdr.bth.opcode == Opcode::Acknowledge
        && out[0].hdr.bth.psn == psn
        && matches!(syndrome(&out[0]), Some(AethSyndrome::Ack { .. }))
}

fn naked(out: &[Packet], psn: u32, code: NakCode) -> bool {
    out.len() == 1
        && out[0].hdr.bth.opcode == Opcode::Acknowledge
        && out[0].hdr.bth.psn == psn
        && syndrome(&out[0]) == Some(AethSyndrome::Nak(code))
}

fn read_u64(s: &Side, off: u64) -> u64 {
    let b = s.read_mem(off, 8);
    u64::from_ne_bytes(b.try_into().unwrap())
}

#[test]
fn in_order_sends_are_placed_and_acked_once_per_burst() {
    let mut s = Side::rc();
    s.post_recv(0, 64);
    s.post_recv(64, 64);
    s.post_recv(128, 64);
    let (a, b, c) = (pattern(16, 1), pattern(20, 2), pattern(3, 3));
    let out = s.burst(&[
        request(Opcode::SendOnly, RQ_PSN, true, &a),
        request(Opcode::SendOnly, RQ_PSN + 1, true, &b),
        request(Opcode::SendOnly, RQ_PSN + 2, true, &c),
    ]);
    // Three packets asked for an ACK: one, for the last, covers them all.
    assert!(acked(&out, RQ_PSN + 2), "{:?}", summary(&out));
    assert_eq!(out[0].hdr.aeth.map(|x| x.msn), Some(3));
    let got: Vec<_> = s
        .take_cqes()
        .iter()
        .map(|c| {
            (
                c.wqe.index,
                c.wc.status,
                c.wc.opcode,
                c.wc.byte_len,
                c.wqe.is_send,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (0, WcStatus::Success, WcOpcode::Recv, 16, false),
            (1, WcStatus::Success, WcOpcode::Recv, 20, false),
            (2, WcStatus::Success, WcOpcode::Recv, 3, false)
        ]
    );
    assert_eq!(s.read_mem(0, 16), a);
    assert_eq!(s.read_mem(64, 20), b);
    assert_eq!(s.read_mem(128, 3), c);
}

#[test]
fn packets_without_ack_req_are_not_acked() {
    let mut s = Side::rc();
    s.post_recv(0, 4096);
    let data = pattern(MTU + 10, 4);
    let out = s.burst(&[
        request(Opcode::SendFirst, RQ_PSN, false, &data[..MTU]),
        request(Opcode::SendLast, RQ_PSN + 1, false, &data[MTU..]),
    ]);
    assert!(out.is_empty());
    let cqes = s.take_cqes();
    assert_eq!(cqes.len(), 1);
    assert_eq!(cqes[0].wc.byte_len, (MTU + 10) as u32);
    assert_eq!(s.read_mem(0, MTU + 10), data);
}

#[test]
fn a_duplicate_is_re_acked_without_being_placed_again() {
    let mut s = Side::rc();
    s.post_recv(0, 64);
    s.post_recv(64, 64);
    let pkt = request(Opcode::SendOnly, RQ_PSN, true, &pattern(16, 5));
    assert!(acked(&s.feed(pkt.clone()), RQ_PSN));
    assert_eq!(s.take_cqes().len(), 1);
    s.write_mem(0, &[0; 16]);
    let dups = s.engine.stats().duplicates;
    let out = s.feed(pkt);
    assert!(acked(&out, RQ_PSN), "{:?}", summary(&out));
    assert!(s.take_cqes().is_empty());
    assert_eq!(s.read_mem(0, 16), [0; 16], "a duplicate is not placed");
    assert_eq!(s.hca.rq.len(), 1, "a duplicate consumes no receive");
    assert_eq!(s.engine.stats().duplicates, dups + 1);
}

#[test]
fn a_psn_gap_is_naked_once_until_the_expected_psn_arrives() {
    let mut s = Side::rc();
    s.post_recv(0, 64);
    s.post_recv(64, 64);
    let out = s.feed(request(Opcode::SendOnly, RQ_PSN + 2, true, &[1; 4]));
    assert!(naked(&out, RQ_PSN, NakCode::PsnSequenceError));
    assert!(
        s.feed(request(Opcode::SendOnly, RQ_PSN + 3, true, &[1; 4]))
            .is_empty()
    );
    assert_eq!(s.engine.stats().seq_naks, 1);
    assert!(s.take_cqes().is_empty());
    // The expected PSN arrives; a new gap gets its own NAK.
    assert!(acked(
        &s.feed(request(Opcode::SendOnly, RQ_PSN, true, &[2; 4])),
        RQ_PSN
    ));
    let out = s.feed(request(Opcode::SendOnly, RQ_PSN + 2, true, &[1; 4]));
    assert!(naked(&out, RQ_PSN + 1, NakCode::PsnSequenceError));
    assert_eq!(s.engine.stats().seq_naks, 2);
    assert_eq!(s.state(), QpState::Rts);
}

#[test]
fn no_receive_posted_is_an_rnr_nak_and_the_retry_succeeds() {
    let mut s = Side::rc();
    let pkt = request(Opcode::SendOnly, RQ_PSN, true, &[7; 8]);
    let out = s.feed(pkt.clone());
    assert_eq!(out.len(), 1);
    assert_eq!(
        syndrome(&out[0]),
        Some(AethSyndrome::RnrNak {
            timer: MIN_RNR_TIMER
        })
    );
    assert_eq!(out[0].hdr.bth.psn, RQ_PSN);
    assert_eq!(s.state(), QpState::Rts);
    s.post_recv(0, 64);
    assert!(acked(&s.feed(pkt), RQ_PSN));
    assert_eq!(s.take_cqes().len(), 1);
}

#[test]
fn a_send_longer_than_the_receive_is_an_invalid_request() {
    let mut s = Side::rc();
    s.post_recv(0, 8);
    let out = s.feed(request(Opcode::SendOnly, RQ_PSN, true, &[1; 16]));
    assert!(naked(&out, RQ_PSN, NakCode::InvalidRequest));
    let cqes = s.take_cqes();
    assert_eq!(cqes[0].wc.status, WcStatus::LocLenErr);
    assert_eq!(s.state(), QpState::Err);
    assert!(s.has_event(QpEventKind::RequestError));
}

#[test]
fn a_multi_packet_write_lands_at_its_offsets_without_a_receive() {
    let mut s = Side::rc();
    let data = pattern(2500, 6);
    let mut first = with_reth(&s, Opcode::WriteFirst, RQ_PSN, 100, 2500, &data[..MTU]);
    first.hdr.bth.ack_req = false;
    let out = s.burst(&[
        first,
        request(Opcode::WriteMiddle, RQ_PSN + 1, false, &data[MTU..2 * MTU]),
        request(Opcode::WriteLast, RQ_PSN + 2, true, &data[2 * MTU..]),
    ]);
    assert!(acked(&out, RQ_PSN + 2));
    assert_eq!(s.read_mem(100, 2500), data);
    assert!(s.take_cqes().is_empty());
}

#[test]
fn a_write_with_immediate_completes_a_receive() {
    let mut s = Side::rc();
    s.post_recv(0, 0);
    let mut pkt = with_reth(
        &s,
        Opcode::WriteOnlyWithImmediate,
        RQ_PSN,
        512,
        12,
        &[3; 12],
    );
    pkt.hdr.imm = Some(0xfeed);
    assert!(acked(&s.feed(pkt), RQ_PSN));
    let cqes = s.take_cqes();
    assert_eq!(cqes.len(), 1);
    assert_eq!(
        (cqes[0].wc.opcode, cqes[0].wc.byte_len, cqes[0].wc.imm_data),
        (WcOpcode::RecvRdmaWithImm, 12, 0xfeed)
    );
    assert!(cqes[0].wc.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!(s.read_mem(512, 12), [3; 12]);
}

#[test]
fn a_write_with_a_bad_rkey_is_a_remote_access_nak_and_errors_the_qp() {
    let mut s = Side::rc();
    let mut pkt = with_reth(&s, Opcode::WriteOnly, RQ_PSN, 0, 16, &[9; 16]);
    if let Some(r) = pkt.hdr.reth.as_mut() {
        r.rkey ^= 0xff00;
    }
    let out = s.feed(pkt);
    assert!(naked(&out, RQ_PSN, NakCode::RemoteAccessError));
    assert_eq!(s.state(), QpState::Err);
    assert!(s.has_event(QpEventKind::AccessError));
    assert_eq!(s.read_mem(0, 16), [0; 16]);
}

#[test]
fn a_read_request_is_answered_with_responses_at_consecutive_psns() {
    let mut s = Side::rc();
    let data = pattern(2500, 8);
    s.write_mem(0, &data);
    let read = with_reth(&s, Opcode::ReadRequest, RQ_PSN, 0, 2500, &[]);
    // The responses go out in the QP's next work turn (`tests/read.rs` has the details).
    assert!(s.feed(read.clone()).is_empty());
    let out = s.turn();
    assert_eq!(
        summary(&out),
        [
            (Opcode::ReadResponseFirst, RQ_PSN),
            (Opcode::ReadResponseMiddle, RQ_PSN + 1),
            (Opcode::ReadResponseLast, RQ_PSN + 2)
        ]
    );
    let aeth: Vec<bool> = out.iter().map(|p| p.hdr.aeth.is_some()).collect();
    assert_eq!(aeth, [true, false, true]);
    let mut got = Vec::new();
    for p in &out {
        got.extend(p.payload.to_vec().unwrap());
    }
    assert_eq!(got, data);
    // The READ used three PSNs: the next request is expected after them.
    s.post_recv(2048 + 1024, 64);
    assert!(acked(
        &s.feed(request(Opcode::SendOnly, RQ_PSN + 3, true, &[1])),
        RQ_PSN + 3
    ));
    // A duplicate READ is answered again from its saved resource.
    assert!(s.feed(read).is_empty());
    let out = s.turn();
    assert_eq!(out.len(), 3);
    assert_eq!(out[2].hdr.bth.psn, RQ_PSN + 2);
}

#[test]
fn atomics_return_the_original_value_and_a_duplicate_replays_it() {
    let mut s = Side::rc();
    s.write_mem(8, &10u64.to_ne_bytes());
    let fadd = atomic(&s, Opcode::FetchAdd, RQ_PSN, 8, 5, 0);
    let out = s.feed(fadd.clone());
    assert_eq!(summary(&out), [(Opcode::AtomicAcknowledge, RQ_PSN)]);
    assert_eq!(out[0].hdr.atomic_ack.map(|a| a.orig), Some(10));
    assert_eq!(read_u64(&s, 8), 15);
    let out = s.feed(atomic(&s, Opcode::CompareSwap, RQ_PSN + 1, 8, 99, 15));
    assert_eq!(out[0].hdr.atomic_ack.map(|a| a.orig), Some(15));
    assert_eq!(read_u64(&s, 8), 99);
    // The first one again: answered from the saved result, not executed a second time.
    let out = s.feed(fadd);
    assert_eq!(summary(&out), [(Opcode::AtomicAcknowledge, RQ_PSN)]);
    assert_eq!(out[0].hdr.atomic_ack.map(|a| a.orig), Some(10));
    assert_eq!(read_u64(&s, 8), 99);
}

#[test]
fn a_misaligned_atomic_is_an_invalid_request() {
    let mut s = Side::rc();
    let out = s.feed(atomic(&s, Opcode::FetchAdd, RQ_PSN, 4, 1, 0));
    assert!(naked(&out, RQ_PSN, NakCode::InvalidRequest));
    assert_eq!(s.state(), QpState::Err);
}

#[test]
fn ud_checks_the_q_key_and_prepends_the_grh_area() {
    let mut s = Side::with(Setup::of(QpType::Ud));
    s.post_recv(0, 200);
    let datagram = |qkey: u32| {
        let mut hdr = TransportHdr::new(bth(Opcode::UdSendOnly, 7, false));
        hdr.deth = Some(Deth { qkey, src_qp: 9 });
        from_peer(hdr, &pattern(20, 9))
    };
    let dropped = s.engine.stats().dropped;
    assert!(s.feed(datagram(QKEY ^ 1)).is_empty());
    assert!(s.take_cqes().is_empty(), "a wrong Q_Key is dropped");
    assert_eq!(s.engine.stats().dropped, dropped + 1);
    assert_eq!(s.engine.stats().bad_qkey, 1, "counted as a bad Q_Key");
    assert_eq!(s.engine.port_violations(1).bad_qkey, 1, "on the QP's port");
    assert_eq!(s.hca.rq.len(), 1, "and consumes no receive");
    assert!(s.feed(datagram(QKEY)).is_empty(), "UD is not acknowledged");
    let cqes = s.take_cqes();
    assert_eq!(cqes.len(), 1);
    assert_eq!(
        (cqes[0].wc.status, cqes[0].wc.byte_len, cqes[0].wc.src_qp),
        (WcStatus::Success, 60, 9)
    );
    assert!(cqes[0].wc.wc_flags.contains(WcFlags::GRH));
    assert_eq!(s.read_mem(40, 20), pattern(20, 9));
}

#[test]
fn uc_drops_the_rest_of_a_message_after_a_gap() {
    let mut s = Side::with(Setup::of(QpType::Uc));
    s.post_recv(0, 4096);
    let data = pattern(MTU + 4, 10);
    let out = s.burst(&[
        request(Opcode::UcSendFirst, RQ_PSN, false, &data[..MTU]),
        // RQ_PSN + 1 is lost.
        request(Opcode::UcSendLast, RQ_PSN + 2, false, &data[MTU..]),
    ]);
    assert!(out.is_empty(), "UC sends neither ACKs nor NAKs");
    assert!(s.take_cqes().is_empty());
    // The next message is received into the receive the broken one held.
    assert!(
        s.feed(request(Opcode::UcSendOnly, RQ_PSN + 3, false, &[5; 6]))
            .is_empty()
    );
    let cqes = s.take_cqes();
    assert_eq!(cqes.len(), 1);
    assert_eq!((cqes[0].wqe.index, cqes[0].wc.byte_len), (0, 6));
    assert_eq!(s.read_mem(0, 6), [5; 6]);
}

#[test]
fn the_first_request_in_rtr_reports_communication_established() {
    let mut setup = Setup::rc();
    setup.rtr_only = true;
    let mut s = Side::with(setup);
    s.post_recv(0, 64);
    assert!(acked(
        &s.feed(request(Opcode::SendOnly, RQ_PSN, true, &[1; 4])),
        RQ_PSN
    ));
    assert!(s.has_event(QpEventKind::CommEstablished));
    assert_eq!(s.state(), QpState::Rtr);
}

#[test]
fn a_packet_from_another_address_is_not_the_connections() {
    let mut s = Side::rc();
    s.post_recv(0, 64);
    // The QP's number, a PSN in order, but another sender's address.
    let mut spoofed = request(Opcode::SendOnly, RQ_PSN, true, &pattern(16, 1));
    spoofed.src_gid = portverbs_hal::types::Gid::from_ip("10.9.9.9".parse().unwrap());
    assert!(s.feed(spoofed).is_empty(), "no ACK or NAK for a stranger");
    assert!(s.take_cqes().is_empty());
    let stats = s.engine.stats();
    assert_eq!((stats.misaddressed, stats.dropped), (1, 1));
    // The same request from the path is taken: the stranger consumed nothing.
    let out = s.feed(request(Opcode::SendOnly, RQ_PSN, true, &pattern(16, 1)));
    assert_eq!(summary(&out), vec![(Opcode::Acknowledge, RQ_PSN)]);
    assert_eq!(s.take_cqes().len(), 1);
    assert_eq!(s.engine.stats().misaddressed, 1);
}

#[test]
fn duplicates_in_one_burst_are_re_acked_once() {
    let mut s = Side::rc();
    s.post_recv(0, 4096);
    let data = pattern(3 * MTU, 2);
    let pkts = [
        request(Opcode::SendFirst, RQ_PSN, false, &data[..MTU]),
        request(Opcode::SendMiddle, RQ_PSN + 1, false, &data[MTU..2 * MTU]),
        request(Opcode::SendLast, RQ_PSN + 2, true, &data[2 * MTU..]),
    ];
    assert!(acked(&s.burst(&pkts), RQ_PSN + 2));
    // The whole message again, twice (a go-back after a lost ACK, duplicated on the way):
    // one ACK says it all.
    let again: Vec<Packet> = pkts.iter().chain(&pkts).cloned().collect();
    let out = s.burst(&again);
    assert!(acked(&out, RQ_PSN + 2), "{:?}", summary(&out));
    assert_eq!(s.take_cqes().len(), 1);
}

//! Responses outside the requests in flight. A requester discards a response whose PSN is
//! outside its outstanding window (IBA 9.7; rxe's `check_psn` in
//! drivers/infiniband/sw/rxe/rxe_comp.c drops responses behind the completer's PSN): a stale or
//! forged ACK, NAK or reserved syndrome from the stale half of the 24-bit PSN space fails no
//! WQE, starts no RNR wait and costs no retry. The benign version of the same: a sequence or
//! RNR NAK duplicated by the network and delivered after the retransmission it asked for.

use portverbs_hal::attr::rnr_timer_ns;
use portverbs_hal::types::QpState;
use portverbs_hal::wc::WcStatus;
use portverbs_hal::wr::SendOp;

use super::super::Packet;
use super::super::packet::psn;
use super::harness::{
    Dir, MIN_RNR_TIMER, Pair, SQ_PSN, Setup, Side, ack, aeth, nak, pattern, summary, syndrome,
};
use crate::wire::{AethSyndrome, NakCode, Opcode};

/// PSNs behind `una`: just behind, a thousand behind, and 2^23 ahead (which the 24-bit
/// circle counts as behind).
fn stale(una: u32) -> [u32; 3] {
    [
        psn::add(una, psn::MASK),
        psn::add(una, psn::MASK - 999),
        psn::add(una, 1 << 23),
    ]
}

/// Completion statuses by WQE index, in delivery order.
fn statuses(s: &mut Side) -> Vec<(u16, WcStatus)> {
    s.take_cqes()
        .iter()
        .map(|c| (c.wqe.index, c.wc.status))
        .collect()
}

/// Four SENDs, the first two acknowledged: `una` is `SQ_PSN + 2`.
fn four_sends_two_acked() -> Side {
    let mut s = Side::rc();
    for _ in 0..4 {
        s.post(s.wqe(SendOp::Send, 0, 16));
    }
    s.feed(ack(SQ_PSN + 1));
    assert_eq!(
        statuses(&mut s),
        [(0, WcStatus::Success), (1, WcStatus::Success)]
    );
    s
}

/// Feeds each stale response; none may send anything. Then the rest of the transfer is
/// acknowledged and completes, with nothing retransmitted and no retry spent.
fn stale_responses_change_nothing(mut s: Side, responses: Vec<Packet>) {
    let before = s.engine.stats();
    let n = responses.len() as u64;
    for r in responses {
        let what = (r.hdr.bth.psn, syndrome(&r));
        let out = s.feed(r);
        assert!(out.is_empty(), "{what:x?}: {:?}", summary(&out));
        assert!(s.take_cqes().is_empty(), "{what:x?} completes nothing");
    }
    let after = s.engine.stats();
    assert_eq!(after.psn_out_of_window, before.psn_out_of_window + n);
    assert_eq!(after.dropped, before.dropped + n);
    assert_eq!(after.retransmits, before.retransmits);
    assert_eq!(s.retries_left(), (3, 3), "no retry spent");
    // Not waiting for an RNR delay: a new request goes out at once.
    let out = s.post(s.wqe(SendOp::Send, 0, 16));
    assert_eq!(summary(&out), [(Opcode::SendOnly, SQ_PSN + 4)]);
    s.feed(ack(SQ_PSN + 4));
    assert_eq!(
        statuses(&mut s),
        [
            (2, WcStatus::Success),
            (3, WcStatus::Success),
            (4, WcStatus::Success)
        ]
    );
    assert_eq!(s.state(), QpState::Rts);
}

#[test]
fn a_stale_sequence_nak_is_dropped_and_costs_no_retry() {
    let s = four_sends_two_acked();
    let naks = stale(SQ_PSN + 2)
        .into_iter()
        .map(|p| nak(p, NakCode::PsnSequenceError))
        .collect();
    stale_responses_change_nothing(s, naks);
}

#[test]
fn a_stale_rnr_nak_starts_no_rnr_wait() {
    let s = four_sends_two_acked();
    // Timer 31: the longest back-off (491.52 ms), which would stall the connection.
    let naks = stale(SQ_PSN + 2)
        .into_iter()
        .map(|p| aeth(p, AethSyndrome::RnrNak { timer: 31 }))
        .collect();
    stale_responses_change_nothing(s, naks);
}

#[test]
fn a_stale_remote_access_nak_fails_no_wqe() {
    for code in [
        NakCode::RemoteAccessError,
        NakCode::InvalidRequest,
        NakCode::RemoteOperationalError,
        NakCode::Unknown(0x1e),
    ] {
        let s = four_sends_two_acked();
        let naks = stale(SQ_PSN + 2)
            .into_iter()
            .map(|p| nak(p, code))
            .collect();
        stale_responses_change_nothing(s, naks);
    }
}

#[test]
fn a_stale_reserved_syndrome_fails_no_wqe() {
    let s = four_sends_two_acked();
    let mut naks = Vec::new();
    for (p, byte) in stale(SQ_PSN + 2).into_iter().zip([0x40, 0x9f, 0xff]) {
        naks.push(aeth(p, AethSyndrome::Reserved(byte)));
    }
    stale_responses_change_nothing(s, naks);
}

/// Posts SENDs of 16 distinct bytes from A's buffer slots `slots` to B; their packets wait in
/// flight.
fn send_slots(p: &mut Pair, slots: std::ops::Range<u64>) {
    for i in slots {
        p.a.write_mem(i * 64, &pattern(16, i as u8));
        let out = p.a.post(p.a.wqe(SendOp::Send, i * 64, 16));
        p.to_b.extend(out);
    }
}

/// B received slot `i`'s bytes into its receive `i`.
fn received(p: &Pair, slots: std::ops::Range<u64>) {
    for i in slots {
        assert_eq!(p.b.read_mem(i * 64, 16), pattern(16, i as u8), "slot {i}");
    }
}

#[test]
fn a_delayed_duplicate_sequence_nak_after_progress_costs_nothing() {
    let mut p = Pair::new(Setup::rc());
    for i in 0..6 {
        p.b.post_recv(i * 64, 64);
    }
    send_slots(&mut p, 0..4);
    // The second SEND is lost once: B NAKs the gap, A goes back and resends.
    let mut lost = false;
    let mut naks = Vec::new();
    p.settle(100, |dir, pkt| {
        if dir == Dir::AtoB && pkt.hdr.bth.psn == SQ_PSN + 1 && !lost {
            lost = true;
            return false;
        }
        if dir == Dir::BtoA && syndrome(pkt) == Some(AethSyndrome::Nak(NakCode::PsnSequenceError)) {
            naks.push(pkt.clone());
        }
        true
    });
    assert_eq!(naks.len(), 1, "one NAK for the gap");
    assert!(p.a.engine.stats().retransmits > 0);
    assert_eq!(p.a.take_cqes().len(), 4);
    // More traffic; then the network delivers the NAK again, long after it was acted on.
    send_slots(&mut p, 4..6);
    let retransmits = p.a.engine.stats().retransmits;
    let out = p.a.feed(naks[0].clone());
    assert!(out.is_empty(), "{:?}", summary(&out));
    assert_eq!(p.a.engine.stats().retransmits, retransmits);
    assert_eq!(p.a.retries_left(), (3, 3), "no retry spent");
    p.settle(100, |_, _| true);
    let cqes = p.a.take_cqes();
    assert_eq!(cqes.len(), 2);
    assert!(cqes.iter().all(|c| c.wc.status == WcStatus::Success));
    assert_eq!(p.a.state(), QpState::Rts);
    received(&p, 0..6);
}

#[test]
fn a_delayed_duplicate_rnr_nak_after_progress_costs_nothing() {
    let mut p = Pair::new(Setup::rc());
    send_slots(&mut p, 0..1);
    // No receive posted yet: B answers with an RNR NAK, A waits for the RNR timer.
    let mut naks = Vec::new();
    p.settle(100, |dir, pkt| {
        if dir == Dir::BtoA && matches!(syndrome(pkt), Some(AethSyndrome::RnrNak { .. })) {
            naks.push(pkt.clone());
        }
        true
    });
    assert_eq!(naks.len(), 1);
    for i in 0..3 {
        p.b.post_recv(i * 64, 64);
    }
    p.advance(rnr_timer_ns(MIN_RNR_TIMER));
    p.settle(100, |_, _| true);
    assert_eq!(p.a.take_cqes().len(), 1);
    // The RNR NAK again, after the retry it asked for succeeded.
    send_slots(&mut p, 1..2);
    let out = p.a.feed(naks[0].clone());
    assert!(out.is_empty(), "{:?}", summary(&out));
    assert_eq!(p.a.retries_left(), (3, 3), "no RNR retry spent");
    // No RNR wait either: the next SEND leaves at once.
    send_slots(&mut p, 2..3);
    assert_eq!(p.to_b.len(), 2, "{:?}", summary(&p.to_b));
    p.settle(100, |_, _| true);
    let cqes = p.a.take_cqes();
    assert_eq!(cqes.len(), 2);
    assert!(cqes.iter().all(|c| c.wc.status == WcStatus::Success));
    received(&p, 0..3);
}

fn target() -> portverbs_hal::wr::RemoteAddr {
    portverbs_hal::wr::RemoteAddr {
        addr: 0x9000,
        rkey: 0x77,
    }
}

/// A READ response from the peer for PSN `psn`.
fn read_response(opcode: Opcode, psn: u32, data: &[u8]) -> Packet {
    let mut hdr = crate::wire::TransportHdr::new(super::harness::bth(opcode, psn, false));
    if opcode != Opcode::ReadResponseMiddle {
        hdr.aeth = Some(crate::wire::Aeth {
            syndrome: AethSyndrome::ACK_UNLIMITED,
            msn: 0,
        });
    }
    super::harness::from_peer(hdr, data)
}

#[test]
fn a_nak_names_a_request_packet_or_it_is_dropped() {
    use super::harness::MTU;
    let mut s = Side::rc();
    // A READ of three responses (PSNs 100..103), a WRITE of two packets, a SEND.
    s.post(s.wqe(SendOp::RdmaRead { remote: target() }, 0, 3 * MTU as u32));
    s.post(s.wqe(SendOp::RdmaWrite { remote: target() }, 0, 2 * MTU as u32));
    s.post(s.wqe(SendOp::Send, 0, 16));
    let before = s.engine.stats();
    let bogus = [
        // PSNs the READ reserved for its responses: no request packet carries them.
        nak(SQ_PSN + 1, NakCode::PsnSequenceError),
        nak(SQ_PSN + 2, NakCode::RemoteAccessError),
        // A WRITE without immediate consumes no receive WQE: no RNR NAK for it.
        aeth(SQ_PSN + 3, AethSyndrome::RnrNak { timer: 31 }),
        // A READ asks for no receive either.
        aeth(SQ_PSN, AethSyndrome::RnrNak { timer: 31 }),
    ];
    for b in bogus {
        assert!(s.feed(b).is_empty());
    }
    let after = s.engine.stats();
    assert_eq!(after.psn_out_of_window, before.psn_out_of_window + 4);
    assert_eq!(s.retries_left(), (3, 3));
    assert!(s.take_cqes().is_empty());
    // The READ's request packet may be NAKed: it fails, the rest is flushed.
    s.feed(nak(SQ_PSN, NakCode::RemoteAccessError));
    assert_eq!(
        statuses(&mut s),
        [
            (0, WcStatus::RemAccessErr),
            (1, WcStatus::WrFlushErr),
            (2, WcStatus::WrFlushErr)
        ]
    );
}

#[test]
fn a_nak_naming_the_read_whose_responses_are_arriving_fails_it() {
    use super::harness::MTU;
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::RdmaRead { remote: target() }, 0, 3 * MTU as u32));
    let data = pattern(MTU, 1);
    s.feed(read_response(Opcode::ReadResponseFirst, SQ_PSN, &data));
    s.feed(read_response(Opcode::ReadResponseMiddle, SQ_PSN + 1, &data));
    // The responder lost the MR in the middle: it NAKs the READ request's PSN, now behind
    // `una`, which is still the READ's to answer.
    s.feed(nak(SQ_PSN, NakCode::RemoteAccessError));
    assert_eq!(statuses(&mut s), [(0, WcStatus::RemAccessErr)]);
    assert_eq!(s.state(), QpState::Err);
}

#[test]
fn an_error_nak_beyond_a_read_still_missing_its_responses_goes_back_to_the_read() {
    use super::harness::MTU;
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::RdmaRead { remote: target() }, 0, 2 * MTU as u32));
    s.post(s.wqe(SendOp::Send, 0, 16));
    // The SEND (PSN 102) is NAKed while the READ before it has none of its responses: they
    // were lost, or cut short by the responder's error. Go back to the READ, as rxe does.
    let out = s.feed(nak(SQ_PSN + 2, NakCode::RemoteOperationalError));
    assert_eq!(
        summary(&out),
        [
            (Opcode::ReadRequest, SQ_PSN),
            (Opcode::SendOnly, SQ_PSN + 2)
        ]
    );
    assert_eq!(s.retries_left(), (2, 3));
    assert!(s.take_cqes().is_empty());
    // The NAK again, once the READ is answered: now it fails the SEND.
    let data = pattern(MTU, 2);
    s.feed(read_response(Opcode::ReadResponseFirst, SQ_PSN, &data));
    s.feed(read_response(Opcode::ReadResponseLast, SQ_PSN + 1, &data));
    s.feed(nak(SQ_PSN + 2, NakCode::RemoteOperationalError));
    assert_eq!(
        statuses(&mut s),
        [(0, WcStatus::Success), (1, WcStatus::RemOpErr)]
    );
}

#[test]
fn rnr_naks_repeated_while_waiting_cost_one_rnr_retry_and_one_timer() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::Send, 0, 16));
    let timers = s.engine.core.timers.len();
    // The network duplicates the RNR NAK many times before the back-off ends.
    for _ in 0..100 {
        assert!(
            s.feed(aeth(SQ_PSN, AethSyndrome::RnrNak { timer: 31 }))
                .is_empty()
        );
    }
    assert_eq!(s.retries_left(), (3, 2), "one RNR retry spent");
    assert!(s.engine.core.timers.len() <= timers + 1, "one timer armed");
    assert!(s.take_cqes().is_empty());
    let out = s.advance_to(s.now + rnr_timer_ns(31));
    assert_eq!(summary(&out), [(Opcode::SendOnly, SQ_PSN)]);
}

//! The completer: in-order completion on ACKs, implicit acknowledgement by READ responses,
//! READ data and atomic results landing in the local buffer, NAK codes turned into completion
//! statuses, retry and RNR-retry exhaustion, flushing, and responses that are not ours.

use portverbs_hal::attr::ack_timeout_ns;
use portverbs_hal::types::QpState;
use portverbs_hal::wc::{WcOpcode, WcStatus};
use portverbs_hal::wr::{RemoteAddr, SendOp};

use super::super::Packet;
use super::harness::{
    MTU, SQ_PSN, Setup, Side, TIMEOUT, ack, aeth, bth, from_peer, nak, pattern, summary,
};
use crate::wire::{Aeth, AethSyndrome, AtomicAckEth, NakCode, Opcode, TransportHdr};

fn target() -> RemoteAddr {
    RemoteAddr {
        addr: 0x9000,
        rkey: 0x77,
    }
}

/// A READ response from the peer; FIRST, LAST and ONLY carry an AETH.
fn read_response(opcode: Opcode, psn: u32, data: &[u8]) -> Packet {
    let mut hdr = TransportHdr::new(bth(opcode, psn, false));
    if opcode != Opcode::ReadResponseMiddle {
        hdr.aeth = Some(Aeth {
            syndrome: AethSyndrome::ACK_UNLIMITED,
            msn: 0,
        });
    }
    from_peer(hdr, data)
}

/// Completion statuses by WQE index, in delivery order.
fn statuses(s: &mut Side) -> Vec<(u16, WcStatus)> {
    s.take_cqes()
        .iter()
        .map(|c| (c.wqe.index, c.wc.status))
        .collect()
}

#[test]
fn an_ack_completes_the_wqes_up_to_its_psn_in_order() {
    let mut s = Side::rc();
    for _ in 0..3 {
        s.post(s.wqe(SendOp::Send, 0, 16));
    }
    s.feed(ack(SQ_PSN + 1));
    assert_eq!(
        statuses(&mut s),
        [(0, WcStatus::Success), (1, WcStatus::Success)]
    );
    s.feed(ack(SQ_PSN + 2));
    let cqes = s.take_cqes();
    assert_eq!(cqes.len(), 1);
    assert_eq!(
        (
            cqes[0].wqe.index,
            cqes[0].wc.opcode,
            cqes[0].wc.byte_len,
            cqes[0].wqe.is_send
        ),
        (2, WcOpcode::Send, 16, true)
    );
}

#[test]
fn a_multi_packet_message_completes_only_when_its_last_psn_is_acked() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::RdmaWrite { remote: target() }, 0, 3 * MTU as u32));
    s.feed(ack(SQ_PSN + 1));
    assert!(s.take_cqes().is_empty());
    s.feed(ack(SQ_PSN + 2));
    let cqes = s.take_cqes();
    assert_eq!(cqes.len(), 1);
    assert_eq!(
        (cqes[0].wc.status, cqes[0].wc.opcode, cqes[0].wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaWrite, 3 * MTU as u32)
    );
}

#[test]
fn an_unsignaled_wqe_retires_silently_but_in_order() {
    let mut s = Side::rc();
    let mut quiet = s.wqe(SendOp::Send, 0, 16);
    quiet.signaled = false;
    s.post(quiet);
    s.post(s.wqe(SendOp::Send, 0, 16));
    s.feed(ack(SQ_PSN + 1));
    assert_eq!(statuses(&mut s), [(1, WcStatus::Success)]);
}

#[test]
fn a_read_response_implicitly_acknowledges_the_sends_before_it() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::Send, 0, 16));
    s.post(s.wqe(SendOp::RdmaRead { remote: target() }, 256, 8));
    // No ACK for the SEND ever arrives: the READ's response stands for it.
    s.feed(read_response(Opcode::ReadResponseOnly, SQ_PSN + 1, &[9; 8]));
    let cqes = s.take_cqes();
    let got: Vec<_> = cqes
        .iter()
        .map(|c| (c.wqe.index, c.wc.status, c.wc.opcode, c.wc.byte_len))
        .collect();
    assert_eq!(
        got,
        [
            (0, WcStatus::Success, WcOpcode::Send, 16),
            (1, WcStatus::Success, WcOpcode::RdmaRead, 8)
        ]
    );
    assert_eq!(s.read_mem(256, 8), [9; 8]);
}

#[test]
fn a_multi_packet_read_lands_in_order_and_completes_on_its_last_response() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::RdmaRead { remote: target() }, 0, 2500));
    let data = pattern(2500, 3);
    s.feed(read_response(
        Opcode::ReadResponseFirst,
        SQ_PSN,
        &data[..MTU],
    ));
    s.feed(read_response(
        Opcode::ReadResponseMiddle,
        SQ_PSN + 1,
        &data[MTU..2 * MTU],
    ));
    assert!(s.take_cqes().is_empty());
    s.feed(read_response(
        Opcode::ReadResponseLast,
        SQ_PSN + 2,
        &data[2 * MTU..],
    ));
    let cqes = s.take_cqes();
    assert_eq!(cqes.len(), 1);
    assert_eq!(
        (cqes[0].wc.status, cqes[0].wc.byte_len),
        (WcStatus::Success, 2500)
    );
    assert_eq!(s.read_mem(0, 2500), data);
}

#[test]
fn a_read_response_of_the_wrong_length_is_a_bad_response() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::RdmaRead { remote: target() }, 0, 8));
    s.feed(read_response(Opcode::ReadResponseOnly, SQ_PSN, &[1; 4]));
    assert_eq!(statuses(&mut s), [(0, WcStatus::BadRespErr)]);
    assert_eq!(s.state(), QpState::Err);
    assert_eq!(s.read_mem(0, 8), [0; 8], "nothing of a bad response lands");
}

#[test]
fn an_atomic_ack_delivers_the_original_value() {
    let mut s = Side::rc();
    s.post(s.wqe(
        SendOp::AtomicFetchAdd {
            remote: target(),
            add: 5,
        },
        64,
        8,
    ));
    let mut hdr = TransportHdr::new(bth(Opcode::AtomicAcknowledge, SQ_PSN, false));
    hdr.aeth = Some(Aeth {
        syndrome: AethSyndrome::ACK_UNLIMITED,
        msn: 1,
    });
    hdr.atomic_ack = Some(AtomicAckEth {
        orig: 0x0102_0304_0506_0708,
    });
    s.feed(from_peer(hdr, &[]));
    let cqes = s.take_cqes();
    assert_eq!(cqes.len(), 1);
    assert_eq!(
        (cqes[0].wc.status, cqes[0].wc.opcode, cqes[0].wc.byte_len),
        (WcStatus::Success, WcOpcode::FetchAdd, 8)
    );
    assert_eq!(s.read_mem(64, 8), 0x0102_0304_0506_0708u64.to_ne_bytes());
}

#[test]
fn nak_codes_become_the_matching_completion_status_and_flush_the_rest() {
    for (code, status) in [
        (NakCode::InvalidRequest, WcStatus::RemInvReqErr),
        (NakCode::RemoteAccessError, WcStatus::RemAccessErr),
        (NakCode::RemoteOperationalError, WcStatus::RemOpErr),
    ] {
        let mut s = Side::rc();
        for _ in 0..3 {
            s.post(s.wqe(SendOp::Send, 0, 16));
        }
        s.feed(nak(SQ_PSN + 1, code));
        assert_eq!(
            statuses(&mut s),
            [
                (0, WcStatus::Success),
                (1, status),
                (2, WcStatus::WrFlushErr)
            ],
            "{code:?}"
        );
        assert_eq!(s.state(), QpState::Err, "{code:?}");
        assert_eq!(s.hca.errors, [super::harness::QPN]);
    }
}

#[test]
fn retry_exhaustion_completes_with_retry_exc_err_and_flushes() {
    let mut setup = Setup::rc();
    setup.retry_cnt = 1;
    let mut s = Side::with(setup);
    s.post(s.wqe(SendOp::Send, 0, 16));
    s.post(s.wqe(SendOp::Send, 0, 16));
    let rto = ack_timeout_ns(TIMEOUT).unwrap();
    // One retry is allowed: the first timeout resends both packets.
    let at = s.now + rto;
    let out = s.advance_to(at);
    assert_eq!(
        summary(&out),
        [(Opcode::SendOnly, SQ_PSN), (Opcode::SendOnly, SQ_PSN + 1)]
    );
    assert!(s.take_cqes().is_empty());
    // The timer backs off after a timeout without progress: the second one comes after
    // twice the timeout, not once.
    let at = s.now + rto;
    assert!(s.advance_to(at).is_empty());
    assert!(s.take_cqes().is_empty(), "timed out before its back-off");
    let at = s.now + rto;
    assert!(s.advance_to(at).is_empty());
    assert_eq!(
        statuses(&mut s),
        [(0, WcStatus::RetryExcErr), (1, WcStatus::WrFlushErr)]
    );
    assert_eq!(s.state(), QpState::Err);
}

#[test]
fn rnr_retry_exhaustion_completes_with_rnr_retry_exc_err() {
    let mut setup = Setup::rc();
    setup.rnr_retry = 0;
    let mut s = Side::with(setup);
    s.post(s.wqe(SendOp::Send, 0, 16));
    let out = s.feed(aeth(SQ_PSN, AethSyndrome::RnrNak { timer: 1 }));
    assert!(out.is_empty());
    assert_eq!(statuses(&mut s), [(0, WcStatus::RnrRetryExcErr)]);
    assert_eq!(s.state(), QpState::Err);
}

#[test]
fn an_ack_beyond_what_was_sent_is_dropped() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::Send, 0, 16));
    let before = s.engine.stats();
    s.feed(ack(SQ_PSN + 1));
    assert!(s.take_cqes().is_empty());
    let after = s.engine.stats();
    assert_eq!(after.dropped, before.dropped + 1);
    assert_eq!(after.psn_out_of_window, before.psn_out_of_window + 1);
    // A stale ACK (before anything outstanding) changes nothing either.
    s.feed(ack(SQ_PSN - 1));
    assert!(s.take_cqes().is_empty());
    s.feed(ack(SQ_PSN));
    assert_eq!(statuses(&mut s), [(0, WcStatus::Success)]);
}

#[test]
fn posting_to_a_qp_in_error_flushes_at_once() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::Send, 0, 16));
    s.feed(nak(SQ_PSN, NakCode::RemoteAccessError));
    assert_eq!(statuses(&mut s), [(0, WcStatus::RemAccessErr)]);
    let out = s.post(s.wqe(SendOp::Send, 0, 16));
    assert!(out.is_empty());
    assert_eq!(statuses(&mut s), [(1, WcStatus::WrFlushErr)]);
}

#[test]
fn a_response_with_another_partitions_p_key_is_dropped_and_counted() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::Send, 0, 16));
    let mut forged = ack(SQ_PSN);
    forged.hdr.bth.pkey = 0x8001;
    s.feed(forged);
    assert!(
        s.take_cqes().is_empty(),
        "a foreign partition's ACK completes nothing"
    );
    assert_eq!(s.engine.stats().bad_pkey, 1);
    // Limited membership of the default partition (0x7fff) matches the port's full key.
    let mut limited = ack(SQ_PSN);
    limited.hdr.bth.pkey = 0x7fff;
    s.feed(limited);
    assert_eq!(statuses(&mut s), [(0, WcStatus::Success)]);
    assert_eq!(s.engine.stats().bad_pkey, 1);
    let v = s.engine.port_violations(1);
    assert_eq!(
        (v.bad_pkey, v.bad_qkey),
        (1, 0),
        "the port's P_Key violations"
    );
    assert_eq!(s.engine.port_violations(2), Default::default());
}

#[test]
fn a_wqe_failing_behind_an_atomic_still_waiting_lets_the_atomic_finish_first() {
    let mut setup = Setup::rc();
    setup.rnr_retry = 0;
    let mut s = Side::with(setup);
    s.post(s.wqe(
        SendOp::AtomicFetchAdd {
            remote: target(),
            add: 1,
        },
        64,
        8,
    ));
    s.post(s.wqe(SendOp::Send, 0, 16));
    // The atomic's ACK is lost; the SEND behind it runs out of RNR retries.
    s.feed(aeth(SQ_PSN + 1, AethSyndrome::RnrNak { timer: 1 }));
    assert!(s.take_cqes().is_empty(), "completions stay in order");
    // The retransmission timer still runs for the atomic, which is asked for again.
    let out = s.advance_to(s.now + ack_timeout_ns(TIMEOUT).unwrap());
    assert_eq!(summary(&out), [(Opcode::FetchAdd, SQ_PSN)]);
    let mut hdr = TransportHdr::new(bth(Opcode::AtomicAcknowledge, SQ_PSN, false));
    hdr.aeth = Some(Aeth {
        syndrome: AethSyndrome::ACK_UNLIMITED,
        msn: 1,
    });
    hdr.atomic_ack = Some(AtomicAckEth { orig: 41 });
    s.feed(from_peer(hdr, &[]));
    assert_eq!(
        statuses(&mut s),
        [(0, WcStatus::Success), (1, WcStatus::RnrRetryExcErr)]
    );
    assert_eq!(s.state(), QpState::Err);
}

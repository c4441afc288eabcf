//! Congestion control as one QP and its peer see it: the path's window bounds the packets in
//! flight and asks for the ACK that opens it again, ACKs grow it, a sequence NAK halves it
//! once per window, CE-marked packets draw CNPs at most once per interval, and a CNP slows the
//! path only when it comes from the QP's own peer.

use portverbs_hal::attr::{QpAttr, QpAttrMask};
use portverbs_hal::types::QpState;
use portverbs_hal::wr::SendOp;

use super::harness::*;
use crate::congestion::{ECN_CE, ECN_ECT0, ECN_MASK, PROBE_PACKETS};
use crate::wire::{Bth, NakCode, Opcode, TransportHdr};
use crate::{CcConfig, Packet, PayloadData};

fn side_with_window(window: u32) -> Side {
    let mut setup = Setup::rc();
    setup.cfg.cc = CcConfig {
        initial_window: window,
        min_window: 1,
        ..CcConfig::default()
    };
    Side::with(setup)
}

fn cwnd(s: &Side) -> u32 {
    let paths = s.engine.paths();
    assert_eq!(paths.len(), 1, "one path: {paths:?}");
    paths[0].cwnd
}

#[test]
fn the_window_bounds_packets_in_flight_and_its_last_packet_asks_for_the_ack() {
    let mut s = side_with_window(4);
    let mut out = Vec::new();
    for _ in 0..10 {
        out.extend(s.post(s.wqe(SendOp::Send, 0, 16)));
    }
    assert_eq!(
        summary(&out),
        (0..4)
            .map(|i| (Opcode::SendOnly, SQ_PSN + i))
            .collect::<Vec<_>>()
    );
    assert!(out.iter().all(|p| p.hdr.bth.ack_req));
    assert_eq!(s.engine.paths()[0].in_flight, 4);
    // Every packet leaves ECN-capable.
    assert!(out.iter().all(|p| p.traffic_class & ECN_MASK == ECN_ECT0));

    // Two acknowledged: slow start grows the window by two, so four more may go.
    let more = s.feed(ack(SQ_PSN + 1));
    assert_eq!(cwnd(&s), 6);
    assert_eq!(
        summary(&more),
        (4..8)
            .map(|i| (Opcode::SendOnly, SQ_PSN + i))
            .collect::<Vec<_>>()
    );
    assert_eq!(s.engine.paths()[0].in_flight, 6);
}

#[test]
fn a_multi_packet_message_under_a_small_window_still_gets_its_acks() {
    let mut s = side_with_window(2);
    // 8 KiB over a 1024-byte path MTU: eight packets, two at a time.
    let out = s.post(s.wqe(SendOp::Send, 0, 8192));
    assert_eq!(out.len(), 2);
    assert!(
        out[1].hdr.bth.ack_req,
        "the packet that fills the window must ask for its ACK"
    );
    let more = s.feed(ack(SQ_PSN + 1));
    assert_eq!(more.len(), 4, "slow start: two acknowledged, window 4");
    assert!(more[3].hdr.bth.ack_req);
}

#[test]
fn a_sequence_nak_halves_the_window_once_per_window() {
    let mut s = side_with_window(16);
    for _ in 0..16 {
        s.post(s.wqe(SendOp::Send, 0, 16));
    }
    assert_eq!(cwnd(&s), 16);
    // The responder lost PSN +4: it NAKs it, then (a duplicate of the NAK) again.
    // The NAK acknowledges the four before it (slow start: 20), then halves the window.
    s.feed(nak(SQ_PSN + 4, NakCode::PsnSequenceError));
    assert_eq!(cwnd(&s), 10, "halved on the loss");
    assert_eq!(s.engine.cc_stats().loss_cuts, 1);
    s.feed(ack(SQ_PSN + 5));
    s.feed(nak(SQ_PSN + 6, NakCode::PsnSequenceError));
    assert_eq!(
        s.engine.cc_stats().loss_cuts,
        1,
        "a second loss in the same window does not cut again"
    );
}

/// A request from the peer, marked Congestion Experienced on its way.
fn marked(psn: u32) -> Packet {
    let mut p = request(Opcode::SendOnly, psn, true, &[1, 2, 3, 4]);
    p.traffic_class = 0x20 | ECN_CE;
    p
}

#[test]
fn a_marked_packet_draws_one_cnp_per_interval_to_the_sending_qp() {
    let mut s = Side::rc();
    for i in 0..3u64 {
        s.post_recv(i * 64, 64);
    }
    let out = s.feed(marked(RQ_PSN));
    let cnps: Vec<_> = out
        .iter()
        .filter(|p| p.hdr.bth.opcode == Opcode::Cnp)
        .collect();
    assert_eq!(cnps.len(), 1, "{:?}", summary(&out));
    let cnp = cnps[0];
    assert_eq!(cnp.hdr.bth.dest_qp, PEER_QPN);
    assert!(cnp.hdr.bth.becn);
    assert_eq!(cnp.dst_gid, ack(0).src_gid, "to the peer");
    assert_eq!(cnp.traffic_class & ECN_MASK, 0, "a CNP is not ECN-capable");
    // The CNP is whole on the wire: BTH, 16 reserved bytes, ICRC.
    let mut frame = Vec::new();
    cnp.to_frame(&mut frame).unwrap();
    let back = Packet::from_frame(&frame).unwrap().unwrap();
    assert_eq!(back.hdr.bth.opcode, Opcode::Cnp);

    // A second mark within the interval: no second CNP.
    let out = s.feed(marked(RQ_PSN + 1));
    assert!(out.iter().all(|p| p.hdr.bth.opcode != Opcode::Cnp));
    // After the interval, another.
    s.now += CcConfig::default().cnp_interval_ns;
    let out = s.feed(marked(RQ_PSN + 2));
    assert_eq!(
        out.iter()
            .filter(|p| p.hdr.bth.opcode == Opcode::Cnp)
            .count(),
        1
    );
    let st = s.engine.cc_stats();
    assert_eq!((st.ce_received, st.cnps_sent), (3, 2));
}

fn cnp_from(src: Packet) -> Packet {
    let hdr = TransportHdr::new(Bth {
        becn: true,
        ..bth(Opcode::Cnp, 0, false)
    });
    Packet::new(src.src_gid, src.dst_gid, hdr, PayloadData::Empty)
}

#[test]
fn a_cnp_from_the_peer_cuts_the_window_and_a_spoofed_one_is_dropped() {
    let mut s = side_with_window(64);
    for _ in 0..4 {
        s.post(s.wqe(SendOp::Send, 0, 16));
    }
    // A CNP from an address that is not the QP's peer: dropped, nothing slows down.
    let mut spoofed = cnp_from(ack(0));
    spoofed.src_gid.0[15] = 99;
    s.feed(spoofed);
    assert_eq!(cwnd(&s), 64);
    assert_eq!(s.engine.stats().misaddressed, 1);

    s.feed(cnp_from(ack(0)));
    let after = cwnd(&s);
    assert!((32..64).contains(&after), "cut by alpha / 2: {after}");
    let st = s.engine.cc_stats();
    assert_eq!((st.cnps_received, st.cnp_cuts), (1, 1));
    // The same window: a second CNP is counted, not cut on.
    s.feed(cnp_from(ack(0)));
    assert_eq!(cwnd(&s), after);
}

#[test]
fn a_lost_tail_is_probed_before_the_local_ack_timeout_without_charging_a_retry() {
    // Window 1 and a lost packet, which no later packet would make the responder NAK.
    let mut s = side_with_window(1);
    let first = s.post(s.wqe(SendOp::Send, 0, 16));
    assert_eq!(summary(&first), [(Opcode::SendOnly, SQ_PSN)]);
    assert!(s.post(s.wqe(SendOp::Send, 0, 16)).is_empty());
    let retries = s.retries_left();
    // The path has no round trip yet: the initial probe timeout, far below the local ACK
    // timeout, goes back N.
    let pto = CcConfig::default().initial_pto_ns;
    let rto = portverbs_hal::attr::ack_timeout_ns(TIMEOUT).unwrap();
    assert!(pto < rto);
    let at = s.now + pto;
    let again = s.advance_to(at);
    assert_eq!(summary(&again), [(Opcode::SendOnly, SQ_PSN)]);
    assert_eq!(s.engine.cc_stats().probe_timeouts, 1);
    assert_eq!(s.engine.stats().timeouts, 0);
    assert_eq!(s.retries_left(), retries, "a probe costs no retry");
    // The next probe waits twice as long.
    assert!(s.advance_to(at + pto).is_empty());
    // Answered: the second goes, and both complete.
    let next = s.feed(ack(SQ_PSN));
    assert_eq!(summary(&next), [(Opcode::SendOnly, SQ_PSN + 1)]);
    s.feed(ack(SQ_PSN + 1));
    assert_eq!(s.take_cqes().len(), 2);
}

#[test]
fn a_peer_that_answers_nothing_is_probed_less_and_less_then_left_to_the_ack_timeout() {
    let mut s = side_with_window(4);
    s.post(s.wqe(SendOp::Send, 0, 16));
    let rto = portverbs_hal::attr::ack_timeout_ns(TIMEOUT).unwrap();
    let mut probes = Vec::new();
    let start = s.now;
    while s.now < start + rto {
        let next = s.engine.poll_timeout().unwrap();
        let before = s.engine.cc_stats().probe_timeouts;
        s.advance_to(next);
        if s.engine.cc_stats().probe_timeouts > before {
            probes.push(next - start);
        }
    }
    assert_eq!(
        s.engine.stats().timeouts,
        1,
        "the local ACK timeout still fires"
    );
    let gaps: Vec<u64> = probes.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.windows(2).all(|g| g[1] == 2 * g[0]),
        "each probe waits twice as long as the one before: {probes:?}"
    );
    assert!(probes.iter().all(|&p| p < rto));
    assert!(
        probes.len() < 16,
        "probes stop once they reach the ACK timeout: {}",
        probes.len()
    );
}

#[test]
fn a_late_ack_past_a_probes_go_back_moves_transmission_up_instead_of_resending() {
    let mut s = side_with_window(4);
    s.post_recv(0, 64);
    let first = s.post(s.wqe(SendOp::Send, 0, 4096));
    assert_eq!(first.len(), 4);
    // No ACK within the probe timeout: back to the first PSN, under a halved window.
    let again = s.advance_to(s.now + CcConfig::default().initial_pto_ns);
    assert_eq!(summary(&again)[0], (Opcode::SendFirst, SQ_PSN));
    assert_eq!(again.len(), 2);
    // The original packets were only late: an ACK covers three of them, past where the
    // go-back got to.
    let after = s.feed(ack(SQ_PSN + 2));
    assert_eq!(
        summary(&after),
        [(Opcode::SendLast, SQ_PSN + 3)],
        "nothing acknowledged is sent again"
    );
    s.feed(ack(SQ_PSN + 3));
    assert_eq!(s.take_cqes().len(), 1);
    let next = s.post(s.wqe(SendOp::Send, 0, 16));
    assert_eq!(summary(&next), [(Opcode::SendOnly, SQ_PSN + 4)]);
}

#[test]
fn timeouts_in_a_row_keep_halving_the_window_with_no_ack_between() {
    // A burst bigger than the path's queue, dropped whole every time: without ACKs the
    // once-per-round-trip rule must not keep the window from shrinking to what fits.
    let mut s = side_with_window(16);
    for _ in 0..16 {
        s.post(s.wqe(SendOp::Send, 0, 16));
    }
    let mut windows = vec![cwnd(&s)];
    for _ in 0..3 {
        let next = s.engine.poll_timeout().unwrap();
        let probes = s.engine.cc_stats().probe_timeouts;
        let resent = s.advance_to(next);
        windows.push(cwnd(&s));
        assert_eq!(s.engine.cc_stats().probe_timeouts, probes + 1);
        assert_eq!(
            resent.len() as u32,
            cwnd(&s).min(PROBE_PACKETS),
            "a probe's go-back sends what the window holds, two packets at most"
        );
    }
    assert_eq!(windows, [16, 8, 4, 2]);
}

/// A QP whose path's window is `window` packets sends one SEND of `kib` KiB (a packet per KiB)
/// and hears nothing within the probe timeout: the side, and what the probe sent.
fn probed(window: u32, kib: u32) -> (Side, Vec<Packet>) {
    let mut s = side_with_window(window);
    s.post_recv(0, 64);
    let first = s.post(s.wqe(SendOp::Send, 0, kib * 1024));
    assert_eq!(first.len() as u32, kib.min(window));
    let again = s.advance_to(s.now + CcConfig::default().initial_pto_ns);
    (s, again)
}

#[test]
fn a_probe_sends_two_packets_again_and_the_answer_resumes_the_go_back() {
    // No answer within the probe timeout: the go-back starts at the first PSN, two packets,
    // the second asking for an ACK; the window (halved to 8) waits for the answer.
    let (mut s, again) = probed(16, 16);
    assert_eq!(
        summary(&again),
        [
            (Opcode::SendFirst, SQ_PSN),
            (Opcode::SendMiddle, SQ_PSN + 1)
        ]
    );
    assert!(again[1].hdr.bth.ack_req && !again[0].hdr.bth.ack_req);
    assert_eq!(cwnd(&s), 8);
    assert!(
        s.advance_to(s.now).is_empty(),
        "nothing more before the answer"
    );
    // The responder had lost everything: it takes the two and acknowledges them, and the
    // go-back goes on with the window.
    let resumed = s.feed(ack(SQ_PSN + 1));
    assert_eq!(resumed.len(), 8);
    assert_eq!(summary(&resumed)[0], (Opcode::SendMiddle, SQ_PSN + 2));
}

#[test]
fn a_reset_ends_a_probe_under_way() {
    let (mut s, again) = probed(16, 16);
    assert_eq!(again.len(), PROBE_PACKETS as usize);
    // No answer, and the QP is reset and connected again: it sends with a fresh window, not
    // two packets for a probe of the connection before.
    let (attr, mask) = (s.attr, s.mask);
    s.modify(QpState::Reset, &attr, QpAttrMask::empty())
        .unwrap();
    let attr = QpAttr { sq_psn: 7, ..attr };
    for st in [QpState::Init, QpState::Rtr, QpState::Rts] {
        s.modify(st, &attr, mask).unwrap();
    }
    let out = s.post(s.wqe(SendOp::Send, 0, 16 * 1024));
    assert_eq!(out.len(), 16);
    assert_eq!(summary(&out)[0], (Opcode::SendFirst, 7));
}

#[test]
fn a_probe_to_a_responder_that_has_everything_costs_two_duplicates() {
    // A slow responder, not a lost tail: its ACK of the whole message answers the probe.
    let (mut s, again) = probed(64, 64);
    assert_eq!(again.len(), PROBE_PACKETS as usize);
    let after = s.feed(ack(SQ_PSN + 63));
    assert!(after.is_empty(), "nothing acknowledged is sent again");
    assert_eq!(s.take_cqes().len(), 1);
    assert_eq!(s.engine.stats().retransmits, 2);
}

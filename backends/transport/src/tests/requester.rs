//! The requester: segmentation into MTU-sized packets with consecutive PSNs, AckReq, the
//! READ/atomic depth, the fence, the PSN window, go-back-N on a sequence NAK, the RNR and
//! retransmission timers, UD datagrams, and local checks before anything goes out.

use portverbs_hal::attr::{AddressVector, ack_timeout_ns, rnr_timer_ns};
use portverbs_hal::types::{AccessFlags, MwType, QpState, QpType};
use portverbs_hal::wc::WcStatus;
use portverbs_hal::wr::{MwBind, RemoteAddr, SendFlags, SendOp, SendOps};

use super::super::{EngineConfig, Packet, UdTarget};
use super::harness::{
    MTU, PEER_QPN, QKEY, QPN, SQ_PSN, Setup, Side, TIMEOUT, ack, aeth, from_peer, nak, pattern,
    summary,
};
use crate::wire::{Aeth, AethSyndrome, NakCode, Opcode, TransportHdr};

fn target() -> RemoteAddr {
    RemoteAddr {
        addr: 0x9000,
        rkey: 0x77,
    }
}

/// An 8-byte RDMA READ response ONLY for PSN `psn`.
fn read_response_only(psn: u32, data: &[u8]) -> Packet {
    let mut hdr = TransportHdr::new(super::harness::bth(Opcode::ReadResponseOnly, psn, false));
    hdr.aeth = Some(Aeth {
        syndrome: AethSyndrome::ACK_UNLIMITED,
        msn: 0,
    });
    from_peer(hdr, data)
}

#[test]
fn write_of_three_mtus_is_first_middle_last_with_consecutive_psns() {
    let mut s = Side::rc();
    let data = pattern(3 * MTU, 7);
    s.write_mem(0, &data);
    let out = s.post(s.wqe(SendOp::RdmaWrite { remote: target() }, 0, 3 * MTU as u32));
    assert_eq!(
        summary(&out),
        [
            (Opcode::WriteFirst, SQ_PSN),
            (Opcode::WriteMiddle, SQ_PSN + 1),
            (Opcode::WriteLast, SQ_PSN + 2)
        ]
    );
    // AckReq on the last packet of the message only.
    let ack_req: Vec<bool> = out.iter().map(|p| p.hdr.bth.ack_req).collect();
    assert_eq!(ack_req, [false, false, true]);
    // The RETH travels in the first packet, for the whole message.
    let reth = out[0].hdr.reth.expect("RETH on WRITE FIRST");
    assert_eq!(
        (reth.va, reth.rkey, reth.dma_len),
        (0x9000, 0x77, 3 * MTU as u32)
    );
    assert!(out[1].hdr.reth.is_none() && out[2].hdr.reth.is_none());
    let mut sent = Vec::new();
    for p in &out {
        assert_eq!(p.hdr.bth.dest_qp, PEER_QPN);
        assert_eq!(p.payload.len(), MTU);
        sent.extend(p.payload.to_vec().unwrap());
    }
    assert_eq!(sent, data);
}

#[test]
fn send_with_immediate_carries_imm_solicited_and_pad_on_its_last_packet() {
    let mut s = Side::rc();
    let mut wqe = s.wqe(SendOp::SendWithImm { imm: 0xabcd }, 0, MTU as u32 + 6);
    wqe.flags = SendFlags::SOLICITED;
    let out = s.post(wqe);
    assert_eq!(
        summary(&out),
        [
            (Opcode::SendFirst, SQ_PSN),
            (Opcode::SendLastWithImmediate, SQ_PSN + 1)
        ]
    );
    assert_eq!(out[0].hdr.imm, None);
    assert!(!out[0].hdr.bth.solicited);
    assert_eq!(out[0].hdr.bth.pad_count, 0);
    assert_eq!(out[1].hdr.imm, Some(0xabcd));
    assert!(out[1].hdr.bth.solicited);
    assert_eq!(out[1].payload.len(), 6);
    assert_eq!(out[1].hdr.bth.pad_count, 2);
}

#[test]
fn ack_req_is_set_every_ack_req_every_packets_and_on_the_last() {
    let mut setup = Setup::rc();
    setup.cfg = EngineConfig {
        ack_req_every: 4,
        ..EngineConfig::default()
    };
    let mut s = Side::with(setup);
    let out = s.post(s.wqe(SendOp::Send, 0, 6 * MTU as u32));
    let ack_req: Vec<bool> = out.iter().map(|p| p.hdr.bth.ack_req).collect();
    assert_eq!(ack_req, [false, false, false, true, false, true]);
}

#[test]
fn a_read_takes_one_psn_per_response_packet() {
    let mut s = Side::rc();
    let out = s.post(s.wqe(SendOp::RdmaRead { remote: target() }, 0, 2500));
    assert_eq!(summary(&out), [(Opcode::ReadRequest, SQ_PSN)]);
    assert!(out[0].hdr.bth.ack_req);
    assert_eq!(out[0].hdr.reth.map(|r| r.dma_len), Some(2500));
    // 2500 bytes come back in three responses: the next request starts three PSNs later.
    let out = s.post(s.wqe(SendOp::Send, 0, 10));
    assert_eq!(summary(&out), [(Opcode::SendOnly, SQ_PSN + 3)]);
}

#[test]
fn max_rd_atomic_bounds_the_reads_in_flight() {
    let mut setup = Setup::rc();
    setup.max_rd_atomic = 2;
    let mut s = Side::with(setup);
    let mut out = Vec::new();
    for i in 0..3 {
        out.extend(s.post(s.wqe(SendOp::RdmaRead { remote: target() }, 8 * i, 8)));
    }
    assert_eq!(
        summary(&out),
        [
            (Opcode::ReadRequest, SQ_PSN),
            (Opcode::ReadRequest, SQ_PSN + 1)
        ]
    );
    // The first READ completes: its responder resource is free, the third goes out.
    let out = s.feed(read_response_only(SQ_PSN, &[1; 8]));
    assert_eq!(summary(&out), [(Opcode::ReadRequest, SQ_PSN + 2)]);
    assert_eq!(s.read_mem(0, 8), [1; 8]);
}

#[test]
fn a_fenced_wqe_waits_for_the_read_before_it() {
    let mut s = Side::rc();
    let out = s.post(s.wqe(SendOp::RdmaRead { remote: target() }, 0, 8));
    assert_eq!(out.len(), 1);
    let mut fenced = s.wqe(SendOp::Send, 64, 4);
    fenced.flags = SendFlags::FENCE;
    assert!(s.post(fenced).is_empty(), "the fence holds the SEND back");
    let out = s.feed(read_response_only(SQ_PSN, &[2; 8]));
    assert_eq!(summary(&out), [(Opcode::SendOnly, SQ_PSN + 1)]);
}

#[test]
fn the_psn_window_bounds_the_packets_in_flight() {
    let mut setup = Setup::rc();
    setup.cfg = EngineConfig {
        psn_window: 4,
        ..EngineConfig::default()
    };
    let mut s = Side::with(setup);
    let mut out = Vec::new();
    for _ in 0..6 {
        out.extend(s.post(s.wqe(SendOp::Send, 0, 4)));
    }
    let psns: Vec<u32> = out.iter().map(|p| p.hdr.bth.psn).collect();
    assert_eq!(psns, [SQ_PSN, SQ_PSN + 1, SQ_PSN + 2, SQ_PSN + 3]);
    let out = s.feed(ack(SQ_PSN + 1));
    assert_eq!(
        summary(&out),
        [
            (Opcode::SendOnly, SQ_PSN + 4),
            (Opcode::SendOnly, SQ_PSN + 5)
        ]
    );
}

#[test]
fn a_sequence_nak_retransmits_from_the_naked_psn_once() {
    let mut s = Side::rc();
    for _ in 0..3 {
        s.post(s.wqe(SendOp::Send, 0, 16));
    }
    let before = s.engine.stats();
    let out = s.feed(nak(SQ_PSN + 1, NakCode::PsnSequenceError));
    // The NAK acknowledges everything before its PSN and asks for the rest again.
    assert_eq!(
        summary(&out),
        [
            (Opcode::SendOnly, SQ_PSN + 1),
            (Opcode::SendOnly, SQ_PSN + 2)
        ]
    );
    let cqes = s.take_cqes();
    assert_eq!(cqes.len(), 1);
    assert_eq!(
        (cqes[0].wqe.index, cqes[0].wc.status),
        (0, WcStatus::Success)
    );
    assert_eq!(s.engine.stats().retransmits, before.retransmits + 2);
    // The same NAK again (a duplicate from the network) costs neither a retry nor packets.
    let out = s.feed(nak(SQ_PSN + 1, NakCode::PsnSequenceError));
    assert!(out.is_empty());
    assert_eq!(s.engine.stats().duplicates, before.duplicates + 1);
    assert_eq!(s.engine.stats().retransmits, before.retransmits + 2);
}

#[test]
fn an_rnr_nak_waits_for_the_rnr_timer_then_resends() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::Send, 0, 16));
    let timer = 5;
    let out = s.feed(aeth(SQ_PSN, AethSyndrome::RnrNak { timer }));
    assert!(out.is_empty(), "nothing is resent before the RNR delay");
    let due = s.now + rnr_timer_ns(timer);
    assert_eq!(s.engine.poll_timeout(), Some(due));
    assert!(s.advance_to(due - 1).is_empty());
    let out = s.advance_to(due);
    assert_eq!(summary(&out), [(Opcode::SendOnly, SQ_PSN)]);
    assert!(s.take_cqes().is_empty());
}

#[test]
fn the_local_ack_timeout_retransmits_from_the_oldest_unacknowledged_psn() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::Send, 0, 16));
    s.post(s.wqe(SendOp::Send, 0, 16));
    s.feed(ack(SQ_PSN));
    let due = s.now + ack_timeout_ns(TIMEOUT).unwrap();
    assert!(s.advance_to(due - 1).is_empty());
    let out = s.advance_to(due);
    assert_eq!(summary(&out), [(Opcode::SendOnly, SQ_PSN + 1)]);
    assert_eq!(s.engine.stats().timeouts, 1);
}

#[test]
fn a_ud_send_carries_a_deth_and_completes_at_once() {
    let mut s = Side::with(Setup::of(QpType::Ud));
    let mut wqe = s.wqe(SendOp::Send, 0, 100);
    wqe.ud = Some(UdTarget {
        av: AddressVector::default(),
        remote_qpn: 77,
        remote_qkey: 0x8000_0000,
    });
    let out = s.post(wqe.clone());
    assert_eq!(summary(&out), [(Opcode::UdSendOnly, SQ_PSN)]);
    assert_eq!(out[0].hdr.bth.dest_qp, 77);
    // Bit 31 of the WQE's Q_Key: the QP's own Q_Key is sent.
    let deth = out[0].hdr.deth.expect("DETH");
    assert_eq!((deth.qkey, deth.src_qp), (QKEY, QPN));
    assert!(!out[0].hdr.bth.ack_req);
    wqe.ud = Some(UdTarget {
        remote_qkey: 0x42,
        ..wqe.ud.unwrap()
    });
    let out = s.post(wqe);
    assert_eq!(out[0].hdr.deth.map(|d| d.qkey), Some(0x42));
    assert_eq!(out[0].hdr.bth.psn, SQ_PSN + 1);
    let cqes = s.take_cqes();
    assert_eq!(cqes.len(), 2);
    assert!(
        cqes.iter()
            .all(|c| c.wc.status == WcStatus::Success && c.wc.byte_len == 100)
    );
}

/// A UD send completes when its packet leaves; the application may rewrite the buffer at
/// once, before the fabric delivers the packet, which must still carry the bytes that were
/// in the buffer when it was sent (the CM's QP1 send slots are reused this way).
#[test]
fn a_ud_packet_keeps_its_bytes_when_the_buffer_is_reused_after_completion() {
    let mut s = Side::with(Setup::of(QpType::Ud));
    let sent = pattern(100, 3);
    s.write_mem(0, &sent);
    let mut wqe = s.wqe(SendOp::Send, 0, 100);
    wqe.ud = Some(UdTarget {
        av: AddressVector::default(),
        remote_qpn: 77,
        remote_qkey: 0x42,
    });
    let out = s.post(wqe);
    assert_eq!(s.take_cqes().len(), 1);
    s.write_mem(0, &pattern(100, 9));
    let mut got = vec![0u8; 100];
    out[0].payload.read(0, &mut got).unwrap();
    assert_eq!(got, sent);
}

#[test]
fn a_bad_lkey_fails_locally_without_a_packet_and_errors_the_qp() {
    let mut s = Side::rc();
    let mut wqe = s.wqe(SendOp::Send, 0, 16);
    wqe.sges[0].lkey ^= 0xff00;
    let out = s.post(wqe);
    assert!(out.is_empty());
    let cqes = s.take_cqes();
    assert_eq!(cqes.len(), 1);
    assert_eq!(cqes[0].wc.status, WcStatus::LocProtErr);
    assert_eq!(s.state(), QpState::Err);
}

/// The operations hal's transport table leaves out of UC and UD complete with
/// `LOC_QP_OP_ERR`, without a packet.
#[test]
fn an_operation_the_transport_lacks_fails_locally_with_loc_qp_op_err() {
    let bind = MwBind {
        new_rkey: 2,
        mw_type: MwType::Type2,
        mr_lkey: 3,
        addr: 0,
        length: 8,
        access: AccessFlags::REMOTE_WRITE,
    };
    let mut refused = 0;
    for t in [QpType::Uc, QpType::Ud] {
        let allowed = SendOps::of_transport(t);
        for op in SendOp::one_of_each(target(), bind) {
            if allowed.contains(op.kind()) {
                continue;
            }
            let mut s = Side::with(Setup::of(t));
            let mut wqe = s.wqe(op, 0, 8);
            if t == QpType::Ud {
                wqe.ud = Some(UdTarget {
                    av: AddressVector::default(),
                    remote_qpn: 77,
                    remote_qkey: 0x42,
                });
            }
            assert!(s.post(wqe).is_empty(), "{t:?} {op:?}");
            let cqes = s.take_cqes();
            assert_eq!(cqes.len(), 1, "{t:?} {op:?}");
            assert_eq!(cqes[0].wc.status, WcStatus::LocQpOpErr, "{t:?} {op:?}");
            refused += 1;
        }
    }
    // UC lacks SEND with invalidate, READ and the two atomics; UD lacks all but the sends.
    assert_eq!(refused, 4 + 8);
}

#[test]
fn an_ack_covering_wqes_the_go_back_has_not_reached_again_completes_them() {
    let mut setup = Setup::rc();
    setup.cfg = EngineConfig {
        burst: 2,
        ..setup.cfg
    };
    let mut s = Side::with(setup);
    for _ in 0..4 {
        s.post(s.wqe(SendOp::Send, 0, 16));
    }
    while s.engine.has_work() {
        s.turn();
    }
    // The ACK is late: the timeout goes back to the first SEND and resends a burst of two.
    let out = s.advance_to(s.now + ack_timeout_ns(TIMEOUT).unwrap());
    assert_eq!(
        summary(&out),
        [(Opcode::SendOnly, SQ_PSN), (Opcode::SendOnly, SQ_PSN + 1)]
    );
    // Then it arrives, covering all four, two of which the go-back has not resent yet.
    s.feed(ack(SQ_PSN + 3));
    let cqes = s.take_cqes();
    assert_eq!(cqes.len(), 4, "{cqes:?}");
    assert!(cqes.iter().all(|c| c.wc.status == WcStatus::Success));
    while s.engine.has_work() {
        assert!(s.turn().is_empty(), "nothing acknowledged is resent");
    }
    // The next message gets the next PSN.
    let out = s.post(s.wqe(SendOp::Send, 0, 16));
    assert_eq!(summary(&out), [(Opcode::SendOnly, SQ_PSN + 4)]);
}

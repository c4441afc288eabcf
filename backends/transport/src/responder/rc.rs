//! RC requests in PSN order: the PSN check (one sequence NAK per gap, duplicates handed to
//! `duplicate.rs`), the opcode sequence, and the receive side of SEND and RDMA WRITE.

use portverbs_hal::types::QpState;
use portverbs_hal::wc::{WcOpcode, WcStatus};

use super::super::Core;
use super::super::hca::Hca;
use super::super::modify::set_state;
use super::super::packet::{Packet, psn};
use super::super::qp::{InMsg, QpCtx};
use super::ack::{accept, access_error, nak_fatal, rnr, send_aeth, send_or_hold};
use super::atomic::atomic;
use super::duplicate::duplicate;
use super::read::read_request;
use super::recv::{complete_recv, scatter_recv, take_recv};
use super::write::{open_write, place_write};
use super::{ends, length_ok, sequence_ok};
use crate::wire::{AethSyndrome, NakCode, OpKind, Position};

#[inline]
pub(super) fn on_rc<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    pkt: &Packet,
    out: &mut Vec<Packet>,
) {
    let p = pkt.hdr.bth.psn;
    let d = psn::diff(p, qp.resp.epsn);
    if d > 0 {
        if !qp.resp.nak_sent {
            qp.resp.nak_sent = true;
            core.stats.seq_naks += 1;
            let epsn = qp.resp.epsn;
            send_or_hold(
                qp,
                core,
                out,
                epsn,
                AethSyndrome::Nak(NakCode::PsnSequenceError),
            );
        }
        return;
    }
    if d < 0 {
        if pkt.train > 1 {
            // A retransmitted train may reach past what was received: take it apart.
            for part in pkt.clone().split() {
                on_rc(qp, core, hca, &part, out);
            }
            return;
        }
        core.stats.duplicates += 1;
        duplicate(qp, core, pkt, out);
        return;
    }
    qp.resp.nak_sent = false;
    // A NAK held back for this PSN asked for what just arrived.
    qp.resp.held_nak = None;
    let op = pkt.hdr.bth.opcode;
    if !sequence_ok(qp, op) {
        nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest);
        return;
    }
    // One look at the opcode's family instead of a test per family.
    match op.kind() {
        Some(OpKind::ReadRequest) => read_request(qp, core, hca, pkt, out),
        Some(OpKind::CompareSwap | OpKind::FetchAdd) => atomic(qp, core, hca, pkt, out),
        Some(OpKind::Send) => send_packet(qp, core, hca, pkt, out),
        Some(OpKind::Write) => write_packet(qp, core, hca, pkt, out),
        _ => nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest),
    }
}

pub(super) fn send_packet<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    pkt: &Packet,
    out: &mut Vec<Packet>,
) {
    let p = pkt.hdr.bth.psn;
    let op = pkt.hdr.bth.opcode;
    let starts = matches!(op.position(), Some(Position::First | Position::Only));
    if !length_ok(qp, core, pkt) {
        nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest);
        return;
    }
    if starts {
        match take_recv(qp, hca) {
            Ok(true) => {}
            Ok(false) => {
                rnr(qp, core, out, p);
                return;
            }
            Err(()) => {
                nak_fatal(qp, core, hca, out, p, NakCode::RemoteOperationalError);
                return;
            }
        }
        qp.resp.msg = Some(InMsg::Send);
        qp.resp.offset = 0;
    }
    if let Err(status) = scatter_recv(qp, core, pkt, 0) {
        let code = if status == WcStatus::LocLenErr {
            NakCode::InvalidRequest
        } else {
            NakCode::RemoteOperationalError
        };
        complete_recv(qp, core, hca, status, WcOpcode::Recv, pkt, 0);
        nak_fatal(qp, core, hca, out, p, code);
        return;
    }
    qp.resp.offset += pkt.payload.len() as u64;
    if ends(pkt) {
        if let Some(rkey) = pkt.hdr.ieth {
            if core.memory.invalidate(rkey, qp.init.pd, qp.qpn).is_err() {
                invalidation_error(qp, core, hca, pkt, out);
                return;
            }
        }
        let len = qp.resp.offset as u32;
        complete_recv(qp, core, hca, WcStatus::Success, WcOpcode::Recv, pkt, len);
        qp.resp.msg = None;
        qp.resp.msn = psn::add(qp.resp.msn, 1);
    }
    accept(qp, core, pkt);
}

/// A SEND_WITH_INV whose key this QP may not invalidate (IBA class J, as rxe implements it):
/// the message did arrive, so the requester gets an ACK and completes successfully; the
/// receive completes with `REM_INV_REQ_ERR` and the QP goes to ERR. No NAK is sent.
pub(super) fn invalidation_error<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    pkt: &Packet,
    out: &mut Vec<Packet>,
) {
    complete_recv(
        qp,
        core,
        hca,
        WcStatus::RemInvReqErr,
        WcOpcode::Recv,
        pkt,
        0,
    );
    qp.resp.msg = None;
    let last = psn::add(pkt.hdr.bth.psn, pkt.psn_count() - 1);
    send_aeth(qp, core, out, last, AethSyndrome::Ack { credits: 0x1f });
    set_state(qp, core, hca, QpState::Err);
}

pub(super) fn write_packet<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    pkt: &Packet,
    out: &mut Vec<Packet>,
) {
    let p = pkt.hdr.bth.psn;
    let op = pkt.hdr.bth.opcode;
    let pos = op.position();
    if !length_ok(qp, core, pkt) {
        nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest);
        return;
    }
    let ends_msg = ends(pkt);
    // A WRITE with immediate needs a receive WQE: check before touching memory, so an RNR
    // retry finds everything as it was.
    if ends_msg && pkt.train_last.has_imm() && !qp.resp.recv_held {
        match take_recv(qp, hca) {
            Ok(true) => {}
            Ok(false) => {
                rnr(qp, core, out, p);
                return;
            }
            Err(()) => {
                nak_fatal(qp, core, hca, out, p, NakCode::RemoteOperationalError);
                return;
            }
        }
    }
    if matches!(pos, Some(Position::First | Position::Only)) {
        match open_write(qp, core, pkt) {
            Ok(()) => {}
            Err(None) => {
                nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest);
                return;
            }
            Err(Some(_)) => {
                // A WRITE with immediate that took a receive: the receive reports the
                // protection error (ibv_poll_cq(3)'s LOC_ACCESS_ERR).
                complete_recv(
                    qp,
                    core,
                    hca,
                    WcStatus::LocAccessErr,
                    WcOpcode::RecvRdmaWithImm,
                    pkt,
                    0,
                );
                access_error(qp, core, hca, out, p);
                return;
            }
        }
    }
    if let Err(code) = place_write(qp, core, hca, pkt, ends_msg) {
        nak_fatal(qp, core, hca, out, p, code);
        return;
    }
    if ends_msg {
        qp.resp.msn = psn::add(qp.resp.msn, 1);
    }
    accept(qp, core, pkt);
}

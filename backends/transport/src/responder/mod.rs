//! The responder: PSN and opcode-sequence checks, duplicate handling, key and rights checks,
//! execution of SEND, RDMA WRITE, RDMA READ and atomics, receive completions, ACK/NAK
//! generation (IBA chapter 9, as Linux `rxe_resp.c`), and UD/UC reception.
//!
//! Split along its seams: per transport (`rc.rs` — PSN order and the SEND/WRITE receive side,
//! `uc.rs`, `ud.rs`), per operation (`write.rs` — WRITE placement shared by RC and UC,
//! `read.rs`, `atomic.rs`), duplicates (`duplicate.rs`), receive WQEs (`recv.rs`), and
//! ACK/NAK generation (`ack.rs`). This file dispatches a request and holds the checks they
//! share.

mod ack;
mod atomic;
mod duplicate;
mod rc;
mod read;
mod recv;
mod uc;
mod ud;
mod write;

use portverbs_hal::event::{DeviceEvent, QpEventKind};
use portverbs_hal::types::{AccessFlags, QpState, QpType};

use super::Core;
use super::hca::Hca;
use super::memory::{KeyError, Span};
use super::packet::Packet;
use super::qp::{InMsg, QpCtx};
use crate::wire::{Opcode, Position};
use rc::on_rc;
use uc::on_uc;
use ud::on_ud;

pub(crate) use ack::flush_ack;
pub(crate) use read::respond;

/// Handles a request packet (SEND, WRITE, READ request, atomic) for this QP.
#[inline(always)]
pub(crate) fn on_request<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    now: u64,
    pkt: &Packet,
    out: &mut Vec<Packet>,
) {
    let _ = now;
    // (The P_Key was checked on the way in, in `Engine::receive`.)
    if !qp.can_receive() {
        core.stats.dropped += 1;
        return;
    }
    if qp.state == QpState::Rtr && !qp.resp.established {
        qp.resp.established = true;
        hca.post_event(DeviceEvent::Qp {
            qpn: qp.qpn,
            kind: QpEventKind::CommEstablished,
        });
    }
    match qp.init.qp_type {
        QpType::Ud => on_ud(qp, core, hca, pkt),
        QpType::Uc => on_uc(qp, core, hca, pkt),
        QpType::Rc => on_rc(qp, core, hca, pkt, out),
    }
}

/// A FIRST must follow a completed message; MIDDLE/LAST must continue one of the same kind.
#[inline]
fn sequence_ok(qp: &QpCtx, op: Opcode) -> bool {
    match (&qp.resp.msg, op.position()) {
        (None, Some(Position::Middle | Position::Last)) => false,
        (None, _) => true,
        (Some(InMsg::Send), Some(Position::Middle | Position::Last)) => op.is_send(),
        (Some(InMsg::Write { .. }), Some(Position::Middle | Position::Last)) => op.is_write(),
        (Some(_), _) => false,
    }
}

#[inline]
fn mtu_of(qp: &QpCtx, core: &Core) -> u64 {
    u64::from(qp.mtu(core.port_mtu(qp.attr.port_num)))
}

/// Payload length rules: FIRST/MIDDLE carry exactly one MTU, LAST/ONLY at most one; a train
/// of k packets carries k − 1 full MTUs plus its last packet's share.
#[inline]
fn length_ok(qp: &QpCtx, core: &Core, pkt: &Packet) -> bool {
    let n = pkt.payload.len() as u64;
    let mtu = mtu_of(qp, core);
    let k = u64::from(pkt.psn_count());
    if k > 1 {
        let opens = matches!(
            pkt.hdr.bth.opcode.position(),
            Some(Position::First | Position::Middle)
        );
        let full = (k - 1) * mtu;
        return opens
            && u64::from(pkt.train_mtu) == mtu
            && match pkt.train_last.position() {
                Some(Position::Middle) => n == k * mtu,
                Some(Position::Last) => n > full && n <= k * mtu,
                _ => false,
            };
    }
    match pkt.hdr.bth.opcode.position() {
        Some(Position::First | Position::Middle) => n == mtu,
        _ => n <= mtu,
    }
}

/// Where the (last packet of the) packet leaves the message.
#[inline]
fn ends(pkt: &Packet) -> bool {
    matches!(
        pkt.train_last.position(),
        Some(Position::Last | Position::Only)
    )
}

#[inline]
fn remote(
    qp: &QpCtx,
    core: &Core,
    rkey: u32,
    va: u64,
    len: u64,
    need: AccessFlags,
) -> Result<Span, KeyError> {
    if !qp.attr.qp_access_flags.contains(need) {
        return Err(KeyError::AccessDenied);
    }
    core.memory.remote(rkey, qp.init.pd, qp.qpn, va, len, need)
}

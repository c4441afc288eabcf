//! Receive WQEs: taking one for a new message, scattering payload into it, completing it.

use portverbs_hal::types::QpState;
use portverbs_hal::wc::{Cqe, WcFlags, WcOpcode, WcStatus, WorkCompletion, WqeRef};

use super::super::Core;
use super::super::hca::{Hca, RecvSource};
use super::super::memory::Span;
use super::super::modify::set_state;
use super::super::packet::Packet;
use super::super::qp::QpCtx;

/// Takes a receive WQE for a new message (kept across the message's packets).
pub(super) fn take_recv<H: Hca + ?Sized>(qp: &mut QpCtx, hca: &mut H) -> Result<bool, ()> {
    if qp.resp.recv_held {
        return Ok(true);
    }
    let src = qp.recv_source();
    match hca.take_recv_wqe(src, &mut qp.resp.recv) {
        Ok(true) => {
            if let RecvSource::Rq { .. } = src {
                qp.resp.recv.pd = qp.init.pd;
            }
            qp.resp.recv_held = true;
            Ok(true)
        }
        Ok(false) => Ok(false),
        Err(fault) => {
            tracing::warn!(qpn = qp.qpn, reason = fault.reason, "malformed receive WQE");
            Err(())
        }
    }
}

/// Copies the packet payload into the held receive WQE at the message offset (plus `skip`
/// bytes reserved at the start, the GRH area for UD).
pub(super) fn scatter_recv(
    qp: &QpCtx,
    core: &Core,
    pkt: &Packet,
    skip: u64,
) -> Result<(), WcStatus> {
    let n = pkt.payload.len() as u64;
    let start = qp.resp.offset + skip;
    if start + n > qp.resp.recv.capacity() {
        return Err(WcStatus::LocLenErr);
    }
    scatter_bytes(qp, core, start, n, |span, src_off, len| {
        pkt.payload
            .copy_range_to(src_off, len, &span.mem, span.offset)
            .map_err(|_| WcStatus::LocProtErr)
    })
}

/// Walks the receive scatter list over message bytes `[start, start + n)` and hands each piece
/// (destination span, source offset, length) to `put`.
pub(super) fn scatter_bytes(
    qp: &QpCtx,
    core: &Core,
    start: u64,
    n: u64,
    mut put: impl FnMut(&Span, usize, usize) -> Result<(), WcStatus>,
) -> Result<(), WcStatus> {
    let mut pos = 0u64;
    let mut done = 0u64;
    for sge in &qp.resp.recv.sges {
        let sl = u64::from(sge.length);
        let at = start + done;
        if done < n && at < pos + sl {
            let within = at - pos;
            let take = (sl - within).min(n - done);
            let span = core
                .memory
                .local(sge.lkey, qp.resp.recv.pd, sge.addr + within, take, true)
                .map_err(|_| WcStatus::LocProtErr)?;
            put(&span, done as usize, take as usize)?;
            done += take;
        }
        pos += sl;
    }
    if done == n {
        Ok(())
    } else {
        Err(WcStatus::LocLenErr)
    }
}

/// Completes the held receive WQE.
pub(super) fn complete_recv<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    status: WcStatus,
    opcode: WcOpcode,
    pkt: &Packet,
    len: u32,
) {
    if !qp.resp.recv_held {
        return;
    }
    qp.resp.recv_held = false;
    let mut flags = WcFlags::empty();
    let mut imm = 0;
    if let Some(v) = pkt.hdr.imm {
        flags |= WcFlags::WITH_IMM;
        imm = v;
    } else if let Some(rkey) = pkt.hdr.ieth {
        flags |= WcFlags::WITH_INV;
        imm = rkey;
    }
    let mut cqe = Cqe {
        wc: WorkCompletion {
            qp_num: qp.qpn,
            status,
            opcode,
            byte_len: len,
            imm_data: imm,
            wc_flags: flags,
            src_qp: qp.attr.dest_qp_num,
            ..WorkCompletion::default()
        },
        wqe: WqeRef {
            is_send: false,
            index: qp.resp.recv.wqe_index as u16,
        },
    };
    if let Some(deth) = pkt.hdr.deth {
        cqe.wc.src_qp = deth.src_qp;
        cqe.wc.wc_flags |= WcFlags::GRH;
    }
    let solicited = pkt.hdr.bth.solicited;
    if !hca.post_completion(qp.init.recv_cqn, &cqe, solicited) {
        // The receive CQ overran (or is in error): the QP goes to ERR (IBA 11.4.2.1).
        set_state(qp, core, hca, QpState::Err);
    }
}

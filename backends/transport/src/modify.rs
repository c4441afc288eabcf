//! QP state changes: the modify-QP command and the one funnel every state change goes through
//! ([`set_state`]), with the work entering each state implies (flushing on ERR and SQE, the
//! SQ drain on SQD, forgetting everything on RESET).

use portverbs_hal::attr::{QpAttr, QpAttrMask};
use portverbs_hal::error::CommandError;
use portverbs_hal::event::{DeviceEvent, QpEventKind};
use portverbs_hal::qp_state::transition;
use portverbs_hal::types::QpState;
use portverbs_hal::wc::{Cqe, WcOpcode, WcStatus, WorkCompletion, WqeRef};

use super::Core;
use super::completer;
use super::hca::{Hca, RecvSource};
use super::packet::{Packet, psn};
use super::qp::QpCtx;
use super::requester;

/// Moves `qp` to state `to`: the only place a QP's state is assigned. Does what entering `to`
/// implies, from the state the QP is in:
/// * RESET — a new incarnation of the QP: requester and responder state forgotten (stale
///   timer entries no longer match a generation), the type-2 windows bound to the old one
///   unbound (the mlx4 model destroys the engine's QP at RESET, so both backends agree), the
///   device's queue counters reset;
/// * INIT from RESET — the device's queue counters reset;
/// * RTS — the SQ drain (if any) and a local-error stall end; the caller kicks the requester;
/// * SQD from another state — the drain starts, and completes at once if nothing is in flight
///   (the SQ-drained event);
/// * SQE (UC/UD send-side error) — the send queue is flushed; receives keep working;
/// * ERR (once) — the device is told, timers stop, READ and atomic responses still owed are
///   dropped, both queues are flushed (an SRQ gets the last-WQE-reached event instead).
///
/// The transition itself is not checked here (`modify` checks a command's; the engine's own
/// moves to ERR and SQE are always legal).
pub(crate) fn set_state<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    to: QpState,
) {
    let prev = qp.state;
    if to == QpState::Err && prev == QpState::Err {
        return;
    }
    if to != prev {
        tracing::debug!(qpn = qp.qpn, "QP state {prev} => {to}");
    }
    match to {
        QpState::Reset => {
            core.cc.detach(qp.qpn, &mut qp.cc, &mut core.woken);
            core.memory.unbind_qp(qp.qpn);
            qp.req.reset();
            qp.resp.reset();
            qp.draining = false;
            qp.state = QpState::Reset;
            hca.reset_queues(qp.qpn, qp.init.qp_type);
        }
        QpState::Err => {
            core.cc.detach(qp.qpn, &mut qp.cc, &mut core.woken);
            qp.state = QpState::Err;
            hca.qp_error(qp.qpn);
            qp.req.rto_armed = false;
            qp.req.rnr_wait = false;
            qp.resp.drop_responses();
            flush_sq(qp, hca);
            flush_rq(qp, hca);
        }
        QpState::Sqe => {
            qp.state = QpState::Sqe;
            flush_sq(qp, hca);
        }
        QpState::Sqd => {
            qp.state = QpState::Sqd;
            if prev != QpState::Sqd {
                qp.draining = true;
                completer::advance_completions(qp, core, hca);
            }
        }
        QpState::Init if prev == QpState::Reset => {
            hca.reset_queues(qp.qpn, qp.init.qp_type);
            qp.state = QpState::Init;
        }
        QpState::Rts => {
            qp.state = QpState::Rts;
            qp.draining = false;
            qp.req.stalled = false;
        }
        other => qp.state = other,
    }
}

/// Applies a modify-QP command.
pub(crate) fn modify<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    now: u64,
    attr: &QpAttr,
    mask: QpAttrMask,
    out: &mut Vec<Packet>,
) -> Result<(), CommandError> {
    let cur = if mask.contains(QpAttrMask::CUR_STATE) {
        attr.cur_qp_state
    } else {
        qp.state
    };
    if cur != qp.state {
        return Err(CommandError::BadState {
            object: "QP",
            number: qp.qpn,
            reason: format!("QP is in {}, not {}", qp.state, cur),
        });
    }
    let next = if mask.contains(QpAttrMask::STATE) {
        attr.qp_state
    } else {
        qp.state
    };
    // The HAL's one transition table (IBA 10.3.1), from the state the QP is really in.
    if transition(qp.init.qp_type, qp.state, next).is_none() {
        return Err(CommandError::BadState {
            object: "QP",
            number: qp.qpn,
            reason: format!("QP is in {}, it cannot go to {next}", qp.state),
        });
    }
    qp.attr.apply(attr, mask);
    if mask.contains(QpAttrMask::RETRY_CNT) {
        qp.req.retries_left = attr.retry_cnt;
    }
    if mask.contains(QpAttrMask::RNR_RETRY) {
        qp.req.rnr_left = attr.rnr_retry;
    }
    if mask.contains(QpAttrMask::RQ_PSN) {
        qp.resp.epsn = attr.rq_psn & psn::MASK;
    }
    if mask.contains(QpAttrMask::SQ_PSN) {
        let p = attr.sq_psn & psn::MASK;
        qp.req.next_psn = p;
        qp.req.sent_end = p;
        qp.req.una = p;
    }
    if mask.contains(QpAttrMask::MAX_DEST_RD_ATOMIC) {
        // A new ring: READ responses still owed are dropped (the requester asks again), what
        // waited behind them goes out in the next work turn.
        qp.resp.resources = vec![None; usize::from(attr.max_dest_rd_atomic)];
        qp.resp.next_resource = 0;
        if qp.resp.responding {
            core.schedule(qp);
        }
    }
    set_state(qp, core, hca, next);
    if next == QpState::Rts {
        // Work posted before the QP could send (or held back by the drain) goes out now.
        requester::transmit(qp, core, hca, now, out);
    }
    Ok(())
}

fn flush_sq<H: Hca + ?Sized>(qp: &mut QpCtx, hca: &mut H) {
    let flush = |hca: &mut H, qpn: u32, cqn: u32, c: u32| {
        let cqe = Cqe {
            wc: WorkCompletion {
                qp_num: qpn,
                status: WcStatus::WrFlushErr,
                ..WorkCompletion::default()
            },
            wqe: WqeRef {
                is_send: true,
                index: c as u16,
            },
        };
        // A flush completion the CQ cannot take is lost; the QP is in ERR already.
        let _ = hca.post_completion(cqn, &cqe, false);
    };
    let (qpn, cqn) = (qp.qpn, qp.init.send_cqn);
    while qp.req.comp != qp.req.fetched {
        flush(hca, qpn, cqn, qp.req.comp);
        qp.req.comp = qp.req.comp.wrapping_add(1);
    }
    if let Some(head) = hca.sq_head(qpn) {
        while qp.req.fetched != head {
            flush(hca, qpn, cqn, qp.req.fetched);
            qp.req.fetched = qp.req.fetched.wrapping_add(1);
        }
    }
    qp.req.comp = qp.req.fetched;
    qp.req.tx = qp.req.fetched;
    qp.req.tx_offset = 0;
    qp.req.stalled = false;
}

fn flush_rq<H: Hca + ?Sized>(qp: &mut QpCtx, hca: &mut H) {
    let (qpn, cqn) = (qp.qpn, qp.init.recv_cqn);
    let flush = |hca: &mut H, wqe_index: u32| {
        let cqe = Cqe {
            wc: WorkCompletion {
                qp_num: qpn,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                ..WorkCompletion::default()
            },
            wqe: WqeRef {
                is_send: false,
                index: wqe_index as u16,
            },
        };
        let _ = hca.post_completion(cqn, &cqe, false);
    };
    if qp.resp.recv_held {
        qp.resp.recv_held = false;
        flush(hca, qp.resp.recv.wqe_index);
    }
    qp.resp.msg = None;
    match qp.recv_source() {
        RecvSource::Rq { .. } => {
            let src = qp.recv_source();
            let mut wqe = std::mem::take(&mut qp.resp.recv);
            while let Ok(true) = hca.take_recv_wqe(src, &mut wqe) {
                flush(hca, wqe.wqe_index);
            }
            qp.resp.recv = wqe;
        }
        RecvSource::Srq { .. } => hca.post_event(DeviceEvent::Qp {
            qpn,
            kind: QpEventKind::LastWqeReached,
        }),
    }
}

/// Flushes send WQEs posted to a QP in SQE (its receive queue keeps working).
pub(crate) fn flush_new_sends<H: Hca + ?Sized>(qp: &mut QpCtx, hca: &mut H) {
    flush_sq(qp, hca);
}

/// Flushes WQEs posted to a QP already in ERR.
pub(crate) fn flush_new<H: Hca + ?Sized>(qp: &mut QpCtx, _core: &mut Core, hca: &mut H) {
    flush_sq(qp, hca);
    if let RecvSource::Rq { .. } = qp.recv_source() {
        flush_rq(qp, hca);
    }
}

//! The completer: acknowledgements, NAKs, READ responses and atomic ACKs; in-order completion
//! of send WQEs; go-back-N retransmission, RNR back-off, retry exhaustion. An error completion
//! moves the QP to ERR (RC) or SQE (UC/UD) through `modify::set_state`, which flushes.

use portverbs_hal::attr::rnr_timer_ns;
use portverbs_hal::event::{DeviceEvent, QpEventKind};
use portverbs_hal::types::{QpState, QpType};
use portverbs_hal::wc::{Cqe, WcOpcode, WcStatus, WorkCompletion, WqeRef};
use portverbs_hal::wr::SendOp;

use super::Core;
use super::congestion;
use super::hca::Hca;
use super::modify::set_state;
use super::packet::{Packet, psn};
use super::qp::QpCtx;
use super::requester;
use super::timers::TimerKind;
use crate::wire::{AethSyndrome, NakCode, Position};

fn send_opcode(op: SendOp) -> WcOpcode {
    match op {
        SendOp::Send | SendOp::SendWithImm { .. } | SendOp::SendWithInv { .. } => WcOpcode::Send,
        SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. } => WcOpcode::RdmaWrite,
        SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
        SendOp::AtomicCmpSwp { .. } => WcOpcode::CompSwap,
        SendOp::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
        SendOp::BindMw { .. } => WcOpcode::BindMw,
        SendOp::LocalInv { .. } => WcOpcode::LocalInv,
    }
}

/// Delivers, in order, the completions of every WQE whose outcome is known.
/// Returns how many WQEs were retired.
pub(crate) fn advance_completions<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
) -> u32 {
    let mut error = None;
    let mut lost = false;
    let start = qp.req.comp;
    while qp.req.comp != qp.req.fetched {
        let c = qp.req.comp;
        let slot = qp.req.slot(c);
        let Some(status) = slot.done else {
            break;
        };
        if slot.wqe.signaled || status != WcStatus::Success {
            let cqe = Cqe {
                wc: WorkCompletion {
                    qp_num: qp.qpn,
                    status,
                    opcode: send_opcode(slot.wqe.op),
                    byte_len: slot.byte_len,
                    ..WorkCompletion::default()
                },
                wqe: WqeRef {
                    is_send: true,
                    index: c as u16,
                },
            };
            lost = !hca.post_completion(qp.init.send_cqn, &cqe, false);
        }
        qp.req.comp = c.wrapping_add(1);
        if qp.req.tx == c {
            // Keep comp <= tx: a WQE retired at the transmit point needs no more packets.
            qp.req.tx = qp.req.comp;
            qp.req.tx_offset = 0;
            requester::passed(qp, core, c);
        }
        if lost {
            // The send CQ overran (or is in error): the QP goes to ERR (IBA 11.4.2.1).
            set_state(qp, core, hca, QpState::Err);
            return qp.req.comp.wrapping_sub(start);
        }
        if status != WcStatus::Success {
            error = Some(status);
            break;
        }
    }
    let retired = qp.req.comp.wrapping_sub(start);
    if error.is_some() {
        match qp.init.qp_type {
            QpType::Rc => set_state(qp, core, hca, QpState::Err),
            QpType::Uc | QpType::Ud => set_state(qp, core, hca, QpState::Sqe),
        }
        return retired;
    }
    if qp.draining && qp.req.comp == qp.req.fetched && qp.req.tx == qp.req.fetched {
        qp.draining = false;
        if qp.attr.en_sqd_async_notify {
            hca.post_event(DeviceEvent::Qp {
                qpn: qp.qpn,
                kind: QpEventKind::SqDrained,
            });
        }
    }
    retired
}

/// Processes an ACK, NAK, READ response or atomic ACK for this QP's requests.
///
/// A response is trusted only for a PSN it can refer to (IBA 9.7: a response outside the
/// requester's outstanding window is discarded; rxe's `check_psn` in
/// drivers/infiniband/sw/rxe/rxe_comp.c drops responses behind the completer's PSN): ACKs,
/// READ responses and atomic ACKs must lie in `[una, sent_end)`, and a NAK or a reserved
/// syndrome must name a request packet still in flight that could draw it ([`nak_target`]).
/// Anything else — stale, duplicated by the network after it was acted on, or forged — is
/// dropped and counted in `psn_out_of_window`: it fails no WQE, starts no RNR wait and costs
/// no retry.
pub(crate) fn on_response<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    now: u64,
    pkt: &Packet,
    out: &mut Vec<Packet>,
) {
    if take_response(qp, core, hca, now, pkt) {
        // The responder answered: a probe's go-back, if one is under way, may use the window.
        qp.cc.probing = false;
        requester::transmit(qp, core, hca, now, out);
    }
}

/// [`on_response`] up to what it makes possible to send; false when the response was dropped.
fn take_response<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    now: u64,
    pkt: &Packet,
) -> bool {
    if qp.init.qp_type != QpType::Rc || !matches!(qp.state, QpState::Rts | QpState::Sqd) {
        core.stats.dropped += 1;
        return false;
    }
    let p = pkt.hdr.bth.psn;
    let opcode = pkt.hdr.bth.opcode;
    let nak = match pkt.hdr.aeth.map(|a| a.syndrome) {
        _ if opcode.is_read_response() || pkt.hdr.atomic_ack.is_some() => None,
        Some(AethSyndrome::Nak(NakCode::PsnSequenceError)) => Some(NakKind::Sequence),
        Some(AethSyndrome::RnrNak { .. }) => Some(NakKind::Rnr),
        Some(AethSyndrome::Nak(_) | AethSyndrome::Reserved(_)) => Some(NakKind::Error),
        Some(AethSyndrome::Ack { .. }) | None => None,
    };
    let target = match nak {
        Some(kind) => nak_target(qp, core, p, kind),
        None if in_flight(qp, p) => Some(qp.req.comp),
        None => {
            // A retransmitted train of READ responses may start behind `una` and reach into
            // the window: take it apart, each part checked on its own (and the requester
            // run once, after them all).
            let last = psn::add(p, u32::from(pkt.train.max(1)) - 1);
            if pkt.train > 1 && opcode.is_read_response() && in_flight(qp, last) {
                let mut taken = false;
                for part in pkt.clone().split() {
                    taken |= take_response(qp, core, hca, now, &part);
                }
                return taken;
            }
            None
        }
    };
    let Some(target) = target else {
        core.stats.dropped += 1;
        core.stats.psn_out_of_window += 1;
        return false;
    };
    if opcode.is_read_response() {
        on_read_response(qp, core, hca, now, pkt);
    } else if let Some(ack) = pkt.hdr.atomic_ack {
        on_atomic_ack(qp, core, hca, now, p, ack.orig);
    } else if let Some(aeth) = pkt.hdr.aeth {
        match aeth.syndrome {
            AethSyndrome::Ack { .. } => ack_through(qp, core, now, p),
            AethSyndrome::RnrNak { timer } => on_rnr_nak(qp, core, hca, now, p, timer),
            AethSyndrome::Nak(NakCode::PsnSequenceError) => {
                ack_through(qp, core, now, psn::add(p, psn::MASK));
                // The responder NAKs a gap once; the same NAK again without progress is a
                // duplicate from the network and must not cost another retry.
                if qp.req.last_nak == Some(p) {
                    core.stats.duplicates += 1;
                    return true;
                }
                qp.req.last_nak = Some(p);
                // Go back to the oldest unacknowledged PSN, not to `p`: an RDMA READ or atomic
                // before `p` may be missing its response even though the responder has moved
                // on (Linux `rxe_comp.c` rewinds to the oldest uncompleted WQE).
                let una = qp.req.una;
                retry(qp, core, hca, now, una);
            }
            AethSyndrome::Nak(code) => {
                let status = match code {
                    NakCode::InvalidRequest => WcStatus::RemInvReqErr,
                    NakCode::RemoteAccessError => WcStatus::RemAccessErr,
                    NakCode::RemoteOperationalError => WcStatus::RemOpErr,
                    _ => WcStatus::BadRespErr,
                };
                on_error_nak(qp, core, hca, now, p, target, status);
            }
            AethSyndrome::Reserved(_) => {
                on_error_nak(qp, core, hca, now, p, target, WcStatus::BadRespErr);
            }
        }
    }
    true
}

/// True when PSN `p` lies in `[una, sent_end)`: sent and not yet acknowledged.
fn in_flight(qp: &QpCtx, p: u32) -> bool {
    psn::diff(p, qp.req.una) >= 0 && psn::diff(p, qp.req.sent_end) < 0
}

/// What a NAK asks for, as far as the PSN it may name goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NakKind {
    /// PSN sequence error: names the responder's expected PSN.
    Sequence,
    /// Receiver not ready: names a request that needs a receive WQE.
    Rnr,
    /// Invalid request, remote access or operational error, or a reserved syndrome: names
    /// the request that failed.
    Error,
}

/// The send WQE a NAK for PSN `p` refers to, or `None` when no request in flight could have
/// drawn it. A responder NAKs the PSN of a request packet (IBA 9.7.5.1): any packet of a
/// SEND or RDMA WRITE, but only the request packet of an RDMA READ (its first PSN, or where a
/// retried request restarted it) or of an atomic, so PSNs a READ reserved for its responses
/// are never NAKed. An RNR NAK names a request that consumes a receive WQE (a SEND, or an
/// RDMA WRITE with immediate). All of them lie in `[una, sent_end)` — except the first PSN of
/// a READ whose responses are partly in: a responder that fails in the middle of a READ's
/// responses NAKs the READ request's PSN (rxe's completer takes such a NAK while a READ
/// response is in progress).
fn nak_target(qp: &QpCtx, core: &Core, p: u32, kind: NakKind) -> Option<u32> {
    let c = wqe_of_psn(qp, p)?;
    let s = qp.req.slot(c);
    if s.done.is_some() {
        return None;
    }
    let mtu = u64::from(qp.mtu(core.port_mtu(qp.attr.port_num)));
    let window = in_flight(qp, p);
    let ok = match (s.wqe.op, kind) {
        (SendOp::RdmaRead { .. }, NakKind::Error) if s.read_done > 0 => {
            p == s.first_psn || (window && p == psn::add(s.first_psn, (s.read_done / mtu) as u32))
        }
        (SendOp::RdmaRead { .. }, NakKind::Sequence | NakKind::Error) => {
            window && p == psn::add(s.first_psn, (s.read_done / mtu) as u32)
        }
        (SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. }, NakKind::Rnr)
        | (SendOp::RdmaRead { .. } | SendOp::RdmaWrite { .. }, NakKind::Rnr) => false,
        (SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. }, _) => {
            window && p == s.first_psn
        }
        _ => window,
    };
    ok.then_some(c)
}

/// A NAK that ends the connection (invalid request, remote access or operational error,
/// reserved syndrome) for WQE `c`, whose request packet had PSN `p`.
fn on_error_nak<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    now: u64,
    p: u32,
    c: u32,
    status: WcStatus,
) {
    ack_through(qp, core, now, psn::add(p, psn::MASK));
    // A READ or atomic before `c` still waits for (the rest of) its response, although the
    // responder got past it: its responses were lost or cut short. As rxe's completer does
    // with a response beyond a READ it waits for, go back to it (one retry) instead of
    // failing a later WQE first; the responder's error comes back when the retry reaches it.
    let mut k = qp.req.comp;
    while k != c {
        let s = qp.req.slot(k);
        if s.done.is_none() && s.wqe.op.is_read_or_atomic() {
            let una = qp.req.una;
            retry(qp, core, hca, now, una);
            return;
        }
        k = k.wrapping_add(1);
    }
    fail_wqe(qp, c, status);
}

/// Counter of the transmitted WQE whose PSN range contains `p`.
fn wqe_of_psn(qp: &QpCtx, p: u32) -> Option<u32> {
    let mut c = qp.req.comp;
    while c != qp.req.fetched {
        let s = qp.req.slot(c);
        if s.assigned
            && psn::diff(p, s.first_psn) >= 0
            && psn::diff(p, psn::add(s.first_psn, s.npsn)) < 0
        {
            return Some(c);
        }
        c = c.wrapping_add(1);
    }
    None
}

/// The oldest unacknowledged PSN moves forward to `una`: the path's window grows by what was
/// acknowledged and the QP's packets in flight shrink; the retransmission timer's back-off ends.
fn advance_una(qp: &mut QpCtx, core: &mut Core, now: u64, una: u32) {
    let acked = psn::diff(una, qp.req.una) as u32;
    qp.req.una = una;
    core.cc.on_ack(&qp.cc, acked);
    core.cc.acked_to(&mut qp.cc, una, now);
    if psn::diff(qp.req.next_psn, una) < 0 {
        skip_acknowledged(qp, core, una);
    }
    let in_flight = congestion::in_flight(una, qp.req.next_psn);
    core.cc.charge(&mut qp.cc, in_flight, &mut core.woken);
    qp.cc.rto_backoff = 0;
    qp.cc.pto_shift = 0;
    if in_flight > 0 {
        requester::arm_probe(qp, core, now);
    } else {
        qp.cc.pto.armed = false;
    }
}

/// Everything up to and including PSN `p` was received by the responder.
fn ack_through(qp: &mut QpCtx, core: &mut Core, now: u64, p: u32) {
    if psn::diff(p, qp.req.una) < 0 {
        return; // stale
    }
    let mut una = psn::add(p, 1);
    let mut c = qp.req.comp;
    // Up to every WQE sent, not only to the transmit point: after a go-back, `tx` is behind
    // WQEs that were sent before and that this ACK may cover.
    while c != qp.req.fetched {
        let s = qp.req.slot_mut(c);
        if s.done.is_some() {
            c = c.wrapping_add(1);
            continue;
        }
        if !s.assigned {
            break; // never sent, nor anything after it
        }
        let last = psn::add(s.first_psn, s.npsn.saturating_sub(1));
        if s.wqe.op.is_read_or_atomic() {
            // Completed only by its own response; nothing after it is acknowledged yet.
            if psn::diff(s.first_psn, una) < 0 {
                una = s.first_psn;
            }
            break;
        }
        if psn::diff(last, p) <= 0 {
            s.done = Some(WcStatus::Success);
            s.byte_len = s.wqe.payload_len() as u32;
            c = c.wrapping_add(1);
        } else {
            break;
        }
    }
    if psn::diff(una, qp.req.una) > 0 {
        advance_una(qp, core, now, una);
        qp.req.last_nak = None;
        qp.req.retries_left = qp.attr.retry_cnt;
        qp.req.rnr_left = qp.attr.rnr_retry;
        if qp.req.una == qp.req.sent_end {
            qp.req.rto_armed = false;
        } else {
            requester::arm_retransmit(qp, core, now);
        }
    }
}

fn on_read_response<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    _hca: &mut H,
    now: u64,
    pkt: &Packet,
) {
    let p = pkt.hdr.bth.psn;
    // The oldest outstanding READ/atomic is the only one a response can be for.
    let mut c = qp.req.comp;
    let target = loop {
        if c == qp.req.tx {
            return;
        }
        let s = qp.req.slot(c);
        if s.done.is_none() && s.wqe.op.is_read_or_atomic() {
            break c;
        }
        c = c.wrapping_add(1);
    };
    let mtu = u64::from(qp.mtu(core.port_mtu(qp.attr.port_num)));
    let s = qp.req.slot(target);
    let SendOp::RdmaRead { .. } = s.wqe.op else {
        return; // an atomic is outstanding: this response is out of place
    };
    let (first_psn, npsn, read_done, total) =
        (s.first_psn, s.npsn, s.read_done, s.wqe.payload_len());
    let expected = psn::add(first_psn, (read_done / mtu) as u32);
    if p != expected {
        if pkt.train > 1 && psn::diff(p, expected) < 0 {
            // A retransmitted train may reach past what arrived: take it apart.
            for part in pkt.clone().split() {
                on_read_response(qp, core, _hca, now, &part);
            }
            return;
        }
        if psn::diff(p, expected) < 0 {
            core.stats.duplicates += 1;
        }
        return; // duplicate or a gap: the retransmission timer recovers
    }
    // Everything before this READ is implicitly acknowledged.
    ack_through(qp, core, now, psn::add(first_psn, psn::MASK));
    let n = pkt.payload.len() as u64;
    let k = u64::from(pkt.psn_count());
    let final_pkt = matches!(
        pkt.train_last.position(),
        Some(Position::Last | Position::Only)
    );
    let remaining = total - read_done;
    let good_len = if final_pkt {
        n == remaining && (k == 1 || n > (k - 1) * mtu) && n <= k * mtu
    } else {
        n == k * mtu && n < remaining
    };
    if !good_len {
        fail_at(qp, p, WcStatus::BadRespErr);
        return;
    }
    let status = scatter(qp, core, target, read_done, pkt);
    if let Err(status) = status {
        qp.req.slot_mut(target).done = Some(status);
        return;
    }
    qp.req.slot_mut(target).read_done += n;
    if final_pkt {
        let s = qp.req.slot_mut(target);
        s.done = Some(WcStatus::Success);
        s.byte_len = total as u32;
        let last = psn::add(first_psn, npsn.saturating_sub(1));
        ack_through(qp, core, now, last);
    } else if psn::diff(psn::add(p, k as u32), qp.req.una) > 0 {
        advance_una(qp, core, now, psn::add(p, k as u32));
        qp.req.retries_left = qp.attr.retry_cnt;
        requester::arm_retransmit(qp, core, now);
    }
}

/// Copies a response payload into the WQE's scatter list at message offset `at`.
fn scatter(qp: &QpCtx, core: &Core, c: u32, at: u64, pkt: &Packet) -> Result<(), WcStatus> {
    scatter_with(qp, core, c, at, pkt.payload.len(), |span, src, len| {
        pkt.payload.copy_range_to(src, len, &span.mem, span.offset)
    })
}

/// Walks the scatter list of WQE `c` over message bytes `[at, at + n)`, checking each piece's
/// key, domain, `LOCAL_WRITE` right and range before `put` copies source bytes `[src, src +
/// len)` into it. This is where a READ's or an atomic's local keys are checked.
fn scatter_with<E>(
    qp: &QpCtx,
    core: &Core,
    c: u32,
    at: u64,
    n: usize,
    mut put: impl FnMut(&super::memory::Span, usize, usize) -> Result<(), E>,
) -> Result<(), WcStatus> {
    let wqe = &qp.req.slot(c).wqe;
    let mut src = 0usize;
    let mut pos = 0u64;
    for sge in &wqe.sges {
        let sl = u64::from(sge.length);
        let begin = at + src as u64;
        if src < n && begin < pos + sl {
            let within = begin - pos;
            let take = ((sl - within) as usize).min(n - src);
            let span = core
                .memory
                .local(sge.lkey, qp.init.pd, sge.addr + within, take as u64, true)
                .map_err(|_| WcStatus::LocProtErr)?;
            put(&span, src, take).map_err(|_| WcStatus::LocProtErr)?;
            src += take;
        }
        pos += sl;
    }
    if src == n {
        Ok(())
    } else {
        Err(WcStatus::LocLenErr)
    }
}

fn on_atomic_ack<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    _hca: &mut H,
    now: u64,
    p: u32,
    orig: u64,
) {
    let mut c = qp.req.comp;
    let target = loop {
        if c == qp.req.tx {
            return;
        }
        let s = qp.req.slot(c);
        if s.done.is_none() && s.wqe.op.is_read_or_atomic() {
            break c;
        }
        c = c.wrapping_add(1);
    };
    let s = qp.req.slot(target);
    if s.first_psn != p
        || !matches!(
            s.wqe.op,
            SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. }
        )
    {
        core.stats.duplicates += 1;
        return;
    }
    ack_through(qp, core, now, psn::add(p, psn::MASK));
    // The original value lands in the (exactly 8-byte) scatter list, in host byte order.
    let bytes = orig.to_ne_bytes();
    let result = scatter_with(qp, core, target, 0, 8, |span, src, len| {
        use portverbs_hal::DmaMemory;
        span.mem.write(span.offset, &bytes[src..src + len])
    });
    let s = qp.req.slot_mut(target);
    s.done = Some(result.err().unwrap_or(WcStatus::Success));
    s.byte_len = 8;
    ack_through(qp, core, now, p);
}

fn on_rnr_nak<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    now: u64,
    p: u32,
    timer: u8,
) {
    ack_through(qp, core, now, psn::add(p, psn::MASK));
    if qp.req.rnr_wait {
        // Already backing off: nothing was sent since the RNR NAK that started it, so this
        // one is its duplicate (or a forgery). It costs no RNR retry and arms no timer (one
        // per NAK would let a peer fill the timer heap).
        core.stats.duplicates += 1;
        return;
    }
    if qp.req.rnr_left == 0 {
        fail_at(qp, p, WcStatus::RnrRetryExcErr);
        let _ = hca;
        return;
    }
    if qp.attr.rnr_retry != 7 {
        qp.req.rnr_left -= 1;
    }
    rewind(qp, core, p);
    qp.req.rnr_wait = true;
    qp.req.rto_armed = false;
    let at = now + rnr_timer_ns(timer);
    qp.req.rnr_generation = core.arm_timer(qp.qpn, TimerKind::Rnr, at);
}

/// Go back N from PSN `p` after a sequence NAK, counting one retry.
fn retry<H: Hca + ?Sized>(qp: &mut QpCtx, core: &mut Core, _hca: &mut H, now: u64, p: u32) {
    if qp.req.retries_left == 0 {
        fail_at(qp, p, WcStatus::RetryExcErr);
        return;
    }
    qp.req.retries_left -= 1;
    core.cc.on_loss(&qp.cc, false);
    rewind(qp, core, p);
    requester::arm_retransmit(qp, core, now);
}

/// The local ACK timer expired.
pub(crate) fn on_retransmit_timeout<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    now: u64,
    out: &mut Vec<Packet>,
) {
    qp.req.rto_armed = false;
    if qp.req.una == qp.req.sent_end || !qp.can_send() {
        return;
    }
    core.stats.timeouts += 1;
    core.cc.on_loss(&qp.cc, true);
    qp.cc.probing = false;
    qp.cc.rto_backoff = (qp.cc.rto_backoff + 1).min(congestion::MAX_RTO_BACKOFF);
    let una = qp.req.una;
    retry(qp, core, hca, now, una);
    requester::transmit(qp, core, hca, now, out);
}

/// No ACK for a few of the path's round trips (the probe timeout): the packets in flight
/// were lost, most likely the last of a burst, which no later packet would make the responder
/// NAK — or the responder is slow. Go back now instead of at the local ACK timeout, and cut
/// the path's window, but charge no retry: only the local ACK timeout does (IBTA 9.7.6.1.3).
///
/// The go-back sends [`congestion::PROBE_PACKETS`] packets and waits for the answer before
/// the rest: a responder that has them all acknowledges up to its last PSN (a duplicate is
/// answered, IBA 9.9.2.2), one that lost them takes them in order and acknowledges, and either
/// answer resumes transmission with the window. Without the cap a probe that fires while a
/// slow responder is still answering sends a whole window again, and the responder answers
/// each duplicate: Linux rxe (6.1) counts those ACKs against the 64 packets a QP may have
/// queued and its requester then stalls for good.
pub(crate) fn on_probe_timeout<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    now: u64,
    out: &mut Vec<Packet>,
) {
    if !qp.can_send() || qp.req.rnr_wait || congestion::in_flight(qp.req.una, qp.req.next_psn) == 0
    {
        return;
    }
    core.cc.stats.probe_timeouts += 1;
    qp.cc.pto_shift = (qp.cc.pto_shift + 1).min(congestion::MAX_PTO_BACKOFF);
    core.cc.on_loss(&qp.cc, true);
    let una = qp.req.una;
    rewind(qp, core, una);
    qp.cc.probing = true;
    requester::transmit(qp, core, hca, now, out);
}

/// Restarts transmission at PSN `p` (the WQE containing it, at the right offset).
fn rewind(qp: &mut QpCtx, core: &mut Core, p: u32) {
    let Some(c) = wqe_of_psn(qp, p) else {
        return;
    };
    let mtu = u64::from(qp.mtu(core.port_mtu(qp.attr.port_num)));
    let s = qp.req.slot(c);
    let first_psn = s.first_psn;
    let tx_offset = match s.wqe.op {
        SendOp::RdmaRead { .. } => s.read_done,
        _ => u64::from(psn::diff(p, first_psn) as u32) * mtu,
    };
    qp.req.tx = c;
    qp.req.tx_offset = tx_offset;
    qp.req.next_psn = psn::add(first_psn, (tx_offset / mtu) as u32);
    qp.req.since_ackreq = 0;
    qp.req.stalled = false;
    let in_flight = congestion::in_flight(qp.req.una, qp.req.next_psn);
    core.cc.charge(&mut qp.cc, in_flight, &mut core.woken);
    core.cc.went_back(&mut qp.cc);
}

/// A go-back restarted transmission behind `una`, and the responder has since acknowledged
/// past it (the original packets were late, not lost): move the transmit point up to `una`
/// instead of sending again what the responder has. Besides the bandwidth, resending them
/// would go unanswered by anything that counts — their ACKs are behind `una` — while the
/// path's window counts nothing in flight for the QP.
fn skip_acknowledged(qp: &mut QpCtx, core: &Core, una: u32) {
    let Some(c) = wqe_of_psn(qp, una) else {
        // Everything sent is acknowledged: the next PSN is `una`, and the WQEs before it are
        // done (transmission steps over them).
        qp.req.next_psn = una;
        return;
    };
    let s = qp.req.slot(c);
    if matches!(s.wqe.op, SendOp::RdmaRead { .. }) && una != s.first_psn {
        return; // a READ resumes from its responses (`rewind`), never from its middle PSNs
    }
    let mtu = u64::from(qp.mtu(core.port_mtu(qp.attr.port_num)));
    let first_psn = s.first_psn;
    qp.req.tx = c;
    qp.req.tx_offset = u64::from(psn::diff(una, first_psn) as u32) * mtu;
    qp.req.next_psn = una;
}

/// Completes the WQE containing `p` with an error; earlier WQEs were acknowledged by the caller.
fn fail_at(qp: &mut QpCtx, p: u32, status: WcStatus) {
    let c = wqe_of_psn(qp, p).unwrap_or(qp.req.comp);
    fail_wqe(qp, c, status);
}

/// Completes WQE `c` with an error and stops transmission. An older WQE still waiting (a
/// READ or atomic whose response is missing) must complete first, and only a retry can bring
/// its response back: the retransmission timer keeps running for it (the retry resends up to
/// `c`, which stops transmission again).
fn fail_wqe(qp: &mut QpCtx, c: u32, status: WcStatus) {
    if c != qp.req.fetched {
        let s = qp.req.slot_mut(c);
        if s.done.is_none() {
            s.done = Some(status);
        }
    }
    qp.req.stalled = true;
    let mut k = qp.req.comp;
    while k != c && k != qp.req.fetched {
        if qp.req.slot(k).done.is_none() {
            return;
        }
        k = k.wrapping_add(1);
    }
    qp.req.rto_armed = false;
}

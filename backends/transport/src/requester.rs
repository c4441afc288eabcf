//! The requester: fetches send WQEs, validates them, executes local operations (bind,
//! invalidate) and turns messages into packets.
//!
//! Invariants kept here (counters are free-running):
//! `comp <= tx <= fetched <= sq_head` — WQEs in `[comp, fetched)` are in the slot ring; those
//! before `tx` have all their packets out; `una <= next_psn <= sent_end` in PSN order.

use portverbs_hal::attr::ack_timeout_ns;
use portverbs_hal::types::{QpState, QpType};
use portverbs_hal::wc::WcStatus;
use portverbs_hal::wr::{SendFlags, SendOp, SendOps};
use smallvec::SmallVec;

use super::completer;
use super::congestion::{self, Grant};
use super::hca::Hca;
use super::modify::set_state;
use super::packet::{MemSeg, Packet, PayloadData, psn};
use super::qp::QpCtx;
use super::timers::TimerKind;
use super::{Core, WqeFault};
use crate::wire::{AtomicEth, Bth, Deth, Opcode, Position, Reth, Service, TransportHdr};

/// Largest message (2^31 bytes, as rxe).
const MAX_MSG: u64 = 1 << 31;

enum Step {
    /// A packet went out or a WQE was retired locally; keep going.
    Progress,
    /// Blocked (PSN window, fence, depth, nothing posted); stop until something changes.
    Blocked,
    /// Waiting for room in the path's congestion window.
    Throttled,
}

/// Sends as much as the QP's state, window and budget allow, then delivers any completions
/// that became possible.
pub(crate) fn transmit<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    now: u64,
    out: &mut Vec<Packet>,
) {
    let mut budget = core.cfg.burst;
    let mut throttled = false;
    loop {
        let mut blocked = false;
        if qp.can_send() && !qp.req.rnr_wait && !qp.req.stalled {
            while budget > 0 {
                match step(qp, core, hca, now, out) {
                    Ok(Step::Progress) => budget -= 1,
                    Ok(Step::Blocked) => {
                        blocked = true;
                        break;
                    }
                    Ok(Step::Throttled) => {
                        throttled = true;
                        break;
                    }
                    Err(fault) => {
                        tracing::warn!(qpn = qp.qpn, reason = fault.reason, "malformed send WQE");
                        hca.post_event(portverbs_hal::event::DeviceEvent::Qp {
                            qpn: qp.qpn,
                            kind: portverbs_hal::event::QpEventKind::Fatal,
                        });
                        set_state(qp, core, hca, QpState::Err);
                        return;
                    }
                }
            }
            if budget == 0 {
                core.schedule(qp);
            }
        }
        // Retiring completions can unblock the loop (a fence or the READ/atomic depth waits
        // for in-order completion), so go round again when it did.
        let retired = completer::advance_completions(qp, core, hca);
        if !(blocked && retired > 0 && budget > 0) {
            break;
        }
    }
    if !throttled && budget > 0 {
        // Not waiting for its path's window (any more): out of its queue.
        core.cc.withdraw(qp.qpn, &mut qp.cc, &mut core.woken);
    }
}

/// Transmission moved past WQE `c` without emitting its last packet (it was done already):
/// the next PSN to assign follows its PSNs, if it has any, so that a WQE transmitted for the
/// first time never reuses one.
pub(crate) fn passed(qp: &mut QpCtx, core: &mut Core, c: u32) {
    let s = qp.req.slot(c);
    if s.assigned {
        qp.req.next_psn = psn::add(s.first_psn, s.npsn);
        let in_flight = congestion::in_flight(qp.req.una, qp.req.next_psn);
        core.cc.charge(&mut qp.cc, in_flight, &mut core.woken);
    }
}

/// Packets a message of `len` bytes takes at `mtu` bytes each (at least one: a zero-length
/// message is one packet). Most messages fit one packet; those need no division.
#[inline(always)]
fn packets(len: u64, mtu: u64) -> u32 {
    if len <= mtu {
        1
    } else {
        len.div_ceil(mtu) as u32
    }
}

/// Send WQEs read per fetch burst.
const FETCH_AHEAD: u32 = 16;

fn step<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    now: u64,
    out: &mut Vec<Packet>,
) -> Result<Step, WqeFault> {
    if qp.req.tx == qp.req.fetched {
        if qp.state != QpState::Rts {
            return Ok(Step::Blocked);
        }
        // The producer counter is read once per burst (the posts it shows are all the burst
        // fetches; a later one is fetched when transmission gets there, or by its doorbell).
        let Some(head) = hca.sq_head(qp.qpn) else {
            return Ok(Step::Blocked);
        };
        if !fetch(qp, core, hca, head)? {
            return Ok(Step::Blocked);
        }
        // Fetch the WQEs posted behind it now too, as an HCA's prefetcher does: reading
        // consecutive slots back to back overlaps their cache misses (the host wrote them on
        // another core). A malformed one is left for when transmission reaches it.
        for _ in 1..FETCH_AHEAD {
            if !matches!(fetch(qp, core, hca, head), Ok(true)) {
                break;
            }
        }
    }
    let tx = qp.req.tx;
    let slot = qp.req.slot(tx);
    if let Some(status) = slot.done {
        if status != WcStatus::Success {
            // A local error: nothing after it may start; completions catch up to it.
            qp.req.stalled = true;
            return Ok(Step::Blocked);
        }
        // Done already (a local operation, or acknowledged while a go-back was behind it).
        qp.req.tx = tx.wrapping_add(1);
        qp.req.tx_offset = 0;
        passed(qp, core, tx);
        return Ok(Step::Progress);
    }
    let op = slot.wqe.op;
    if op.is_local() {
        let status = execute_local(qp, core, op);
        let slot = qp.req.slot_mut(tx);
        slot.done = Some(status);
        if status == WcStatus::Success {
            qp.req.tx = tx.wrapping_add(1);
        } else {
            qp.req.stalled = true;
        }
        return Ok(Step::Progress);
    }
    if slot.wqe.flags.contains(SendFlags::FENCE)
        && !slot.assigned
        && qp.req.rd_atomic_outstanding() > 0
    {
        return Ok(Step::Blocked);
    }
    if op.is_read_or_atomic()
        && qp.req.tx_offset == 0
        && qp.req.rd_atomic_outstanding() >= u32::from(qp.attr.max_rd_atomic)
    {
        return Ok(Step::Blocked);
    }
    // The path's congestion window: how many packets this QP may send now.
    let mut room = u32::MAX;
    if qp.init.qp_type == QpType::Rc {
        let in_flight = congestion::in_flight(qp.req.una, qp.req.next_psn);
        let path = (qp.attr.port_num, qp.attr.ah_attr.dgid);
        match core
            .cc
            .grant(qp.qpn, &mut qp.cc, path, in_flight, now, &mut core.woken)
        {
            Grant::Packets(n) => room = n,
            Grant::Wait => {
                if in_flight == 0 {
                    // Nothing of its own is out: nothing to time until it sends again.
                    qp.req.rto_armed = false;
                }
                return Ok(Step::Throttled);
            }
        }
        if qp.cc.probing {
            // A probe's go-back: the rest waits for the responder's answer.
            match congestion::PROBE_PACKETS.checked_sub(in_flight) {
                Some(left) if left > 0 => room = room.min(left),
                _ => return Ok(Step::Blocked),
            }
        }
    }
    let mtu = qp.mtu(core.port_mtu(qp.attr.port_num));
    if !qp.req.slot(tx).assigned {
        if qp.init.qp_type == QpType::Rc
            && qp.req.una != qp.req.next_psn
            && psn::diff(qp.req.next_psn, qp.req.una) >= core.cfg.psn_window as i32
        {
            return Ok(Step::Blocked);
        }
        let len = qp.req.slot(tx).wqe.payload_len();
        let npsn = match op {
            SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. } => 1,
            _ => packets(len, u64::from(mtu)),
        };
        let first = qp.req.next_psn;
        let slot = qp.req.slot_mut(tx);
        slot.assigned = true;
        slot.first_psn = first;
        slot.npsn = npsn;
    }
    emit(qp, core, now, mtu, room, out);
    Ok(Step::Progress)
}

/// Fetches the next posted WQE into the slot ring (the QP is in RTS, `head` is its send
/// queue's producer counter); false when none is posted or the ring of in-flight WQEs is full.
fn fetch<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    head: u32,
) -> Result<bool, WqeFault> {
    let c = qp.req.fetched;
    if c == head || c.wrapping_sub(qp.req.comp) > qp.req.mask {
        return Ok(false);
    }
    let qpn = qp.qpn;
    let slot = qp.req.slot_mut(c);
    hca.read_send_wqe(qpn, c, &mut slot.wqe)?;
    slot.wqe.counter = c;
    slot.assigned = false;
    slot.done = None;
    slot.read_done = 0;
    slot.byte_len = 0;
    let status = validate(qp, core, c);
    if let Err(status) = status {
        qp.req.slot_mut(c).done = Some(status);
    }
    qp.req.fetched = c.wrapping_add(1);
    Ok(true)
}

/// Local checks a requester makes before anything goes on the wire, in this order: the
/// operation exists on the transport (`LOC_QP_OP_ERR`); the message length — at most 2^31,
/// a UD message at most the port MTU, an atomic's local buffer exactly 8 bytes
/// (`LOC_LEN_ERR`); a READ or atomic needs `max_rd_atomic` > 0 (`LOC_QP_OP_ERR`); then every
/// gather entry's key, domain and range (`LOC_PROT_ERR`). A READ's or atomic's scatter list
/// is checked only when its response arrives, so the responder's errors come first (a READ
/// or atomic with a bad rkey and a bad lkey completes with `REM_ACCESS_ERR`). The
/// responder's order for an atomic is in `responder/atomic.rs`.
#[inline(always)]
fn validate(qp: &QpCtx, core: &Core, counter: u32) -> Result<(), WcStatus> {
    let wqe = &qp.req.slot(counter).wqe;
    let t = qp.init.qp_type;
    let allowed = SendOps::of_transport(t).contains(wqe.op.kind());
    if !allowed || (t == QpType::Ud) != wqe.ud.is_some() {
        return Err(WcStatus::LocQpOpErr);
    }
    let len = wqe.payload_len();
    if len > MAX_MSG {
        return Err(WcStatus::LocLenErr);
    }
    if t == QpType::Ud && len > u64::from(core.port_mtu(qp.attr.port_num)) {
        return Err(WcStatus::LocLenErr);
    }
    let atomic = matches!(
        wqe.op,
        SendOp::AtomicCmpSwp { .. } | SendOp::AtomicFetchAdd { .. }
    );
    // An atomic returns exactly 8 bytes: its local buffer must be exactly that long.
    if atomic && wqe.sges.iter().map(|s| u64::from(s.length)).sum::<u64>() != 8 {
        return Err(WcStatus::LocLenErr);
    }
    if wqe.op.is_read_or_atomic() {
        // The scatter list of a READ or an atomic is checked when the response lands in it
        // (`completer::scatter_with`), as rxe and HCAs do: a remote error is reported first.
        return if qp.attr.max_rd_atomic == 0 {
            Err(WcStatus::LocQpOpErr)
        } else {
            Ok(())
        };
    }
    if !wqe.is_inline() {
        for sge in wqe.sges.iter().filter(|s| s.length > 0) {
            core.memory
                .check_local(sge.lkey, qp.init.pd, sge.addr, u64::from(sge.length), false)
                .map_err(|_| WcStatus::LocProtErr)?;
        }
    }
    Ok(())
}

fn execute_local(qp: &mut QpCtx, core: &mut Core, op: SendOp) -> WcStatus {
    let ok = match op {
        SendOp::BindMw { bind } => core.memory.bind(qp.init.pd, qp.qpn, &bind).is_ok(),
        SendOp::LocalInv { rkey } => core.memory.invalidate(rkey, qp.init.pd, qp.qpn).is_ok(),
        _ => false,
    };
    if ok {
        WcStatus::Success
    } else {
        WcStatus::MwBindErr
    }
}

/// The BTH transport of a QP type.
pub(crate) fn service(t: QpType) -> Service {
    match t {
        QpType::Rc => Service::Rc,
        QpType::Uc => Service::Uc,
        QpType::Ud => Service::Ud,
    }
}

fn position(first: bool, last: bool) -> Position {
    match (first, last) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, true) => Position::Last,
        (false, false) => Position::Middle,
    }
}

/// Emits the next packet of WQE `tx` (a train of at most `room` packets) and advances the
/// cursors.
fn emit(qp: &mut QpCtx, core: &mut Core, now: u64, mtu: u32, room: u32, out: &mut Vec<Packet>) {
    let tx = qp.req.tx;
    let off = qp.req.tx_offset;
    let t = qp.init.qp_type;
    let slot = qp.req.slot(tx);
    let wqe = &slot.wqe;
    let len = wqe.payload_len();
    // Most packets start their message: no division for them.
    let pkt_index = if off == 0 {
        0
    } else {
        (off / u64::from(mtu)) as u32
    };
    let psn_now = psn::add(slot.first_psn, pkt_index);
    let mut hdr = TransportHdr::new(Bth::new(Opcode::from_u8(0), qp.attr.dest_qp_num, psn_now));
    let mut payload = PayloadData::Empty;
    let mut train = 1u32;
    let mut train_last = Opcode::from_u8(0xff);
    let last;
    let next_psn;
    match wqe.op {
        SendOp::RdmaRead { remote } => {
            hdr.bth.opcode = Opcode::ReadRequest;
            hdr.reth = Some(Reth {
                va: remote.addr.wrapping_add(off),
                rkey: remote.rkey,
                dma_len: (len - off) as u32,
            });
            hdr.bth.ack_req = true;
            last = true;
            next_psn = psn::add(slot.first_psn, slot.npsn);
        }
        SendOp::AtomicCmpSwp {
            remote,
            compare,
            swap,
        } => {
            hdr.bth.opcode = Opcode::CompareSwap;
            hdr.atomic = Some(AtomicEth {
                va: remote.addr,
                rkey: remote.rkey,
                swap_add: swap,
                compare,
            });
            hdr.bth.ack_req = true;
            last = true;
            next_psn = psn::add(psn_now, 1);
        }
        SendOp::AtomicFetchAdd { remote, add } => {
            hdr.bth.opcode = Opcode::FetchAdd;
            hdr.atomic = Some(AtomicEth {
                va: remote.addr,
                rkey: remote.rkey,
                swap_add: add,
                compare: 0,
            });
            hdr.bth.ack_req = true;
            last = true;
            next_psn = psn::add(psn_now, 1);
        }
        op => {
            let mtu64 = u64::from(mtu);
            // A train: as many packets of this message as the engine may coalesce and the
            // PSN window allows (under 2^23 PSNs outstanding), all MTU-sized but the last.
            // The room is at least one packet, so a message with one packet left is never a
            // train.
            let left = u64::from(packets(len - off, mtu64));
            if left > 1 && core.max_train > 1 && t != QpType::Ud {
                let mut room = u64::from(core.max_train.min(room));
                if t == QpType::Rc {
                    let in_flight = psn::diff(psn_now, qp.req.una).max(0) as u64;
                    room = room.min(
                        u64::from(core.cfg.psn_window)
                            .saturating_sub(in_flight)
                            .max(1),
                    );
                }
                train = left.min(room) as u32;
            }
            let n = (len - off).min(mtu64 * u64::from(train));
            let first = off == 0;
            last = off + n >= len;
            let pos = position(first, last && train == 1);
            let last_pos = position(first && train == 1, last);
            let last_n = n - mtu64 * u64::from(train - 1);
            let (imm, inv) = match op {
                SendOp::SendWithImm { imm } | SendOp::RdmaWriteWithImm { imm, .. } => {
                    (Some(imm), None)
                }
                SendOp::SendWithInv { rkey } => (None, Some(rkey)),
                _ => (None, None),
            };
            let is_write = matches!(
                op,
                SendOp::RdmaWrite { .. } | SendOp::RdmaWriteWithImm { .. }
            );
            // Immediate data and the invalidated key travel in the last packet only (for a
            // train: its last packet, see `train_last`).
            let first_is_last = last && train == 1;
            let opcode = if is_write {
                Opcode::write(service(t), pos, first_is_last && imm.is_some())
            } else {
                Opcode::send(
                    service(t),
                    pos,
                    first_is_last && imm.is_some(),
                    first_is_last && inv.is_some(),
                )
            };
            // validate() only lets through combinations that exist.
            hdr.bth.opcode = opcode.unwrap_or(Opcode::from_u8(0xff));
            train_last = if train == 1 {
                hdr.bth.opcode
            } else if is_write {
                Opcode::write(service(t), last_pos, last && imm.is_some())
                    .unwrap_or(Opcode::from_u8(0xff))
            } else {
                Opcode::send(
                    service(t),
                    last_pos,
                    last && imm.is_some(),
                    last && inv.is_some(),
                )
                .unwrap_or(Opcode::from_u8(0xff))
            };
            if last {
                hdr.imm = imm;
                hdr.ieth = inv;
                hdr.bth.solicited = wqe.flags.contains(SendFlags::SOLICITED);
            }
            if is_write && first {
                if let SendOp::RdmaWrite { remote } | SendOp::RdmaWriteWithImm { remote, .. } = op {
                    hdr.reth = Some(Reth {
                        va: remote.addr,
                        rkey: remote.rkey,
                        dma_len: len as u32,
                    });
                }
            }
            if let Some(ud) = &wqe.ud {
                hdr.bth.dest_qp = ud.remote_qpn;
                let qkey = if ud.remote_qkey & 0x8000_0000 != 0 {
                    qp.attr.qkey
                } else {
                    ud.remote_qkey
                };
                hdr.deth = Some(Deth {
                    qkey,
                    src_qp: qp.qpn,
                });
            }
            hdr.bth.pad_count = ((4 - (last_n % 4)) % 4) as u8;
            payload = gather(qp, core, off, n as u32);
            if t != QpType::Rc {
                // UD and UC complete as soon as the packet leaves (no ACK), and the
                // application may then reuse the buffer at once, as a real HCA allows: its
                // DMA has read the bytes. A reference into that memory would be read only
                // when the fabric delivers the packet, possibly after the buffer was
                // rewritten (a QP1 send slot reused for the next MAD, whose bytes then
                // reached the peer twice while the first MAD was never seen). Copy now.
                payload = payload.into_owned();
            }
            // AckReq also when the window is used up: the ACK is what opens it again.
            hdr.bth.ack_req = t == QpType::Rc
                && (last || qp.req.since_ackreq + train >= core.cfg.ack_req_every.min(room));
            next_psn = psn::add(psn_now, train);
        }
    }
    let (dgid, sgid_index, flow_label, hop_limit, tclass) = match &qp.req.slot(tx).wqe.ud {
        Some(ud) => (
            ud.av.dgid,
            ud.av.sgid_index,
            ud.av.flow_label,
            ud.av.hop_limit,
            ud.av.traffic_class,
        ),
        None => {
            let av = &qp.attr.ah_attr;
            (
                av.dgid,
                av.sgid_index,
                av.flow_label,
                av.hop_limit,
                av.traffic_class,
            )
        }
    };
    if train == 1 {
        train_last = hdr.bth.opcode;
    }
    let pkt = Packet {
        src_gid: core.sgid(qp.attr.port_num, sgid_index),
        dst_gid: dgid,
        flow_label,
        traffic_class: if t == QpType::Rc {
            core.cc.traffic_class(tclass)
        } else {
            tclass
        },
        hop_limit,
        udp_sport: crate::wire::udp_source_port(flow_label, qp.qpn, hdr.bth.dest_qp),
        hdr,
        payload,
        train: train as u16,
        train_last,
        train_mtu: mtu as u16,
    };
    let ack_req = pkt.hdr.bth.ack_req;
    out.push(pkt);
    core.stats.tx_packets += 1;

    // Advance the cursors.
    let req = &mut qp.req;
    req.since_ackreq = if ack_req { 0 } else { req.since_ackreq + 1 };
    if last {
        req.tx = tx.wrapping_add(1);
        req.tx_offset = 0;
        if t != QpType::Rc {
            let slot = req.slot_mut(tx);
            slot.done = Some(WcStatus::Success);
            slot.byte_len = len as u32;
        }
    } else {
        req.tx_offset = off + u64::from(mtu) * u64::from(train);
    }
    if psn::diff(next_psn, req.sent_end) > 0 {
        req.sent_end = next_psn;
    } else {
        core.stats.retransmits += 1;
    }
    req.next_psn = next_psn;
    if t == QpType::Rc {
        let in_flight = congestion::in_flight(req.una, next_psn);
        core.cc.charge(&mut qp.cc, in_flight, &mut core.woken);
        core.cc.sent(&mut qp.cc, psn::add(next_psn, psn::MASK), now);
        if !qp.cc.pto.armed {
            arm_probe(qp, core, now);
        }
        if !qp.req.rto_armed {
            arm_retransmit(qp, core, now);
        }
    } else {
        qp.req.una = next_psn;
    }
}

/// (Re)arms the local ACK timeout (`timeout` 0 means none), lengthened by the QP's back-off
/// after timeouts without progress.
pub(crate) fn arm_retransmit(qp: &mut QpCtx, core: &mut Core, now: u64) {
    match ack_timeout_ns(qp.attr.timeout) {
        Some(ns) => {
            let at = now + (ns << qp.cc.rto_backoff);
            qp.req.rto_deadline = at;
            qp.req.rto_armed = true;
            // A queued entry due no later than `at` re-queues itself when it fires early; only
            // an earlier deadline needs a new one.
            if qp.req.rto_queued.is_none_or(|q| q > at) {
                qp.req.rto_generation = core.arm_timer(qp.qpn, TimerKind::Retransmit, at);
                qp.req.rto_queued = Some(at);
            }
        }
        None => qp.req.rto_armed = false,
    }
}

/// (Re)arms the probe timeout from the path's round trips. Once it has backed off to the
/// local ACK timeout it stays off: that timer covers the rest (a peer that answers nothing
/// is not probed for ever).
pub(crate) fn arm_probe(qp: &mut QpCtx, core: &mut Core, now: u64) {
    let pto = core.cc.pto_ns(&qp.cc);
    let ack_timeout = ack_timeout_ns(qp.attr.timeout).map(|ns| ns << qp.cc.rto_backoff);
    match pto.filter(|&p| ack_timeout.is_none_or(|t| p < t)) {
        Some(ns) => qp.cc.pto.arm(
            &mut core.timers,
            &mut core.timer_generation,
            qp.qpn,
            TimerKind::Probe,
            now + ns,
        ),
        None => qp.cc.pto.armed = false,
    }
}

/// Describes payload bytes `[off, off + n)` of WQE `tx` without copying them.
fn gather(qp: &QpCtx, core: &Core, off: u64, n: u32) -> PayloadData {
    if n == 0 {
        return PayloadData::Empty;
    }
    let wqe = &qp.req.slot(qp.req.tx).wqe;
    if wqe.is_inline() {
        let start = off as usize;
        let end = (start + n as usize).min(wqe.inline_data.len());
        return PayloadData::from_slice(&wqe.inline_data[start.min(end)..end]);
    }
    let mut segs: SmallVec<[MemSeg; 2]> = SmallVec::new();
    let mut pos = 0u64;
    let mut want = u64::from(n);
    let mut at = off;
    for sge in &wqe.sges {
        let sl = u64::from(sge.length);
        if want == 0 {
            break;
        }
        if at < pos + sl {
            let within = at - pos;
            let take = (sl - within).min(want);
            // Keys were checked when the WQE was fetched; a registration removed since then
            // makes the bytes vanish (the responder sees a short message and errors out).
            if let Ok(span) =
                core.memory
                    .local(sge.lkey, qp.init.pd, sge.addr + within, take, false)
            {
                segs.push(MemSeg {
                    mem: span.mem,
                    offset: span.offset,
                    len: take as u32,
                });
            }
            want -= take;
            at += take;
        }
        pos += sl;
    }
    PayloadData::Mem(segs)
}

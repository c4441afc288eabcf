//! The responder: PSN and opcode-sequence checks, duplicate handling, key and rights checks,
//! execution of SEND, RDMA WRITE, RDMA READ and atomics, receive completions, ACK/NAK
//! generation (facts/ib-cm-and-rocev2.md §6.3), and UD/UC reception.

use std::net::IpAddr;

use portverbs_hal::attr::rnr_timer_ns;
use portverbs_hal::event::{DeviceEvent, QpEventKind};
use portverbs_hal::types::{AccessFlags, QpState, QpType};
use portverbs_hal::wc::{Cqe, WcFlags, WcOpcode, WcStatus};

use super::Core;
use super::hca::{Hca, RecvSource};
use super::memory::{KeyError, Span};
use super::modify::set_state;
use super::packet::{MemSeg, Packet, PayloadData, psn};
use super::qp::{InMsg, QpCtx, Resource};
use crate::wire::{Aeth, AethSyndrome, AtomicAckEth, Bth, NakCode, Opcode, Position, TransportHdr};

/// Size of the GRH area at the start of a UD receive buffer.
const GRH_LEN: usize = 40;

/// Handles a request packet (SEND, WRITE, READ request, atomic) for this QP.
pub(crate) fn on_request<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    now: u64,
    pkt: &Packet,
    out: &mut Vec<Packet>,
) {
    let _ = now;
    if !qp.can_receive() || pkt.hdr.bth.pkey & 0x7fff != 0x7fff {
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

fn on_rc<H: Hca + ?Sized>(
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
            send_aeth(
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
    let op = pkt.hdr.bth.opcode;
    if !sequence_ok(qp, op) {
        nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest);
        return;
    }
    if op.is_read_request() {
        read_request(qp, core, hca, pkt, out);
    } else if op.is_atomic() {
        atomic(qp, core, hca, pkt, out);
    } else if op.is_send() {
        send_packet(qp, core, hca, pkt, out);
    } else if op.is_write() {
        write_packet(qp, core, hca, pkt, out);
    } else {
        nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest);
    }
}

/// A FIRST must follow a completed message; MIDDLE/LAST must continue one of the same kind.
fn sequence_ok(qp: &QpCtx, op: Opcode) -> bool {
    match (&qp.resp.msg, op.position()) {
        (None, Some(Position::Middle | Position::Last)) => false,
        (None, _) => true,
        (Some(InMsg::Send), Some(Position::Middle | Position::Last)) => op.is_send(),
        (Some(InMsg::Write { .. }), Some(Position::Middle | Position::Last)) => op.is_write(),
        (Some(_), _) => false,
    }
}

fn mtu_of(qp: &QpCtx, core: &Core) -> u64 {
    u64::from(qp.mtu(core.port_mtu(qp.attr.port_num)))
}

/// Payload length rules: FIRST/MIDDLE carry exactly one MTU, LAST/ONLY at most one; a train
/// of k packets carries k − 1 full MTUs plus its last packet's share.
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
fn ends(pkt: &Packet) -> bool {
    matches!(
        pkt.train_last.position(),
        Some(Position::Last | Position::Only)
    )
}

fn send_packet<H: Hca + ?Sized>(
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
fn invalidation_error<H: Hca + ?Sized>(
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

fn write_packet<H: Hca + ?Sized>(
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

/// Opens an incoming RDMA WRITE message from its RETH, checking the rkey for the whole length
/// before any byte lands. `Err(None)`: no RETH; `Err(Some(_))`: the key check failed.
fn open_write(qp: &mut QpCtx, core: &Core, pkt: &Packet) -> Result<(), Option<KeyError>> {
    let reth = pkt.hdr.reth.ok_or(None)?;
    let len = u64::from(reth.dma_len);
    let span = if len == 0 {
        None
    } else {
        Some(remote(qp, core, reth.rkey, reth.va, len, AccessFlags::REMOTE_WRITE).map_err(Some)?)
    };
    qp.resp.msg = Some(InMsg::Write { span, len });
    qp.resp.offset = 0;
    Ok(())
}

/// Places one (train of) RDMA WRITE packet(s) of the current message at the message offset
/// and, on its last packet, completes a WRITE with immediate into the held receive WQE. Checks
/// the payload against the RETH length before touching memory; the caller turns an error into
/// its transport's reaction (RC: a NAK; UC: a silent drop).
fn place_write<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    pkt: &Packet,
    ends_msg: bool,
) -> Result<(), NakCode> {
    let n = pkt.payload.len() as u64;
    let at = qp.resp.offset;
    let Some(InMsg::Write { span, len }) = &qp.resp.msg else {
        return Err(NakCode::InvalidRequest);
    };
    let len = *len;
    if at + n > len || (ends_msg && at + n != len) {
        return Err(NakCode::InvalidRequest);
    }
    if let Some(span) = span {
        pkt.payload
            .copy_range_to(0, n as usize, &span.mem, span.offset + at as usize)
            .map_err(|_| NakCode::RemoteOperationalError)?;
    }
    qp.resp.offset += n;
    if ends_msg {
        if pkt.train_last.has_imm() {
            complete_recv(
                qp,
                core,
                hca,
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                pkt,
                len as u32,
            );
        }
        qp.resp.msg = None;
    }
    Ok(())
}

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

fn read_request<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    pkt: &Packet,
    out: &mut Vec<Packet>,
) {
    let p = pkt.hdr.bth.psn;
    let Some(reth) = pkt.hdr.reth else {
        nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest);
        return;
    };
    if qp.resp.resources.is_empty() {
        nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest);
        return;
    }
    let len = u64::from(reth.dma_len);
    let span = if len == 0 {
        None
    } else {
        match remote(qp, core, reth.rkey, reth.va, len, AccessFlags::REMOTE_READ) {
            Ok(span) => Some(span),
            Err(_) => {
                access_error(qp, core, hca, out, p);
                return;
            }
        }
    };
    let mtu = mtu_of(qp, core);
    let npsn = len.div_ceil(mtu).max(1) as u32;
    store_resource(
        qp,
        Resource::Read {
            first_psn: p,
            npsn,
            va: reth.va,
            rkey: reth.rkey,
            len: reth.dma_len,
        },
    );
    qp.resp.msn = psn::add(qp.resp.msn, 1);
    read_responses(qp, core, out, p, 0, npsn, span.as_ref(), len);
    qp.resp.epsn = psn::add(p, npsn);
    // A READ answers with data; an ACK owed for earlier PSNs is covered by its AETH.
    qp.resp.pending_ack = None;
}

/// Emits READ response packets `from..npsn` of a request starting at `first_psn`.
#[allow(clippy::too_many_arguments)]
fn read_responses(
    qp: &QpCtx,
    core: &mut Core,
    out: &mut Vec<Packet>,
    first_psn: u32,
    from: u32,
    npsn: u32,
    span: Option<&Span>,
    len: u64,
) {
    let mtu = mtu_of(qp, core);
    let pos_of = |i: u32| match (i == 0, i + 1 == npsn) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, true) => Position::Last,
        (false, false) => Position::Middle,
    };
    let mut i = from;
    while i < npsn {
        // Consecutive responses travel as one train when the engine may coalesce them.
        let k = (npsn - i).min(core.max_train.max(1));
        let off = u64::from(i) * mtu;
        let n = (len - off.min(len)).min(mtu * u64::from(k));
        let last_n = n - (mtu * u64::from(k - 1)).min(n);
        let pos = pos_of(i);
        let mut hdr = TransportHdr::new(bth(
            qp,
            Opcode::read_response(pos).unwrap_or(Opcode::from_u8(0xff)),
            psn::add(first_psn, i),
        ));
        let last_pos = pos_of(i + k - 1);
        if pos != Position::Middle || last_pos != Position::Middle {
            hdr.aeth = Some(Aeth {
                syndrome: AethSyndrome::Ack { credits: 0x1f },
                msn: qp.resp.msn,
            });
        }
        hdr.bth.pad_count = ((4 - (last_n % 4)) % 4) as u8;
        let payload = match span {
            Some(s) if n > 0 => PayloadData::Mem(smallvec::smallvec![MemSeg {
                mem: s.mem.clone(),
                offset: s.offset + off as usize,
                len: n as u32,
            }]),
            _ => PayloadData::Empty,
        };
        out.push(Packet {
            train: k as u16,
            train_last: Opcode::read_response(last_pos).unwrap_or(Opcode::from_u8(0xff)),
            train_mtu: mtu as u16,
            ..reply(qp, core, hdr, payload)
        });
        i += k;
    }
}

fn atomic<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    pkt: &Packet,
    out: &mut Vec<Packet>,
) {
    let p = pkt.hdr.bth.psn;
    let Some(a) = pkt.hdr.atomic else {
        nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest);
        return;
    };
    // The order of the checks (rxe's): responder resources, then the QP's and the key's
    // rights and the range (REM_ACCESS_ERR), and only then the alignment (REM_INV_REQ_ERR).
    if qp.resp.resources.is_empty() {
        nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest);
        return;
    }
    let Ok(span) = remote(qp, core, a.rkey, a.va, 8, AccessFlags::REMOTE_ATOMIC) else {
        access_error(qp, core, hca, out, p);
        return;
    };
    if a.va % 8 != 0 {
        nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest);
        return;
    }
    let result = if pkt.hdr.bth.opcode == Opcode::CompareSwap {
        span.mem
            .compare_swap_u64(span.offset, a.compare, a.swap_add)
    } else {
        span.mem.fetch_add_u64(span.offset, a.swap_add)
    };
    let Ok(orig) = result else {
        nak_fatal(qp, core, hca, out, p, NakCode::InvalidRequest);
        return;
    };
    store_resource(qp, Resource::Atomic { psn: p, orig });
    qp.resp.msn = psn::add(qp.resp.msn, 1);
    qp.resp.epsn = psn::add(p, 1);
    qp.resp.pending_ack = None;
    out.push(atomic_ack(qp, core, p, orig));
}

fn atomic_ack(qp: &QpCtx, core: &mut Core, p: u32, orig: u64) -> Packet {
    let mut hdr = TransportHdr::new(bth(qp, Opcode::AtomicAcknowledge, p));
    hdr.aeth = Some(Aeth {
        syndrome: AethSyndrome::Ack { credits: 0x1f },
        msn: qp.resp.msn,
    });
    hdr.atomic_ack = Some(AtomicAckEth { orig });
    reply(qp, core, hdr, PayloadData::Empty)
}

fn store_resource(qp: &mut QpCtx, r: Resource) {
    let n = qp.resp.resources.len();
    if n == 0 {
        return;
    }
    let i = qp.resp.next_resource % n;
    qp.resp.resources[i] = Some(r);
    qp.resp.next_resource = (i + 1) % n;
}

/// A request with a PSN behind the expected one (IBA 9.9.2.2).
fn duplicate(qp: &mut QpCtx, core: &mut Core, pkt: &Packet, out: &mut Vec<Packet>) {
    let p = pkt.hdr.bth.psn;
    let op = pkt.hdr.bth.opcode;
    if op.is_read_request() {
        let Some(reth) = pkt.hdr.reth else { return };
        let found = qp.resp.resources.iter().flatten().find_map(|r| match *r {
            Resource::Read {
                first_psn,
                npsn,
                va,
                rkey,
                len,
            } if psn::diff(p, first_psn) >= 0
                && psn::diff(p, psn::add(first_psn, npsn)) < 0
                && rkey == reth.rkey =>
            {
                Some((first_psn, npsn, va, len))
            }
            _ => None,
        });
        let Some((first_psn, npsn, va, len)) = found else {
            return; // no resource: drop silently
        };
        let from = psn::diff(p, first_psn) as u32;
        let mtu = mtu_of(qp, core);
        // The retried request must lie inside the original one.
        if reth.va != va + u64::from(from) * mtu {
            return;
        }
        let span = if len == 0 {
            None
        } else {
            remote(
                qp,
                core,
                rkey_of(pkt),
                va,
                u64::from(len),
                AccessFlags::REMOTE_READ,
            )
            .ok()
        };
        if len > 0 && span.is_none() {
            return;
        }
        read_responses(
            qp,
            core,
            out,
            first_psn,
            from,
            npsn,
            span.as_ref(),
            u64::from(len),
        );
    } else if op.is_atomic() {
        let cached = qp.resp.resources.iter().flatten().find_map(|r| match *r {
            Resource::Atomic { psn: rp, orig } if rp == p => Some(orig),
            _ => None,
        });
        if let Some(orig) = cached {
            out.push(atomic_ack(qp, core, p, orig));
        }
    } else {
        // SEND/WRITE already executed: acknowledge what we have.
        let last = psn::add(qp.resp.epsn, psn::MASK);
        send_aeth(qp, core, out, last, AethSyndrome::Ack { credits: 0x1f });
    }
}

fn rkey_of(pkt: &Packet) -> u32 {
    pkt.hdr.reth.map_or(0, |r| r.rkey)
}

/// Takes a receive WQE for a new message (kept across the message's packets).
fn take_recv<H: Hca + ?Sized>(qp: &mut QpCtx, hca: &mut H) -> Result<bool, ()> {
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
fn scatter_recv(qp: &QpCtx, core: &Core, pkt: &Packet, skip: u64) -> Result<(), WcStatus> {
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
fn scatter_bytes(
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
fn complete_recv<H: Hca + ?Sized>(
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
        qpn: qp.qpn,
        is_send: false,
        wqe_index: qp.resp.recv.wqe_index as u16,
        status,
        opcode,
        byte_len: len,
        imm,
        flags,
        src_qp: qp.attr.dest_qp_num,
        ..Cqe::default()
    };
    if let Some(deth) = pkt.hdr.deth {
        cqe.src_qp = deth.src_qp;
        cqe.flags |= WcFlags::GRH;
    }
    let solicited = pkt.hdr.bth.solicited;
    if !hca.post_completion(qp.init.recv_cqn, &cqe, solicited) {
        // The receive CQ overran (or is in error): the QP goes to ERR (IBA 11.4.2.1).
        set_state(qp, core, hca, QpState::Err);
    }
}

/// The packet was executed: advance the expected PSN and owe an ACK if asked for.
fn accept(qp: &mut QpCtx, core: &mut Core, pkt: &Packet) {
    let last = psn::add(pkt.hdr.bth.psn, pkt.psn_count() - 1);
    qp.resp.epsn = psn::add(last, 1);
    if pkt.hdr.bth.ack_req {
        qp.resp.pending_ack = Some(last);
        if !qp.ack_scheduled {
            qp.ack_scheduled = true;
            core.acks.push(qp.qpn);
        }
    }
}

/// Sends the coalesced ACK, if one is owed.
pub(crate) fn flush_ack(qp: &mut QpCtx, core: &mut Core, out: &mut Vec<Packet>) {
    qp.ack_scheduled = false;
    if let Some(p) = qp.resp.pending_ack.take() {
        send_aeth(qp, core, out, p, AethSyndrome::Ack { credits: 0x1f });
    }
}

fn rnr(qp: &mut QpCtx, core: &mut Core, out: &mut Vec<Packet>, p: u32) {
    core.stats.rnr_naks += 1;
    let timer = qp.attr.min_rnr_timer & 0x1f;
    let _ = rnr_timer_ns(timer);
    send_aeth(qp, core, out, p, AethSyndrome::RnrNak { timer });
}

/// A remote access violation: NAK, QP to ERR, and an access-error event on this side.
fn access_error<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    out: &mut Vec<Packet>,
    p: u32,
) {
    hca.post_event(DeviceEvent::Qp {
        qpn: qp.qpn,
        kind: QpEventKind::AccessError,
    });
    nak_fatal(qp, core, hca, out, p, NakCode::RemoteAccessError);
}

/// A NAK that ends the connection: the QP goes to ERR (IBA 9.9.3 class C errors).
fn nak_fatal<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    out: &mut Vec<Packet>,
    p: u32,
    code: NakCode,
) {
    if code == NakCode::InvalidRequest {
        hca.post_event(DeviceEvent::Qp {
            qpn: qp.qpn,
            kind: QpEventKind::RequestError,
        });
    }
    send_aeth(qp, core, out, p, AethSyndrome::Nak(code));
    set_state(qp, core, hca, QpState::Err);
}

fn bth(qp: &QpCtx, opcode: Opcode, p: u32) -> Bth {
    Bth {
        opcode,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        tver: 0,
        pkey: 0xffff,
        fecn: false,
        becn: false,
        dest_qp: qp.attr.dest_qp_num,
        ack_req: false,
        psn: p,
    }
}

fn send_aeth(
    qp: &mut QpCtx,
    core: &mut Core,
    out: &mut Vec<Packet>,
    p: u32,
    syndrome: AethSyndrome,
) {
    let mut hdr = TransportHdr::new(bth(qp, Opcode::Acknowledge, p));
    hdr.aeth = Some(Aeth {
        syndrome,
        msn: qp.resp.msn,
    });
    if qp.resp.pending_ack.is_some_and(|a| psn::diff(a, p) <= 0) {
        qp.resp.pending_ack = None;
    }
    out.push(reply(qp, core, hdr, PayloadData::Empty));
}

/// A response packet back to the connected peer.
fn reply(qp: &QpCtx, core: &mut Core, hdr: TransportHdr, payload: PayloadData) -> Packet {
    core.stats.tx_packets += 1;
    let av = &qp.attr.ah_attr;
    Packet {
        flow_label: av.flow_label,
        traffic_class: av.traffic_class,
        hop_limit: av.hop_limit,
        udp_sport: crate::wire::udp_source_port(av.flow_label, qp.qpn, qp.attr.dest_qp_num),
        ..Packet::new(
            core.sgid(qp.attr.port_num, av.sgid_index),
            av.dgid,
            hdr,
            payload,
        )
    }
}

/// UC: no ACKs, no NAKs; a gap drops the rest of the message (facts §6.3).
fn on_uc<H: Hca + ?Sized>(qp: &mut QpCtx, core: &mut Core, hca: &mut H, pkt: &Packet) {
    let p = pkt.hdr.bth.psn;
    let k = pkt.psn_count();
    let op = pkt.hdr.bth.opcode;
    let starts = matches!(op.position(), Some(Position::First | Position::Only));
    if p != qp.resp.epsn || qp.resp.drop_msg {
        if starts {
            qp.resp.drop_msg = false;
            qp.resp.msg = None;
        } else {
            qp.resp.drop_msg = true;
            qp.resp.epsn = psn::add(p, k);
            core.stats.dropped += 1;
            return;
        }
    }
    if !sequence_ok(qp, op) || !length_ok(qp, core, pkt) {
        qp.resp.msg = None;
        qp.resp.drop_msg = true;
        qp.resp.epsn = psn::add(p, k);
        return;
    }
    if op.is_send() {
        if starts && !matches!(take_recv(qp, hca), Ok(true)) {
            qp.resp.drop_msg = !ends(pkt);
            qp.resp.epsn = psn::add(p, k);
            core.stats.dropped += 1;
            return;
        }
        if starts {
            qp.resp.msg = Some(InMsg::Send);
            qp.resp.offset = 0;
        }
        match scatter_recv(qp, core, pkt, 0) {
            Ok(()) => {
                qp.resp.offset += pkt.payload.len() as u64;
                if ends(pkt) {
                    let len = qp.resp.offset as u32;
                    complete_recv(qp, core, hca, WcStatus::Success, WcOpcode::Recv, pkt, len);
                    qp.resp.msg = None;
                }
            }
            Err(WcStatus::LocLenErr) => {
                drop_too_long(qp, core, hca, pkt);
                qp.resp.drop_msg = !ends(pkt);
            }
            Err(status) => {
                complete_recv(qp, core, hca, status, WcOpcode::Recv, pkt, 0);
                qp.resp.msg = None;
                qp.resp.drop_msg = true;
            }
        }
        qp.resp.epsn = psn::add(p, k);
    } else if op.is_write() {
        let ends_msg = ends(pkt);
        if ends_msg && pkt.train_last.has_imm() && !matches!(take_recv(qp, hca), Ok(true)) {
            qp.resp.msg = None;
            qp.resp.epsn = psn::add(p, k);
            return;
        }
        if starts && open_write(qp, core, pkt).is_err() {
            // UC: silently dropped.
            qp.resp.drop_msg = !ends_msg;
            qp.resp.epsn = psn::add(p, k);
            core.stats.dropped += 1;
            return;
        }
        if place_write(qp, core, hca, pkt, ends_msg).is_err() {
            // UC: a message that does not fit its RETH length is silently dropped.
            qp.resp.msg = None;
            qp.resp.drop_msg = !ends_msg;
            core.stats.dropped += 1;
        }
        qp.resp.epsn = psn::add(p, k);
    }
}

/// UD: Q_Key check, GRH area, one packet per message; errors never change the QP state.
fn on_ud<H: Hca + ?Sized>(qp: &mut QpCtx, core: &mut Core, hca: &mut H, pkt: &Packet) {
    let Some(deth) = pkt.hdr.deth else {
        core.stats.dropped += 1;
        return;
    };
    if deth.qkey != qp.attr.qkey
        || !matches!(pkt.hdr.bth.opcode.position(), Some(Position::Only) | None)
    {
        core.stats.dropped += 1;
        return;
    }
    match take_recv(qp, hca) {
        Ok(true) => {}
        _ => {
            core.stats.dropped += 1;
            return;
        }
    }
    qp.resp.offset = 0;
    if (GRH_LEN + pkt.payload.len()) as u64 > qp.resp.recv.capacity() {
        // Checked before a byte is written: on a QP's own receive queue the buffer is left
        // untouched as well as posted.
        drop_too_long(qp, core, hca, pkt);
        return;
    }
    let grh = grh_area(pkt);
    let mut status = scatter_bytes(qp, core, 0, GRH_LEN as u64, |span, src, len| {
        use portverbs_hal::DmaMemory;
        span.mem
            .write(span.offset, &grh[src..src + len])
            .map_err(|_| WcStatus::LocProtErr)
    });
    if status.is_ok() {
        status = scatter_recv(qp, core, pkt, GRH_LEN as u64);
    }
    let len = (GRH_LEN + pkt.payload.len()) as u32;
    match status {
        Ok(()) => complete_recv(qp, core, hca, WcStatus::Success, WcOpcode::Recv, pkt, len),
        Err(s) => complete_recv(qp, core, hca, s, WcOpcode::Recv, pkt, 0),
    }
}

/// A UD or UC message that does not fit the receive it would land in. The QP's state does
/// not change. On the QP's own receive queue this is IBA class D: the message is dropped and
/// the receive stays posted (held here, unchanged in the queue's order) for the next message,
/// as rxe does. A receive from an SRQ was already taken from the shared queue when its size
/// became known, so it completes with `LOC_LEN_ERR` (class E; rxe reports `REM_INV_REQ_ERR`
/// there, hardware the local length error).
fn drop_too_long<H: Hca + ?Sized>(qp: &mut QpCtx, core: &mut Core, hca: &mut H, pkt: &Packet) {
    core.stats.dropped += 1;
    qp.resp.msg = None;
    qp.resp.offset = 0;
    if let RecvSource::Srq { .. } = qp.recv_source() {
        complete_recv(qp, core, hca, WcStatus::LocLenErr, WcOpcode::Recv, pkt, 0);
    }
}

/// The 40-byte area a UD receive starts with: the IPv6 header, or for RoCEv2 over IPv4 20
/// reserved bytes followed by the IPv4 header (as Linux and rdma-core present it).
fn grh_area(pkt: &Packet) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    let payload_len =
        pkt.payload.len() + pkt.hdr.len() + usize::from(pkt.hdr.bth.pad_count) + 4 + 8;
    match (pkt.src_gid.to_ip(), pkt.dst_gid.to_ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let total = (20 + payload_len) as u16;
            let h = &mut g[20..];
            h[0] = 0x45;
            h[1] = pkt.traffic_class;
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[6] = 0x40;
            h[8] = pkt.hop_limit;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            let mut sum = 0u32;
            for w in h.chunks_exact(2) {
                sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
            }
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        }
        _ => {
            let vtf =
                (6u32 << 28) | (u32::from(pkt.traffic_class) << 20) | (pkt.flow_label & 0xf_ffff);
            g[0..4].copy_from_slice(&vtf.to_be_bytes());
            g[4..6].copy_from_slice(&(payload_len as u16).to_be_bytes());
            g[6] = 17;
            g[7] = pkt.hop_limit;
            g[8..24].copy_from_slice(&pkt.src_gid.0);
            g[24..40].copy_from_slice(&pkt.dst_gid.0);
        }
    }
    g
}

//! RDMA READ requests and the responses the responder owes.
//!
//! A READ is checked (key, rights, range) when it arrives and kept in a responder resource
//! (IBA 9.5.3) with a cursor, the PSN of its next response; its responses are generated as the
//! link drains them, as rxe's responder does (drivers/infiniband/sw/rxe/rxe_resp.c, one
//! response per pass of its task): [`respond`] sends at most `burst` packets (or trains) per
//! call and leaves the QP on the engine's work list for the rest, so a QP holds a fixed-size
//! ring of resources whatever the READ sizes, and a turn's output is bounded. Responses go
//! out in PSN order, oldest resource first; an ACK or NAK for a later request waits behind
//! them (`ack.rs`). Each later turn checks the key again (as rxe re-checks its MR for every
//! continuation): an MR deregistered in the middle ends the READ with a remote access NAK.
//!
//! The resources are a ring of `max_dest_rd_atomic` entries; a new READ or atomic takes the
//! oldest. rxe recycles the oldest whatever its state, which is safe there because rxe takes
//! no new request while a READ reply is in progress. Here later requests are executed while
//! a READ's responses are still going out (IBA allows a later request to execute before an
//! RDMA READ's data is returned; that is what the fence is for), so the oldest resource may
//! still owe responses of its own request. Then every resource does (they are answered in
//! order), the requester has more READs and atomics outstanding than the `max_dest_rd_atomic`
//! it was granted (none of them can have completed), and evicting one would silently drop
//! responses it waits for, which it could only detect by running out of retries. So such a
//! request is an invalid request (NAK 0x61, the QP to ERR), as rxe treats a READ or atomic
//! with no responder resources at all. A resource owing only a replay for a duplicate does
//! not count: a delayed duplicate from the network may restart a READ the requester
//! completed long ago.

use portverbs_hal::types::AccessFlags;

use super::super::Core;
use super::super::hca::Hca;
use super::super::packet::{MemSeg, Packet, PayloadData, psn};
use super::super::qp::{QpCtx, ReadResource, Resource};
use super::ack::{access_error, bth, nak_fatal, reply, send_aeth};
use super::atomic::atomic_ack;
use super::{mtu_of, remote};
use crate::wire::{Aeth, AethSyndrome, NakCode, Opcode, Position, TransportHdr};

pub(super) fn read_request<H: Hca + ?Sized>(
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
    if !resource_free(qp) {
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
    let npsn = len.div_ceil(mtu_of(qp, core)).max(1) as u32;
    qp.resp.msn = psn::add(qp.resp.msn, 1);
    store_resource(
        qp,
        Resource::Read(ReadResource {
            first_psn: p,
            npsn,
            va: reth.va,
            rkey: reth.rkey,
            len: reth.dma_len,
            msn: qp.resp.msn,
            next: 0,
            sent: false,
            span,
        }),
    );
    qp.resp.epsn = psn::add(p, npsn);
    // The READ's responses acknowledge everything before it.
    qp.resp.pending_ack = None;
    owe_responses(qp, core);
}

/// True when a new READ or atomic may take a resource: the QP has some (with
/// `max_dest_rd_atomic` 0 it takes none at all), and the oldest does not still owe responses
/// to its own request (see the module documentation).
pub(super) fn resource_free(qp: &QpCtx) -> bool {
    let n = qp.resp.resources.len();
    n > 0
        && !qp.resp.resources[qp.resp.next_resource % n]
            .as_ref()
            .is_some_and(Resource::unanswered)
}

/// Puts `r` in the oldest resource (checked free by [`resource_free`]).
pub(super) fn store_resource(qp: &mut QpCtx, r: Resource) {
    let n = qp.resp.resources.len();
    if n == 0 {
        return;
    }
    let i = qp.resp.next_resource % n;
    qp.resp.resources[i] = Some(r);
    qp.resp.next_resource = (i + 1) % n;
}

/// Some resource owes responses now: they go out in the QP's next work turn.
pub(super) fn owe_responses(qp: &mut QpCtx, core: &mut Core) {
    qp.resp.responding = true;
    core.schedule(qp);
}

/// Sends the responses the QP owes, oldest resource first, at most `burst` packets (or
/// trains) per call; leaves the QP scheduled when some are left. Once all are out, the ACK
/// and the NAK that waited behind them follow.
pub(crate) fn respond<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    out: &mut Vec<Packet>,
) {
    if !qp.resp.responding {
        return;
    }
    let mut budget = core.cfg.burst.max(1);
    let n = qp.resp.resources.len();
    for k in 0..n {
        let i = (qp.resp.next_resource + k) % n;
        let Some(r) = qp.resp.resources[i].as_mut() else {
            continue;
        };
        if !r.owed() {
            continue;
        }
        if budget == 0 {
            core.schedule(qp);
            return;
        }
        match r {
            Resource::Atomic(a) => {
                let a = *a;
                out.push(atomic_ack(qp, core, a.psn, a.orig, a.msn));
                if let Some(Resource::Atomic(a)) = qp.resp.resources[i].as_mut() {
                    a.owed = false;
                    a.sent = true;
                }
                budget -= 1;
            }
            Resource::Read(_) => {
                let Some(Resource::Read(mut r)) = qp.resp.resources[i].take() else {
                    continue;
                };
                let result = read_responses(qp, core, &mut r, &mut budget, out);
                let first_psn = r.first_psn;
                qp.resp.resources[i] = Some(Resource::Read(r));
                if result.is_err() {
                    // The MR went away (or lost its rights) in the middle of the READ.
                    access_error(qp, core, hca, out, first_psn);
                    return;
                }
            }
        }
    }
    let left = qp.resp.resources.iter().flatten().any(Resource::owed);
    if left {
        core.schedule(qp);
        return;
    }
    qp.resp.responding = false;
    if let Some(p) = qp.resp.pending_ack.take() {
        send_aeth(qp, core, out, p, AethSyndrome::Ack { credits: 0x1f });
    }
    if let Some((p, syndrome)) = qp.resp.held_nak.take() {
        send_aeth(qp, core, out, p, syndrome);
    }
}

/// Emits READ responses from `r.next` on while `budget` lasts (one unit per packet or train),
/// advancing the cursor.
///
/// # Errors
/// The key no longer allows reading the rest of the READ.
fn read_responses(
    qp: &QpCtx,
    core: &mut Core,
    r: &mut ReadResource,
    budget: &mut u32,
    out: &mut Vec<Packet>,
) -> Result<(), ()> {
    let mtu = mtu_of(qp, core);
    let len = u64::from(r.len);
    let base = (u64::from(r.next) * mtu).min(len);
    // The span the request's (or the duplicate's) key check found serves the first turn;
    // later turns check the key again.
    let span = match r.span.take() {
        Some(s) => Some(s),
        None if len > base => Some(
            remote(
                qp,
                core,
                r.rkey,
                r.va + base,
                len - base,
                AccessFlags::REMOTE_READ,
            )
            .map_err(|_| ())?,
        ),
        None => None,
    };
    let npsn = r.npsn;
    let pos_of = |i: u32| match (i == 0, i + 1 == npsn) {
        (true, true) => Position::Only,
        (true, false) => Position::First,
        (false, true) => Position::Last,
        (false, false) => Position::Middle,
    };
    while r.next < npsn && *budget > 0 {
        let i = r.next;
        // Consecutive responses travel as one train when the engine may coalesce them.
        let k = (npsn - i).min(core.max_train.max(1));
        let off = (u64::from(i) * mtu).min(len);
        let n = (len - off).min(mtu * u64::from(k));
        let last_n = n - (mtu * u64::from(k - 1)).min(n);
        let pos = pos_of(i);
        let mut hdr = TransportHdr::new(bth(
            qp,
            Opcode::read_response(pos).unwrap_or(Opcode::from_u8(0xff)),
            psn::add(r.first_psn, i),
        ));
        let last_pos = pos_of(i + k - 1);
        if pos != Position::Middle || last_pos != Position::Middle {
            hdr.aeth = Some(Aeth {
                syndrome: AethSyndrome::Ack { credits: 0x1f },
                msn: r.msn,
            });
        }
        hdr.bth.pad_count = ((4 - (last_n % 4)) % 4) as u8;
        let payload = match &span {
            Some(s) if n > 0 => PayloadData::Mem(smallvec::smallvec![MemSeg {
                mem: s.mem.clone(),
                offset: s.offset + (off - base) as usize,
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
        r.next += k;
        *budget -= 1;
    }
    if r.next >= npsn {
        r.sent = true;
    }
    Ok(())
}

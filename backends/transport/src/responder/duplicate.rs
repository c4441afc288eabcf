//! Duplicate requests (IBA 9.9.2.2): a READ restarts its resource's responses from the PSN it
//! asks for, an atomic's saved result is sent again, SENDs and WRITEs are re-acknowledged (one
//! coalesced ACK per burst) without being executed again. None of them adds work: a duplicate
//! READ moves the one cursor its resource has (three duplicates in a row cost one more pass
//! from the last one's PSN, not three), and what it owes goes out in the QP's work turns, in
//! PSN order.

use portverbs_hal::types::AccessFlags;

use super::super::Core;
use super::super::packet::{Packet, psn};
use super::super::qp::{QpCtx, Resource};
use super::ack::owe_ack;
use super::atomic::atomic_ack;
use super::read::owe_responses;
use super::{mtu_of, remote};

/// A request with a PSN behind the expected one (IBA 9.9.2.2).
pub(super) fn duplicate(qp: &mut QpCtx, core: &mut Core, pkt: &Packet, out: &mut Vec<Packet>) {
    let p = pkt.hdr.bth.psn;
    let op = pkt.hdr.bth.opcode;
    if op.is_read_request() {
        duplicate_read(qp, core, pkt);
    } else if op.is_atomic() {
        let responding = qp.resp.responding;
        let found = qp
            .resp
            .resources
            .iter_mut()
            .flatten()
            .find_map(|r| match r {
                Resource::Atomic(a) if a.psn == p => {
                    // Sent at once unless responses before it are still owed.
                    a.owed |= responding;
                    Some(*a)
                }
                _ => None,
            });
        match found {
            Some(a) if !responding => out.push(atomic_ack(qp, core, a.psn, a.orig, a.msn)),
            Some(_) => owe_responses(qp, core),
            None => {}
        }
    } else {
        // SEND/WRITE already executed: acknowledge what we have, once for the burst (a
        // go-back resends many packets; each need not draw its own ACK).
        owe_ack(qp, core, psn::add(qp.resp.epsn, psn::MASK));
    }
}

/// A READ again: the resource whose PSNs hold `p`, with the same R_Key, if the request asks
/// for exactly the rest of the original from `p`'s response on (the requester re-requests
/// from the first response it is missing, with the address and length moved on accordingly;
/// the same rule as rxe's in drivers/infiniband/sw/rxe/rxe_resp.c). Anything else has no
/// resource and is dropped silently.
fn duplicate_read(qp: &mut QpCtx, core: &mut Core, pkt: &Packet) {
    let p = pkt.hdr.bth.psn;
    let Some(reth) = pkt.hdr.reth else { return };
    let mtu = mtu_of(qp, core);
    let Some(i) = qp.resp.resources.iter().position(|r| {
        matches!(r, Some(Resource::Read(r))
            if psn::diff(p, r.first_psn) >= 0
                && psn::diff(p, psn::add(r.first_psn, r.npsn)) < 0
                && r.rkey == reth.rkey)
    }) else {
        return;
    };
    let Some(Resource::Read(r)) = &qp.resp.resources[i] else {
        return;
    };
    let from = psn::diff(p, r.first_psn) as u32;
    let skip = (u64::from(from) * mtu).min(u64::from(r.len));
    let rest = u64::from(r.len) - skip;
    if reth.va != r.va.wrapping_add(skip) || u64::from(reth.dma_len) != rest {
        return;
    }
    // The key is checked again now: the rights may have changed since the original.
    let span = if rest == 0 {
        None
    } else {
        match remote(qp, core, r.rkey, reth.va, rest, AccessFlags::REMOTE_READ) {
            Ok(span) => Some(span),
            Err(_) => return,
        }
    };
    if let Some(Resource::Read(r)) = qp.resp.resources[i].as_mut() {
        r.next = from;
        r.span = span;
    }
    owe_responses(qp, core);
}

//! Atomic requests (compare-and-swap, fetch-and-add): checks in rxe's order, execution, the
//! atomic ACK (sent at once, or behind READ responses owed before it), and the saved original
//! value a duplicate is answered from (the responder resource, shared with READs: `read.rs`).

use portverbs_hal::types::AccessFlags;

use super::super::Core;
use super::super::hca::Hca;
use super::super::packet::{Packet, PayloadData, psn};
use super::super::qp::{AtomicResource, QpCtx, Resource};
use super::ack::{access_error, bth, nak_fatal, reply};
use super::read::{resource_free, store_resource};
use super::remote;
use crate::wire::{Aeth, AethSyndrome, AtomicAckEth, NakCode, Opcode, TransportHdr};

pub(super) fn atomic<H: Hca + ?Sized>(
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
    if !resource_free(qp) {
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
    qp.resp.msn = psn::add(qp.resp.msn, 1);
    qp.resp.epsn = psn::add(p, 1);
    // The atomic ACK acknowledges everything before it.
    qp.resp.pending_ack = None;
    let mut a = AtomicResource {
        psn: p,
        orig,
        msn: qp.resp.msn,
        owed: false,
        sent: false,
    };
    if qp.resp.responding {
        // Behind the responses owed before it.
        a.owed = true;
    } else {
        a.sent = true;
        out.push(atomic_ack(qp, core, p, orig, a.msn));
    }
    store_resource(qp, Resource::Atomic(a));
}

/// The atomic ACK of the atomic at PSN `p`: its original value and the MSN it completed.
pub(super) fn atomic_ack(qp: &QpCtx, core: &mut Core, p: u32, orig: u64, msn: u32) -> Packet {
    let mut hdr = TransportHdr::new(bth(qp, Opcode::AtomicAcknowledge, p));
    hdr.aeth = Some(Aeth {
        syndrome: AethSyndrome::Ack { credits: 0x1f },
        msn,
    });
    hdr.atomic_ack = Some(AtomicAckEth { orig });
    reply(qp, core, hdr, PayloadData::Empty)
}

//! Atomic requests (compare-and-swap, fetch-and-add): checks in rxe's order, execution, the
//! atomic ACK, and the saved original value a duplicate is answered from.

use portverbs_hal::types::AccessFlags;

use super::super::Core;
use super::super::hca::Hca;
use super::super::packet::{Packet, PayloadData, psn};
use super::super::qp::{QpCtx, Resource};
use super::ack::{access_error, bth, nak_fatal, reply};
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

pub(super) fn atomic_ack(qp: &QpCtx, core: &mut Core, p: u32, orig: u64) -> Packet {
    let mut hdr = TransportHdr::new(bth(qp, Opcode::AtomicAcknowledge, p));
    hdr.aeth = Some(Aeth {
        syndrome: AethSyndrome::Ack { credits: 0x1f },
        msn: qp.resp.msn,
    });
    hdr.atomic_ack = Some(AtomicAckEth { orig });
    reply(qp, core, hdr, PayloadData::Empty)
}

pub(super) fn store_resource(qp: &mut QpCtx, r: Resource) {
    let n = qp.resp.resources.len();
    if n == 0 {
        return;
    }
    let i = qp.resp.next_resource % n;
    qp.resp.resources[i] = Some(r);
    qp.resp.next_resource = (i + 1) % n;
}

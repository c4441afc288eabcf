//! RDMA READ requests: key and rights check, the responder resource kept for a duplicate, and
//! the READ response packets (as trains when the engine may coalesce them).

use portverbs_hal::types::AccessFlags;

use super::super::Core;
use super::super::hca::Hca;
use super::super::memory::Span;
use super::super::packet::{MemSeg, Packet, PayloadData, psn};
use super::super::qp::{QpCtx, Resource};
use super::ack::{access_error, bth, nak_fatal, reply};
use super::atomic::store_resource;
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
pub(super) fn read_responses(
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

//! Duplicate requests (IBA 9.9.2.2): READs re-executed from their saved resource, atomics
//! answered from the saved result, SENDs and WRITEs re-acknowledged without re-executing.

use portverbs_hal::types::AccessFlags;

use super::super::Core;
use super::super::packet::{Packet, psn};
use super::super::qp::{QpCtx, Resource};
use super::ack::send_aeth;
use super::atomic::atomic_ack;
use super::read::read_responses;
use super::{mtu_of, remote};
use crate::wire::AethSyndrome;

/// A request with a PSN behind the expected one (IBA 9.9.2.2).
pub(super) fn duplicate(qp: &mut QpCtx, core: &mut Core, pkt: &Packet, out: &mut Vec<Packet>) {
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

pub(super) fn rkey_of(pkt: &Packet) -> u32 {
    pkt.hdr.reth.map_or(0, |r| r.rkey)
}

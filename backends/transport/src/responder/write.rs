//! Placement of RDMA WRITE data (RC and UC): the RETH's key check for the whole message
//! before any byte lands, then each packet at its message offset.

use portverbs_hal::types::AccessFlags;
use portverbs_hal::wc::{WcOpcode, WcStatus};

use super::super::Core;
use super::super::hca::Hca;
use super::super::memory::KeyError;
use super::super::packet::Packet;
use super::super::qp::{InMsg, QpCtx};
use super::recv::complete_recv;
use super::remote;
use crate::wire::NakCode;

/// Opens an incoming RDMA WRITE message from its RETH, checking the rkey for the whole length
/// before any byte lands. `Err(None)`: no RETH; `Err(Some(_))`: the key check failed.
#[inline]
pub(super) fn open_write(
    qp: &mut QpCtx,
    core: &Core,
    pkt: &Packet,
) -> Result<(), Option<KeyError>> {
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
#[inline]
pub(super) fn place_write<H: Hca + ?Sized>(
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
        // The whole payload (`n` is its length), so no range of it to check.
        pkt.payload
            .copy_to(&span.mem, span.offset + at as usize)
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

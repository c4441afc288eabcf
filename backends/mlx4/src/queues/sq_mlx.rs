//! Send WQEs of the GSI QP (facts §2.8, §5.10): the MLX control segment's extra fields and the
//! UD packet header — LRH, GRH, BTH, DETH — the driver builds and the WQE carries as inline
//! data, followed by the MAD's gather list. Only the special QP's send queue comes here; the
//! post path of every other QP never looks at it.

use portverbs_hal::error::WqeError;
use portverbs_hal::types::{Gid, SpecialQp};
use portverbs_hal::wr::{Payload, SendFlags, SendOp, SendWr};

use super::sq::Mlx4Sq;
use crate::dma::{Slot, WqeSlot as _};
use crate::layout::mlx::{MAX_HEADER, Route, UdHeader, flags};
use crate::layout::wqe::{INLINE_SEG, opcode};

/// What the GSI QP's send queue needs to build headers.
#[derive(Debug, Clone)]
pub(crate) struct MlxSend {
    /// The port's GID table (the GRH source GID is the one the AV's sgid_index names).
    pub(crate) gids: Vec<Gid>,
    /// The default P_Key the BTH carries.
    pub(crate) pkey: u16,
}

/// The default (full-membership) P_Key, index 0 of every P_Key table here.
pub(crate) const DEFAULT_PKEY: u16 = 0xffff;

impl Mlx4Sq {
    /// [`Mlx4Sq::body`] of the GSI QP: the header as inline data, then the payload; ORs the
    /// service level and static rate into the control segment's flags (written before the
    /// body). Returns the opcode, the DLID dword and the end of the WQE.
    #[inline(never)]
    pub(super) fn mlx_body(
        &self,
        m: &MlxSend,
        wqe: Slot<'_, 64>,
        wr: &SendWr<'_>,
    ) -> Result<(u8, u32, usize), WqeError> {
        let Some(dest) = wr.ud else {
            return Err(WqeError::BadDestination {
                reason: "a send on QP1 needs an address handle",
            });
        };
        if !matches!(wr.op, SendOp::Send) {
            return Err(WqeError::OpNotSupported { op: wr.op.name() });
        }
        let Payload::Sges(sges) = wr.payload else {
            return Err(WqeError::OpNotSupported {
                op: "inline data on QP1",
            });
        };
        let av = dest.av;
        let grh = if av.is_global {
            let Some(sgid) = m.gids.get(usize::from(av.sgid_index)) else {
                return Err(WqeError::BadDestination {
                    reason: "the address handle's source GID index is not in the GID table",
                });
            };
            Some(Route {
                traffic_class: av.traffic_class,
                flow_label: av.flow_label,
                hop_limit: av.hop_limit,
                sgid: sgid.0,
                dgid: av.dgid.0,
            })
        } else {
            None
        };
        // A Q_Key with the high bit set means the sending QP's own, which for QP1 is fixed.
        let qkey = if dest.remote_qkey & 0x8000_0000 != 0 {
            SpecialQp::GSI_QKEY
        } else {
            dest.remote_qkey
        };
        let h = UdHeader {
            sl: av.sl & 0xf,
            dlid: av.dlid,
            slid: 0,
            grh,
            solicited: wr.flags.contains(SendFlags::SOLICITED),
            pkey: m.pkey,
            dest_qp: dest.remote_qpn & 0xff_ffff,
            psn: 0,
            qkey,
            src_qp: SpecialQp::GSI_QPN,
        };
        let payload: u64 = sges.iter().map(|s| u64::from(s.length)).sum();
        let mut hdr = [0u8; MAX_HEADER];
        let n = h
            .encode(payload as usize, &mut hdr)
            .map_err(|_| WqeError::InlineTooLarge {
                given: payload as usize,
                max: crate::layout::mlx::MAX_PAYLOAD as u32,
            })?;
        let end =
            wqe.inline_segments::<16>(INLINE_SEG, &hdr[..n])
                .ok_or(WqeError::InlineTooLarge {
                    given: n,
                    max: MAX_HEADER as u32,
                })?;
        let end = self.data_segs(wqe, end.next_multiple_of(16), sges)?;
        let f = u32::from_be_bytes(wqe.read::<8, 4>())
            | (u32::from(h.sl) << flags::SL_SHIFT)
            | (u32::from(av.static_rate & 0xf) << 12);
        wqe.put::<8, 4>(f.to_be_bytes());
        Ok((opcode::SEND, u32::from(av.dlid) << 16, end))
    }
}

//! Send WQEs of the GSI QP (Linux `hw/mlx4/qp.c`, `build_mlx_header`): the MLX control segment's
//! extra fields and the UD packet header — LRH, GRH, BTH, DETH — the driver builds and the WQE
//! carries as inline data, followed by the MAD's gather list. Only the special QP's send queue
//! comes here; the post path of every other QP never looks at it.

use portverbs_hal::error::WqeError;
use portverbs_hal::types::{Gid, SpecialQp};
use portverbs_hal::wr::{Payload, SendFlags, SendOp, SendWr};

use super::sq::{CTRL_FLAGS, Mlx4Sq};
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
        let f = u32::from_be_bytes(wqe.read::<CTRL_FLAGS, 4>())
            | (u32::from(h.sl) << flags::SL_SHIFT)
            | (u32::from(av.static_rate & 0xf) << 12);
        wqe.put::<CTRL_FLAGS, 4>(f.to_be_bytes());
        Ok((opcode::SEND, u32::from(av.dlid) << 16, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use portverbs_hal::attr::AddressVector;
    use portverbs_hal::mmio::MemRegisters;
    use portverbs_hal::queue::SendQueue;
    use portverbs_hal::types::QpType;
    use portverbs_hal::wr::{Sge, UdDest};

    use crate::dma::Slots;
    use crate::layout::mlx::flags;
    use crate::layout::wqe::ctrl;
    use crate::queues::Geometry;
    use crate::queues::rq::tests::ring;

    const SGID: [u8; 16] = [0x5a; 16];
    const DGID: [u8; 16] = [0xa5; 16];

    /// A GSI send queue of two 256-byte slots, as `do_create_qp` shapes it for one SGE.
    fn gsi_sq() -> Mlx4Sq {
        let geom = Geometry {
            base: 0,
            shift: 8,
            cnt: 2,
        };
        let mut sq = Mlx4Sq {
            qpn: 0x4a,
            qp_type: QpType::Ud,
            buf: crate::dma::WorkRing::new(Slots::new(ring(geom.bytes()), geom).unwrap()),
            // The slot after the one written gets stamped.
            spare: 1,
            max_sge: 4,
            max_inline: 0,
            uar: crate::uar::Uar::over_bar(Arc::new(MemRegisters::new(4096)), 0),
            bf: None,
            bf_half: 0,
            fatal: Arc::new(AtomicBool::new(false)),
            bf_len: 0,
            mlx: Some(Box::new(MlxSend {
                gids: vec![Gid([0; 16]), Gid(SGID)],
                pkey: DEFAULT_PKEY,
            })),
        };
        sq.init_slots();
        sq
    }

    fn av() -> AddressVector {
        AddressVector {
            dgid: Gid(DGID),
            sgid_index: 1,
            is_global: true,
            sl: 5,
            dlid: 0x21,
            hop_limit: 64,
            port_num: 1,
            ..AddressVector::default()
        }
    }

    fn bytes(sq: &Mlx4Sq) -> Vec<u8> {
        let mut out = vec![0u8; 256];
        assert!(sq.buf.at(0).read_at(0, &mut out));
        out
    }

    #[test]
    fn a_mad_send_is_an_mlx_wqe_with_the_header_inline() {
        let mut sq = gsi_sq();
        let a = av();
        let sge = [Sge {
            addr: 0x9000,
            length: 256,
            lkey: 0x77,
        }];
        let wr = SendWr::new(1, SendOp::Send).sges(&sge).ud(UdDest {
            ah_pd: None,
            av: &a,
            remote_qpn: 1,
            // The high bit: the QP's own Q_Key, which for QP1 is the GSI one.
            remote_qkey: 0x8000_0000,
        });
        sq.write_wqe(0, &wr, true).unwrap();
        let w = bytes(&sq);
        let be32 = |at: usize| u32::from_be_bytes(w[at..at + 4].try_into().unwrap());
        assert_eq!(w[3], opcode::SEND);
        // ctrl (1) + inline 44 bytes to the boundary, inline 24 more, pad, one data segment.
        assert_eq!(w[7], 7, "ds");
        assert_eq!(
            be32(8),
            ctrl::CQ_UPDATE | (5 << flags::SL_SHIFT),
            "C and SL in the MLX flags"
        );
        assert_eq!(be32(12), 0x21 << 16, "DLID");
        assert_eq!(be32(16), INLINE_SEG | 44);
        assert_eq!(be32(64), INLINE_SEG | 24);
        let mut hdr = w[20..64].to_vec();
        hdr.extend_from_slice(&w[68..92]);
        let (h, n) = UdHeader::decode(&hdr, 256).unwrap();
        assert_eq!(n, MAX_HEADER);
        let g = h.grh.unwrap();
        assert_eq!((g.sgid, g.dgid, g.hop_limit), (SGID, DGID, 64));
        assert_eq!((h.sl, h.dlid, h.dest_qp, h.src_qp), (5, 0x21, 1, 1));
        assert_eq!((h.qkey, h.pkey), (SpecialQp::GSI_QKEY, DEFAULT_PKEY));
        assert_eq!(
            &w[96..112],
            &[
                &256u32.to_be_bytes()[..],
                &0x77u32.to_be_bytes(),
                &0x9000u64.to_be_bytes()
            ]
            .concat()[..]
        );
    }

    #[test]
    fn what_qp1_cannot_send_is_refused() {
        let mut sq = gsi_sq();
        let a = av();
        let sge = [Sge {
            addr: 0,
            length: 8,
            lkey: 1,
        }];
        let dest = UdDest {
            ah_pd: None,
            av: &a,
            remote_qpn: 1,
            remote_qkey: SpecialQp::GSI_QKEY,
        };
        let no_ah = SendWr::new(1, SendOp::Send).sges(&sge);
        assert!(matches!(
            sq.write_wqe(0, &no_ah, true),
            Err(WqeError::BadDestination { .. })
        ));
        let imm = SendWr::new(1, SendOp::SendWithImm { imm: 3 })
            .sges(&sge)
            .ud(dest);
        assert!(matches!(
            sq.write_wqe(0, &imm, true),
            Err(WqeError::OpNotSupported { .. })
        ));
        let inline = SendWr::new(1, SendOp::Send).inline(b"mad").ud(dest);
        assert!(matches!(
            sq.write_wqe(0, &inline, true),
            Err(WqeError::OpNotSupported { .. })
        ));
        let bad_sgid = AddressVector { sgid_index: 9, ..a };
        let wr = SendWr::new(1, SendOp::Send).sges(&sge).ud(UdDest {
            ah_pd: None,
            av: &bad_sgid,
            ..dest
        });
        assert!(matches!(
            sq.write_wqe(0, &wr, true),
            Err(WqeError::BadDestination { .. })
        ));
    }
}

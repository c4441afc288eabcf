//! Host side of the send WQE: the slot stride of a send queue and the encoder the send queue
//! object calls.

use portverbs_hal::error::WqeError;
use portverbs_hal::types::QpType;
use portverbs_hal::wr::{Payload, RemoteAddr, SendFlags, SendOp, SendWr};
use zerocopy::IntoBytes;
use zerocopy::little_endian::{U16, U32, U64};

use super::{
    DATAGRAM_SEG, DatagramSeg, FLAG_FENCE, FLAG_INLINE, FLAG_SIGNALED, FLAG_SOLICITED, SEND_HEADER,
    SGE_SIZE, SendHeader, SoftOp, data_offset, put_sge,
};

/// Slot stride of a send queue.
pub fn send_stride(qp_type: QpType, max_sge: u32, max_inline: u32) -> usize {
    let fixed = SEND_HEADER
        + if qp_type == QpType::Ud {
            DATAGRAM_SEG
        } else {
            0
        };
    let data = (max_sge as usize * SGE_SIZE).max(max_inline as usize);
    (fixed + data).next_power_of_two().max(64)
}

/// Encoder of send WQEs for one queue geometry.
#[derive(Debug, Clone, Copy)]
pub struct SendFormat {
    /// Slot size.
    pub stride: usize,
    /// SGE capacity.
    pub max_sge: u32,
    /// Inline capacity.
    pub max_inline: u32,
}

/// Per-WQE facts the send encoder needs besides the work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeContext {
    /// Transport of the queue pair.
    pub qp_type: QpType,
    /// QP number.
    pub qpn: u32,
    /// Producer counter of this WQE.
    pub counter: u32,
    /// Whether the WQE must generate a completion on success.
    pub signaled: bool,
}

impl SendFormat {
    /// Encodes `wr` into `out` (one ring slot, in place) and returns the number of bytes used;
    /// the entry is complete but for its ownership byte (byte 0), which is left as it was: the
    /// caller stores it last, once the rest is written.
    ///
    /// # Errors
    /// The request does not fit the slot or has no encoding on this queue.
    pub fn encode_send(
        &self,
        wr: &SendWr<'_>,
        ctx: &EncodeContext,
        out: &mut [u8],
    ) -> Result<usize, WqeError> {
        let mut h = SendHeader::default();
        let mut flags = 0;
        if ctx.signaled {
            flags |= FLAG_SIGNALED;
        }
        if wr.flags.contains(SendFlags::SOLICITED) {
            flags |= FLAG_SOLICITED;
        }
        if wr.flags.contains(SendFlags::FENCE) {
            flags |= FLAG_FENCE;
        }
        let set_remote = |h: &mut SendHeader, r: RemoteAddr| {
            h.raddr = U64::new(r.addr);
            h.rkey = U32::new(r.rkey);
        };
        h.opcode = match wr.op {
            SendOp::Send => SoftOp::Send,
            SendOp::SendWithImm { imm } => {
                h.imm = U32::new(imm);
                SoftOp::SendImm
            }
            SendOp::SendWithInv { rkey } => {
                h.imm = U32::new(rkey);
                SoftOp::SendInv
            }
            SendOp::RdmaWrite { remote } => {
                set_remote(&mut h, remote);
                SoftOp::Write
            }
            SendOp::RdmaWriteWithImm { remote, imm } => {
                set_remote(&mut h, remote);
                h.imm = U32::new(imm);
                SoftOp::WriteImm
            }
            SendOp::RdmaRead { remote } => {
                set_remote(&mut h, remote);
                SoftOp::Read
            }
            SendOp::AtomicCmpSwp {
                remote,
                compare,
                swap,
            } => {
                set_remote(&mut h, remote);
                h.compare = U64::new(compare);
                h.swap_add = U64::new(swap);
                SoftOp::CmpSwp
            }
            SendOp::AtomicFetchAdd { remote, add } => {
                set_remote(&mut h, remote);
                h.swap_add = U64::new(add);
                SoftOp::FetchAdd
            }
            SendOp::BindMw { bind } => {
                h.raddr = U64::new(bind.addr);
                h.compare = U64::new(bind.length);
                h.new_rkey = U32::new(bind.new_rkey);
                h.mr_lkey = U32::new(bind.mr_lkey);
                h.bind_info = U32::new(bind.access.bits() & 0xffff | (bind.mw_type as u32) << 16);
                SoftOp::BindMw
            }
            SendOp::LocalInv { rkey } => {
                h.imm = U32::new(rkey);
                SoftOp::LocalInv
            }
        } as u8;
        let mut at = data_offset(ctx.qp_type);
        if at > out.len() {
            return Err(WqeError::InlineTooLarge {
                given: at,
                max: out.len() as u32,
            });
        }
        match (ctx.qp_type, wr.ud) {
            (QpType::Ud, Some(ud)) => {
                let av = ud.av;
                let seg = DatagramSeg {
                    dgid: av.dgid.0,
                    remote_qpn: U32::new(ud.remote_qpn),
                    qkey: U32::new(ud.remote_qkey),
                    flow_label: U32::new(av.flow_label),
                    sgid_index: av.sgid_index,
                    hop_limit: av.hop_limit,
                    traffic_class: av.traffic_class,
                    sl: av.sl,
                    dlid: U16::new(av.dlid),
                    port: av.port_num,
                    is_global: u8::from(av.is_global),
                    static_rate: av.static_rate,
                    src_path_bits: av.src_path_bits,
                    reserved: [0; 10],
                };
                out[SEND_HEADER..SEND_HEADER + DATAGRAM_SEG].copy_from_slice(seg.as_bytes());
            }
            (QpType::Ud, None) => {
                return Err(WqeError::BadDestination {
                    reason: "a UD send needs an address handle",
                });
            }
            (_, Some(_)) => {
                return Err(WqeError::BadDestination {
                    reason: "connected QPs take no address handle",
                });
            }
            (_, None) => {}
        }
        match wr.payload {
            Payload::Inline(bytes) => {
                if bytes.len() > self.max_inline as usize || at + bytes.len() > out.len() {
                    return Err(WqeError::InlineTooLarge {
                        given: bytes.len(),
                        max: self.max_inline,
                    });
                }
                flags |= FLAG_INLINE;
                h.inline_len = U32::new(bytes.len() as u32);
                out[at..at + bytes.len()].copy_from_slice(bytes);
                at += bytes.len();
            }
            Payload::Sges(sges) => {
                if sges.len() > self.max_sge as usize || at + sges.len() * SGE_SIZE > out.len() {
                    return Err(WqeError::TooManySges {
                        given: sges.len(),
                        max: self.max_sge,
                    });
                }
                h.num_sge = sges.len() as u8;
                for sge in sges {
                    put_sge(&mut out[at..at + SGE_SIZE], sge);
                    at += SGE_SIZE;
                }
            }
        }
        h.flags = flags;
        out[1..SEND_HEADER].copy_from_slice(&h.as_bytes()[1..]);
        Ok(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::format::decode_send;
    use crate::engine::SendWqe;
    use portverbs_hal::attr::AddressVector;
    use portverbs_hal::types::{AccessFlags, Gid, MwType};
    use portverbs_hal::wr::UdDest;
    use portverbs_hal::wr::{MwBind, Sge};

    fn ctx(qp_type: QpType) -> EncodeContext {
        EncodeContext {
            qp_type,
            qpn: 0x11,
            counter: 0,
            signaled: true,
        }
    }

    fn round_trip(wr: &SendWr<'_>, qp_type: QpType) -> SendWqe {
        let fmt = SendFormat {
            stride: send_stride(qp_type, 4, 64),
            max_sge: 4,
            max_inline: 64,
        };
        let mut slot = vec![0u8; fmt.stride];
        fmt.encode_send(wr, &ctx(qp_type), &mut slot).unwrap();
        let mut out = SendWqe::default();
        decode_send(&slot, qp_type, &mut out).unwrap();
        out
    }

    #[test]
    fn send_wqe_round_trips_every_operation() {
        let sges = [Sge {
            addr: 0x1000,
            length: 64,
            lkey: 0x101,
        }];
        let remote = RemoteAddr {
            addr: 0xdead_0000,
            rkey: 0x2201,
        };
        let bind = MwBind {
            new_rkey: 0x302,
            mw_type: MwType::Type2,
            mr_lkey: 0x101,
            addr: 0x1000,
            length: 32,
            access: AccessFlags::REMOTE_READ,
        };
        let ops = SendOp::one_of_each(remote, bind);
        for op in ops {
            let wr = SendWr::new(1, op).sges(&sges).flags(SendFlags::FENCE);
            let got = round_trip(&wr, QpType::Rc);
            assert_eq!(got.op, op);
            assert_eq!(got.sges.as_slice(), &sges[..]);
            assert!(got.signaled);
            assert!(got.flags.contains(SendFlags::FENCE));
        }
    }

    #[test]
    fn inline_and_ud_round_trip() {
        let av = AddressVector {
            dgid: Gid::from_ipv4("10.0.0.2".parse().unwrap()),
            hop_limit: 64,
            is_global: true,
            port_num: 1,
            ..AddressVector::default()
        };
        let wr = SendWr::new(1, SendOp::Send).inline(b"hello").ud(UdDest {
            ah_pd: None,
            av: &av,
            remote_qpn: 0x22,
            remote_qkey: 0x1111,
        });
        let got = round_trip(&wr, QpType::Ud);
        assert_eq!(got.inline_data.as_slice(), b"hello");
        let ud = got.ud.unwrap();
        assert_eq!(ud.av, av);
        assert_eq!(ud.remote_qpn, 0x22);
        assert_eq!(ud.remote_qkey, 0x1111);
    }

    #[test]
    fn encoder_refuses_what_does_not_fit() {
        let fmt = SendFormat {
            stride: 128,
            max_sge: 2,
            max_inline: 32,
        };
        let mut slot = [0u8; 128];
        let sges = [Sge::default(); 3];
        let wr = SendWr::new(1, SendOp::Send).sges(&sges);
        assert!(matches!(
            fmt.encode_send(&wr, &ctx(QpType::Rc), &mut slot),
            Err(WqeError::TooManySges { given: 3, max: 2 })
        ));
        let big = [0u8; 33];
        let wr = SendWr::new(1, SendOp::Send).inline(&big);
        assert!(matches!(
            fmt.encode_send(&wr, &ctx(QpType::Rc), &mut slot),
            Err(WqeError::InlineTooLarge { .. })
        ));
        let wr = SendWr::new(1, SendOp::Send);
        assert!(matches!(
            fmt.encode_send(&wr, &ctx(QpType::Ud), &mut slot),
            Err(WqeError::BadDestination { .. })
        ));
    }
}

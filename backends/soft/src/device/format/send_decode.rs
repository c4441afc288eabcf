//! Device side of the send WQE: the owner bit and the decoder the engine reads slots with.

use portverbs_hal::attr::AddressVector;
use portverbs_hal::types::{AccessFlags, Gid, MwType, QpType};
use portverbs_hal::wr::{MwBind, RemoteAddr, SendFlags, SendOp};
use zerocopy::FromBytes;

use super::{
    DatagramSeg, FLAG_FENCE, FLAG_INLINE, FLAG_SIGNALED, FLAG_SOLICITED, SEND_HEADER, SGE_SIZE,
    SendHeader, data_offset, get_sge,
};
use crate::engine::{SendWqe, UdTarget, WqeFault};

/// The owner bit of a send WQE slot.
pub fn send_owner(slot: &[u8]) -> bool {
    slot.first().is_some_and(|b| b & 1 == 1)
}

/// Device side: decodes a send WQE slot (the caller checked the owner bit).
///
/// # Errors
/// Unknown opcode, SGE count or inline length beyond the slot, bad window type.
#[inline]
pub fn decode_send(slot: &[u8], qp_type: QpType, out: &mut SendWqe) -> Result<(), WqeFault> {
    let h = SendHeader::read_from_bytes(slot.get(..SEND_HEADER).ok_or(WqeFault {
        reason: "slot smaller than a WQE header",
    })?)
    .map_err(|_| WqeFault {
        reason: "unreadable header",
    })?;
    let remote = RemoteAddr {
        addr: h.raddr.get(),
        rkey: h.rkey.get(),
    };
    out.op = match h.opcode {
        1 => SendOp::Send,
        2 => SendOp::SendWithImm { imm: h.imm.get() },
        3 => SendOp::SendWithInv { rkey: h.imm.get() },
        4 => SendOp::RdmaWrite { remote },
        5 => SendOp::RdmaWriteWithImm {
            remote,
            imm: h.imm.get(),
        },
        6 => SendOp::RdmaRead { remote },
        7 => SendOp::AtomicCmpSwp {
            remote,
            compare: h.compare.get(),
            swap: h.swap_add.get(),
        },
        8 => SendOp::AtomicFetchAdd {
            remote,
            add: h.swap_add.get(),
        },
        9 => {
            let info = h.bind_info.get();
            let mw_type = MwType::from_u8((info >> 16) as u8).ok_or(WqeFault {
                reason: "bad memory-window type",
            })?;
            SendOp::BindMw {
                bind: MwBind {
                    new_rkey: h.new_rkey.get(),
                    mw_type,
                    mr_lkey: h.mr_lkey.get(),
                    addr: h.raddr.get(),
                    length: h.compare.get(),
                    access: AccessFlags::from_bits_truncate(info & 0xffff),
                },
            }
        }
        10 => SendOp::LocalInv { rkey: h.imm.get() },
        _ => {
            return Err(WqeFault {
                reason: "unknown send opcode",
            });
        }
    };
    let mut flags = SendFlags::empty();
    if h.flags & FLAG_SOLICITED != 0 {
        flags |= SendFlags::SOLICITED;
    }
    if h.flags & FLAG_FENCE != 0 {
        flags |= SendFlags::FENCE;
    }
    if h.flags & FLAG_INLINE != 0 {
        flags |= SendFlags::INLINE;
    }
    out.flags = flags;
    out.signaled = h.flags & FLAG_SIGNALED != 0;
    out.ud = None;
    let at = data_offset(qp_type);
    if qp_type == QpType::Ud {
        let seg = DatagramSeg::read_from_bytes(slot.get(SEND_HEADER..at).ok_or(WqeFault {
            reason: "slot too small for a datagram segment",
        })?)
        .map_err(|_| WqeFault {
            reason: "unreadable datagram segment",
        })?;
        out.ud = Some(UdTarget {
            av: AddressVector {
                dgid: Gid(seg.dgid),
                sgid_index: seg.sgid_index,
                flow_label: seg.flow_label.get(),
                hop_limit: seg.hop_limit,
                traffic_class: seg.traffic_class,
                is_global: seg.is_global != 0,
                dlid: seg.dlid.get(),
                sl: seg.sl,
                src_path_bits: seg.src_path_bits,
                static_rate: seg.static_rate,
                port_num: seg.port,
            },
            remote_qpn: seg.remote_qpn.get(),
            remote_qkey: seg.qkey.get(),
        });
    }
    out.sges.clear();
    if flags.contains(SendFlags::INLINE) {
        let n = h.inline_len.get() as usize;
        let bytes = slot.get(at..at.saturating_add(n)).ok_or(WqeFault {
            reason: "inline data beyond the slot",
        })?;
        // A send queue's WQEs tend to carry the same amount of inline data each time: when
        // the length is unchanged, copy over the old bytes instead of clearing and growing.
        if out.inline_data.len() == bytes.len() {
            out.inline_data.copy_from_slice(bytes);
        } else {
            out.inline_data.clear();
            out.inline_data.extend_from_slice(bytes);
        }
    } else {
        out.inline_data.clear();
        for i in 0..usize::from(h.num_sge) {
            let off = at + i * SGE_SIZE;
            let sge = slot
                .get(off..off + SGE_SIZE)
                .and_then(get_sge)
                .ok_or(WqeFault {
                    reason: "scatter/gather list beyond the slot",
                })?;
            out.sges.push(sge);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::format::decode_recv;
    use crate::engine::RecvWqe;

    #[test]
    fn device_side_decoder_rejects_garbage() {
        let mut out = SendWqe::default();
        let mut slot = [0u8; 64];
        slot[1] = 99;
        assert!(decode_send(&slot, QpType::Rc, &mut out).is_err());
        slot[1] = 1;
        slot[3] = 200; // 200 SGEs in a 64-byte slot
        assert!(decode_send(&slot, QpType::Rc, &mut out).is_err());
        assert!(decode_send(&slot[..10], QpType::Rc, &mut out).is_err());
        let mut r = RecvWqe::default();
        assert!(decode_recv(&[5u8; 32], &mut r).is_err());
    }
}

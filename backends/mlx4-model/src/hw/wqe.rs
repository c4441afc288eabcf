//! Work queue entries in the mlx4 format (rdma-core `providers/mlx4/qp.c`): discovering posted send
//! WQEs by their owner bit and stamps, decoding send WQEs (control segment, datagram, remote
//! address, atomic, bind, local-invalidate, inline and data segments) into the engine's
//! [`SendWqe`], and receive/SRQ scatter lists into [`RecvWqe`]. Everything is read from a local
//! copy; malformed input is a [`WqeFault`], never a panic.

use portverbs_hal::attr::AddressVector;
use portverbs_hal::types::{AccessFlags, Gid, MwType, QpType, SpecialQp};
use portverbs_hal::wr::{MwBind, RemoteAddr, SendFlags, SendOp, Sge};
use portverbs_mlx4_layout::mlx::{self, UdHeader};
use portverbs_mlx4_layout::wqe::{
    AtomicSeg, BindSeg, CtrlSeg, DataSeg, DatagramSeg, INLINE_ALIGN, INLINE_SEG, INVALID_LKEY,
    LocalInvalSeg, RaddrSeg, STAMP, bind, ctrl, opcode as wop,
};
use portverbs_transport::{RecvWqe, SendWqe, UdTarget, WqeFault};
use zerocopy::FromBytes;

use portverbs_dma::ring::Geometry;

use super::mem::Buf;

fn fault(reason: &'static str) -> WqeFault {
    WqeFault { reason }
}

/// A work queue inside a QP buffer: `1 << log` WQEs of `1 << shift` bytes, addressed by the
/// workspace's one ring arithmetic ([`Geometry`]).
#[derive(Debug, Clone)]
pub(super) struct Wq {
    pub(super) buf: Buf,
    pub(super) geom: Geometry,
}

impl Wq {
    /// `1 << log` WQEs of `1 << shift` bytes in `buf`.
    pub(super) fn new(buf: Buf, log: u32, shift: u32) -> Self {
        Self {
            buf,
            geom: Geometry {
                base: 0,
                shift,
                cnt: 1 << log,
            },
        }
    }

    pub(super) fn entries(&self) -> u32 {
        self.geom.entries()
    }

    pub(super) fn offset(&self, counter: u32) -> usize {
        self.geom.offset(counter)
    }

    /// Bytes per WQE.
    pub(super) fn stride(&self) -> usize {
        self.geom.stride()
    }

    /// Whether send WQE `counter`, whose control segment starts with `byte0`, is the HCA's:
    /// its owner bit (bit 31 of the big-endian ownership dword) equals the counter's wrap
    /// parity (the work ring rule the driver writes by, `WorkRing::owner_bit`).
    pub(super) fn owner_matches(&self, byte0: u8, counter: u32) -> bool {
        const OWNER_BIT: u8 = (ctrl::OWNER >> 24) as u8;
        (byte0 & OWNER_BIT != 0) == self.geom.parity(counter)
    }

    /// True when send WQE `counter` is posted: its owner bit matches the counter's parity and
    /// no 64-byte block after the first inside its size still carries the stamp (rdma-core
    /// `providers/mlx4/qp.c`).
    pub(super) fn send_ready(&self, counter: u32) -> bool {
        let off = self.offset(counter);
        let mut head = [0u8; 8];
        if !self.buf.read(off, &mut head) {
            return false;
        }
        if !self.owner_matches(head[0], counter) {
            return false;
        }
        let size = usize::from(head[7] & ctrl::DS_MASK) * 16;
        let stride = self.stride();
        (INLINE_ALIGN..size.min(stride))
            .step_by(INLINE_ALIGN)
            .all(|blk| self.buf.be32(off + blk).is_some_and(|d| d != STAMP))
    }
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

fn seg<T: FromBytes>(b: &[u8], at: usize) -> Result<T, WqeFault> {
    b.get(at..)
        .and_then(|s| T::read_from_prefix(s).ok())
        .map(|(v, _)| v)
        .ok_or(fault("segment beyond the WQE"))
}

/// Decodes a send WQE of `ds` × 16 bytes (`wqe`) of a QP of type `qp_type` into `out`.
pub(super) fn decode_send(wqe: &[u8], qp_type: QpType, out: &mut SendWqe) -> Result<(), WqeFault> {
    let c: CtrlSeg = seg(wqe, 0)?;
    let opcode = (c.owner_opcode.get() & ctrl::OPCODE_MASK) as u8;
    let flags_byte = c.srcrb_flags.get();
    let mut flags = SendFlags::empty();
    if flags_byte & ctrl::SOLICIT != 0 {
        flags |= SendFlags::SOLICITED;
    }
    if c.fence_size & ctrl::FENCE != 0 {
        flags |= SendFlags::FENCE;
    }
    out.signaled = flags_byte & ctrl::CQ_UPDATE == ctrl::CQ_UPDATE;
    if out.signaled {
        flags |= SendFlags::SIGNALED;
    }
    let imm = c.imm.get();
    let mut p = 16;
    out.ud = None;
    if qp_type == QpType::Ud {
        let d: DatagramSeg = seg(wqe, p)?;
        let a = &d.av;
        let stf = a.sl_tclass_flowlabel.get();
        out.ud = Some(UdTarget {
            av: AddressVector {
                dgid: Gid(a.dgid),
                sgid_index: a.gid_index,
                flow_label: stf & 0xf_ffff,
                hop_limit: a.hop_limit,
                traffic_class: (stf >> 20) as u8,
                is_global: a.g_slid & 0x80 != 0,
                dlid: a.dlid.get(),
                sl: (stf >> 28) as u8,
                src_path_bits: a.g_slid & 0x7f,
                static_rate: a.stat_rate,
                port_num: (a.port_pd.get() >> 24) as u8,
            },
            remote_qpn: d.dqpn.get() & 0xff_ffff,
            remote_qkey: d.qkey.get(),
        });
        p += size_of::<DatagramSeg>();
    }
    let raddr = |p: usize| -> Result<RemoteAddr, WqeFault> {
        let r: RaddrSeg = seg(wqe, p)?;
        Ok(RemoteAddr {
            addr: r.raddr.get(),
            rkey: r.rkey.get(),
        })
    };
    out.sges.clear();
    out.inline_data.clear();
    out.op = match opcode {
        wop::SEND => SendOp::Send,
        wop::SEND_IMM => SendOp::SendWithImm { imm },
        wop::SEND_INVAL => SendOp::SendWithInv { rkey: imm },
        wop::RDMA_WRITE | wop::RDMA_WRITE_IMM | wop::RDMA_READ => {
            let remote = raddr(p)?;
            p += 16;
            match opcode {
                wop::RDMA_WRITE => SendOp::RdmaWrite { remote },
                wop::RDMA_WRITE_IMM => SendOp::RdmaWriteWithImm { remote, imm },
                _ => SendOp::RdmaRead { remote },
            }
        }
        wop::ATOMIC_CS | wop::ATOMIC_FA => {
            let remote = raddr(p)?;
            let a: AtomicSeg = seg(wqe, p + 16)?;
            p += 32;
            if opcode == wop::ATOMIC_CS {
                SendOp::AtomicCmpSwp {
                    remote,
                    compare: a.compare.get(),
                    swap: a.swap_add.get(),
                }
            } else {
                SendOp::AtomicFetchAdd {
                    remote,
                    add: a.swap_add.get(),
                }
            }
        }
        wop::BIND_MW => {
            let b: BindSeg = seg(wqe, p)?;
            let f1 = b.flags1.get();
            let mut access = AccessFlags::empty();
            for (bit, a) in [
                (bind::REMOTE_ATOMIC, AccessFlags::REMOTE_ATOMIC),
                (bind::REMOTE_WRITE, AccessFlags::REMOTE_WRITE),
                (bind::REMOTE_READ, AccessFlags::REMOTE_READ),
            ] {
                if f1 & bit != 0 {
                    access |= a;
                }
            }
            if b.flags2.get() & bind::ZERO_BASED != 0 {
                access |= AccessFlags::ZERO_BASED;
            }
            let new_rkey = b.new_rkey.get();
            out.flags = flags;
            out.op = SendOp::BindMw {
                bind: MwBind {
                    new_rkey,
                    mw_type: if b.flags2.get() & bind::TYPE_2 != 0 {
                        MwType::Type2
                    } else {
                        MwType::Type1
                    },
                    mr_lkey: b.lkey.get(),
                    addr: b.addr.get(),
                    length: b.length.get(),
                    access,
                },
            };
            return Ok(());
        }
        wop::LOCAL_INVAL => {
            let l: LocalInvalSeg = seg(wqe, p)?;
            out.flags = flags;
            out.op = SendOp::LocalInv {
                rkey: l.mem_key.get(),
            };
            return Ok(());
        }
        _ => return Err(fault("send opcode the model does not implement")),
    };
    let first = be32(wqe, p);
    if first.is_some_and(|d| d & INLINE_SEG != 0 && d != INLINE_SEG) {
        flags |= SendFlags::INLINE;
        decode_inline(wqe, p, out)?;
    } else {
        while p + 16 <= wqe.len() {
            let d: DataSeg = seg(wqe, p)?;
            out.sges.push(Sge {
                addr: d.addr.get(),
                length: d.byte_count.get() & !INLINE_SEG,
                lkey: d.lkey.get(),
            });
            p += 16;
        }
    }
    out.flags = flags;
    Ok(())
}

/// Inline segments: a header `INLINE_SEG | len` and `len` bytes, never crossing a 64-byte
/// boundary; a segment that ends on a boundary may be followed by another one.
fn decode_inline(wqe: &[u8], mut p: usize, out: &mut SendWqe) -> Result<(), WqeFault> {
    while let Some(d) = be32(wqe, p) {
        if d & INLINE_SEG == 0 {
            break;
        }
        let len = (d & !INLINE_SEG) as usize;
        if p % INLINE_ALIGN + 4 + len > INLINE_ALIGN {
            return Err(fault("inline segment crosses a 64-byte boundary"));
        }
        let data = wqe
            .get(p + 4..p + 4 + len)
            .ok_or(fault("inline data beyond the WQE"))?;
        out.inline_data.extend_from_slice(data);
        p += 4 + len;
        if p % INLINE_ALIGN != 0 || p >= wqe.len() {
            break;
        }
    }
    Ok(())
}

/// Decodes an MLX-transport send WQE of a special QP (`hw/mlx4/qp.c`): the MLX control segment,
/// inline segments holding the packet header software built, then the payload's data
/// segments. The header is checked against the control segment and the payload: a WQE whose
/// header the HCA could not send as it stands is a fault (an error completion), as is any
/// operation but a UD SEND from QP 1 and a GRH whose source GID is not in `gids` (port 1's
/// table; its index becomes the send's sgid_index).
pub(super) fn decode_mlx_send(wqe: &[u8], gids: &[Gid], out: &mut SendWqe) -> Result<(), WqeFault> {
    let c: CtrlSeg = seg(wqe, 0)?;
    if (c.owner_opcode.get() & ctrl::OPCODE_MASK) as u8 != wop::SEND {
        return Err(fault("MLX WQE with an opcode other than SEND"));
    }
    let f = c.srcrb_flags.get();
    if f & mlx::flags::VL15 != 0 {
        return Err(fault("VL15 on the GSI QP (only QP0 uses it)"));
    }
    let rlid = (c.imm.get() >> 16) as u16;
    // Inline segments (the header) back to back, never across a 64-byte boundary.
    let mut hdr = [0u8; mlx::MAX_HEADER];
    let mut hlen = 0;
    let mut p = 16;
    while let Some(d) = be32(wqe, p) {
        if d & INLINE_SEG == 0 {
            break;
        }
        let len = (d & !INLINE_SEG) as usize;
        if p % INLINE_ALIGN + 4 + len > INLINE_ALIGN {
            return Err(fault("inline segment crosses a 64-byte boundary"));
        }
        let data = wqe
            .get(p + 4..p + 4 + len)
            .ok_or(fault("inline data beyond the WQE"))?;
        hdr.get_mut(hlen..hlen + len)
            .ok_or(fault("MLX header longer than LRH+GRH+BTH+DETH"))?
            .copy_from_slice(data);
        hlen += len;
        p += 4 + len;
        if p % INLINE_ALIGN != 0 {
            break;
        }
    }
    out.sges.clear();
    out.inline_data.clear();
    let mut payload = 0usize;
    for chunk in wqe
        .get(p.next_multiple_of(16)..)
        .unwrap_or(&[])
        .chunks_exact(16)
    {
        let d: DataSeg = seg(chunk, 0)?;
        if d.byte_count.get() & INLINE_SEG != 0 {
            return Err(fault("inline payload after an MLX header"));
        }
        let length = d.byte_count.get();
        payload = payload.saturating_add(length as usize);
        out.sges.push(Sge {
            addr: d.addr.get(),
            length,
            lkey: d.lkey.get(),
        });
    }
    let (h, used) = UdHeader::decode(&hdr[..hlen], payload).map_err(|e| {
        tracing::debug!(error = %e, "bad MLX header");
        fault("malformed MLX header")
    })?;
    if used != hlen {
        return Err(fault("bytes after the DETH in the MLX header"));
    }
    if h.src_qp != SpecialQp::GSI_QPN {
        return Err(fault("DETH source QP is not QP1"));
    }
    if h.dlid != rlid || u32::from(h.sl) != (f >> mlx::flags::SL_SHIFT) & 0xf {
        return Err(fault("LRH DLID or SL differs from the control segment"));
    }
    let g = h.grh.unwrap_or_default();
    let sgid_index = match h.grh {
        Some(g) => gids
            .iter()
            .position(|x| x.0 == g.sgid && !x.is_zero())
            .ok_or(fault("GRH source GID is not one of the port's"))? as u8,
        None => 0,
    };
    out.ud = Some(UdTarget {
        av: AddressVector {
            dgid: Gid(g.dgid),
            sgid_index,
            flow_label: g.flow_label,
            hop_limit: g.hop_limit,
            traffic_class: g.traffic_class,
            is_global: h.grh.is_some(),
            dlid: h.dlid,
            sl: h.sl,
            src_path_bits: 0,
            static_rate: ((f >> 12) & 0xf) as u8,
            port_num: 1,
        },
        remote_qpn: h.dest_qp,
        remote_qkey: h.qkey,
    });
    out.op = SendOp::Send;
    out.signaled = f & ctrl::CQ_UPDATE == ctrl::CQ_UPDATE;
    let mut flags = SendFlags::empty();
    if out.signaled {
        flags |= SendFlags::SIGNALED;
    }
    if h.solicited {
        flags |= SendFlags::SOLICITED;
    }
    out.flags = flags;
    Ok(())
}

/// Decodes a receive scatter list (16-byte data segments up to the 0x100 terminator or the
/// end of the WQE).
pub(super) fn decode_scatter(segs: &[u8], out: &mut RecvWqe) -> Result<(), WqeFault> {
    out.sges.clear();
    for chunk in segs.chunks_exact(16) {
        let d: DataSeg = seg(chunk, 0)?;
        if d.lkey.get() == INVALID_LKEY {
            break;
        }
        out.sges.push(Sge {
            addr: d.addr.get(),
            length: d.byte_count.get() & !INLINE_SEG,
            lkey: d.lkey.get(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use zerocopy::IntoBytes;

    fn ctrl_seg(opcode: u8, ds: u8, flags: u32) -> [u8; 16] {
        let c = CtrlSeg {
            owner_opcode: u32::from(opcode).into(),
            fence_size: ds,
            srcrb_flags: flags.into(),
            ..CtrlSeg::default()
        };
        let mut b = [0u8; 16];
        b.copy_from_slice(c.as_bytes());
        b
    }

    #[test]
    fn inline_rdma_write_of_facts_10_1() {
        // RDMA WRITE of 8 inline bytes: ds = 3, header 0x80000008.
        let mut w = vec![0u8; 48];
        w[..16].copy_from_slice(&ctrl_seg(wop::RDMA_WRITE, 3, ctrl::CQ_UPDATE));
        w[16..24].copy_from_slice(&0x1000u64.to_be_bytes());
        w[24..28].copy_from_slice(&0x2100u32.to_be_bytes());
        w[32..36].copy_from_slice(&0x8000_0008u32.to_be_bytes());
        w[36..44].copy_from_slice(b"ABCDEFGH");
        let mut out = SendWqe::default();
        decode_send(&w, QpType::Rc, &mut out).unwrap();
        assert!(out.signaled && out.is_inline());
        assert_eq!(&out.inline_data[..], b"ABCDEFGH");
        assert!(matches!(out.op, SendOp::RdmaWrite { remote } if remote.rkey == 0x2100));
    }

    #[test]
    fn inline_continues_across_a_boundary_and_must_not_cross_one() {
        // ctrl (16) + inline header at 16 with 44 bytes (ends at 64), then 10 more at 64.
        let mut w = vec![0u8; 96];
        w[..16].copy_from_slice(&ctrl_seg(wop::SEND, 6, 0));
        w[16..20].copy_from_slice(&(INLINE_SEG | 44).to_be_bytes());
        w[64..68].copy_from_slice(&(INLINE_SEG | 10).to_be_bytes());
        let mut out = SendWqe::default();
        decode_send(&w, QpType::Rc, &mut out).unwrap();
        assert_eq!(out.inline_data.len(), 54);
        w[16..20].copy_from_slice(&(INLINE_SEG | 45).to_be_bytes());
        assert!(decode_send(&w, QpType::Rc, &mut out).is_err());
    }

    #[test]
    fn garbage_never_panics() {
        let mut out = SendWqe::default();
        for len in [0, 3, 16, 17, 40, 64] {
            let w = vec![0xffu8; len];
            let _ = decode_send(&w, QpType::Ud, &mut out);
            let _ = decode_send(&w, QpType::Rc, &mut out);
            let mut r = RecvWqe::default();
            let _ = decode_scatter(&w, &mut r);
        }
    }
    const SGID: [u8; 16] = [0x11; 16];

    fn header(src_qp: u32) -> UdHeader {
        UdHeader {
            sl: 2,
            dlid: 0x33,
            slid: 0,
            grh: Some(mlx::Route {
                traffic_class: 4,
                flow_label: 5,
                hop_limit: 64,
                sgid: SGID,
                dgid: [0x22; 16],
            }),
            solicited: false,
            pkey: 0xffff,
            dest_qp: 1,
            psn: 0,
            qkey: SpecialQp::GSI_QKEY,
            src_qp,
        }
    }

    /// An MLX WQE as the driver lays it out: control segment, the 68-byte header as two inline
    /// segments split at the 64-byte boundary, one data segment of `len` bytes.
    fn mlx_wqe(h: &UdHeader, payload: usize, len: u32, flags: u32) -> Vec<u8> {
        let mut hdr = [0u8; mlx::MAX_HEADER];
        let n = h.encode(payload, &mut hdr).unwrap();
        let mut w = vec![0u8; 112];
        w[..16].copy_from_slice(&ctrl_seg(wop::SEND, 7, flags));
        w[12..14].copy_from_slice(&h.dlid.to_be_bytes());
        w[16..20].copy_from_slice(&(INLINE_SEG | 44).to_be_bytes());
        w[20..64].copy_from_slice(&hdr[..44]);
        w[64..68].copy_from_slice(&(INLINE_SEG | (n as u32 - 44)).to_be_bytes());
        w[68..68 + n - 44].copy_from_slice(&hdr[44..n]);
        w[96..100].copy_from_slice(&len.to_be_bytes());
        w[100..104].copy_from_slice(&0x1234u32.to_be_bytes());
        w[104..112].copy_from_slice(&0x8000u64.to_be_bytes());
        w
    }

    #[test]
    fn an_mlx_wqe_becomes_a_ud_send_from_qp1() {
        let gids = [Gid([0; 16]), Gid(SGID)];
        let flags = ctrl::CQ_UPDATE | (2 << mlx::flags::SL_SHIFT);
        let w = mlx_wqe(&header(1), 256, 256, flags);
        let mut out = SendWqe::default();
        decode_mlx_send(&w, &gids, &mut out).unwrap();
        assert!(out.signaled && matches!(out.op, SendOp::Send));
        assert_eq!(out.sges.len(), 1);
        assert_eq!((out.sges[0].length, out.sges[0].lkey), (256, 0x1234));
        let ud = out.ud.unwrap();
        assert_eq!((ud.remote_qpn, ud.remote_qkey), (1, SpecialQp::GSI_QKEY));
        assert_eq!(ud.av.dgid, Gid([0x22; 16]));
        assert_eq!((ud.av.sgid_index, ud.av.sl, ud.av.dlid), (1, 2, 0x33));
        assert!(ud.av.is_global);
        assert_eq!(
            (ud.av.hop_limit, ud.av.traffic_class, ud.av.flow_label),
            (64, 4, 5)
        );
    }

    #[test]
    fn bad_mlx_wqes_are_faults() {
        let gids = [Gid(SGID)];
        let flags = ctrl::CQ_UPDATE | (2 << mlx::flags::SL_SHIFT);
        let mut out = SendWqe::default();
        let cases: [(&str, Vec<u8>, &[Gid]); 6] = [
            ("source QP 5", mlx_wqe(&header(5), 256, 256, flags), &gids),
            (
                "payload shorter than the header says",
                mlx_wqe(&header(1), 256, 200, flags),
                &gids,
            ),
            (
                "VL15",
                mlx_wqe(&header(1), 256, 256, flags | mlx::flags::VL15),
                &gids,
            ),
            (
                "SL differs",
                mlx_wqe(&header(1), 256, 256, ctrl::CQ_UPDATE),
                &gids,
            ),
            (
                "unknown source GID",
                mlx_wqe(&header(1), 256, 256, flags),
                &[],
            ),
            ("no header", ctrl_seg(wop::SEND, 1, flags).to_vec(), &gids),
        ];
        for (what, w, g) in cases {
            assert!(decode_mlx_send(&w, g, &mut out).is_err(), "{what}");
        }
        let mut w = mlx_wqe(&header(1), 256, 256, flags);
        w[3] = wop::RDMA_WRITE;
        assert!(decode_mlx_send(&w, &gids, &mut out).is_err(), "RDMA WRITE");
        let mut w = mlx_wqe(&header(1), 256, 256, flags);
        w[12] = 0x77;
        assert!(
            decode_mlx_send(&w, &gids, &mut out).is_err(),
            "DLID differs"
        );
        for len in [0, 3, 16, 20, 64, 100] {
            for fill in [0u8, 0xff, 0x80] {
                let _ = decode_mlx_send(&vec![fill; len], &gids, &mut out);
            }
        }
    }
}

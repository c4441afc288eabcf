//! The send queue: encodes work requests into mlx4 WQEs (rdma-core `providers/mlx4/qp.c`), stamps
//! the slot the HCA may prefetch next, and rings the UAR send doorbell or copies the WQE through
//! BlueFlame.

use std::mem::offset_of;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use portverbs_hal::barrier;
use portverbs_hal::error::WqeError;
use portverbs_hal::queue::SendQueue;
use portverbs_hal::types::{AccessFlags, MwType, QpType};
use portverbs_hal::wr::{
    MwBind, Payload, RemoteAddr, SendFlags, SendOp, SendOps, SendWr, Sge, UdDest,
};
use zerocopy::{IntoBytes as _, transmute};

use super::sq_mlx::MlxSend;
use crate::dma::{Slot, WorkRing, WqeSlot as _};
use crate::layout::av::Av;
use crate::layout::wqe::{
    AtomicSeg, BindSeg, CtrlSeg, DataSeg, DatagramSeg, INLINE_SEG, LocalInvalSeg, RaddrSeg, STAMP,
    bind, ctrl, opcode,
};
use crate::uar::Uar;

/// Most inline bytes per WQE this driver offers.
pub(crate) const MAX_INLINE: u32 = 256;

/// BlueFlame register of this QP.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BfReg {
    /// BAR2 offset of the register.
    pub(crate) offset: usize,
    /// Bytes per half.
    pub(crate) half: usize,
}

/// Host side of a send queue.
#[derive(Debug)]
pub struct Mlx4Sq {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    /// The WQE ring (slots of at least 64 bytes). Its producer counter is verbs-core's.
    pub(crate) buf: WorkRing<64>,
    pub(crate) spare: u32,
    pub(crate) max_sge: u32,
    pub(crate) max_inline: u32,
    /// The doorbells of the device's UAR page.
    pub(crate) uar: Uar,
    pub(crate) bf: Option<BfReg>,
    pub(crate) bf_half: usize,
    pub(crate) fatal: Arc<AtomicBool>,
    /// Bytes of the last WQE written if it carries inline data (a BlueFlame candidate), else 0.
    pub(crate) bf_len: usize,
    /// The GSI QP's header material: its sends are MLX-transport WQEs (Linux `hw/mlx4/qp.c`).
    pub(crate) mlx: Option<Box<MlxSend>>,
}

/// The largest WQE: ds is a 6-bit count of 16-byte units.
const MAX_WQE: usize = 63 * 16;

// The control segment is stored a dword at a time (the ownership dword last, after a barrier),
// at its `CtrlSeg` field offsets.
/// Ctrl dword 0: owner, BlueFlame counter, opcode.
pub(crate) const CTRL_OWNER: usize = offset_of!(CtrlSeg, owner_opcode);
/// Ctrl dword 1: VLAN (or the BlueFlame QPN), fence and size; its last byte is fence + size.
pub(crate) const CTRL_VLAN: usize = offset_of!(CtrlSeg, vlan_tag);
/// Ctrl byte 7: fence and size (ds).
pub(crate) const CTRL_FENCE_SIZE: usize = offset_of!(CtrlSeg, fence_size);
/// Ctrl dword 2: the flags.
pub(crate) const CTRL_FLAGS: usize = offset_of!(CtrlSeg, srcrb_flags);
/// Ctrl dword 3: immediate or rkey to invalidate.
pub(crate) const CTRL_IMM: usize = offset_of!(CtrlSeg, imm);
const _: () = assert!(CTRL_VLAN + 3 == CTRL_FENCE_SIZE);

// Every other segment is built as its `mlx4-layout` struct (the one the emulated HCA reads and
// `tests/mlx4dv_layout.rs` checks against rdma-core's `mlx4dv.h`) and stored into the slot as
// its bytes: `transmute!` checks the sizes at compile time and costs no copy, so the stores
// stay what hand-built byte arrays compiled to.

/// A remote-address segment (`struct mlx4_wqe_raddr_seg`).
#[inline(always)]
fn raddr_seg(r: &RemoteAddr) -> [u8; 16] {
    transmute!(RaddrSeg {
        raddr: r.addr.into(),
        rkey: r.rkey.into(),
        _r: 0.into(),
    })
}

/// An atomic segment (`struct mlx4_wqe_atomic_seg`).
#[inline(always)]
fn atomic_seg(swap_add: u64, compare: u64) -> [u8; 16] {
    transmute!(AtomicSeg {
        swap_add: swap_add.into(),
        compare: compare.into(),
    })
}

/// A data (gather) segment (`struct mlx4_wqe_data_seg`); a zero length is written as
/// [`INLINE_SEG`], as rdma-core does.
#[inline(always)]
pub(crate) fn data_seg(s: &Sge) -> [u8; 16] {
    let count = if s.length == 0 { INLINE_SEG } else { s.length };
    transmute!(DataSeg {
        byte_count: count.into(),
        lkey: s.lkey.into(),
        addr: s.addr.into(),
    })
}

/// The datagram segment of a UD send (`struct mlx4_wqe_datagram_seg`, 48 bytes). The address
/// vector carries the address handle's PD beside the port, as rdma-core's mlx4 provider writes
/// it (`mlx4_create_ah`); a vector built by hand, with no handle, carries PD 0.
fn datagram_seg(dest: &UdDest<'_>) -> [u8; 48] {
    let av = dest.av;
    let stf = (u32::from(av.sl & 0xf) << 28)
        | (u32::from(av.traffic_class) << 20)
        | (av.flow_label & 0xf_ffff);
    transmute!(DatagramSeg {
        av: Av {
            port_pd: ((u32::from(av.port_num) << 24) | (dest.ah_pd.unwrap_or(0) & 0xff_ffff))
                .into(),
            g_slid: (if av.is_global { 0x80 } else { 0 }) | (av.src_path_bits & 0x7f),
            dlid: av.dlid.into(),
            gid_index: av.sgid_index,
            stat_rate: av.static_rate,
            hop_limit: av.hop_limit,
            sl_tclass_flowlabel: stf.into(),
            dgid: av.dgid.0,
            ..Av::default()
        },
        dqpn: (dest.remote_qpn & 0xff_ffff).into(),
        qkey: dest.remote_qkey.into(),
        ..DatagramSeg::default()
    })
}

/// The memory-window bind segment (`struct mlx4_wqe_bind_seg`, 32 bytes).
fn bind_seg(b: &MwBind) -> [u8; 32] {
    let mut f1 = 0;
    if b.access.contains(AccessFlags::REMOTE_ATOMIC) {
        f1 |= bind::REMOTE_ATOMIC;
    }
    if b.access.contains(AccessFlags::REMOTE_WRITE) {
        f1 |= bind::REMOTE_WRITE;
    }
    if b.access.contains(AccessFlags::REMOTE_READ) {
        f1 |= bind::REMOTE_READ;
    }
    let mut f2 = if b.mw_type == MwType::Type2 {
        bind::TYPE_2
    } else {
        0
    };
    if b.access.contains(AccessFlags::ZERO_BASED) {
        f2 |= bind::ZERO_BASED;
    }
    transmute!(BindSeg {
        flags1: f1.into(),
        flags2: f2.into(),
        new_rkey: b.new_rkey.into(),
        lkey: b.mr_lkey.into(),
        addr: b.addr.into(),
        length: b.length.into(),
    })
}

/// The local-invalidate segment (`struct mlx4_wqe_local_inval_seg`, 32 bytes).
fn local_inval_seg(rkey: u32) -> [u8; 32] {
    transmute!(LocalInvalSeg {
        mem_key: rkey.into(),
        ..LocalInvalSeg::default()
    })
}

impl Mlx4Sq {
    /// Prepares every slot for pass 0: owner = 1 ("not yet valid"), ds = the whole slot, the
    /// 64-byte blocks stamped (as rdma-core's `mlx4_qp_init_sq_ownership`), written by the
    /// work ring's one initialisation.
    pub(crate) fn init_slots(&mut self) {
        let stride = self.buf.geom().stride();
        let ds = (stride / 16).min(63) as u8;
        let mut slot = vec![0u8; stride];
        let c = CtrlSeg {
            owner_opcode: ctrl::OWNER.into(),
            fence_size: ds,
            ..CtrlSeg::default()
        };
        slot[..size_of::<CtrlSeg>()].copy_from_slice(c.as_bytes());
        for b in (64..stride).step_by(64) {
            slot[b..b + 4].copy_from_slice(&STAMP.to_be_bytes());
        }
        let _ = self.buf.init(&slot);
    }

    /// Stamps the 64-byte blocks (after the first) of the WQE last written to the slot of
    /// `counter`, whose size its control segment still holds (as rdma-core `providers/mlx4/qp.c`
    /// does).
    #[inline(always)]
    fn stamp(&self, counter: u32) {
        let slot = self.buf.at(counter);
        let size = usize::from(slot.byte::<CTRL_FENCE_SIZE>() & ctrl::DS_MASK) * 16;
        slot.stamp_blocks(size, STAMP.to_be_bytes());
    }

    /// Writes the data segments at `at`; returns the end.
    #[inline(always)]
    pub(super) fn data_segs(
        &self,
        wqe: Slot<'_, 64>,
        mut at: usize,
        sges: &[Sge],
    ) -> Result<usize, WqeError> {
        let too_many = WqeError::TooManySges {
            given: sges.len(),
            max: self.max_sge,
        };
        if sges.len() > self.max_sge as usize {
            return Err(too_many);
        }
        for s in sges {
            if !wqe.put_at(at, data_seg(s)) {
                return Err(too_many);
            }
            at += 16;
        }
        Ok(at)
    }

    /// Writes inline data from offset `AT` in segments that never cross a 64-byte boundary
    /// (as rdma-core splits it); returns the end. `AT` is a constant per opcode, so the first
    /// segment's size is computed at compile time.
    #[inline(always)]
    fn inline<const AT: usize>(&self, wqe: Slot<'_, 64>, data: &[u8]) -> Result<usize, WqeError> {
        let too_large = || WqeError::InlineTooLarge {
            given: data.len(),
            max: self.max_inline,
        };
        if data.len() > self.max_inline as usize {
            return Err(too_large());
        }
        wqe.inline_segments::<AT>(INLINE_SEG, data)
            .ok_or_else(too_large)
    }

    /// Writes the payload (gather entries or inline data) from offset `AT`; returns the end.
    #[inline(always)]
    fn payload<const AT: usize>(
        &self,
        wqe: Slot<'_, 64>,
        wr: &SendWr<'_>,
    ) -> Result<usize, WqeError> {
        match wr.payload {
            Payload::Sges(s) => self.data_segs(wqe, AT, s),
            Payload::Inline(_) if wr.op.is_read_or_atomic() => Err(WqeError::OpNotSupported {
                op: "inline data on a read or atomic",
            }),
            Payload::Inline(d) => self.inline::<AT>(wqe, d),
        }
    }

    /// Writes every segment after the control segment straight into the slot; returns the
    /// opcode, the immediate (or rkey to invalidate) and the end of the WQE. The commonest
    /// operations on RC and UC QPs are encoded here; the rest out of line.
    #[inline(always)]
    fn body(&self, wqe: Slot<'_, 64>, wr: &SendWr<'_>) -> Result<(u8, u32, usize), WqeError> {
        if self.qp_type == QpType::Ud {
            return self.ud_body(wqe, wr);
        }
        Ok(match wr.op {
            SendOp::RdmaWrite { remote } => {
                wqe.put::<16, 16>(raddr_seg(&remote));
                (opcode::RDMA_WRITE, 0, self.payload::<32>(wqe, wr)?)
            }
            SendOp::Send => (opcode::SEND, 0, self.payload::<16>(wqe, wr)?),
            SendOp::SendWithImm { imm } => (opcode::SEND_IMM, imm, self.payload::<16>(wqe, wr)?),
            SendOp::RdmaWriteWithImm { remote, imm } => {
                wqe.put::<16, 16>(raddr_seg(&remote));
                (opcode::RDMA_WRITE_IMM, imm, self.payload::<32>(wqe, wr)?)
            }
            _ => return self.other_body(wqe, wr),
        })
    }

    /// [`Mlx4Sq::body`] of a UD send: the datagram segment, then the payload.
    #[inline(never)]
    fn ud_body(&self, wqe: Slot<'_, 64>, wr: &SendWr<'_>) -> Result<(u8, u32, usize), WqeError> {
        if let Some(m) = &self.mlx {
            return self.mlx_body(m, wqe, wr);
        }
        let Some(dest) = wr.ud else {
            return Err(WqeError::BadDestination {
                reason: "a UD send needs an address handle",
            });
        };
        let (op, imm) = match wr.op {
            SendOp::Send => (opcode::SEND, 0),
            SendOp::SendWithImm { imm } => (opcode::SEND_IMM, imm),
            _ => return Err(WqeError::OpNotSupported { op: wr.op.name() }),
        };
        wqe.put::<16, 48>(datagram_seg(&dest));
        Ok((op, imm, self.payload::<64>(wqe, wr)?))
    }

    /// [`Mlx4Sq::body`] of the less common operations on RC and UC QPs.
    #[inline(never)]
    fn other_body(&self, wqe: Slot<'_, 64>, wr: &SendWr<'_>) -> Result<(u8, u32, usize), WqeError> {
        // Which operations the transport has is hal's one table; the arms below only encode.
        if !SendOps::of_transport(self.qp_type).contains(wr.op.kind()) {
            return Err(WqeError::OpNotSupported { op: wr.op.name() });
        }
        Ok(match wr.op {
            SendOp::SendWithInv { rkey } => {
                (opcode::SEND_INVAL, rkey, self.payload::<16>(wqe, wr)?)
            }
            SendOp::RdmaRead { remote } => {
                wqe.put::<16, 16>(raddr_seg(&remote));
                (opcode::RDMA_READ, 0, self.payload::<32>(wqe, wr)?)
            }
            SendOp::AtomicCmpSwp {
                remote,
                compare,
                swap,
            } => {
                wqe.put::<16, 16>(raddr_seg(&remote));
                wqe.put::<32, 16>(atomic_seg(swap, compare));
                (opcode::ATOMIC_CS, 0, self.payload::<48>(wqe, wr)?)
            }
            SendOp::AtomicFetchAdd { remote, add } => {
                wqe.put::<16, 16>(raddr_seg(&remote));
                wqe.put::<32, 16>(atomic_seg(add, 0));
                (opcode::ATOMIC_FA, 0, self.payload::<48>(wqe, wr)?)
            }
            // Local operations carry no payload.
            SendOp::BindMw { bind } => {
                wqe.put::<16, 32>(bind_seg(&bind));
                (opcode::BIND_MW, 0, 48)
            }
            SendOp::LocalInv { rkey } => {
                wqe.put::<16, 32>(local_inval_seg(rkey));
                (opcode::LOCAL_INVAL, 0, 48)
            }
            _ => return Err(WqeError::OpNotSupported { op: wr.op.name() }),
        })
    }
}

impl SendQueue for Mlx4Sq {
    fn depth(&self) -> u32 {
        self.buf.geom().cnt - self.spare
    }

    fn max_sge(&self) -> u32 {
        self.max_sge
    }

    fn max_inline(&self) -> u32 {
        self.max_inline
    }

    /// Encodes straight into the ring slot (its old owner bit keeps the HCA off it until the
    /// last store). On an error the slot's body may have been overwritten, but it was not
    /// passed to the HCA.
    #[cfg_attr(not(portverbs_split), inline(always))]
    #[cfg_attr(portverbs_split, inline(never))]
    fn write_wqe(&mut self, counter: u32, wr: &SendWr<'_>, signaled: bool) -> Result<(), WqeError> {
        if self.fatal.load(Ordering::Relaxed) {
            return Err(WqeError::DeviceFatal);
        }
        let ring = self.buf.cursor();
        let wqe = ring.at(counter);
        let mut flags = 0;
        if signaled {
            flags |= ctrl::CQ_UPDATE;
        }
        if wr.flags.contains(SendFlags::SOLICITED) {
            flags |= ctrl::SOLICIT;
        }
        // Control segment dword 2 (flags) goes first: an MLX body adds its fields to it.
        wqe.put::<CTRL_FLAGS, 4>(flags.to_be_bytes());
        let (op, imm, end) = self.body(wqe, wr)?;
        let len = end.next_multiple_of(16);
        if len > MAX_WQE {
            return Err(WqeError::InlineTooLarge {
                given: wr.payload.len() as usize,
                max: self.max_inline,
            });
        }
        let fence = if wr.flags.contains(SendFlags::FENCE) {
            ctrl::FENCE
        } else {
            0
        };
        // Control segment dwords 1 and 3 (no VLAN; fence + size; immediate), a barrier,
        // then the ownership dword: the HCA may start on the WQE as soon as it is right.
        wqe.put::<CTRL_VLAN, 4>(u32::from((len / 16) as u8 | fence).to_be_bytes());
        wqe.put::<CTRL_IMM, 4>(imm.to_be_bytes());
        barrier::to_device();
        let owner = if ring.parity(counter) { ctrl::OWNER } else { 0 };
        wqe.publish4::<CTRL_OWNER>((owner | u32::from(op)).to_be_bytes());
        self.stamp(counter.wrapping_add(self.spare));
        self.bf_len = if matches!(wr.payload, Payload::Inline(_)) {
            len
        } else {
            0
        };
        Ok(())
    }

    #[cfg_attr(not(portverbs_split), inline)]
    #[cfg_attr(portverbs_split, inline(never))]
    fn ring_doorbell(&mut self, from: u32, to: u32) {
        barrier::to_device();
        let single = to.wrapping_sub(from) == 1;
        if let Some(bf) = self.bf {
            let len = self.bf_len;
            if single && len > 16 && len <= bf.half {
                // BlueFlame as rdma-core `providers/mlx4/qp.c` does it: the counter ORed into ctrl
                // dword 0 and the QPN into dword 1 (keeping fence and size) of the WQE in the ring,
                // then the WQE rounded up to 64 bytes copied from the ring through the register
                // half. The HCA ignores both fields in a WQE it fetches from the ring.
                let c = from;
                let wqe = self.buf.at(c);
                let d0 = u32::from_be_bytes(wqe.read::<CTRL_OWNER, 4>()) | ((c & 0xffff) << 8);
                wqe.publish4::<CTRL_OWNER>(d0.to_be_bytes());
                wqe.publish4::<CTRL_VLAN>(
                    ((self.qpn << 8) | u32::from(wqe.byte::<CTRL_FENCE_SIZE>())).to_be_bytes(),
                );
                let n = len.next_multiple_of(64);
                let (uar, at) = (&self.uar, bf.offset + self.bf_half);
                if wqe.lend(n, |block| uar.blueflame(at, block)).is_some() {
                    self.bf_half ^= bf.half;
                    return;
                }
            }
        }
        self.uar.send(self.qpn);
    }

    fn reset(&mut self) {
        self.bf_len = 0;
        self.init_slots();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use portverbs_hal::attr::AddressVector;
    use portverbs_hal::mmio::MemRegisters;

    use crate::dma::Slots;
    use crate::queues::Geometry;
    use crate::queues::rq::tests::ring;

    /// A send queue of two 256-byte slots for a QP of type `qp_type`.
    fn sq(qp_type: QpType) -> Mlx4Sq {
        let geom = Geometry {
            base: 0,
            shift: 8,
            cnt: 2,
        };
        let mut sq = Mlx4Sq {
            qpn: 0x4b,
            qp_type,
            buf: WorkRing::new(Slots::new(ring(geom.bytes()), geom).unwrap()),
            spare: 1,
            max_sge: 4,
            max_inline: 0,
            uar: Uar::over_bar(Arc::new(MemRegisters::new(4096)), 0),
            bf: None,
            bf_half: 0,
            fatal: Arc::new(AtomicBool::new(false)),
            bf_len: 0,
            mlx: None,
        };
        sq.init_slots();
        sq
    }

    /// Every operation on every transport: the WQE builder refuses exactly what hal's
    /// `SendOps::of_transport` leaves out, and encodes the rest.
    #[test]
    fn refuses_exactly_what_the_transport_table_leaves_out() {
        let bind = MwBind {
            new_rkey: 2,
            mw_type: MwType::Type2,
            mr_lkey: 3,
            addr: 0,
            length: 8,
            access: AccessFlags::REMOTE_WRITE,
        };
        let av = AddressVector::default();
        let dest = UdDest {
            ah_pd: None,
            av: &av,
            remote_qpn: 5,
            remote_qkey: 6,
        };
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            let allowed = SendOps::of_transport(t);
            let mut q = sq(t);
            for op in SendOp::one_of_each(RemoteAddr::default(), bind) {
                let mut wr = SendWr::new(1, op);
                if t == QpType::Ud {
                    wr = wr.ud(dest);
                }
                let got = q.write_wqe(0, &wr, true);
                if allowed.contains(op.kind()) {
                    assert!(got.is_ok(), "{t:?} {op:?}: {got:?}");
                } else {
                    assert!(
                        matches!(got, Err(WqeError::OpNotSupported { .. })),
                        "{t:?} {op:?}: {got:?}"
                    );
                }
            }
        }
    }

    /// The slot's first `N` bytes.
    fn slot_bytes<const N: usize>(q: &Mlx4Sq) -> [u8; N] {
        let mut out = [0u8; N];
        assert!(q.buf.at(0).read_at(0, &mut out));
        out
    }

    /// What the driver stores is what the layout structs (the ones the emulated HCA reads and
    /// the mlx4dv.h check covers) say, field by field, for each segment after the control one.
    #[test]
    fn segments_read_back_through_the_layout_structs() {
        use crate::layout::read;

        let mut q = sq(QpType::Rc);
        let remote = RemoteAddr {
            addr: 0x0123_4567_89ab_cdef,
            rkey: 0xa1b2_c3d4,
        };
        let sge = [Sge {
            addr: 0x1122_3344_5566_7788,
            length: 0,
            lkey: 0x99,
        }];
        let op = SendOp::AtomicCmpSwp {
            remote,
            compare: 5,
            swap: 6,
        };
        q.write_wqe(0, &SendWr::new(1, op).sges(&sge), true)
            .unwrap();
        let w = slot_bytes::<64>(&q);
        let c: CtrlSeg = read(&w).unwrap();
        assert_eq!(
            c.owner_opcode.get() & ctrl::OPCODE_MASK,
            u32::from(opcode::ATOMIC_CS)
        );
        assert_eq!(c.fence_size & ctrl::DS_MASK, 4);
        assert_eq!(c.srcrb_flags.get(), ctrl::CQ_UPDATE);
        let r: RaddrSeg = read(&w[16..]).unwrap();
        assert_eq!(
            (r.raddr.get(), r.rkey.get(), r._r.get()),
            (remote.addr, remote.rkey, 0)
        );
        let a: AtomicSeg = read(&w[32..]).unwrap();
        assert_eq!((a.swap_add.get(), a.compare.get()), (6, 5));
        let d: DataSeg = read(&w[48..]).unwrap();
        assert_eq!(
            (d.byte_count.get(), d.lkey.get(), d.addr.get()),
            (INLINE_SEG, 0x99, sge[0].addr),
            "a zero-length entry is written as rdma-core writes it"
        );

        let bind = MwBind {
            new_rkey: 0x4455,
            mw_type: MwType::Type2,
            mr_lkey: 0x66,
            addr: 0x7000,
            length: 0x800,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_ATOMIC
                | AccessFlags::ZERO_BASED,
        };
        q.write_wqe(0, &SendWr::new(2, SendOp::BindMw { bind }), false)
            .unwrap();
        let b: BindSeg = read(&slot_bytes::<48>(&q)[16..]).unwrap();
        assert_eq!(
            b,
            BindSeg {
                flags1: (bind::REMOTE_WRITE | bind::REMOTE_ATOMIC).into(),
                flags2: (bind::TYPE_2 | bind::ZERO_BASED).into(),
                new_rkey: 0x4455.into(),
                lkey: 0x66.into(),
                addr: 0x7000.into(),
                length: 0x800.into(),
            }
        );
        q.write_wqe(0, &SendWr::new(3, SendOp::LocalInv { rkey: 0x1234 }), false)
            .unwrap();
        let l: LocalInvalSeg = read(&slot_bytes::<48>(&q)[16..]).unwrap();
        assert_eq!(
            l,
            LocalInvalSeg {
                mem_key: 0x1234.into(),
                ..LocalInvalSeg::default()
            }
        );

        let mut q = sq(QpType::Ud);
        let av = portverbs_hal::attr::AddressVector {
            dgid: portverbs_hal::types::Gid([0xf5; 16]),
            sgid_index: 2,
            flow_label: 0x1_2345,
            hop_limit: 64,
            traffic_class: 0xa0,
            is_global: true,
            dlid: 0x21,
            sl: 3,
            src_path_bits: 0x05,
            static_rate: 7,
            port_num: 1,
        };
        let dest = UdDest {
            ah_pd: Some(0x12_3456),
            av: &av,
            remote_qpn: 0x0100_0abc,
            remote_qkey: 0x8001_0002,
        };
        let wr = SendWr::new(4, SendOp::Send).sges(&sge[..0]).ud(dest);
        q.write_wqe(0, &wr, true).unwrap();
        let g: DatagramSeg = read(&slot_bytes::<64>(&q)[16..]).unwrap();
        assert_eq!(
            g,
            DatagramSeg {
                av: Av {
                    port_pd: ((1 << 24) | 0x12_3456).into(),
                    g_slid: 0x85,
                    dlid: 0x21.into(),
                    gid_index: 2,
                    stat_rate: 7,
                    hop_limit: 64,
                    sl_tclass_flowlabel: 0x3a01_2345.into(),
                    dgid: [0xf5; 16],
                    ..Av::default()
                },
                dqpn: 0xabc.into(),
                qkey: 0x8001_0002.into(),
                ..DatagramSeg::default()
            },
            "the remote QPN is masked to 24 bits; the handle's PD rides in the vector"
        );
    }
}

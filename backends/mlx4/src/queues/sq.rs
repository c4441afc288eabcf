//! The send queue: encodes work requests into mlx4 WQEs (facts §5.2–§5.5), stamps the slot the
//! HCA may prefetch next, and rings the UAR send doorbell or copies the WQE through BlueFlame.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use portverbs_hal::barrier;
use portverbs_hal::error::WqeError;
use portverbs_hal::mmio::Mmio;
use portverbs_hal::queue::SendQueue;
use portverbs_hal::types::{AccessFlags, MwType, QpType};
use portverbs_hal::wr::{Payload, SendFlags, SendOp, SendWr, Sge};

use crate::dma::Slots;
use crate::layout::uar::SEND_DOORBELL;
use crate::layout::wqe::{INLINE_ALIGN, INLINE_SEG, STAMP, bind, ctrl, opcode};

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
    /// The WQE ring (slots of at least 64 bytes).
    pub(crate) buf: Slots<64>,
    pub(crate) spare: u32,
    pub(crate) max_sge: u32,
    pub(crate) max_inline: u32,
    pub(crate) bar2: Arc<dyn Mmio>,
    /// BAR2 offset of the UAR send doorbell.
    pub(crate) db_offset: usize,
    pub(crate) bf: Option<BfReg>,
    pub(crate) bf_half: usize,
    pub(crate) fatal: Arc<AtomicBool>,
    /// The WQE being built (at most one slot).
    pub(crate) wqe: Box<WqeBuf>,
    /// ds of the WQE last written to each slot (for stamping).
    pub(crate) ds: Box<[u8]>,
    /// WQEs written since the last doorbell, and the size of the last one.
    pub(crate) batch: u32,
    pub(crate) last_len: usize,
    pub(crate) last_inline: bool,
    pub(crate) last_counter: u32,
}

/// Bytes of the local WQE buffer: the largest stride (1024) plus room for BlueFlame's rounding
/// up to 64 bytes, so that no store into it can fall outside.
pub(crate) const WQE_BUF: usize = 1024 + 64;

/// The WQE being built. A fixed-size array, so that stores at constant offsets need no
/// run-time bounds check.
pub(crate) type WqeBuf = [u8; WQE_BUF];

#[inline(always)]
fn put32(b: &mut WqeBuf, at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

#[inline(always)]
fn put64(b: &mut WqeBuf, at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

impl Mlx4Sq {
    /// Prepares every slot for pass 0: owner = 1 ("not yet valid"), ds = the whole slot, the
    /// 64-byte blocks stamped (facts §5.2).
    pub(crate) fn init_slots(&mut self) {
        let ds = (self.buf.geom().stride() / 16).min(63) as u8;
        let mut slot = vec![0u8; self.buf.geom().stride()];
        slot[..4].copy_from_slice(&ctrl::OWNER.to_be_bytes());
        slot[7] = ds;
        for b in (64..self.buf.geom().stride()).step_by(64) {
            slot[b..b + 4].copy_from_slice(&STAMP.to_be_bytes());
        }
        for i in 0..self.buf.geom().cnt {
            self.buf.write(i, 0, &slot);
        }
        self.ds.fill(ds);
    }

    #[inline(always)]
    fn stamp(&self, counter: u32) {
        let slot = (counter & (self.buf.geom().cnt - 1)) as usize;
        let ds = usize::from(self.ds[slot]);
        let mut b = 64;
        while b < ds * 16 {
            self.buf.store4_at(counter, b, STAMP.to_be_bytes());
            b += 64;
        }
    }

    /// Appends data segments; returns the new length.
    #[inline(always)]
    fn data_segs(&mut self, mut at: usize, sges: &[Sge]) -> Result<usize, WqeError> {
        if sges.len() > self.max_sge as usize {
            return Err(WqeError::TooManySges {
                given: sges.len(),
                max: self.max_sge,
            });
        }
        for s in sges {
            let count = if s.length == 0 { INLINE_SEG } else { s.length };
            put32(&mut self.wqe, at, count);
            put32(&mut self.wqe, at + 4, s.lkey);
            put64(&mut self.wqe, at + 8, s.addr);
            at += 16;
        }
        Ok(at)
    }

    /// Appends inline data in segments that never cross a 64-byte boundary; returns the new
    /// length (not yet rounded).
    #[inline(always)]
    fn inline(&mut self, mut at: usize, data: &[u8]) -> Result<usize, WqeError> {
        if data.len() > self.max_inline as usize {
            return Err(WqeError::InlineTooLarge {
                given: data.len(),
                max: self.max_inline,
            });
        }
        let mut rest = data;
        loop {
            let room = INLINE_ALIGN - (at + 4) % INLINE_ALIGN;
            let n = rest.len().min(room);
            put32(&mut self.wqe, at, INLINE_SEG | n as u32);
            self.wqe[at + 4..at + 4 + n].copy_from_slice(&rest[..n]);
            at += 4 + n;
            rest = &rest[n..];
            if rest.is_empty() {
                return Ok(at);
            }
        }
    }

    #[inline(always)]
    fn encode(&mut self, wr: &SendWr<'_>) -> Result<(u8, u32, usize), WqeError> {
        let mut at = 16;
        let mut imm = 0;
        let ud = self.qp_type == QpType::Ud;
        if ud {
            let Some(dest) = wr.ud else {
                return Err(WqeError::BadDestination {
                    reason: "a UD send needs an address handle",
                });
            };
            if !matches!(wr.op, SendOp::Send | SendOp::SendWithImm { .. }) {
                return Err(WqeError::OpNotSupported { op: wr.op.name() });
            }
            let av = dest.av;
            put32(&mut self.wqe, at, u32::from(av.port_num) << 24);
            self.wqe[at + 4] = 0;
            self.wqe[at + 5] = (if av.is_global { 0x80 } else { 0 }) | (av.src_path_bits & 0x7f);
            self.wqe[at + 6..at + 8].copy_from_slice(&av.dlid.to_be_bytes());
            self.wqe[at + 8] = 0;
            self.wqe[at + 9] = av.sgid_index;
            self.wqe[at + 10] = av.static_rate;
            self.wqe[at + 11] = av.hop_limit;
            put32(
                &mut self.wqe,
                at + 12,
                (u32::from(av.sl & 0xf) << 28)
                    | (u32::from(av.traffic_class) << 20)
                    | (av.flow_label & 0xf_ffff),
            );
            self.wqe[at + 16..at + 32].copy_from_slice(&av.dgid.0);
            put32(&mut self.wqe, at + 32, dest.remote_qpn & 0xff_ffff);
            put32(&mut self.wqe, at + 36, dest.remote_qkey);
            self.wqe[at + 40..at + 48].fill(0);
            at += 48;
        }
        let raddr = |wqe: &mut WqeBuf, at: usize, r: &portverbs_hal::wr::RemoteAddr| {
            put64(wqe, at, r.addr);
            put32(wqe, at + 8, r.rkey);
            put32(wqe, at + 12, 0);
            at + 16
        };
        let uc = self.qp_type == QpType::Uc;
        let op = match wr.op {
            SendOp::Send => opcode::SEND,
            SendOp::SendWithImm { imm: v } => {
                imm = v;
                opcode::SEND_IMM
            }
            SendOp::SendWithInv { rkey } => {
                imm = rkey;
                opcode::SEND_INVAL
            }
            SendOp::RdmaWrite { remote } if !ud => {
                at = raddr(&mut self.wqe, at, &remote);
                opcode::RDMA_WRITE
            }
            SendOp::RdmaWriteWithImm { remote, imm: v } if !ud => {
                imm = v;
                at = raddr(&mut self.wqe, at, &remote);
                opcode::RDMA_WRITE_IMM
            }
            SendOp::RdmaRead { remote } if !ud && !uc => {
                at = raddr(&mut self.wqe, at, &remote);
                opcode::RDMA_READ
            }
            SendOp::AtomicCmpSwp {
                remote,
                compare,
                swap,
            } if !ud && !uc => {
                at = raddr(&mut self.wqe, at, &remote);
                put64(&mut self.wqe, at, swap);
                put64(&mut self.wqe, at + 8, compare);
                at += 16;
                opcode::ATOMIC_CS
            }
            SendOp::AtomicFetchAdd { remote, add } if !ud && !uc => {
                at = raddr(&mut self.wqe, at, &remote);
                put64(&mut self.wqe, at, add);
                put64(&mut self.wqe, at + 8, 0);
                at += 16;
                opcode::ATOMIC_FA
            }
            SendOp::BindMw { bind: b } if !ud => {
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
                let f2 = if b.mw_type == MwType::Type2 {
                    bind::TYPE_2
                } else {
                    0
                };
                put32(&mut self.wqe, at, f1);
                put32(&mut self.wqe, at + 4, f2);
                put32(&mut self.wqe, at + 8, b.new_rkey);
                put32(&mut self.wqe, at + 12, b.mr_lkey);
                put64(&mut self.wqe, at + 16, b.addr);
                put64(&mut self.wqe, at + 24, b.length);
                at += 32;
                opcode::BIND_MW
            }
            SendOp::LocalInv { rkey } if !ud => {
                self.wqe[at..at + 32].fill(0);
                put32(&mut self.wqe, at + 8, rkey);
                at += 32;
                opcode::LOCAL_INVAL
            }
            other => return Err(WqeError::OpNotSupported { op: other.name() }),
        };
        if !wr.op.is_local() {
            at = match wr.payload {
                Payload::Sges(s) => self.data_segs(at, s)?,
                Payload::Inline(d) => {
                    if wr.op.is_read_or_atomic() {
                        return Err(WqeError::OpNotSupported {
                            op: "inline data on a read or atomic",
                        });
                    }
                    self.inline(at, d)?
                }
            };
        }
        let len = at.next_multiple_of(16);
        if len > self.buf.geom().stride() {
            return Err(WqeError::InlineTooLarge {
                given: wr.payload.len() as usize,
                max: self.max_inline,
            });
        }
        // Pad to 16 bytes (`at + 16` stays inside: `len` is at most a stride).
        self.wqe[at..at + 16].fill(0);
        Ok((op, imm, len))
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

    #[inline]
    fn write_wqe(&mut self, counter: u32, wr: &SendWr<'_>, signaled: bool) -> Result<(), WqeError> {
        if self.fatal.load(Ordering::Relaxed) {
            return Err(WqeError::DeviceFatal);
        }
        let (op, imm, len) = self.encode(wr)?;
        let ds = (len / 16) as u8;
        let owner = if self.buf.geom().parity(counter) {
            ctrl::OWNER
        } else {
            0
        };
        put32(&mut self.wqe, 0, owner | u32::from(op));
        self.wqe[4..7].copy_from_slice(&[0; 3]);
        self.wqe[7] = ds
            | if wr.flags.contains(SendFlags::FENCE) {
                ctrl::FENCE
            } else {
                0
            };
        let mut flags = 0;
        if signaled {
            flags |= ctrl::CQ_UPDATE;
        }
        if wr.flags.contains(SendFlags::SOLICITED) {
            flags |= ctrl::SOLICIT;
        }
        put32(&mut self.wqe, 8, flags);
        put32(&mut self.wqe, 12, imm);
        // Everything but the ownership dword, a barrier, then ownership: the HCA may start on
        // the WQE as soon as the owner bit is right.
        self.buf.write(counter, 4, &self.wqe[4..len]);
        barrier::to_device();
        self.buf.store4::<0>(
            counter,
            [self.wqe[0], self.wqe[1], self.wqe[2], self.wqe[3]],
        );
        self.ds[(counter & (self.buf.geom().cnt - 1)) as usize] = ds;
        self.stamp(counter.wrapping_add(self.spare));
        self.batch += 1;
        self.last_len = len;
        self.last_inline = matches!(wr.payload, Payload::Inline(_));
        self.last_counter = counter;
        Ok(())
    }

    #[inline]
    fn ring_doorbell(&mut self, _head: u32) {
        barrier::to_device();
        let single = self.batch == 1 && self.last_inline;
        self.batch = 0;
        if let Some(bf) = self.bf {
            if single && self.last_len > 16 && self.last_len <= bf.half {
                // facts §4.4: counter into ctrl dword 0, qpn into dword 1, then the WQE rounded
                // up to 64 bytes through the write-combining register half.
                let c = u32::from_be_bytes([self.wqe[0], self.wqe[1], self.wqe[2], self.wqe[3]]);
                put32(&mut self.wqe, 0, c | ((self.last_counter & 0xffff) << 8));
                let fence_size = u32::from(self.wqe[7]);
                put32(&mut self.wqe, 4, (self.qpn << 8) | fence_size);
                let n = self.last_len.next_multiple_of(64);
                let mut pad = self.last_len;
                while pad < n {
                    self.wqe[pad..pad + 16].fill(0);
                    pad += 16;
                }
                let _ = self.bar2.write_wc(bf.offset + self.bf_half, &self.wqe[..n]);
                self.bf_half ^= bf.half;
                return;
            }
        }
        let _ = self.bar2.write32(self.db_offset, self.qpn << 8);
    }

    fn reset(&mut self) {
        self.batch = 0;
        self.init_slots();
    }
}

/// The UAR send doorbell's BAR2 offset for UAR page `uar`.
pub(crate) fn doorbell_offset(uar: u32) -> usize {
    uar as usize * crate::layout::uar::UAR_PAGE + SEND_DOORBELL
}

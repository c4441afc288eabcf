//! Memory (Linux `mlx4/mr.c`): SW2HW_MPT / QUERY_MPT / HW2SW_MPT and WRITE_MTT. A region
//! MPT is translated through its MTT range to one DMA region and registered in the engine's
//! key table at the key the driver formed (key = rotl8(MPT field)); an MPT without the REGION
//! bit is a memory window allocated at its key.

use portverbs_hal::error::CommandError;
use portverbs_hal::types::{AccessFlags, MwType};
use portverbs_mlx4_layout::ctx::{Mpt, mpt_flag};
use portverbs_mlx4_layout::mailbox::{WRITE_MTT_MAX, WriteMttHeader};
use portverbs_mlx4_layout::opcode as op;
use portverbs_mlx4_layout::status::Status;
use portverbs_transport::Engine;
use portverbs_transport::memory::MrSpec;
use zerocopy::{FromBytes, IntoBytes};

use super::mem::Buf;
use super::{CmdResult, Command, Hw, check_number};
use crate::caps;

/// PHYSICAL regions covering the whole address space (`len64`): accepted, never translated.
const LEN64: u32 = 1 << 22;

/// What an MPT index holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MptRec {
    /// A region registered in the engine at `key`; `None` when it cannot be translated (a
    /// whole-address-space physical region).
    Region { key: Option<u32> },
    /// A memory window.
    Window,
}

/// The engine rights of an MPT's flags (LOCAL_READ is implicit).
fn access(flags: u32) -> AccessFlags {
    let mut a = AccessFlags::empty();
    for (bit, f) in [
        (mpt_flag::LOCAL_WRITE, AccessFlags::LOCAL_WRITE),
        (mpt_flag::REMOTE_READ, AccessFlags::REMOTE_READ),
        (mpt_flag::REMOTE_WRITE, AccessFlags::REMOTE_WRITE),
        (mpt_flag::ATOMIC, AccessFlags::REMOTE_ATOMIC),
        (mpt_flag::BIND_ENABLE, AccessFlags::MW_BIND),
    ] {
        if flags & bit != 0 {
            a |= f;
        }
    }
    a
}

impl Hw {
    fn dmpt_addr(&self, index: u32) -> Result<u64, Status> {
        let l = self.layout()?;
        check_number(index, l.log_mpt, 1 << caps::LOG_RSVD_MRW)?;
        Ok(l.dmpt + u64::from(index) * u64::from(caps::DMPT_ENTRY))
    }

    pub(super) fn mpt_command(&mut self, engine: &mut Engine, cmd: &Command) -> CmdResult {
        if cmd.opcode == op::WRITE_MTT {
            return self.write_mtt(cmd);
        }
        let index = cmd.in_mod;
        let at = self.dmpt_addr(index)?;
        match cmd.opcode {
            op::SW2HW_MPT => self.sw2hw_mpt(engine, index, at, cmd),
            op::QUERY_MPT => {
                if !self.mpts.contains(index) {
                    return Err(Status::BadResState);
                }
                let ctx = self.mpt_context(engine, index, at)?;
                self.outbox(cmd.out_param, &ctx).map(|()| None)
            }
            _ => {
                let Some(&rec) = self.mpts.get(index) else {
                    return Err(Status::BadResState);
                };
                let ctx = self.mpt_context(engine, index, at)?;
                if cmd.opmod == 0 {
                    self.mailbox(cmd.out_param, ctx.len())?;
                }
                match rec {
                    MptRec::Region { key: Some(key) } => {
                        engine.memory_mut().deregister(key).map_err(|e| match e {
                            CommandError::Busy { .. } => Status::RegBound,
                            _ => Status::InternalErr,
                        })?;
                    }
                    MptRec::Region { key: None } => {}
                    MptRec::Window => {
                        let _ = engine.memory_mut().dealloc_mw_index(index);
                    }
                }
                self.mpts.remove(index);
                if cmd.opmod == 0 {
                    self.outbox(cmd.out_param, &ctx)?;
                }
                Ok(None)
            }
        }
    }

    fn sw2hw_mpt(&mut self, engine: &mut Engine, index: u32, at: u64, cmd: &Command) -> CmdResult {
        if self.mpts.contains(index) {
            return Err(Status::BadResState);
        }
        if !self.icm.is_mapped(at) {
            return Err(Status::IcmError);
        }
        let mut mpt: Mpt = self.inbox(cmd.in_param)?;
        let hw_key = mpt.key.get();
        let mask = (1u32 << self.layout()?.log_mpt) - 1;
        if hw_key & 0xff_ffff & mask != index {
            return Err(Status::BadParam);
        }
        let key = hw_key.rotate_left(8);
        let flags = mpt.flags.get();
        let pd = mpt.pd_flags.get() & 0xff_ffff;
        let rec = if flags & mpt_flag::REGION != 0 {
            let start = mpt.start.get();
            let len = mpt.length.get();
            let buf = if flags & mpt_flag::PHYSICAL != 0 {
                if mpt.mtt_rep.get() & LEN64 != 0 {
                    None
                } else {
                    let n = usize::try_from(len).map_err(|_| Status::BadParam)?;
                    Some(Buf::at(&self.shared.iova, start, n).ok_or(Status::BadParam)?)
                }
            } else {
                let shift = mpt.entity_size.get();
                if !(12..=30).contains(&shift) {
                    return Err(Status::BadParam);
                }
                let first = mpt.mtt_addr.get() / 8;
                Some(self.resolve(first, shift, start & ((1 << shift) - 1), len)?)
            };
            match buf {
                Some(b) => {
                    engine
                        .memory_mut()
                        .register_at(
                            key,
                            MrSpec {
                                pd,
                                access: access(flags),
                                va: start,
                                len,
                                mem: b.mem,
                                mem_offset: b.off,
                            },
                        )
                        .map_err(|_| Status::BadParam)?;
                    MptRec::Region { key: Some(key) }
                }
                None => MptRec::Region { key: None },
            }
        } else {
            let ty = if mpt.qpn.get() & mpt_flag::QP_BOUND != 0 {
                MwType::Type2
            } else {
                MwType::Type1
            };
            engine
                .memory_mut()
                .alloc_mw_at(key, pd, ty)
                .map_err(|_| Status::BadParam)?;
            MptRec::Window
        };
        // The hardware owns the entry now: status nibble 0.
        mpt.flags = (flags & 0x0fff_ffff).into();
        if let Err(s) = self.icm_write(at, mpt.as_bytes()) {
            match rec {
                MptRec::Region { key: Some(k) } => {
                    let _ = engine.memory_mut().deregister(k);
                }
                MptRec::Window => {
                    let _ = engine.memory_mut().dealloc_mw_index(index);
                }
                MptRec::Region { key: None } => {}
            }
            return Err(s);
        }
        self.mpts.insert(index, rec);
        Ok(None)
    }

    /// The MPT as QUERY_MPT returns it: the entry SW2HW_MPT stored, with a window's current key.
    fn mpt_context(&self, engine: &Engine, index: u32, at: u64) -> Result<Vec<u8>, Status> {
        let raw = self.icm_read(at, size_of::<Mpt>())?;
        let mut mpt = Mpt::read_from_bytes(&raw).map_err(|_| Status::IcmError)?;
        if let Some(key) = engine.memory().key_at(index) {
            mpt.key = key.rotate_right(8).into();
        }
        Ok(mpt.as_bytes().to_vec())
    }

    /// WRITE_MTT: BE64 first index, BE64 reserved, then `in_mod` BE64 entries into the ICM MTT
    /// table.
    fn write_mtt(&mut self, cmd: &Command) -> CmdResult {
        let n = cmd.in_mod as usize;
        if n == 0 || n > WRITE_MTT_MAX {
            return Err(Status::BadParam);
        }
        let base = self.layout()?.mtt;
        let raw = self
            .mailbox(cmd.in_param, 16 + n * 8)?
            .vec(0, 16 + n * 8)
            .ok_or(Status::BadParam)?;
        let (h, entries) = WriteMttHeader::read_from_prefix(&raw).map_err(|_| Status::BadParam)?;
        let at = h
            .start
            .get()
            .checked_mul(8)
            .and_then(|o| o.checked_add(base))
            .ok_or(Status::BadParam)?;
        self.icm_write(at, entries).map(|()| None)
    }
}

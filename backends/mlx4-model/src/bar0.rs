//! BAR0 of the model (Linux `mlx4/cmd.c`, `mlx4/reset.c`): the HCR, the reset register and
//! semaphores, the catastrophic-error buffer and the clear-interrupt register, over an atomic
//! register file.
//!
//! A 32-bit write of the HCR status dword with go = 1 latches the command and executes it at
//! once in the writing thread, under the fabric lock: status into bits 31:24, t kept as
//! written, go cleared, an immediate output into out_param, and — when the e bit is set — a
//! command-completion EQE on the EQ mapped for type 0x0a.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use portverbs_fabric::NodeHandle;
use portverbs_hal::mmio::{MemRegisters, Mmio, MmioError, check_access};
use portverbs_mlx4_layout::hcr::{
    BAR0_MIN_LEN, EVENT, GO, HCR_BASE, OWNER_SEMAPHORE, RESET_REG, RESET_SEMAPHORE, StatusWord,
    dword,
};

use crate::caps::{CATAS_DWORDS, CATAS_OFFSET};
use crate::hw::{self, Command, ModelNode};
use crate::shared::{Shared, Stats};

/// The model's BAR0.
#[derive(Debug)]
pub(crate) struct Bar0 {
    regs: MemRegisters,
    shared: Arc<Shared>,
    handle: NodeHandle<ModelNode>,
}

fn catas_range(offset: usize) -> bool {
    (CATAS_OFFSET..CATAS_OFFSET + CATAS_DWORDS as usize * 4).contains(&offset)
}

impl Bar0 {
    pub(crate) fn new(shared: Arc<Shared>, handle: NodeHandle<ModelNode>) -> Self {
        Self {
            regs: MemRegisters::new(BAR0_MIN_LEN),
            shared,
            handle,
        }
    }

    fn hcr(&self, d: usize) -> u32 {
        self.regs.read32(HCR_BASE + d).unwrap_or(0)
    }

    fn set_hcr(&self, d: usize, v: u32) {
        let _ = self.regs.write32(HCR_BASE + d, v);
    }

    /// Marks the catastrophic-error buffer (what a health check polls).
    pub(crate) fn set_catastrophic(&self) {
        let _ = self.regs.write32(CATAS_OFFSET, 0xdead_0001);
    }

    /// Power-on register contents.
    fn clear(&self) {
        for off in (0..BAR0_MIN_LEN).step_by(4) {
            let _ = self.regs.write32(off, 0);
        }
    }

    /// The reset register: everything back to power-on state.
    fn reset(&self) {
        let _ = self.handle.try_with(|ctx| hw::reset(ctx, false));
        self.shared.cmd_timeout.store(false, Ordering::Release);
        self.shared.hold_events.store(false, Ordering::Release);
        self.shared
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
        self.shared.corrupt_cqe.store(0, Ordering::Release);
        self.clear();
    }

    /// The status dword was written.
    fn post(&self, word: u32) {
        self.set_hcr(dword::STATUS, word);
        if word & GO == 0 {
            return;
        }
        Stats::bump(&self.shared.stats.commands);
        if self.shared.cmd_timeout.load(Ordering::Acquire) {
            // The command latched and never completes: go stays set until a reset.
            return;
        }
        let w = StatusWord(word);
        let hi_lo = |hi, lo| (u64::from(self.hcr(hi)) << 32) | u64::from(self.hcr(lo));
        let cmd = Command {
            in_param: hi_lo(dword::IN_PARAM_HI, dword::IN_PARAM_LO),
            in_mod: self.hcr(dword::IN_MODIFIER),
            out_param: hi_lo(dword::OUT_PARAM_HI, dword::OUT_PARAM_LO),
            opcode: w.opcode(),
            opmod: w.opmod(),
        };
        let token = (self.hcr(dword::TOKEN) >> 16) as u16;
        let _ = self.handle.try_with(|ctx| {
            let (status, imm) = hw::run_command(ctx, &cmd);
            if let Some(v) = imm {
                self.set_hcr(dword::OUT_PARAM_HI, (v >> 32) as u32);
                self.set_hcr(dword::OUT_PARAM_LO, v as u32);
            }
            self.set_hcr(dword::STATUS, w.completed(status).0);
            if word & EVENT != 0 && !self.shared.hold_completion(token, status, imm.unwrap_or(0)) {
                ctx.node.hw.command_event(token, status, imm.unwrap_or(0));
            }
        });
    }
}

impl Mmio for Bar0 {
    fn len(&self) -> usize {
        BAR0_MIN_LEN
    }

    fn read32(&self, offset: usize) -> Result<u32, MmioError> {
        check_access(offset, 4, self.len())?;
        if self.shared.removed() {
            return Err(MmioError::Removed);
        }
        match offset {
            RESET_SEMAPHORE => Ok(0),
            // Read-to-acquire: 0 for the first reader, then 1 until released by writing 0.
            OWNER_SEMAPHORE => {
                let v = self.regs.read32(offset)?;
                self.regs.write32(offset, 1)?;
                Ok(v)
            }
            _ => self.regs.read32(offset),
        }
    }

    fn write32(&self, offset: usize, value: u32) -> Result<(), MmioError> {
        check_access(offset, 4, self.len())?;
        if self.shared.removed() {
            return Ok(());
        }
        match offset {
            o if o == HCR_BASE + dword::STATUS => self.post(value),
            RESET_REG => {
                if value & 1 != 0 {
                    self.reset();
                }
            }
            RESET_SEMAPHORE => {}
            o if catas_range(o) => {}
            _ => self.regs.write32(offset, value)?,
        }
        Ok(())
    }

    fn write64(&self, offset: usize, value: u64) -> Result<(), MmioError> {
        check_access(offset, 8, self.len())?;
        self.write32(offset, (value >> 32) as u32)?;
        self.write32(offset + 4, value as u32)
    }

    fn write_wc(&self, offset: usize, block: &[u8]) -> Result<(), MmioError> {
        check_access(offset, block.len().max(8), self.len())?;
        Ok(())
    }
}

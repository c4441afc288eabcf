//! Firmware-level commands (Linux `mlx4/fw.c`, `mlx4/icm.c`, `mlx4/main.c`): queries, the firmware
//! area, ICM sizing and mapping, INIT_HCA / CLOSE_HCA, and the list of opcodes the model knows.

use portverbs_mlx4_layout::mailbox::{InitHca, PAGE_LIST_MAX, PageListEntry, split_base_log};
use portverbs_mlx4_layout::opcode as op;
use portverbs_mlx4_layout::status::Status;
use portverbs_transport::Engine;
use zerocopy::{FromBytes, IntoBytes};

use super::{CmdResult, Command, Hw};
use crate::caps;
use crate::iova::PAGE;

/// SYNC_TPT (flushes TPT caches; nothing to do in a model).
pub(super) const SYNC_TPT: u16 = 0x02f;

/// Firmware state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fw {
    /// After reset: only QUERY_FW, MAP_FA, UNMAP_FA and RUN_FW.
    Off,
    /// After RUN_FW: queries, ICM sizing and mapping, INIT_HCA.
    Running,
    /// After INIT_HCA: object commands.
    Initialized,
}

/// The table layout INIT_HCA gave.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    pub(super) qpc: u64,
    pub(super) log_qp: u8,
    pub(super) srqc: u64,
    pub(super) log_srq: u8,
    pub(super) cqc: u64,
    pub(super) log_cq: u8,
    pub(super) eqc: u64,
    pub(super) log_eq: u8,
    pub(super) dmpt: u64,
    pub(super) log_mpt: u8,
    pub(super) mtt: u64,
    /// The multicast group table, when INIT_HCA gave one.
    pub(super) mcg: Option<McgLayout>,
    /// The inbox as given (QUERY_HCA reads it back).
    raw: Vec<u8>,
}

/// Where the multicast group (MCG) table lies in ICM and its geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct McgLayout {
    pub(super) base: u64,
    pub(super) log_entry: u8,
    pub(super) log_hash: u8,
    pub(super) log_table: u8,
}

impl McgLayout {
    /// Bytes of one entry.
    pub(super) fn entry(&self) -> usize {
        1 << self.log_entry
    }

    /// Entries of the table.
    pub(super) fn entries(&self) -> u32 {
        1 << self.log_table
    }

    /// Hash buckets (the table's first entries).
    pub(super) fn buckets(&self) -> u32 {
        1 << self.log_hash
    }
}

/// The opcodes the model implements; every other one is BAD_OP.
pub(super) fn known(opcode: u16) -> bool {
    matches!(
        opcode,
        op::QUERY_DEV_CAP
            | op::QUERY_FW
            | op::QUERY_ADAPTER
            | op::INIT_HCA
            | op::CLOSE_HCA
            | op::INIT_PORT
            | op::CLOSE_PORT
            | op::QUERY_HCA
            | op::SET_PORT
            | op::SW2HW_MPT
            | op::QUERY_MPT
            | op::HW2SW_MPT
            | op::WRITE_MTT
            | op::MAP_EQ
            | op::SW2HW_EQ
            | op::HW2SW_EQ
            | op::QUERY_EQ
            | op::SW2HW_CQ
            | op::HW2SW_CQ
            | op::QUERY_CQ
            | op::RST2INIT_QP
            | op::INIT2RTR_QP
            | op::RTR2RTS_QP
            | op::RTS2RTS_QP
            | op::SQERR2RTS_QP
            | op::ERR_QP
            | op::RTS2SQD_QP
            | op::SQD2RTS_QP
            | op::RST_QP
            | op::QUERY_QP
            | op::CONF_SPECIAL_QP
            | op::READ_MCG
            | op::WRITE_MCG
            | op::MGID_HASH
            | op::MODIFY_CQ
            | op::INIT2INIT_QP
            | SYNC_TPT
            | op::NOP
            | op::MOD_STAT_CFG
            | op::SW2HW_SRQ
            | op::HW2SW_SRQ
            | op::QUERY_SRQ
            | op::SQD2SQD_QP
            | op::ARM_SRQ
            | op::QUERY_PORT
            | op::RUN_FW
            | op::UNMAP_ICM
            | op::MAP_ICM
            | op::UNMAP_ICM_AUX
            | op::MAP_ICM_AUX
            | op::SET_ICM_SIZE
            | op::UNMAP_FA
            | op::MAP_FA
    )
}

impl Hw {
    pub(super) fn firmware(&mut self, cmd: &Command) -> CmdResult {
        match cmd.opcode {
            op::QUERY_FW => self.outbox(cmd.out_param, &caps::query_fw()).map(|()| None),
            op::QUERY_DEV_CAP => self
                .outbox(cmd.out_param, &caps::query_dev_cap(self.ports))
                .map(|()| None),
            op::QUERY_ADAPTER => self
                .outbox(cmd.out_param, &caps::query_adapter())
                .map(|()| None),
            op::MAP_FA => {
                self.fa_pages += self.page_list(cmd, false)?;
                Ok(None)
            }
            op::UNMAP_FA => {
                if self.fw == Fw::Running {
                    self.fw = Fw::Off;
                    self.icm.clear();
                    self.icm_size = None;
                    self.aux_pages = 0;
                }
                self.fa_pages = 0;
                Ok(None)
            }
            op::RUN_FW => {
                if self.fa_pages < caps::FW_PAGES {
                    return Err(Status::BadSysState);
                }
                self.fw = Fw::Running;
                Ok(None)
            }
            op::MOD_STAT_CFG | op::NOP | SYNC_TPT => Ok(None),
            op::SET_ICM_SIZE => {
                let size = cmd.in_param;
                if size == 0 || size > caps::MAX_ICM {
                    return Err(Status::BadParam);
                }
                self.icm_size = Some(size);
                Ok(Some(caps::aux_pages(size)))
            }
            op::MAP_ICM_AUX => {
                self.aux_pages += self.page_list(cmd, false)?;
                Ok(None)
            }
            op::UNMAP_ICM_AUX => {
                self.aux_pages = 0;
                Ok(None)
            }
            op::MAP_ICM => self.page_list(cmd, true).map(|_| None),
            op::UNMAP_ICM => {
                if cmd.in_param % PAGE != 0 {
                    return Err(Status::BadParam);
                }
                self.icm.unmap(cmd.in_param, u64::from(cmd.in_mod));
                Ok(None)
            }
            op::INIT_HCA => self.init_hca(cmd),
            op::QUERY_HCA => {
                let mut raw = self.layout()?.raw.clone();
                raw.resize(0x200, 0);
                self.outbox(cmd.out_param, &raw).map(|()| None)
            }
            _ => Err(Status::BadOp),
        }
    }

    /// Validates a MAP_FA / MAP_ICM_AUX / MAP_ICM page list and applies it; returns the pages
    /// it covers. Every chunk must be naturally aligned and lie in one mapped DMA region.
    fn page_list(&mut self, cmd: &Command, icm: bool) -> Result<u64, Status> {
        let n = cmd.in_mod as usize;
        if n > PAGE_LIST_MAX {
            return Err(Status::BadParam);
        }
        let inbox = self.mailbox(cmd.in_param, n * 16)?;
        let raw = inbox.vec(0, n * 16).ok_or(Status::BadParam)?;
        let entries = <[PageListEntry]>::ref_from_bytes(&raw).map_err(|_| Status::BadParam)?;
        let mut chunks = Vec::with_capacity(n);
        for e in entries {
            let (pa, bytes) = e.chunk().ok_or(Status::BadParam)?;
            if self.shared.iova.translate(pa, bytes).is_none() {
                return Err(Status::BadParam);
            }
            let virt = e.virt.get();
            if icm {
                let end = virt.checked_add(bytes).ok_or(Status::BadParam)?;
                if virt % PAGE != 0 || self.icm_size.is_some_and(|s| end > s) {
                    return Err(Status::BadParam);
                }
            }
            chunks.push((virt, pa, bytes));
        }
        let pages = chunks.iter().map(|c| c.2 / PAGE).sum();
        if icm {
            for (i, &(virt, pa, bytes)) in chunks.iter().enumerate() {
                if !self.icm.map(virt, pa, bytes) {
                    for &(v, _, b) in &chunks[..i] {
                        self.icm.unmap(v, b / PAGE);
                    }
                    return Err(Status::BadParam);
                }
            }
        }
        Ok(pages)
    }

    /// CLOSE_HCA: back to the pre-INIT state; every object must be gone (opmod 1, the
    /// "panic" form used in error paths, forgets them instead).
    pub(super) fn close_hca(&mut self, engine: &mut Engine, cmd: &Command) -> CmdResult {
        if cmd.opmod & 1 == 0 && self.objects() > 0 {
            return Err(Status::ResourceBusy);
        }
        self.forget_objects(engine);
        self.fw = Fw::Running;
        self.layout = None;
        Ok(None)
    }

    fn init_hca(&mut self, cmd: &Command) -> CmdResult {
        let Some(icm_size) = self.icm_size else {
            return Err(Status::BadSysState);
        };
        if self.aux_pages < caps::aux_pages(icm_size) {
            return Err(Status::BadSysState);
        }
        let raw = self
            .mailbox(cmd.in_param, size_of::<InitHca>())?
            .vec(0, size_of::<InitHca>())
            .ok_or(Status::BadParam)?;
        let m = InitHca::read_from_bytes(&raw).map_err(|_| Status::BadParam)?;
        // Version 2, little-endian host, 32-byte CQEs and EQEs, 4 KiB UAR pages.
        if m.version != 2
            || m.flags.get() & 2 != 0
            || m.cqe_eqe_size.get() & (3 << 29) != 0
            || m.uar_page_sz != 0
        {
            return Err(Status::BadParam);
        }
        let (qpc, log_qp) = split_base_log(m.qpc_base_log.get());
        let (srqc, log_srq) = split_base_log(m.srqc_base_log.get());
        let (cqc, log_cq) = split_base_log(m.cqc_base_log.get());
        let (eqc, log_eq) = split_base_log(m.eqc_base_log.get());
        let (rdmarc, _) = split_base_log(m.rdmarc_base_log.get());
        let log_mpt = (m.mw_log_mpt.get() & 0x3f) as u8;
        let dmpt = m.dmpt_base.get();
        let mtt = m.mtt_base.get();
        let within = |base: u64, log: u8, max: u8, reserved: u8, entry: u16| -> bool {
            log <= max
                && log > reserved
                && (1u64 << log)
                    .checked_mul(u64::from(entry))
                    .and_then(|s| s.checked_add(base))
                    .is_some_and(|end| end <= icm_size)
        };
        let ok = within(
            qpc,
            log_qp,
            caps::LOG_MAX_QP,
            caps::LOG_RSVD_QP,
            caps::QPC_ENTRY,
        ) && within(
            srqc,
            log_srq,
            caps::LOG_MAX_SRQ,
            caps::LOG_RSVD_SRQ,
            caps::SRQC_ENTRY,
        ) && within(
            cqc,
            log_cq,
            caps::LOG_MAX_CQ,
            caps::LOG_RSVD_CQ,
            caps::CQC_ENTRY,
        ) && within(eqc, log_eq, caps::LOG_MAX_EQ, 2, caps::EQC_ENTRY)
            && within(
                dmpt,
                log_mpt,
                caps::LOG_MAX_MPT,
                caps::LOG_RSVD_MRW,
                caps::DMPT_ENTRY,
            )
            && [
                mtt,
                rdmarc,
                m.auxc_base.get(),
                m.altc_base.get(),
                m.cmpt_base.get(),
                m.mcg_base.get(),
            ]
            .iter()
            .all(|&b| b < icm_size);
        if !ok {
            return Err(Status::BadParam);
        }
        // The MCG table is optional (a driver without multicast gives none): entries of 64
        // bytes to 4 KiB, at least one overflow entry behind the hash buckets, inside ICM.
        let mcg = if m.log_mc_table_sz == 0 {
            None
        } else {
            let l = McgLayout {
                base: m.mcg_base.get(),
                log_entry: m.log_mc_entry_sz,
                log_hash: m.log_mc_hash_sz,
                log_table: m.log_mc_table_sz,
            };
            let fits = (6..=12).contains(&l.log_entry)
                && l.log_table <= caps::LOG_MAX_MCG
                && l.log_hash < l.log_table
                && (u64::from(l.entries()) << l.log_entry)
                    .checked_add(l.base)
                    .is_some_and(|end| end <= icm_size);
            if !fits {
                return Err(Status::BadParam);
            }
            Some(l)
        };
        let raw = m.as_bytes().to_vec();
        self.layout = Some(Layout {
            qpc,
            log_qp,
            srqc,
            log_srq,
            cqc,
            log_cq,
            eqc,
            log_eq,
            dmpt,
            log_mpt,
            mtt,
            mcg,
            raw,
        });
        self.fw = Fw::Initialized;
        Ok(None)
    }
}

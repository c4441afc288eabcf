//! ICM: host memory donated to the HCA for its context tables (Linux `mlx4/profile.c`,
//! `mlx4/icm.c`), plus the firmware area (MAP_FA) and auxiliary pages (MAP_ICM_AUX).
//!
//! This driver uses a small fixed profile (it is a userspace driver for one process, not a
//! kernel driver for a whole machine): every table is sized from the profile and the entry sizes
//! QUERY_DEV_CAP reports, tables are packed into the ICM virtual space largest first and naturally
//! aligned, and each one is backed by one DMA region mapped whole at bring-up (no lazy chunk
//! mapping). The cMPT tables get virtual space but are never mapped: this driver does not use
//! them.

use std::sync::Arc;

use portverbs_hal::dma::DmaMemory;
use portverbs_hal::error::CommandError;
use zerocopy::IntoBytes;

use crate::caps::DevCaps;
use crate::cmd::{Cmd, CommandInterface};
use crate::layout::mailbox::{PAGE_LIST_MAX, PageListEntry};
use crate::layout::opcode;
use crate::pci::PciFunction;

/// log2 sizes of the objects this driver's profile provides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Profile {
    /// log2 QPs.
    pub log_qps: u8,
    /// log2 SRQs.
    pub log_srqs: u8,
    /// log2 CQs.
    pub log_cqs: u8,
    /// log2 EQs.
    pub log_eqs: u8,
    /// log2 MPTs (MRs and MWs).
    pub log_mpts: u8,
    /// log2 MTT entries.
    pub log_mtts: u8,
    /// log2 RDMA-read/atomic responder entries per QP.
    pub log_rdmarc: u8,
    /// log2 multicast group (MCG) table entries (0: no table, no multicast); half of them
    /// are the hash buckets, half the overflow entries their chains link to.
    pub log_mcg: u8,
}

/// log2 bytes of one MCG table entry: 128, the smallest Linux's mlx4 accepts (room for 24
/// QPs; the firmware's `log_max_qp_mcg` may allow fewer).
pub const LOG_MCG_ENTRY: u8 = 7;

impl Profile {
    /// The default profile clipped to what the device offers.
    pub fn for_device(caps: &DevCaps) -> Self {
        Self {
            log_qps: caps.log_max_qp.min(10),
            log_srqs: caps.log_max_srq.min(10),
            log_cqs: caps.log_max_cq.min(10),
            log_eqs: caps.log_max_eq.min(6),
            log_mpts: caps.log_max_mpt.min(12),
            log_mtts: (caps.log_max_mtt + 3).min(16),
            log_rdmarc: caps.log_max_ra_res_qp.clamp(2, 4),
            // At most 128 entries: 64 groups, each with a bucket or an overflow entry
            // guaranteed (see `device::mcg`). A table needs two entries or more.
            log_mcg: if caps.log_max_mcg >= 1 {
                caps.log_max_mcg.min(7)
            } else {
                0
            },
        }
    }
}

/// Which table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Table {
    /// QP contexts.
    Qpc,
    /// Auxiliary QP contexts.
    Auxc,
    /// Alternate-path contexts.
    Altc,
    /// RDMA-read/atomic responder contexts.
    Rdmarc,
    /// SRQ contexts.
    Srqc,
    /// CQ contexts.
    Cqc,
    /// EQ contexts.
    Eqc,
    /// Data MPTs.
    Dmpt,
    /// MTT entries.
    Mtt,
    /// Compressed MPTs (virtual space only).
    Cmpt,
    /// The multicast group table.
    Mcg,
}

/// One table's place in ICM.
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    /// Which table.
    pub table: Table,
    /// ICM virtual base.
    pub base: u64,
    /// Bytes (a power of two).
    pub size: u64,
}

/// The ICM virtual layout of every table.
#[derive(Debug, Clone)]
pub struct IcmLayout {
    /// Tables in address order.
    pub tables: Vec<Placement>,
    /// Total virtual size.
    pub total: u64,
}

impl IcmLayout {
    /// Lays out the tables of `profile` with the entry sizes of `caps` (as Linux
    /// `mlx4_make_profile`).
    pub fn new(caps: &DevCaps, p: &Profile) -> Self {
        let qps = 1u64 << p.log_qps;
        let mut want = vec![
            (Table::Qpc, qps * u64::from(caps.qpc_entry_sz)),
            (Table::Auxc, qps * u64::from(caps.aux_entry_sz)),
            (Table::Altc, qps * u64::from(caps.altc_entry_sz)),
            (
                Table::Rdmarc,
                (qps << p.log_rdmarc) * u64::from(caps.rdmarc_entry_sz),
            ),
            (
                Table::Srqc,
                (1u64 << p.log_srqs) * u64::from(caps.srq_entry_sz),
            ),
            (
                Table::Cqc,
                (1u64 << p.log_cqs) * u64::from(caps.cqc_entry_sz),
            ),
            (
                Table::Eqc,
                (1u64 << p.log_eqs) * u64::from(caps.eqc_entry_sz),
            ),
            (
                Table::Dmpt,
                (1u64 << p.log_mpts) * u64::from(caps.dmpt_entry_sz),
            ),
            (
                Table::Mtt,
                (1u64 << p.log_mtts) * u64::from(caps.mtt_entry_sz),
            ),
            (Table::Cmpt, (4u64 << 24) * u64::from(caps.cmpt_entry_sz)),
        ];
        if p.log_mcg > 0 {
            want.push((Table::Mcg, (1u64 << p.log_mcg) << LOG_MCG_ENTRY));
        }
        for (_, s) in &mut want {
            *s = s.next_power_of_two().max(4096);
        }
        // Largest first, so that packing keeps every table naturally aligned.
        want.sort_by_key(|&(_, size)| std::cmp::Reverse(size));
        let mut at = 0u64;
        let tables = want
            .into_iter()
            .map(|(table, size)| {
                let p = Placement {
                    table,
                    base: at,
                    size,
                };
                at += size;
                p
            })
            .collect();
        Self { tables, total: at }
    }

    /// The placement of `t`.
    pub fn get(&self, t: Table) -> Placement {
        self.tables
            .iter()
            .copied()
            .find(|p| p.table == t)
            .unwrap_or(Placement {
                table: t,
                base: 0,
                size: 0,
            })
    }
}

/// Page-list entries covering `mem` (bus addresses) mapped at ICM virtual `virt`: each entry the
/// largest chunk both addresses are aligned to (Linux `mlx4_map_cmd`).
pub(crate) fn page_list(mem: &dyn DmaMemory, virt: u64) -> Vec<PageListEntry> {
    let mut out = Vec::new();
    let len = mem.len() as u64 & !0xfff;
    let pa0 = mem.device_addr();
    let mut off = 0u64;
    while off < len {
        let pa = pa0 + off;
        let va = virt + off;
        let mut size = 4096u64;
        while size < (1 << 30) && (pa | va) % (size * 2) == 0 && off + size * 2 <= len {
            size *= 2;
        }
        out.push(PageListEntry::new(
            va,
            pa,
            (size.trailing_zeros() - 12) as u8,
        ));
        off += size;
    }
    out
}

/// Runs MAP_FA / MAP_ICM_AUX / MAP_ICM with `entries`, at most one mailbox per command.
pub(crate) async fn map_pages(
    hcr: &CommandInterface,
    op: u16,
    entries: &[PageListEntry],
) -> Result<(), CommandError> {
    for chunk in entries.chunks(PAGE_LIST_MAX) {
        hcr.exec_in(Cmd::new(op).in_mod(chunk.len() as u32), chunk.as_bytes())
            .await?;
    }
    Ok(())
}

/// Memory handed to the HCA: kept alive until the HCA gives it back.
#[derive(Debug, Default)]
pub(crate) struct Donated {
    pub(crate) fa: Option<Arc<dyn DmaMemory>>,
    pub(crate) aux: Option<Arc<dyn DmaMemory>>,
    pub(crate) tables: Vec<(Placement, Arc<dyn DmaMemory>)>,
}

/// Allocates and maps the firmware area, then RUN_FW.
pub(crate) async fn start_firmware(
    pci: &dyn PciFunction,
    hcr: &CommandInterface,
    fw_pages: u32,
    donated: &mut Donated,
) -> Result<(), CommandError> {
    let fa = pci.alloc_dma(fw_pages as usize * 4096)?;
    map_pages(hcr, opcode::MAP_FA, &page_list(fa.as_ref(), 0)).await?;
    donated.fa = Some(fa);
    hcr.exec(Cmd::new(opcode::RUN_FW)).await?;
    Ok(())
}

/// SET_ICM_SIZE, MAP_ICM_AUX, and MAP_ICM of every table but cMPT.
pub(crate) async fn map_icm(
    pci: &dyn PciFunction,
    hcr: &CommandInterface,
    layout: &IcmLayout,
    donated: &mut Donated,
) -> Result<(), CommandError> {
    let aux_pages = hcr
        .exec(Cmd::new(opcode::SET_ICM_SIZE).in_param(layout.total))
        .await?;
    if aux_pages == 0 || aux_pages > 1 << 18 {
        return Err(CommandError::InvalidArgument {
            what: format!("SET_ICM_SIZE asked for {aux_pages} auxiliary pages"),
        });
    }
    let aux = pci.alloc_dma(aux_pages as usize * 4096)?;
    map_pages(hcr, opcode::MAP_ICM_AUX, &page_list(aux.as_ref(), 0)).await?;
    donated.aux = Some(aux);
    for p in &layout.tables {
        if p.table == Table::Cmpt {
            continue;
        }
        let mem = pci.alloc_dma(p.size as usize)?;
        map_pages(hcr, opcode::MAP_ICM, &page_list(mem.as_ref(), p.base)).await?;
        donated.tables.push((*p, mem));
    }
    Ok(())
}

/// Gives every ICM table, the auxiliary pages and the firmware area back (after CLOSE_HCA).
/// Keeps going after a failure and reports the first one.
pub(crate) async fn unmap_all(
    hcr: &CommandInterface,
    donated: &mut Donated,
) -> Result<(), CommandError> {
    let mut first = Ok(());
    for (p, _) in donated.tables.drain(..) {
        let r = hcr
            .exec(
                Cmd::new(opcode::UNMAP_ICM)
                    .in_param(p.base)
                    .in_mod((p.size / 4096) as u32),
            )
            .await;
        if first.is_ok() {
            first = r.map(|_| ());
        }
    }
    if donated.aux.take().is_some() {
        let r = hcr.exec(Cmd::new(opcode::UNMAP_ICM_AUX)).await;
        if first.is_ok() {
            first = r.map(|_| ());
        }
    }
    if donated.fa.take().is_some() {
        let r = hcr.exec(Cmd::new(opcode::UNMAP_FA)).await;
        if first.is_ok() {
            first = r.map(|_| ());
        }
    }
    first
}

//! Command mailboxes (Linux `mlx4/fw.c`, `mlx4/mr.c`): QUERY_FW, QUERY_DEV_CAP and QUERY_PORT
//! outboxes, the INIT_HCA inbox, the page lists of MAP_FA/MAP_ICM_AUX/MAP_ICM, and WRITE_MTT's
//! inbox. Fields keep the names of Linux's `fw.c`; "log" fields hold log2 values.

#![allow(missing_docs)]

use zerocopy::byteorder::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::layout;

/// Bytes in a command mailbox (MLX4_MAILBOX_SIZE).
pub const MAILBOX_SIZE: usize = 4096;

/// QUERY_FW outbox, the part a driver uses (Linux `mlx4_QUERY_FW`).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct QueryFw {
    /// Firmware area in 4 KiB pages (to hand over with MAP_FA).
    pub fw_pages: U16,
    pub fw_major: U16,
    pub fw_subminor: U16,
    pub fw_minor: U16,
    pub _r0: u8,
    pub ppf_id: u8,
    /// Command interface revision (2..3).
    pub cmd_if_rev: U16,
    pub _r1: [u8; 3],
    /// log2(max outstanding commands in event mode).
    pub log_max_cmds: u8,
    pub _r2: [u8; 0x10],
    pub clr_int_base: U64,
    pub clr_int_bar: u8,
    pub _r3: [u8; 7],
    pub catas_offset: U64,
    pub catas_size: U32,
    pub catas_bar: u8,
    pub _r4: [u8; 3],
}
layout!(QueryFw, 0x40, {
    fw_pages: 0x00, fw_major: 0x02, fw_subminor: 0x04, fw_minor: 0x06, ppf_id: 0x09,
    cmd_if_rev: 0x0a, log_max_cmds: 0x0f, clr_int_base: 0x20, clr_int_bar: 0x28,
    catas_offset: 0x30, catas_size: 0x38, catas_bar: 0x3c,
});

/// QUERY_DEV_CAP outbox (Linux `mlx4_QUERY_DEV_CAP`), 0x00..0xa8.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DevCap {
    pub _r0: [u8; 0x10],
    pub log_max_srq_sz: u8,
    pub log_max_qp_sz: u8,
    pub log_rsvd_qp: u8,
    pub log_max_qp: u8,
    pub log_rsvd_srq: u8,
    pub log_max_srq: u8,
    pub _r1: [u8; 3],
    pub log_max_cq_sz: u8,
    pub log_rsvd_cq: u8,
    pub log_max_cq: u8,
    pub _r2: u8,
    pub log_max_mpt: u8,
    pub rsvd_eq: u8,
    pub log_max_eq: u8,
    pub log_rsvd_mtt: u8,
    pub log_max_mrw_sz: u8,
    pub log_rsvd_mrw: u8,
    pub log_max_mtt: u8,
    pub _r3: [u8; 2],
    pub num_sys_eq: u8,
    pub _r4: [u8; 2],
    pub log_max_ra_req_qp: u8,
    pub _r5: u8,
    pub log_max_ra_res_qp: u8,
    pub _r6: u8,
    pub log_max_gso: u8,
    pub rss: u8,
    pub log_max_rdma: u8,
    pub _r7: [u8; 3],
    pub srq_resize: u8,
    pub _r8: u8,
    pub ack_delay: u8,
    pub mtu_width: u8,
    pub vl_ports: u8,
    pub log_max_msg: u8,
    pub _r9: [u8; 2],
    pub log_max_gid: u8,
    pub stat_rate: U16,
    pub timestamp: u8,
    pub log_max_pkey: u8,
    pub flags_hi: U32,
    pub flags_lo: U32,
    pub rsvd_uar: u8,
    pub uar_size: u8,
    pub _r10: u8,
    pub log_page_sz: u8,
    pub bf: u8,
    pub log_bf_reg_sz: u8,
    pub log_max_bf_per_page: u8,
    pub _r11: [u8; 2],
    pub max_sg_sq: u8,
    pub max_desc_sz_sq: U16,
    pub _r12: u8,
    pub max_sg_rq: u8,
    pub max_desc_sz_rq: U16,
    pub _r13: [u8; 9],
    pub log_max_qp_mcg: u8,
    pub rsvd_mcg: u8,
    pub log_max_mcg: u8,
    pub rsvd_pd: u8,
    pub log_max_pd: u8,
    pub rsvd_xrcd: u8,
    pub log_max_xrcd: u8,
    pub max_counters: U32,
    pub _r14: [u8; 4],
    pub flags2: U32,
    pub _r15: [u8; 12],
    pub rdmarc_entry_sz: U16,
    pub qpc_entry_sz: U16,
    pub aux_entry_sz: U16,
    pub altc_entry_sz: U16,
    pub eqc_entry_sz: U16,
    pub cqc_entry_sz: U16,
    pub srq_entry_sz: U16,
    pub cmpt_entry_sz: U16,
    pub mtt_entry_sz: U16,
    pub dmpt_entry_sz: U16,
    pub bmme_flags: U32,
    pub reserved_lkey: U32,
    pub _r16: [u8; 4],
    pub max_icm_sz: U64,
}
layout!(DevCap, 0xa8, {
    log_max_srq_sz: 0x10, log_max_qp_sz: 0x11, log_rsvd_qp: 0x12, log_max_qp: 0x13,
    log_rsvd_srq: 0x14, log_max_srq: 0x15, log_max_cq_sz: 0x19, log_rsvd_cq: 0x1a,
    log_max_cq: 0x1b, log_max_mpt: 0x1d, rsvd_eq: 0x1e, log_max_eq: 0x1f, log_rsvd_mtt: 0x20,
    log_max_mrw_sz: 0x21, log_rsvd_mrw: 0x22, log_max_mtt: 0x23, num_sys_eq: 0x26,
    log_max_ra_req_qp: 0x29, log_max_ra_res_qp: 0x2b, log_max_gso: 0x2d, rss: 0x2e,
    log_max_rdma: 0x2f, srq_resize: 0x33, ack_delay: 0x35, mtu_width: 0x36, vl_ports: 0x37,
    log_max_msg: 0x38, log_max_gid: 0x3b, stat_rate: 0x3c, timestamp: 0x3e, log_max_pkey: 0x3f,
    flags_hi: 0x40, flags_lo: 0x44, rsvd_uar: 0x48, uar_size: 0x49, log_page_sz: 0x4b, bf: 0x4c,
    log_bf_reg_sz: 0x4d, log_max_bf_per_page: 0x4e, max_sg_sq: 0x51, max_desc_sz_sq: 0x52,
    max_sg_rq: 0x55, max_desc_sz_rq: 0x56, log_max_qp_mcg: 0x61, rsvd_mcg: 0x62,
    log_max_mcg: 0x63, rsvd_pd: 0x64, log_max_pd: 0x65, rsvd_xrcd: 0x66, log_max_xrcd: 0x67,
    max_counters: 0x68, flags2: 0x70, rdmarc_entry_sz: 0x80, qpc_entry_sz: 0x82,
    aux_entry_sz: 0x84, altc_entry_sz: 0x86, eqc_entry_sz: 0x88, cqc_entry_sz: 0x8a,
    srq_entry_sz: 0x8c, cmpt_entry_sz: 0x8e, mtt_entry_sz: 0x90, dmpt_entry_sz: 0x92,
    bmme_flags: 0x94, reserved_lkey: 0x98, max_icm_sz: 0xa0,
});

impl Default for DevCap {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

/// Device capability flag bits (Linux `mlx4/fw.c`, `flags` = hi << 32 | lo).
pub mod dev_flag {
    pub const RC: u64 = 1 << 0;
    pub const UC: u64 = 1 << 1;
    pub const UD: u64 = 1 << 2;
    pub const SRQ: u64 = 1 << 6;
    pub const MEM_WINDOW: u64 = 1 << 16;
    pub const APM: u64 = 1 << 17;
    pub const ATOMIC: u64 = 1 << 18;
    pub const IBOE: u64 = 1 << 30;
}

/// BMME flag bits (QUERY_DEV_CAP 0x94).
pub mod bmme_flag {
    pub const TYPE_2B_WIN: u32 = 1 << 1;
    pub const LOCAL_INV: u32 = 1 << 6;
    pub const REMOTE_INV: u32 = 1 << 7;
    pub const TYPE_2_WIN: u32 = 1 << 9;
}

/// QUERY_PORT outbox (Linux `mlx4_QUERY_PORT`, command interface revision ≥ 3).
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct QueryPort {
    /// bit7 link up, bits 1:0 supported types (bit0 IB, bit1 Ethernet).
    pub link: u8,
    /// Low nibble: max IB MTU (IB encoding).
    pub ib_mtu: u8,
    pub eth_mtu: U16,
    pub _r0: u8,
    /// Current Ethernet link speed, as Linux's mlx4_ib reads it for a RoCE port
    /// (`eth_link_query_port`): [`ETH_SPEED_40G`], [`ETH_SPEED_56G`], anything else 10 GbE.
    pub eth_speed: u8,
    pub width: u8,
    /// High nibble log2 max GIDs, low nibble log2 max P_Keys.
    pub log_gid_pkey: u8,
    pub _r1: [u8; 2],
    pub log_mac_vlan: u8,
    pub max_vl: u8,
    pub _r2: [u8; 4],
    pub default_mac: U64,
}
/// [`QueryPort::eth_speed`] of a 40 GbE link (4X QDR lanes).
pub const ETH_SPEED_40G: u8 = 0x40;
/// [`QueryPort::eth_speed`] of a 56 GbE link (4X FDR lanes).
pub const ETH_SPEED_56G: u8 = 0x20;

layout!(QueryPort, 0x18, {
    link: 0x00, ib_mtu: 0x01, eth_mtu: 0x02, eth_speed: 0x05, width: 0x06, log_gid_pkey: 0x07,
    log_mac_vlan: 0x0a, max_vl: 0x0b, default_mac: 0x10,
});

/// INIT_HCA inbox (Linux `mlx4_INIT_HCA`). The table bases are naturally aligned, so the low
/// byte of each base dword pair doubles as its "log2 number of entries" field (Linux's
/// `INIT_HCA_LOG_*_OFFSET`: 0x37, 0x4f, …).
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct InitHca {
    /// Must be 2.
    pub version: u8,
    pub _r0: [u8; 0x0b],
    pub vxlan: u8,
    pub _r1: u8,
    /// ((log2(cacheline) − 4) << 5) | 1 << 4.
    pub cacheline: u8,
    pub _r2: [u8; 5],
    /// bit1 must be 0 on little-endian hosts.
    pub flags: U32,
    pub recoverable_events: U32,
    pub _r3: [u8; 0x14],
    /// QPC base | log2 number of QPs.
    pub qpc_base_log: U64,
    pub _r4: [u8; 0x10],
    pub srqc_base_log: U64,
    pub cqc_base_log: U64,
    /// bit29 64-byte EQEs, bit30 64-byte CQEs.
    pub cqe_eqe_size: U32,
    pub _r5: [u8; 4],
    pub altc_base: U64,
    pub _r6: [u8; 8],
    pub auxc_base: U64,
    pub _r7: [u8; 8],
    pub eqc_base_log: U64,
    pub _r8: [u8; 8],
    pub rdmarc_base_log: U64,
    pub _r9: [u8; 0x28],
    /// Base of the multicast group (MCG) table: hash buckets (MGMs) then the overflow
    /// entries (AMGMs) their chains link to.
    pub mcg_base: U64,
    pub _r10: [u8; 0x0b],
    /// log2 bytes of one MCG entry.
    pub log_mc_entry_sz: u8,
    pub _r10b: [u8; 3],
    /// log2 hash buckets (the first entries of the table).
    pub log_mc_hash_sz: u8,
    pub _r10c: [u8; 3],
    /// log2 entries of the whole table.
    pub log_mc_table_sz: u8,
    pub _r10d: [u8; 0x14],
    pub dmpt_base: U64,
    /// bit31 memory windows enable; low byte log2 number of MPTs.
    pub mw_log_mpt: U32,
    pub _r11: [u8; 4],
    pub mtt_base: U64,
    pub cmpt_base: U64,
    pub _r12: [u8; 0x1a],
    pub log_uars: u8,
    pub uar_page_sz: u8,
    pub _r13: [u8; 4],
}
layout!(InitHca, 0x130, {
    version: 0x00, vxlan: 0x0c, cacheline: 0x0e, flags: 0x14, recoverable_events: 0x18,
    qpc_base_log: 0x30, srqc_base_log: 0x48, cqc_base_log: 0x50, cqe_eqe_size: 0x58,
    altc_base: 0x60, auxc_base: 0x70, eqc_base_log: 0x80, rdmarc_base_log: 0x90,
    mcg_base: 0xc0, log_mc_entry_sz: 0xd3, log_mc_hash_sz: 0xd7, log_mc_table_sz: 0xdb,
    dmpt_base: 0xf0, mw_log_mpt: 0xf8, mtt_base: 0x100, cmpt_base: 0x108,
    log_uars: 0x12a, uar_page_sz: 0x12b,
});

impl Default for InitHca {
    fn default() -> Self {
        Self::new_zeroed()
    }
}

/// Splits a "base | log" field.
pub fn split_base_log(v: u64) -> (u64, u8) {
    (v & !0xff, (v & 0x1f) as u8)
}

/// One entry of a MAP_FA / MAP_ICM_AUX / MAP_ICM page list (Linux `mlx4_map_cmd`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct PageListEntry {
    /// ICM virtual address (MAP_ICM only).
    pub virt: U64,
    /// Bus address of the chunk | (log2(chunk bytes) − 12).
    pub pa_log: U64,
}
layout!(PageListEntry, 16, { virt: 0, pa_log: 8 });

impl PageListEntry {
    /// An entry for a naturally aligned chunk of `1 << (12 + log)` bytes at bus address `pa`.
    pub fn new(virt: u64, pa: u64, log: u8) -> Self {
        Self {
            virt: virt.into(),
            pa_log: (pa | u64::from(log & 0x3f)).into(),
        }
    }

    /// (bus address, chunk bytes), or `None` if the address is not aligned to the chunk.
    pub fn chunk(&self) -> Option<(u64, u64)> {
        let v = self.pa_log.get();
        let log = (v & 0x3f) as u32;
        let bytes = 1u64.checked_shl(12 + log)?;
        let pa = v & !0xfff;
        (pa % bytes == 0).then_some((pa, bytes))
    }
}

/// Page-list entries per command.
pub const PAGE_LIST_MAX: usize = MAILBOX_SIZE / 16;

/// WRITE_MTT inbox header (Linux `mlx4/mr.c`); the BE64 entries (`addr | 1`) follow at 0x10.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct WriteMttHeader {
    /// Index of the first MTT entry.
    pub start: U64,
    pub _r: U64,
}
layout!(WriteMttHeader, 16, { start: 0 });

/// Most MTT entries one WRITE_MTT carries.
pub const WRITE_MTT_MAX: usize = (MAILBOX_SIZE - 16) / 8;
/// MTT entry "present" bit.
pub const MTT_PRESENT: u64 = 1;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_list_entry_encodes_chunk_size_in_low_bits() {
        let e = PageListEntry::new(0x4_0000, 0x1234_0000, 6);
        assert_eq!(e.as_bytes()[15], 6);
        assert_eq!(e.chunk(), Some((0x1234_0000, 256 * 1024)));
        // Misaligned chunks are refused.
        assert_eq!(PageListEntry::new(0, 0x1000, 1).chunk(), None);
    }

    #[test]
    fn init_hca_log_fields_sit_in_the_base_low_byte() {
        let mut m = InitHca {
            qpc_base_log: (0x80_0000u64 | 17).into(),
            ..Default::default()
        };
        assert_eq!(m.as_bytes()[0x37], 17);
        assert_eq!(split_base_log(m.qpc_base_log.get()), (0x80_0000, 17));
        m.mw_log_mpt = ((1u32 << 31) | 19).into();
        assert_eq!(m.as_bytes()[0xfb], 19);
    }
}

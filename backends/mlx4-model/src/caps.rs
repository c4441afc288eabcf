//! What the model's firmware reports: QUERY_FW, QUERY_DEV_CAP, QUERY_ADAPTER and QUERY_PORT
//! outboxes, and the limits and reserved counts it then enforces. Values are modest and
//! ConnectX-3-like (the outboxes Linux `mlx4/fw.c` reads).

use portverbs_hal::types::Mtu;
use portverbs_mlx4_layout::mailbox::{
    DevCap, ETH_SPEED_40G, QueryFw, QueryPort, bmme_flag, dev_flag,
};
use zerocopy::IntoBytes;

/// Firmware area the driver must hand over with MAP_FA before RUN_FW (4 KiB pages).
pub(crate) const FW_PAGES: u64 = 64;
/// Firmware version reported (2.42.5000, a late ConnectX-3 release).
pub(crate) const FW_VERSION: (u16, u16, u16) = (2, 42, 5000);
/// Command interface revision (≥ 3: INIT_PORT and QUERY_PORT without mailboxes).
pub(crate) const CMD_IF_REV: u16 = 3;
/// log2 outstanding commands in event mode.
pub(crate) const LOG_MAX_CMDS: u8 = 4;

/// BAR0 offset of the catastrophic-error buffer (reads non-zero after a catastrophic error).
pub(crate) const CATAS_OFFSET: usize = 0x8_1000;
/// Its size in dwords.
pub(crate) const CATAS_DWORDS: u32 = 16;
/// BAR0 offset of the clear-interrupt register (writes are accepted and ignored).
pub(crate) const CLR_INT_OFFSET: usize = 0x8_2000;

/// log2 QPs / firmware-reserved QPs (64 QPNs at the bottom).
pub(crate) const LOG_MAX_QP: u8 = 17;
pub(crate) const LOG_RSVD_QP: u8 = 6;
/// log2 WQEs per QP.
pub(crate) const LOG_MAX_QP_SZ: u8 = 14;
/// log2 SRQs / reserved SRQs.
pub(crate) const LOG_MAX_SRQ: u8 = 16;
pub(crate) const LOG_RSVD_SRQ: u8 = 6;
/// log2 WQEs per SRQ.
pub(crate) const LOG_MAX_SRQ_SZ: u8 = 14;
/// log2 CQs / reserved CQs (128).
pub(crate) const LOG_MAX_CQ: u8 = 16;
pub(crate) const LOG_RSVD_CQ: u8 = 7;
/// log2 CQEs per CQ.
pub(crate) const LOG_MAX_CQ_SZ: u8 = 22;
/// log2 EQs; reserved EQs (a count; read as a log2 it would be 16, which is also safe).
pub(crate) const LOG_MAX_EQ: u8 = 9;
pub(crate) const RSVD_EQ: u8 = 4;
/// log2 EQEs per EQ the model accepts.
pub(crate) const LOG_MAX_EQ_SZ: u8 = 16;
/// log2 MPTs / reserved MPTs (16, including index 1 = the 0x100 invalid lkey).
pub(crate) const LOG_MAX_MPT: u8 = 17;
pub(crate) const LOG_RSVD_MRW: u8 = 4;
/// log2 MTT segments / reserved segments.
pub(crate) const LOG_MAX_MTT: u8 = 20;
pub(crate) const LOG_RSVD_MTT: u8 = 4;
/// log2 largest region.
pub(crate) const LOG_MAX_MRW_SZ: u8 = 40;
/// log2 RDMA-read/atomic depth as requester and responder.
pub(crate) const LOG_MAX_RA: u8 = 4;
/// Reserved UARs: a 4-bit count in QUERY_DEV_CAP (Linux raises it to 128 itself).
pub(crate) const RSVD_UAR: u8 = 8;
/// UAR pages in BAR2 (1 MiB of UARs) and as many BlueFlame pages after them.
pub(crate) const NUM_UARS: usize = 256;
/// BlueFlame registers: 512 bytes, 8 per page.
pub(crate) const LOG_BF_REG_SZ: u8 = 9;
pub(crate) const LOG_BF_PER_PAGE: u8 = 3;
/// Scatter/gather entries and descriptor sizes.
pub(crate) const MAX_SG_SQ: u8 = 32;
pub(crate) const MAX_DESC_SZ_SQ: u16 = 1008;
pub(crate) const MAX_SG_RQ: u8 = 32;
pub(crate) const MAX_DESC_SZ_RQ: u16 = 512;
/// log2 PDs.
pub(crate) const LOG_MAX_PD: u8 = 17;
/// Context entry sizes (bytes).
pub(crate) const RDMARC_ENTRY: u16 = 32;
pub(crate) const QPC_ENTRY: u16 = 256;
pub(crate) const AUXC_ENTRY: u16 = 128;
pub(crate) const ALTC_ENTRY: u16 = 256;
pub(crate) const EQC_ENTRY: u16 = 64;
pub(crate) const CQC_ENTRY: u16 = 64;
pub(crate) const SRQC_ENTRY: u16 = 64;
pub(crate) const CMPT_ENTRY: u16 = 64;
pub(crate) const MTT_ENTRY: u16 = 8;
pub(crate) const DMPT_ENTRY: u16 = 64;
/// Largest ICM virtual space (the cMPT tables alone take 4 × 2^24 entries).
pub(crate) const MAX_ICM: u64 = 1 << 40;
/// Auxiliary ICM pages SET_ICM_SIZE asks for: one per GiB of ICM, plus one.
pub(crate) fn aux_pages(icm_size: u64) -> u64 {
    1 + (icm_size >> 30)
}
/// log2 GID table entries per port (the SET_PORT GID table carries 128).
pub(crate) const LOG_GIDS: u8 = 7;
/// log2 multicast group (MCG) table entries the firmware accepts (hash buckets and overflow
/// entries together).
pub(crate) const LOG_MAX_MCG: u8 = 4;
/// log2 QPs one MCG entry may list.
pub(crate) const LOG_MAX_QP_MCG: u8 = 3;
/// GID table entries.
pub(crate) const GIDS: usize = 1 << LOG_GIDS;

/// Device capability flags.
pub(crate) const DEV_FLAGS: u64 = dev_flag::RC
    | dev_flag::UC
    | dev_flag::UD
    | dev_flag::SRQ
    | dev_flag::MEM_WINDOW
    | dev_flag::ATOMIC
    | dev_flag::IBOE;
/// Base memory-management extension flags.
pub(crate) const BMME_FLAGS: u32 =
    bmme_flag::TYPE_2_WIN | bmme_flag::LOCAL_INV | bmme_flag::REMOTE_INV;

/// The QUERY_FW outbox.
pub(crate) fn query_fw() -> Vec<u8> {
    let f = QueryFw {
        fw_pages: (FW_PAGES as u16).into(),
        fw_major: FW_VERSION.0.into(),
        fw_minor: FW_VERSION.1.into(),
        fw_subminor: FW_VERSION.2.into(),
        cmd_if_rev: CMD_IF_REV.into(),
        log_max_cmds: LOG_MAX_CMDS,
        clr_int_base: (CLR_INT_OFFSET as u64).into(),
        clr_int_bar: 0,
        catas_offset: (CATAS_OFFSET as u64).into(),
        catas_size: CATAS_DWORDS.into(),
        catas_bar: 0,
        ..QueryFw::default()
    };
    f.as_bytes().to_vec()
}

/// The QUERY_DEV_CAP outbox for a device with `ports` ports.
pub(crate) fn query_dev_cap(ports: u8) -> Vec<u8> {
    let d = DevCap {
        log_max_srq_sz: LOG_MAX_SRQ_SZ,
        log_max_qp_sz: LOG_MAX_QP_SZ,
        log_rsvd_qp: LOG_RSVD_QP,
        log_max_qp: LOG_MAX_QP,
        log_rsvd_srq: LOG_RSVD_SRQ << 4,
        log_max_srq: LOG_MAX_SRQ,
        log_max_cq_sz: LOG_MAX_CQ_SZ,
        log_rsvd_cq: LOG_RSVD_CQ,
        log_max_cq: LOG_MAX_CQ,
        log_max_mpt: LOG_MAX_MPT,
        rsvd_eq: RSVD_EQ,
        log_max_eq: LOG_MAX_EQ,
        log_rsvd_mtt: LOG_RSVD_MTT << 4,
        log_max_mrw_sz: LOG_MAX_MRW_SZ,
        log_rsvd_mrw: LOG_RSVD_MRW,
        log_max_mtt: LOG_MAX_MTT,
        log_max_ra_req_qp: LOG_MAX_RA,
        log_max_ra_res_qp: LOG_MAX_RA,
        ack_delay: 15,
        mtu_width: (5 << 4) | 2,
        vl_ports: (8 << 4) | (ports & 0xf),
        log_max_msg: 31,
        log_max_gid: LOG_GIDS,
        log_max_pkey: 0,
        flags_hi: ((DEV_FLAGS >> 32) as u32).into(),
        flags_lo: (DEV_FLAGS as u32).into(),
        rsvd_uar: RSVD_UAR << 4,
        uar_size: 0,
        log_page_sz: 12,
        bf: 0x80,
        log_bf_reg_sz: LOG_BF_REG_SZ,
        log_max_bf_per_page: LOG_BF_PER_PAGE,
        max_sg_sq: MAX_SG_SQ,
        max_desc_sz_sq: MAX_DESC_SZ_SQ.into(),
        max_sg_rq: MAX_SG_RQ,
        max_desc_sz_rq: MAX_DESC_SZ_RQ.into(),
        log_max_pd: LOG_MAX_PD,
        log_max_qp_mcg: LOG_MAX_QP_MCG,
        rsvd_mcg: 0,
        log_max_mcg: LOG_MAX_MCG,
        rdmarc_entry_sz: RDMARC_ENTRY.into(),
        qpc_entry_sz: QPC_ENTRY.into(),
        aux_entry_sz: AUXC_ENTRY.into(),
        altc_entry_sz: ALTC_ENTRY.into(),
        eqc_entry_sz: EQC_ENTRY.into(),
        cqc_entry_sz: CQC_ENTRY.into(),
        srq_entry_sz: SRQC_ENTRY.into(),
        cmpt_entry_sz: CMPT_ENTRY.into(),
        mtt_entry_sz: MTT_ENTRY.into(),
        dmpt_entry_sz: DMPT_ENTRY.into(),
        bmme_flags: BMME_FLAGS.into(),
        reserved_lkey: 0.into(),
        max_icm_sz: MAX_ICM.into(),
        ..DevCap::default()
    };
    d.as_bytes().to_vec()
}

/// The QUERY_ADAPTER outbox: INTx pin 0, no vendor-specific data.
pub(crate) fn query_adapter() -> Vec<u8> {
    vec![0u8; 0x100]
}

/// The QUERY_PORT outbox: an Ethernet (RoCE) port.
pub(crate) fn query_port(port: u8, up: bool, mtu: Mtu) -> Vec<u8> {
    let p = QueryPort {
        link: if up { 0x80 } else { 0 } | 0x02,
        ib_mtu: mtu as u8,
        eth_mtu: 9600.into(),
        // A 40 GbE port, as on the common ConnectX-3 VPI cards.
        eth_speed: ETH_SPEED_40G,
        width: 2,
        log_gid_pkey: LOG_GIDS << 4,
        log_mac_vlan: 0x77,
        max_vl: 8,
        default_mac: (0x0002_c900_0000_u64 + u64::from(port)).into(),
        ..QueryPort::default()
    };
    p.as_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use portverbs_mlx4_layout::read;

    #[test]
    fn outboxes_carry_the_documented_values() {
        let d: DevCap = read(&query_dev_cap(2)).unwrap();
        assert_eq!(d.vl_ports & 0xf, 2);
        assert_eq!(1u64 << (u32::from(d.uar_size) + 20), 1 << 20);
        assert_eq!(d.qpc_entry_sz.get(), 256);
        assert_eq!(
            (u64::from(d.flags_hi.get()) << 32) | u64::from(d.flags_lo.get()),
            DEV_FLAGS
        );
        let f: QueryFw = read(&query_fw()).unwrap();
        assert_eq!(f.fw_pages.get(), 64);
        assert_eq!(f.cmd_if_rev.get(), 3);
        let p: QueryPort = read(&query_port(1, true, Mtu::Mtu4096)).unwrap();
        assert_eq!(p.link, 0x82);
        assert_eq!(p.ib_mtu, 5);
    }
}

//! Device-level bookkeeping of a soft HCA: identity, attributes, ports, protection domains and
//! registrations, and the fatal flag.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize};

use portverbs_hal::caps::{
    AtomicCap, DeviceAttr, DeviceCapFlags, DeviceInfo, PortAttr, Quirk, QuirkId,
};
use portverbs_hal::rng::SplitMix64;
use portverbs_hal::types::{Gid, LinkLayer, Mtu, PortState, Transport};

/// Limits of the software device.
pub(crate) mod limits {
    /// 2^18 numbers: enough for 100 000 connections each way through one pair of devices
    /// (the CM scale runs); numbers are handed out in O(1) and tables grow on demand.
    pub(crate) const MAX_QP: u32 = 1 << 18;
    pub(crate) const MAX_QP_WR: u32 = 1 << 14;
    pub(crate) const MAX_SGE: u32 = 16;
    pub(crate) const MAX_INLINE: u32 = 512;
    pub(crate) const MAX_CQ: u32 = 1 << 16;
    pub(crate) const MAX_CQE: u32 = (1 << 16) - 1;
    pub(crate) const MAX_MR: u32 = 1 << 20;
    pub(crate) const MAX_PD: u32 = 1 << 16;
    pub(crate) const MAX_RD_ATOM: u32 = 16;
    pub(crate) const MAX_SRQ: u32 = 1 << 16;
    pub(crate) const MAX_SRQ_WR: u32 = 1 << 14;
    pub(crate) const GID_TABLE: u32 = 16;
    pub(crate) const COMP_VECTORS: u32 = 4;
    /// Multicast groups (`max_mcast_grp`): below the 20 IPv4 memberships a Linux socket may
    /// hold by default (`net.ipv4.igmp_max_memberships`), since a UDP-bound device joins
    /// each group on its socket.
    pub(crate) const MAX_MCAST_GRP: u32 = 16;
    /// QPs of one multicast group (`max_mcast_qp_attach`).
    pub(crate) const MAX_MCAST_QP_ATTACH: u32 = 8;
    /// Attachments over all groups (`max_total_mcast_qp_attach`).
    pub(crate) const MAX_TOTAL_MCAST_QP_ATTACH: u32 = 64;
    /// The lowest number of an ordinary QP (below: QP0, QP1 and numbers kept back, as rxe
    /// keeps 0x10 and below).
    pub(crate) const FIRST_QPN: u32 = 0x11;
}

/// The soft device's deviations from IBTA and choices where IBTA allows several.
pub static SOFT_QUIRKS: &[Quirk] = &[
    Quirk {
        id: QuirkId::DeregMrWithBoundMwRefused,
        summary: "deregistering an MR with bound memory windows fails with Busy \
                  (IBA 10.6.7.2.6 allows refusing); the windows keep working",
    },
    Quirk {
        id: QuirkId::NoAutomaticPathMigration,
        summary: "alternate paths (ALT_PATH, PATH_MIG_STATE) are not implemented",
    },
    Quirk {
        id: QuirkId::RetryCnt7IsFinite,
        summary: "retry_cnt = 7 means seven transport retries as IBTA says; rxe treats it as \
                  infinite. rnr_retry = 7 is infinite, as IBTA says",
    },
    Quirk {
        id: QuirkId::NoSrqResize,
        summary: "an SRQ's max_wr cannot change after creation (SRQ_RESIZE is not offered)",
    },
    Quirk::RESET_TO_ERR_REFUSED,
    Quirk::UD_OVERSIZE_IS_LOC_LEN_ERR,
    Quirk::NO_ZERO_BASED_ADDRESSING,
];

/// One port.
#[derive(Debug, Clone)]
pub(crate) struct PortStateRec {
    pub(crate) attr: PortAttr,
    pub(crate) gids: Vec<Gid>,
}

/// Bookkeeping of one device.
#[derive(Debug)]
pub(crate) struct DevState {
    pub(crate) info: DeviceInfo,
    pub(crate) attr: DeviceAttr,
    pub(crate) ports: Vec<PortStateRec>,
    pub(crate) pds: BTreeSet<u32>,
    pub(crate) next_pd: u32,
    pub(crate) mrs: BTreeSet<u32>,
    pub(crate) mws: BTreeSet<u32>,
    pub(crate) dma: Arc<AtomicUsize>,
    pub(crate) fatal: Arc<AtomicBool>,
    /// Where the search for the next QP number starts: a random point of
    /// `FIRST_QPN..MAX_QP` at first (so that a peer cannot guess the numbers), then the number
    /// after the last one handed out, round the range.
    pub(crate) next_qpn: u32,
}

impl DevState {
    pub(crate) fn new(
        name: String,
        index: usize,
        ports: Vec<(Vec<Gid>, Mtu)>,
        rng: &mut SplitMix64,
        progress: portverbs_hal::Progress,
    ) -> Self {
        use limits::*;
        // Like rxe's GUID, which embeds the netdev's MAC: the low 24 bits are the last three
        // bytes of port 1's first address, so devices on different fabrics (UDP-bound ones,
        // each on a fabric of its own) differ too; the device's number when it has none.
        let low = ports
            .first()
            .and_then(|(gids, _)| gids.first())
            .map_or(index as u64, |g| {
                u64::from(u32::from_be_bytes([0, g.0[13], g.0[14], g.0[15]]))
            });
        let node_guid = 0x5076_00ff_fe00_0000 | low;
        let attr = DeviceAttr {
            fw_ver: env!("CARGO_PKG_VERSION").to_string(),
            node_guid,
            sys_image_guid: node_guid,
            max_mr_size: 1 << 47,
            page_size_cap: 0xffff_f000,
            vendor_id: 0x00ff_ffff,
            vendor_part_id: 0,
            hw_ver: 0,
            board_id: "PORTVERBS_SOFT".into(),
            max_qp: MAX_QP - FIRST_QPN,
            max_qp_wr: MAX_QP_WR,
            device_cap_flags: DeviceCapFlags::RC_RNR_NAK_GEN
                | DeviceCapFlags::PORT_ACTIVE_EVENT
                | DeviceCapFlags::SYS_IMAGE_GUID
                | DeviceCapFlags::CURR_QP_STATE_MOD
                | DeviceCapFlags::MEM_WINDOW
                | DeviceCapFlags::MEM_WINDOW_TYPE_2B,
            max_sge: MAX_SGE,
            max_sge_rd: MAX_SGE,
            max_cq: MAX_CQ,
            max_cqe: MAX_CQE,
            max_mr: MAX_MR,
            max_pd: MAX_PD,
            max_qp_rd_atom: MAX_RD_ATOM,
            max_res_rd_atom: MAX_RD_ATOM * MAX_QP,
            max_qp_init_rd_atom: MAX_RD_ATOM,
            atomic_cap: AtomicCap::Hca,
            max_mw: MAX_MR,
            max_ah: MAX_QP,
            max_mcast_grp: MAX_MCAST_GRP,
            max_mcast_qp_attach: MAX_MCAST_QP_ATTACH,
            max_total_mcast_qp_attach: MAX_TOTAL_MCAST_QP_ATTACH,
            max_srq: MAX_SRQ,
            max_srq_wr: MAX_SRQ_WR,
            max_srq_sge: MAX_SGE,
            max_pkeys: 1,
            local_ca_ack_delay: 15,
            phys_port_cnt: ports.len() as u8,
            max_inline_data: MAX_INLINE,
            num_comp_vectors: COMP_VECTORS,
            hca_core_clock: 0,
        };
        let ports = ports
            .into_iter()
            .map(|(gids, mtu)| PortStateRec {
                attr: PortAttr {
                    state: PortState::Active,
                    max_mtu: Mtu::Mtu4096,
                    active_mtu: mtu,
                    gid_tbl_len: GID_TABLE,
                    // IB_PORT_CM_SUP | IB_PORT_IP_BASED_GIDS
                    port_cap_flags: (1 << 16) | (1 << 26),
                    max_msg_sz: 1 << 31,
                    pkey_tbl_len: 1,
                    lid: 0,
                    sm_lid: 0,
                    lmc: 0,
                    active_width: 2,
                    active_speed: 32,
                    phys_state: 5,
                    link_layer: LinkLayer::Ethernet,
                    // Counted by the engine; filled in by query_port.
                    bad_pkey_cntr: 0,
                    qkey_viol_cntr: 0,
                },
                gids,
            })
            .collect();
        Self {
            info: DeviceInfo {
                name,
                driver: "soft",
                transport: Transport::InfiniBand,
                node_guid,
                quirks: SOFT_QUIRKS,
                progress,
            },
            attr,
            ports,
            pds: BTreeSet::new(),
            next_pd: 1,
            mrs: BTreeSet::new(),
            mws: BTreeSet::new(),
            dma: Arc::new(AtomicUsize::new(0)),
            fatal: Arc::new(AtomicBool::new(false)),
            next_qpn: FIRST_QPN + rng.below(u64::from(MAX_QP - FIRST_QPN)) as u32,
        }
    }
}

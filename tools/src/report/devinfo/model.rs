//! Input data for the `ibv_devinfo` layout: plain structs filled by the caller.
//!
//! Fields carry the numeric verbs codes (`IBV_PORT_*`, `IBV_MTU_*`, …); the formatter looks up
//! the names `ibv_devinfo` prints for them.

use portverbs::hal::Gid;

/// One RDMA device as `ibv_devinfo` shows it.
#[derive(Debug, Clone, Default)]
pub(crate) struct DevinfoDevice {
    /// Device name (`hca_id`).
    pub(crate) hca_id: String,
    /// `IBV_TRANSPORT_*` code: 0 InfiniBand, 1 iWARP, 2 usNIC, 3 usNIC UDP, 4 unspecified.
    pub(crate) transport: i32,
    /// Firmware version; the line is omitted when empty.
    pub(crate) fw_ver: String,
    /// Node GUID as a number (printed high 16 bits first).
    pub(crate) node_guid: u64,
    /// System image GUID as a number.
    pub(crate) sys_image_guid: u64,
    /// PCI vendor id.
    pub(crate) vendor_id: u32,
    /// Vendor part id.
    pub(crate) vendor_part_id: u32,
    /// Hardware version.
    pub(crate) hw_ver: u32,
    /// Board id; the line is omitted when `None`.
    pub(crate) board_id: Option<String>,
    /// Number of physical ports.
    pub(crate) phys_port_cnt: u8,
    /// Who makes the device progress (`auto` or `manual`), printed in verbose mode after
    /// `phys_port_cnt` (a line `ibv_devinfo` does not have); `None` leaves it out.
    pub(crate) progress: Option<&'static str>,
    /// Device limits, printed in verbose mode only.
    pub(crate) limits: DevinfoLimits,
    /// The ports to print (the caller leaves out ports not asked for with `-i`).
    pub(crate) ports: Vec<DevinfoPort>,
}

/// Device attributes printed by `ibv_devinfo -v` (fields as in `struct ibv_device_attr`).
#[derive(Debug, Clone, Default)]
pub(crate) struct DevinfoLimits {
    /// Largest memory region, in bytes (printed as hex).
    pub(crate) max_mr_size: u64,
    /// Supported page sizes bitmap (printed as hex).
    pub(crate) page_size_cap: u64,
    /// Maximum number of queue pairs.
    pub(crate) max_qp: u32,
    /// Maximum outstanding work requests per queue.
    pub(crate) max_qp_wr: u32,
    /// `IBV_DEVICE_*` bits, decoded one name per line.
    pub(crate) device_cap_flags: u32,
    /// Maximum scatter/gather entries per work request.
    pub(crate) max_sge: u32,
    /// Maximum scatter/gather entries per RDMA read.
    pub(crate) max_sge_rd: u32,
    /// Maximum number of completion queues.
    pub(crate) max_cq: u32,
    /// Maximum entries per completion queue.
    pub(crate) max_cqe: u32,
    /// Maximum number of memory regions.
    pub(crate) max_mr: u32,
    /// Maximum number of protection domains.
    pub(crate) max_pd: u32,
    /// Maximum outstanding RDMA reads/atomics per QP as target.
    pub(crate) max_qp_rd_atom: u32,
    /// Maximum outstanding RDMA reads/atomics per EE context as target.
    pub(crate) max_ee_rd_atom: u32,
    /// Total resources for incoming RDMA reads/atomics.
    pub(crate) max_res_rd_atom: u32,
    /// Maximum outstanding RDMA reads/atomics per QP as initiator.
    pub(crate) max_qp_init_rd_atom: u32,
    /// Maximum outstanding RDMA reads/atomics per EE context as initiator.
    pub(crate) max_ee_init_rd_atom: u32,
    /// `IBV_ATOMIC_*` code: 0 none, 1 HCA, 2 global.
    pub(crate) atomic_cap: u32,
    /// Maximum number of EE contexts.
    pub(crate) max_ee: u32,
    /// Maximum number of reliable datagram domains.
    pub(crate) max_rdd: u32,
    /// Maximum number of memory windows.
    pub(crate) max_mw: u32,
    /// Maximum number of raw IPv6 QPs.
    pub(crate) max_raw_ipv6_qp: u32,
    /// Maximum number of raw Ethertype QPs.
    pub(crate) max_raw_ethy_qp: u32,
    /// Maximum number of multicast groups.
    pub(crate) max_mcast_grp: u32,
    /// Maximum QPs per multicast group.
    pub(crate) max_mcast_qp_attach: u32,
    /// Maximum QP attachments over all multicast groups.
    pub(crate) max_total_mcast_qp_attach: u32,
    /// Maximum number of address handles.
    pub(crate) max_ah: u32,
    /// Maximum number of FMRs; when 0, `max_map_per_fmr` is not printed.
    pub(crate) max_fmr: u32,
    /// Maximum remaps per FMR.
    pub(crate) max_map_per_fmr: u32,
    /// Maximum number of SRQs; when 0, `max_srq_wr` and `max_srq_sge` are not printed.
    pub(crate) max_srq: u32,
    /// Maximum work requests per SRQ.
    pub(crate) max_srq_wr: u32,
    /// Maximum scatter/gather entries per SRQ work request.
    pub(crate) max_srq_sge: u32,
    /// Number of partition keys.
    pub(crate) max_pkeys: u16,
    /// Local CA ACK delay.
    pub(crate) local_ca_ack_delay: u8,
    /// 0 prints "completion_timestamp_mask not supported".
    pub(crate) completion_timestamp_mask: u64,
    /// Core clock in kHz; 0 prints "core clock not supported".
    pub(crate) hca_core_clock: u64,
    /// Number of completion vectors.
    pub(crate) num_comp_vectors: u32,
    /// The `ibv_query_device_ex` capabilities (ODP, TSO, RSS, …); the default is a device
    /// without any of them.
    pub(crate) ext: DevinfoExtCaps,
}

/// The `struct ibv_device_attr_ex` capabilities `ibv_devinfo -v` prints besides the limits. A
/// field left at 0 prints as `ibv_devinfo` prints a device without the feature (`NO SUPPORT`,
/// `tag matching not supported`, `max_tso: 0`, …), or not at all where it prints nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct DevinfoExtCaps {
    /// `odp_caps.general_caps` (`IBV_ODP_SUPPORT*`).
    pub(crate) odp_general_caps: u64,
    /// `odp_caps.per_transport_caps.rc_odp_caps` (`IBV_ODP_SUPPORT_*` operations).
    pub(crate) rc_odp_caps: u32,
    /// Same for UC.
    pub(crate) uc_odp_caps: u32,
    /// Same for UD.
    pub(crate) ud_odp_caps: u32,
    /// Same for XRC (`xrc_odp_caps`).
    pub(crate) xrc_odp_caps: u32,
    /// `raw_packet_caps` (`IBV_RAW_PACKET_CAP_*`); the section is printed only when non-zero.
    pub(crate) raw_packet_caps: u32,
    /// `device_cap_flags_ex`: every device capability bit, the low 32 bits being
    /// `device_cap_flags`; the high bits are decoded.
    pub(crate) device_cap_flags_ex: u64,
    /// `tso_caps.max_tso`.
    pub(crate) max_tso: u32,
    /// `tso_caps.supported_qpts` (bit n = QP type n).
    pub(crate) tso_supported_qpts: u32,
    /// `rss_caps.max_rwq_indirection_tables`.
    pub(crate) max_rwq_indirection_tables: u32,
    /// `rss_caps.max_rwq_indirection_table_size`.
    pub(crate) max_rwq_indirection_table_size: u32,
    /// `rss_caps.rx_hash_function`.
    pub(crate) rx_hash_function: u8,
    /// `rss_caps.rx_hash_fields_mask`.
    pub(crate) rx_hash_fields_mask: u64,
    /// `rss_caps.supported_qpts`.
    pub(crate) rss_supported_qpts: u32,
    /// `max_wq_type_rq`.
    pub(crate) max_wq_type_rq: u32,
    /// `packet_pacing_caps.qp_rate_limit_min` in kbps.
    pub(crate) qp_rate_limit_min: u32,
    /// `packet_pacing_caps.qp_rate_limit_max` in kbps.
    pub(crate) qp_rate_limit_max: u32,
    /// `packet_pacing_caps.supported_qpts`.
    pub(crate) packet_pacing_supported_qpts: u32,
    /// `tm_caps.max_rndv_hdr_size`.
    pub(crate) tm_max_rndv_hdr_size: u32,
    /// `tm_caps.max_num_tags`; 0 prints "tag matching not supported".
    pub(crate) tm_max_num_tags: u32,
    /// `tm_caps.max_ops`.
    pub(crate) tm_max_ops: u32,
    /// `tm_caps.max_sge`.
    pub(crate) tm_max_sge: u32,
    /// `tm_caps.flags` (`IBV_TM_CAP_RC`).
    pub(crate) tm_flags: u32,
    /// `cq_mod_caps.max_cq_count`; the section is printed only when both are non-zero.
    pub(crate) max_cq_count: u16,
    /// `cq_mod_caps.max_cq_period` in microseconds.
    pub(crate) max_cq_period: u16,
    /// `max_dm_size` in bytes; printed only when non-zero.
    pub(crate) max_dm_size: u64,
}

/// One port (fields as in `struct ibv_port_attr`).
#[derive(Debug, Clone, Default)]
pub(crate) struct DevinfoPort {
    /// Port number (1-based).
    pub(crate) port_num: u32,
    /// `IBV_PORT_*` state code (1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE).
    pub(crate) state: u32,
    /// `IBV_MTU_*` code (1 = 256 … 5 = 4096).
    pub(crate) max_mtu: u32,
    /// `IBV_MTU_*` code.
    pub(crate) active_mtu: u32,
    /// Subnet manager LID.
    pub(crate) sm_lid: u16,
    /// Port LID.
    pub(crate) port_lid: u16,
    /// LID mask control.
    pub(crate) port_lmc: u8,
    /// `IBV_LINK_LAYER_*` code: 0 unspecified, 1 InfiniBand, 2 Ethernet.
    pub(crate) link_layer: u8,
    /// Details printed in verbose mode only.
    pub(crate) extra: DevinfoPortExtra,
}

/// Port attributes printed by `ibv_devinfo -v`.
#[derive(Debug, Clone, Default)]
pub(crate) struct DevinfoPortExtra {
    /// Largest message size.
    pub(crate) max_msg_sz: u32,
    /// `IBV_PORT_*` capability bits (printed as hex).
    pub(crate) port_cap_flags: u32,
    /// Second capability word (printed as hex).
    pub(crate) port_cap_flags2: u16,
    /// VL capability code (1 → 1, 2 → 2, 3 → 4, 4 → 8, 5 → 15 VLs).
    pub(crate) max_vl_num: u8,
    /// Bad P_Key counter.
    pub(crate) bad_pkey_cntr: u16,
    /// Q_Key violation counter.
    pub(crate) qkey_viol_cntr: u16,
    /// SM service level.
    pub(crate) sm_sl: u8,
    /// P_Key table length.
    pub(crate) pkey_tbl_len: u16,
    /// GID table length.
    pub(crate) gid_tbl_len: u32,
    /// Subnet timeout.
    pub(crate) subnet_timeout: u8,
    /// InitTypeReply.
    pub(crate) init_type_reply: u8,
    /// Width code (1 → 1X, 2 → 4X, 4 → 8X, 8 → 12X, 16 → 2X).
    pub(crate) active_width: u8,
    /// Speed code (1 = 2.5 Gbps … 256 = 200.0 Gbps); pass `active_speed_ex` when non-zero.
    pub(crate) active_speed: u32,
    /// Effective port speed in units of 100 Mb/s; `None` omits the line.
    pub(crate) effective_speed: Option<u64>,
    /// Physical state code (5 = LINK_UP); printed only for the InfiniBand transport.
    pub(crate) phys_state: u8,
    /// GID table entries; entries whose interface id (bytes 8..16) is zero are skipped.
    pub(crate) gids: Vec<DevinfoGid>,
}

/// The kind of a GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum GidType {
    /// IB or RoCE v1 GID: printed as eight hex groups.
    #[default]
    IbRoceV1,
    /// RoCE v2 GID: printed as IPv6 text.
    RoceV2,
    /// Type unknown: `ibv_devinfo` prints no line for it.
    #[cfg_attr(
        not(test),
        allow(
            dead_code,
            reason = "no HAL GID type maps to it today; the layout rule is tested"
        )
    )]
    Unknown,
}

/// One GID table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct DevinfoGid {
    /// Table index.
    pub(crate) index: u32,
    /// The GID.
    pub(crate) gid: Gid,
    /// Its type.
    pub(crate) gid_type: GidType,
}

//! Capabilities (`ibv_query_device` / `ibv_query_port` in shape and naming) and the quirks
//! table: the one place where a backend says how it deviates from IBTA.

use std::fmt;

use crate::types::{Gid, LinkLayer, Mtu, PortState, Transport};

bitflags::bitflags! {
    /// Device capability flags (`enum ibv_device_cap_flags` values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct DeviceCapFlags: u64 {
        /// The device can resize to the maximum work-request count.
        const RESIZE_MAX_WR = 1;
        /// Bad P_Key counter.
        const BAD_PKEY_CNTR = 1 << 1;
        /// Bad Q_Key counter.
        const BAD_QKEY_CNTR = 1 << 2;
        /// Raw multicast.
        const RAW_MULTI = 1 << 3;
        /// Automatic path migration.
        const AUTO_PATH_MIG = 1 << 4;
        /// Change of physical port.
        const CHANGE_PHY_PORT = 1 << 5;
        /// UD address-vector port enforcement.
        const UD_AV_PORT_ENFORCE = 1 << 6;
        /// Current-state modifier on modify QP.
        const CURR_QP_STATE_MOD = 1 << 7;
        /// Port shutdown.
        const SHUTDOWN_PORT = 1 << 8;
        /// Init type.
        const INIT_TYPE = 1 << 9;
        /// Port-active event.
        const PORT_ACTIVE_EVENT = 1 << 10;
        /// System image GUID.
        const SYS_IMAGE_GUID = 1 << 11;
        /// RC RNR NAK generation.
        const RC_RNR_NAK_GEN = 1 << 12;
        /// SRQ resize.
        const SRQ_RESIZE = 1 << 13;
        /// N-notify CQ.
        const N_NOTIFY_CQ = 1 << 14;
        /// Memory windows.
        const MEM_WINDOW = 1 << 17;
        /// UD IP checksum.
        const UD_IP_CSUM = 1 << 18;
        /// XRC.
        const XRC = 1 << 20;
        /// Memory-management extensions (fast registration, local invalidate).
        const MEM_MGT_EXTENSIONS = 1 << 21;
        /// Type 2A memory windows.
        const MEM_WINDOW_TYPE_2A = 1 << 23;
        /// Type 2B memory windows.
        const MEM_WINDOW_TYPE_2B = 1 << 24;
        /// RC IP checksum.
        const RC_IP_CSUM = 1 << 25;
        /// Raw IP checksum.
        const RAW_IP_CSUM = 1 << 26;
        /// Managed flow steering.
        const MANAGED_FLOW_STEERING = 1 << 29;
    }
}

impl DeviceCapFlags {
    /// The libibverbs name of every set flag, for `ibv_devinfo -v` style listings.
    pub fn names(self) -> Vec<&'static str> {
        const NAMES: [(DeviceCapFlags, &str); 24] = [
            (DeviceCapFlags::RESIZE_MAX_WR, "RESIZE_MAX_WR"),
            (DeviceCapFlags::BAD_PKEY_CNTR, "BAD_PKEY_CNTR"),
            (DeviceCapFlags::BAD_QKEY_CNTR, "BAD_QKEY_CNTR"),
            (DeviceCapFlags::RAW_MULTI, "RAW_MULTI"),
            (DeviceCapFlags::AUTO_PATH_MIG, "AUTO_PATH_MIG"),
            (DeviceCapFlags::CHANGE_PHY_PORT, "CHANGE_PHY_PORT"),
            (DeviceCapFlags::UD_AV_PORT_ENFORCE, "UD_AV_PORT_ENFORCE"),
            (DeviceCapFlags::CURR_QP_STATE_MOD, "CURR_QP_STATE_MOD"),
            (DeviceCapFlags::SHUTDOWN_PORT, "SHUTDOWN_PORT"),
            (DeviceCapFlags::INIT_TYPE, "INIT_TYPE"),
            (DeviceCapFlags::PORT_ACTIVE_EVENT, "PORT_ACTIVE_EVENT"),
            (DeviceCapFlags::SYS_IMAGE_GUID, "SYS_IMAGE_GUID"),
            (DeviceCapFlags::RC_RNR_NAK_GEN, "RC_RNR_NAK_GEN"),
            (DeviceCapFlags::SRQ_RESIZE, "SRQ_RESIZE"),
            (DeviceCapFlags::N_NOTIFY_CQ, "N_NOTIFY_CQ"),
            (DeviceCapFlags::MEM_WINDOW, "MEM_WINDOW"),
            (DeviceCapFlags::UD_IP_CSUM, "UD_IP_CSUM"),
            (DeviceCapFlags::XRC, "XRC"),
            (DeviceCapFlags::MEM_MGT_EXTENSIONS, "MEM_MGT_EXTENSIONS"),
            (DeviceCapFlags::MEM_WINDOW_TYPE_2A, "MEM_WINDOW_TYPE_2A"),
            (DeviceCapFlags::MEM_WINDOW_TYPE_2B, "MEM_WINDOW_TYPE_2B"),
            (DeviceCapFlags::RC_IP_CSUM, "RC_IP_CSUM"),
            (DeviceCapFlags::RAW_IP_CSUM, "RAW_IP_CSUM"),
            (
                DeviceCapFlags::MANAGED_FLOW_STEERING,
                "MANAGED_FLOW_STEERING",
            ),
        ];
        NAMES
            .iter()
            .filter(|(flag, _)| self.contains(*flag))
            .map(|(_, name)| *name)
            .collect()
    }
}

/// Atomic-operation guarantees (`enum ibv_atomic_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum AtomicCap {
    /// No atomics.
    #[default]
    None = 0,
    /// Atomic among operations through this HCA.
    Hca = 1,
    /// Atomic with respect to the CPU too.
    Glob = 2,
}

impl fmt::Display for AtomicCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "ATOMIC_NONE",
            Self::Hca => "ATOMIC_HCA",
            Self::Glob => "ATOMIC_GLOB",
        })
    }
}

/// Static identity of a device: what `ibv_get_device_list`/`ibv_devinfo` show without a query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Name (`hca_id`), e.g. `soft0`.
    pub name: String,
    /// Which backend drives it, e.g. `soft` or `mlx4`.
    pub driver: &'static str,
    /// Node transport.
    pub transport: Transport,
    /// Node GUID.
    pub node_guid: u64,
    /// The quirks of this backend.
    pub quirks: &'static [Quirk],
    /// Who makes the device progress: its own thread or hardware (auto), or the
    /// application's calls (manual); see [`crate::progress`].
    pub progress: crate::progress::Progress,
}

/// Device attributes (`struct ibv_device_attr`, plus the few extended fields `ibv_devinfo -v`
/// prints).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID.
    pub node_guid: u64,
    /// System image GUID.
    pub sys_image_guid: u64,
    /// Largest MR in bytes.
    pub max_mr_size: u64,
    /// Supported page sizes (bit n = 2^n bytes).
    pub page_size_cap: u64,
    /// PCI vendor ID.
    pub vendor_id: u32,
    /// PCI device ID.
    pub vendor_part_id: u32,
    /// Hardware revision.
    pub hw_ver: u32,
    /// Board ID (`ibv_devinfo` prints it).
    pub board_id: String,
    /// Maximum QPs.
    pub max_qp: u32,
    /// Maximum outstanding WRs per queue.
    pub max_qp_wr: u32,
    /// Capability flags.
    pub device_cap_flags: DeviceCapFlags,
    /// Maximum SGEs per WR.
    pub max_sge: u32,
    /// Maximum SGEs per RDMA READ.
    pub max_sge_rd: u32,
    /// Maximum CQs.
    pub max_cq: u32,
    /// Maximum entries per CQ.
    pub max_cqe: u32,
    /// Maximum MRs.
    pub max_mr: u32,
    /// Maximum PDs.
    pub max_pd: u32,
    /// Maximum outstanding reads/atomics per QP as responder.
    pub max_qp_rd_atom: u32,
    /// Maximum outstanding reads/atomics for the whole device as responder.
    pub max_res_rd_atom: u32,
    /// Maximum outstanding reads/atomics per QP as initiator.
    pub max_qp_init_rd_atom: u32,
    /// Atomic guarantees.
    pub atomic_cap: AtomicCap,
    /// Maximum memory windows.
    pub max_mw: u32,
    /// Maximum address handles.
    pub max_ah: u32,
    /// Maximum multicast groups the device can hold at once (`max_mcast_grp`); 0 when the
    /// device has no multicast (`Device::attach_mcast` then answers `Unsupported`).
    pub max_mcast_grp: u32,
    /// Maximum QPs attached to one multicast group (`max_mcast_qp_attach`: per group, as
    /// libibverbs defines it; a QP can be in at most `max_mcast_grp` groups).
    pub max_mcast_qp_attach: u32,
    /// Maximum QP attachments over all groups of the device (`max_total_mcast_qp_attach`).
    pub max_total_mcast_qp_attach: u32,
    /// Maximum SRQs.
    pub max_srq: u32,
    /// Maximum WRs per SRQ.
    pub max_srq_wr: u32,
    /// Maximum SGEs per SRQ WR.
    pub max_srq_sge: u32,
    /// P_Key table size.
    pub max_pkeys: u16,
    /// Local CA ACK delay (IB encoding).
    pub local_ca_ack_delay: u8,
    /// Physical ports.
    pub phys_port_cnt: u8,
    /// Maximum inline bytes per send WR.
    pub max_inline_data: u32,
    /// Completion vectors (event queues for completions) available.
    pub num_comp_vectors: u32,
    /// Core clock in kHz (0 when not exposed).
    pub hca_core_clock: u64,
}

/// Port attributes (`struct ibv_port_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Logical state.
    pub state: PortState,
    /// Largest MTU supported.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// Port capability flags.
    pub port_cap_flags: u32,
    /// Largest message in bytes.
    pub max_msg_sz: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u16,
    /// LID (0 on Ethernet).
    pub lid: u16,
    /// Subnet manager LID.
    pub sm_lid: u16,
    /// LMC.
    pub lmc: u8,
    /// Active width (IB encoding: 1 = 1x, 2 = 4x, …).
    pub active_width: u8,
    /// Active speed (IB encoding).
    pub active_speed: u16,
    /// Physical state (5 = LinkUp).
    pub phys_state: u8,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Packets received with a P_Key not in the port's table (PortInfo P_KeyViolations;
    /// saturates at 0xffff).
    pub bad_pkey_cntr: u16,
    /// UD datagrams received with the wrong Q_Key (PortInfo Q_KeyViolations; saturates).
    pub qkey_viol_cntr: u16,
}

/// GID type of a table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidType {
    /// InfiniBand / RoCE v1.
    Ib,
    /// RoCE v2 (UDP encapsulation).
    RoceV2,
}

impl fmt::Display for GidType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ib => "IB/RoCE v1",
            Self::RoceV2 => "RoCE v2",
        })
    }
}

/// One GID-table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its type.
    pub gid_type: GidType,
}

/// Known deviations from IBTA (or choices IBTA leaves open) that a test or application may need
/// to know about. Every difference between backends is an entry here, never a skipped test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QuirkId {
    /// IBA 10.6.7.2.6 allows two behaviours when an MR with bound windows is deregistered; this
    /// backend refuses with `Busy` (windows stay usable).
    DeregMrWithBoundMwRefused,
    /// Automatic path migration (alternate paths) is not implemented.
    NoAutomaticPathMigration,
    /// `retry_cnt = 7` is treated as seven retries, as IBTA says (rxe treats it as infinite).
    RetryCnt7IsFinite,
    /// SRQ max_wr cannot be changed after creation.
    NoSrqResize,
    /// A responder with `max_dest_rd_atomic = 0` has no remote read/atomic rights, so a READ
    /// or atomic to it fails with `REM_ACCESS_ERR` instead of `REM_INV_REQ_ERR`.
    ZeroRdAtomicIsAccessError,
    /// RESET → ERR is refused, as Linux's transition table does (IBTA allows it).
    ResetToErrRefused,
    /// A UD send larger than the port MTU completes with `LOC_LEN_ERR` (IBTA C10-93.1.1 says
    /// the message is silently not sent).
    UdOversizeIsLocLenErr,
    /// No zero-based MRs or windows (`ZERO_BASED` is refused).
    NoZeroBasedAddressing,
}

/// One quirk with a human explanation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quirk {
    /// Identifier.
    pub id: QuirkId,
    /// What the backend does, and where IBTA or other stacks differ.
    pub summary: &'static str,
}

/// The quirks that come from layers every backend shares (verbs-core's transition table, the
/// transport engine), written once for the backends' tables.
impl Quirk {
    /// [`QuirkId::ResetToErrRefused`].
    pub const RESET_TO_ERR_REFUSED: Self = Self {
        id: QuirkId::ResetToErrRefused,
        summary: "RESET -> ERR is refused (InvalidTransition), as Linux's ib_modify_qp_is_ok \
                  table does; IBTA lets any state go to ERR",
    };
    /// [`QuirkId::UdOversizeIsLocLenErr`].
    pub const UD_OVERSIZE_IS_LOC_LEN_ERR: Self = Self {
        id: QuirkId::UdOversizeIsLocLenErr,
        summary: "a UD send larger than the port MTU completes with LOC_LEN_ERR and the QP \
                  enters SQE, as HCAs and rdma-unit-test expect; IBTA C10-93.1.1 (and rxe) \
                  send nothing and report success",
    };
    /// [`QuirkId::NoZeroBasedAddressing`].
    pub const NO_ZERO_BASED_ADDRESSING: Self = Self {
        id: QuirkId::NoZeroBasedAddressing,
        summary: "no zero-based addressing: ZERO_BASED is refused on reg_mr (InvalidAccess) \
                  and a zero-based bind fails with MW_BIND_ERR; IBTA allows zero-based type-2 \
                  windows (mlx5 and irdma lack them too)",
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_flag_names_follow_libibverbs() {
        let flags = DeviceCapFlags::MEM_WINDOW | DeviceCapFlags::RC_RNR_NAK_GEN;
        assert_eq!(flags.names(), vec!["RC_RNR_NAK_GEN", "MEM_WINDOW"]);
        assert_eq!(DeviceCapFlags::MEM_WINDOW.bits(), 1 << 17);
    }
}

//! The names `ibv_devinfo` prints for the numeric verbs codes.
//!
//! Each lookup mirrors `ibv_devinfo`'s tables, including its texts for codes it does not know
//! (`invalid state`, `invalid MTU`, …).

/// `IBV_DEVICE_*` capability bits and the names `ibv_devinfo -v` prints for them.
pub(super) const DEVICE_CAP_NAMES: [(u32, &str); 24] = [
    (1, "RESIZE_MAX_WR"),
    (1 << 1, "BAD_PKEY_CNTR"),
    (1 << 2, "BAD_QKEY_CNTR"),
    (1 << 3, "RAW_MULTI"),
    (1 << 4, "AUTO_PATH_MIG"),
    (1 << 5, "CHANGE_PHY_PORT"),
    (1 << 6, "UD_AV_PORT_ENFORCE"),
    (1 << 7, "CURR_QP_STATE_MOD"),
    (1 << 8, "SHUTDOWN_PORT"),
    (1 << 9, "INIT_TYPE"),
    (1 << 10, "PORT_ACTIVE_EVENT"),
    (1 << 11, "SYS_IMAGE_GUID"),
    (1 << 12, "RC_RNR_NAK_GEN"),
    (1 << 13, "SRQ_RESIZE"),
    (1 << 14, "N_NOTIFY_CQ"),
    (1 << 17, "MEM_WINDOW"),
    (1 << 18, "UD_IP_CSUM"),
    (1 << 20, "XRC"),
    (1 << 21, "MEM_MGT_EXTENSIONS"),
    (1 << 23, "MEM_WINDOW_TYPE_2A"),
    (1 << 24, "MEM_WINDOW_TYPE_2B"),
    (1 << 25, "RC_IP_CSUM"),
    (1 << 26, "RAW_IP_CSUM"),
    (1 << 29, "MANAGED_FLOW_STEERING"),
];

/// `IBV_ODP_SUPPORT*` general ODP bits and their `ibv_devinfo -v` names.
pub(super) const ODP_GENERAL_NAMES: [(u64, &str); 2] =
    [(1, "ODP_SUPPORT"), (1 << 1, "ODP_SUPPORT_IMPLICIT")];

/// `IBV_ODP_SUPPORT_*` per-transport operation bits and their names.
pub(super) const ODP_TRANSPORT_NAMES: [(u64, &str); 8] = [
    (1, "SUPPORT_SEND"),
    (1 << 1, "SUPPORT_RECV"),
    (1 << 2, "SUPPORT_WRITE"),
    (1 << 3, "SUPPORT_READ"),
    (1 << 4, "SUPPORT_ATOMIC"),
    (1 << 5, "SUPPORT_SRQ"),
    (1 << 6, "SUPPORT_FLUSH"),
    (1 << 7, "SUPPORT_ATOMIC_WRITE"),
];

/// The `device_cap_flags_ex` bits above the 32 of `device_cap_flags` that `ibv_devinfo -v`
/// names.
pub(super) const DEVICE_CAP_EX_NAMES: [(u64, &str); 3] = [
    (1 << 34, "RAW_SCATTER_FCS"),
    (1 << 36, "PCI_WRITE_END_PADDING"),
    (1 << 41, "CC_DMA_BOUNCE"),
];

/// `IBV_RAW_PACKET_CAP_*` bits and their names (unknown bits are not listed).
pub(super) const RAW_PACKET_CAP_NAMES: [(u32, &str); 4] = [
    (1, "C-VLAN stripping offload"),
    (1 << 1, "Scatter FCS offload"),
    (1 << 2, "IP csum offload"),
    (1 << 3, "Delay drop"),
];

/// Name of an `IBV_TRANSPORT_*` code.
pub(crate) fn transport_name(code: i32) -> &'static str {
    match code {
        0 => "InfiniBand",
        1 => "iWARP",
        2 => "usNIC",
        3 => "usNIC UDP",
        4 => "unspecified",
        _ => "invalid transport",
    }
}

/// Name of an `IBV_PORT_*` state code.
pub(crate) fn port_state_name(code: u32) -> &'static str {
    match code {
        1 => "PORT_DOWN",
        2 => "PORT_INIT",
        3 => "PORT_ARMED",
        4 => "PORT_ACTIVE",
        _ => "invalid state",
    }
}

/// Text of an `IBV_MTU_*` code (the MTU in bytes).
pub(crate) fn mtu_name(code: u32) -> &'static str {
    match code {
        1 => "256",
        2 => "512",
        3 => "1024",
        4 => "2048",
        5 => "4096",
        _ => "invalid MTU",
    }
}

/// Name of an `IBV_LINK_LAYER_*` code.
pub(crate) fn link_layer_name(code: u8) -> &'static str {
    match code {
        0 => "Unspecified",
        1 => "InfiniBand",
        2 => "Ethernet",
        _ => "Unknown",
    }
}

pub(super) fn atomic_cap_name(code: u32) -> &'static str {
    match code {
        0 => "ATOMIC_NONE",
        1 => "ATOMIC_HCA",
        2 => "ATOMIC_GLOB",
        _ => "invalid atomic capability",
    }
}

pub(super) fn width_name(code: u8) -> &'static str {
    match code {
        1 => "1",
        2 => "4",
        4 => "8",
        8 => "12",
        16 => "2",
        _ => "invalid width",
    }
}

pub(super) fn speed_name(code: u32) -> &'static str {
    match code {
        1 => "2.5 Gbps",
        2 => "5.0 Gbps",
        4 | 8 => "10.0 Gbps",
        16 => "14.0 Gbps",
        32 => "25.0 Gbps",
        64 => "50.0 Gbps",
        128 => "100.0 Gbps",
        256 => "200.0 Gbps",
        _ => "invalid speed",
    }
}

pub(super) fn vl_name(code: u8) -> &'static str {
    match code {
        1 => "1",
        2 => "2",
        3 => "4",
        4 => "8",
        5 => "15",
        _ => "invalid value",
    }
}

pub(super) fn phys_state_name(code: u8) -> &'static str {
    match code {
        1 => "SLEEP",
        2 => "POLLING",
        3 => "DISABLED",
        4 => "PORT_CONFIGURATION TRAINNING",
        5 => "LINK_UP",
        6 => "LINK_ERROR_RECOVERY",
        7 => "PHY TEST",
        _ => "invalid physical state",
    }
}

//! `ibv_devinfo` layout for `portverbs devices`.
//!
//! Output per device: `hca_id:\t<name>`, then one `\t<key>:<tabs><value>` line per attribute,
//! then for each port `\t\tport:\t<n>` and its `\t\t\t<key>:<tabs><value>` lines, each port block
//! followed by an empty line. Values are padded with tabs so that they start at column 40
//! (device lines) or 48 (port lines) with 8-column tab stops, as `ibv_devinfo` does; scripts
//! grep these keys, so the key names are kept exactly.
//!
//! Enumerated values print as `NAME (number)` with `ibv_devinfo`'s names (`PORT_ACTIVE (4)`,
//! `4096 (5)`, `4X (2)`, `25.0 Gbps (32)`, `LINK_UP (5)`, `ATOMIC_HCA (1)`); the input structs
//! carry the numeric verbs codes and the names are looked up here.
//!
//! Verbose mode (`-v`) prints what `ibv_devinfo -v` prints, in its order: the `max_*` limits,
//! `device_cap_flags` with one decoded flag name per line, `atomic_cap`, the ODP capabilities,
//! the completion timestamp mask, `hca_core_clock`, the raw-packet capabilities,
//! `device_cap_flags_ex`, the TSO, RSS, packet-pacing, tag-matching, CQ-moderation and
//! device-memory sections, `num_comp_vectors`, and the per-port details with the GID table.
//! Capabilities the caller leaves at zero print as `ibv_devinfo` prints them for a device that
//! lacks them. (`max_comp_cntr`, printed by the newest `ibv_devinfo` for devices with
//! completion counters, is not produced.)

use std::fmt::Write as _;

mod model;
mod names;

pub(crate) use model::{
    DevinfoDevice, DevinfoExtCaps, DevinfoGid, DevinfoLimits, DevinfoPort, DevinfoPortExtra,
    GidType,
};
pub(crate) use names::{link_layer_name, mtu_name, port_state_name, transport_name};

use names::{
    DEVICE_CAP_EX_NAMES, DEVICE_CAP_NAMES, ODP_GENERAL_NAMES, ODP_TRANSPORT_NAMES,
    RAW_PACKET_CAP_NAMES, atomic_cap_name, phys_state_name, speed_name, vl_name, width_name,
};

/// Formats a GUID as four groups of four hex digits, most significant first.
pub(crate) fn format_guid(guid: u64) -> String {
    format!(
        "{:04x}:{:04x}:{:04x}:{:04x}",
        (guid >> 48) & 0xffff,
        (guid >> 32) & 0xffff,
        (guid >> 16) & 0xffff,
        guid & 0xffff
    )
}

/// Appends `<indent tabs><key>:<tabs><value>\n`, with enough tabs (at least one) after the
/// colon to reach column `value_col` on 8-column tab stops.
fn field(
    out: &mut String,
    indent: usize,
    key: &str,
    value_col: usize,
    value: impl std::fmt::Display,
) {
    let end = indent * 8 + key.len() + 1;
    let tabs = (value_col.saturating_sub(end / 8 * 8) / 8).max(1);
    let _ = writeln!(
        out,
        "{}{key}:{}{value}",
        "\t".repeat(indent),
        "\t".repeat(tabs)
    );
}

/// A device-level line (value at column 40).
fn dev(out: &mut String, key: &str, value: impl std::fmt::Display) {
    field(out, 1, key, 40, value);
}

/// A port-level line (value at column 48).
fn port(out: &mut String, key: &str, value: impl std::fmt::Display) {
    field(out, 3, key, 48, value);
}

/// Formats `ibv_devinfo -l`: `N HCA(s) found:`, one tab-indented name per line, an empty line.
pub(crate) fn format_list<S: AsRef<str>>(names: &[S]) -> String {
    let plural = if names.len() == 1 { "" } else { "s" };
    let mut o = format!("{} HCA{plural} found:\n", names.len());
    for name in names {
        let _ = writeln!(o, "\t{}", name.as_ref());
    }
    o.push('\n');
    o
}

/// Formats one device like `ibv_devinfo` (or `ibv_devinfo -v` when `verbose`).
pub(crate) fn format_device(d: &DevinfoDevice, verbose: bool) -> String {
    let mut o = format!("hca_id:\t{}\n", d.hca_id);
    dev(
        &mut o,
        "transport",
        format_args!("{} ({})", transport_name(d.transport), d.transport),
    );
    if !d.fw_ver.is_empty() {
        dev(&mut o, "fw_ver", &d.fw_ver);
    }
    dev(&mut o, "node_guid", format_guid(d.node_guid));
    dev(&mut o, "sys_image_guid", format_guid(d.sys_image_guid));
    dev(&mut o, "vendor_id", format_args!("0x{:04x}", d.vendor_id));
    dev(&mut o, "vendor_part_id", d.vendor_part_id);
    dev(&mut o, "hw_ver", format_args!("0x{:X}", d.hw_ver));
    if let Some(board) = &d.board_id {
        dev(&mut o, "board_id", board);
    }
    dev(&mut o, "phys_port_cnt", d.phys_port_cnt);
    if verbose {
        if let Some(p) = d.progress {
            dev(&mut o, "progress", p);
        }
        format_limits(&mut o, &d.limits);
    }
    for p in &d.ports {
        format_port(&mut o, p, verbose, d.transport == 0);
    }
    o
}

fn format_limits(o: &mut String, l: &DevinfoLimits) {
    dev(o, "max_mr_size", format_args!("0x{:x}", l.max_mr_size));
    dev(o, "page_size_cap", format_args!("0x{:x}", l.page_size_cap));
    dev(o, "max_qp", l.max_qp);
    dev(o, "max_qp_wr", l.max_qp_wr);
    dev(
        o,
        "device_cap_flags",
        format_args!("0x{:08x}", l.device_cap_flags),
    );
    let mut known = 0;
    for (bit, name) in DEVICE_CAP_NAMES {
        known |= bit;
        if l.device_cap_flags & bit != 0 {
            let _ = writeln!(o, "\t\t\t\t\t{name}");
        }
    }
    if l.device_cap_flags & !known != 0 {
        let _ = writeln!(
            o,
            "\t\t\t\t\tUnknown flags: 0x{:X}",
            l.device_cap_flags & !known
        );
    }
    let numbers = [
        ("max_sge", l.max_sge),
        ("max_sge_rd", l.max_sge_rd),
        ("max_cq", l.max_cq),
        ("max_cqe", l.max_cqe),
        ("max_mr", l.max_mr),
        ("max_pd", l.max_pd),
        ("max_qp_rd_atom", l.max_qp_rd_atom),
        ("max_ee_rd_atom", l.max_ee_rd_atom),
        ("max_res_rd_atom", l.max_res_rd_atom),
        ("max_qp_init_rd_atom", l.max_qp_init_rd_atom),
        ("max_ee_init_rd_atom", l.max_ee_init_rd_atom),
    ];
    for (key, value) in numbers {
        dev(o, key, value);
    }
    dev(
        o,
        "atomic_cap",
        format_args!("{} ({})", atomic_cap_name(l.atomic_cap), l.atomic_cap),
    );
    let numbers = [
        ("max_ee", l.max_ee),
        ("max_rdd", l.max_rdd),
        ("max_mw", l.max_mw),
        ("max_raw_ipv6_qp", l.max_raw_ipv6_qp),
        ("max_raw_ethy_qp", l.max_raw_ethy_qp),
        ("max_mcast_grp", l.max_mcast_grp),
        ("max_mcast_qp_attach", l.max_mcast_qp_attach),
        ("max_total_mcast_qp_attach", l.max_total_mcast_qp_attach),
        ("max_ah", l.max_ah),
        ("max_fmr", l.max_fmr),
    ];
    for (key, value) in numbers {
        dev(o, key, value);
    }
    if l.max_fmr != 0 {
        dev(o, "max_map_per_fmr", l.max_map_per_fmr);
    }
    dev(o, "max_srq", l.max_srq);
    if l.max_srq != 0 {
        dev(o, "max_srq_wr", l.max_srq_wr);
        dev(o, "max_srq_sge", l.max_srq_sge);
    }
    dev(o, "max_pkeys", l.max_pkeys);
    dev(o, "local_ca_ack_delay", l.local_ca_ack_delay);
    let x = &l.ext;
    format_odp_caps(o, x);
    if l.completion_timestamp_mask != 0 {
        // ibv_devinfo spells this key with a space and pads it past the usual column.
        let _ = writeln!(
            o,
            "\tcompletion timestamp_mask:\t\t\t0x{:016x}",
            l.completion_timestamp_mask
        );
    } else {
        o.push_str("\tcompletion_timestamp_mask not supported\n");
    }
    if l.hca_core_clock != 0 {
        dev(o, "hca_core_clock", format_args!("{}kHZ", l.hca_core_clock));
    } else {
        o.push_str("\tcore clock not supported\n");
    }
    if x.raw_packet_caps != 0 {
        o.push_str("\traw packet caps:\n");
        for (bit, name) in RAW_PACKET_CAP_NAMES {
            if x.raw_packet_caps & bit != 0 {
                let _ = writeln!(o, "\t\t\t\t\t{name}");
            }
        }
    }
    dev(
        o,
        "device_cap_flags_ex",
        format_args!("0x{:X}", x.device_cap_flags_ex),
    );
    flag_lines(
        o,
        x.device_cap_flags_ex & 0xffff_ffff_0000_0000,
        &DEVICE_CAP_EX_NAMES,
    );
    format_ext_sections(o, x);
    dev(o, "num_comp_vectors", l.num_comp_vectors);
}

/// One `\t\t\t\t\t<NAME>` line per known bit of `bits`, then `Unknown flags: 0x…` for the rest.
fn flag_lines(o: &mut String, bits: u64, names: &[(u64, &str)]) {
    let mut known = 0;
    for &(bit, name) in names {
        known |= bit;
        if bits & bit != 0 {
            let _ = writeln!(o, "\t\t\t\t\t{name}");
        }
    }
    if bits & !known != 0 {
        let _ = writeln!(o, "\t\t\t\t\tUnknown flags: 0x{:X}", bits & !known);
    }
}

/// `general_odp_caps` and the per-transport ODP operations (`NO SUPPORT` when none).
fn format_odp_caps(o: &mut String, x: &DevinfoExtCaps) {
    o.push_str("\tgeneral_odp_caps:\n");
    flag_lines(o, x.odp_general_caps, &ODP_GENERAL_NAMES);
    for (name, caps) in [
        ("rc", x.rc_odp_caps),
        ("uc", x.uc_odp_caps),
        ("ud", x.ud_odp_caps),
        ("xrc", x.xrc_odp_caps),
    ] {
        let _ = writeln!(o, "\t{name}_odp_caps:");
        if caps == 0 {
            o.push_str("\t\t\t\t\tNO SUPPORT\n");
        } else {
            flag_lines(o, u64::from(caps), &ODP_TRANSPORT_NAMES);
        }
    }
}

/// The `SUPPORT_<QP type>` lines of a `supported_qp:` list (bit n = `ibv_qp_type` n), with
/// the QP types the section can name.
fn supported_qps(o: &mut String, qpts: u32, types: &[(u32, &str)]) {
    o.push_str("\t\tsupported_qp:\n");
    let mut known = 0;
    for &(qpt, name) in types {
        known |= 1 << qpt;
        if qpts & (1 << qpt) != 0 {
            let _ = writeln!(o, "\t\t\t\t\tSUPPORT_{name}");
        }
    }
    if qpts & !known != 0 {
        let _ = writeln!(o, "\t\t\t\t\tUnknown flags: 0x{:X}", qpts & !known);
    }
}

/// `ibv_qp_type` values the capability sections name.
const QPT_RC: u32 = 2;
const QPT_UD: u32 = 4;
const QPT_RAW_PACKET: u32 = 8;

/// TSO, RSS, `max_wq_type_rq`, packet pacing, tag matching, CQ moderation, device memory.
fn format_ext_sections(o: &mut String, x: &DevinfoExtCaps) {
    let raw_ud = [(QPT_RAW_PACKET, "RAW_PACKET"), (QPT_UD, "UD")];
    o.push_str("\ttso_caps:\n");
    let _ = writeln!(o, "\t\tmax_tso:\t\t\t{}", x.max_tso);
    if x.max_tso != 0 {
        supported_qps(o, x.tso_supported_qpts, &raw_ud);
    }
    o.push_str("\trss_caps:\n");
    let _ = writeln!(
        o,
        "\t\tmax_rwq_indirection_tables:\t\t\t{}",
        x.max_rwq_indirection_tables
    );
    let _ = writeln!(
        o,
        "\t\tmax_rwq_indirection_table_size:\t\t\t{}",
        x.max_rwq_indirection_table_size
    );
    let _ = writeln!(o, "\t\trx_hash_function:\t\t\t\t0x{:x}", x.rx_hash_function);
    let _ = writeln!(
        o,
        "\t\trx_hash_fields_mask:\t\t\t\t0x{:X}",
        x.rx_hash_fields_mask
    );
    if x.rss_supported_qpts != 0 {
        supported_qps(o, x.rss_supported_qpts, &raw_ud);
    }
    dev(o, "max_wq_type_rq", x.max_wq_type_rq);
    o.push_str("\tpacket_pacing_caps:\n");
    let _ = writeln!(o, "\t\tqp_rate_limit_min:\t{}kbps", x.qp_rate_limit_min);
    let _ = writeln!(o, "\t\tqp_rate_limit_max:\t{}kbps", x.qp_rate_limit_max);
    if x.qp_rate_limit_max != 0 {
        supported_qps(
            o,
            x.packet_pacing_supported_qpts,
            &[
                (QPT_RAW_PACKET, "RAW_PACKET"),
                (QPT_UD, "UD"),
                (QPT_RC, "RC"),
            ],
        );
    }
    if x.tm_max_num_tags != 0 {
        let _ = writeln!(o, "\tmax_rndv_hdr_size:\t\t{}", x.tm_max_rndv_hdr_size);
        let _ = writeln!(o, "\tmax_num_tags:\t\t\t{}", x.tm_max_num_tags);
        let _ = writeln!(o, "\tmax_ops:\t\t\t{}", x.tm_max_ops);
        let _ = writeln!(o, "\tmax_sge:\t\t\t{}", x.tm_max_sge);
        o.push_str("\tflags:\n");
        if x.tm_flags & 1 != 0 {
            o.push_str("\t\t\t\t\tIBV_TM_CAP_RC\n");
        }
    } else {
        o.push_str("\ttag matching not supported\n");
    }
    if x.max_cq_count != 0 && x.max_cq_period != 0 {
        o.push_str("\n\tcq moderation caps:\n");
        let _ = writeln!(o, "\t\tmax_cq_count:\t{}", x.max_cq_count);
        let _ = writeln!(o, "\t\tmax_cq_period:\t{} us\n", x.max_cq_period);
    }
    if x.max_dm_size != 0 {
        let _ = writeln!(
            o,
            "\tmaximum available device memory:\t{}Bytes\n",
            x.max_dm_size
        );
    }
}

fn format_port(o: &mut String, p: &DevinfoPort, verbose: bool, ib_transport: bool) {
    let _ = writeln!(o, "\t\tport:\t{}", p.port_num);
    port(
        o,
        "state",
        format_args!("{} ({})", port_state_name(p.state), p.state),
    );
    port(
        o,
        "max_mtu",
        format_args!("{} ({})", mtu_name(p.max_mtu), p.max_mtu),
    );
    port(
        o,
        "active_mtu",
        format_args!("{} ({})", mtu_name(p.active_mtu), p.active_mtu),
    );
    port(o, "sm_lid", p.sm_lid);
    port(o, "port_lid", p.port_lid);
    port(o, "port_lmc", format_args!("0x{:02x}", p.port_lmc));
    port(o, "link_layer", link_layer_name(p.link_layer));
    if verbose {
        let x = &p.extra;
        port(o, "max_msg_sz", format_args!("0x{:x}", x.max_msg_sz));
        port(
            o,
            "port_cap_flags",
            format_args!("0x{:08x}", x.port_cap_flags),
        );
        port(
            o,
            "port_cap_flags2",
            format_args!("0x{:04x}", x.port_cap_flags2),
        );
        port(
            o,
            "max_vl_num",
            format_args!("{} ({})", vl_name(x.max_vl_num), x.max_vl_num),
        );
        port(o, "bad_pkey_cntr", format_args!("0x{:x}", x.bad_pkey_cntr));
        port(
            o,
            "qkey_viol_cntr",
            format_args!("0x{:x}", x.qkey_viol_cntr),
        );
        port(o, "sm_sl", x.sm_sl);
        port(o, "pkey_tbl_len", x.pkey_tbl_len);
        port(o, "gid_tbl_len", x.gid_tbl_len);
        port(o, "subnet_timeout", x.subnet_timeout);
        port(o, "init_type_reply", x.init_type_reply);
        port(
            o,
            "active_width",
            format_args!("{}X ({})", width_name(x.active_width), x.active_width),
        );
        port(
            o,
            "active_speed",
            format_args!("{} ({})", speed_name(x.active_speed), x.active_speed),
        );
        if let Some(speed) = x.effective_speed {
            port(
                o,
                "effective_speed",
                format_args!("{:.1} Gbps", speed as f64 / 10.0),
            );
        }
        if ib_transport {
            port(
                o,
                "phys_state",
                format_args!("{} ({})", phys_state_name(x.phys_state), x.phys_state),
            );
        }
        for g in &x.gids {
            format_gid(o, g, p.link_layer == 2);
        }
    }
    o.push('\n');
}

fn format_gid(o: &mut String, g: &DevinfoGid, ethernet: bool) {
    if g.gid.0[8..].iter().all(|&b| b == 0) {
        return;
    }
    let text = match g.gid_type {
        GidType::IbRoceV1 => g.gid.hex_groups(),
        GidType::RoceV2 => g.gid.inet6(),
        GidType::Unknown => return,
    };
    let suffix = match (ethernet, g.gid_type) {
        (true, GidType::IbRoceV1) => ", RoCE v1",
        (true, GidType::RoceV2) => ", RoCE v2",
        _ => "",
    };
    let _ = writeln!(o, "\t\t\tGID[{:3}]:\t\t{text}{suffix}", g.index);
}

#[cfg(test)]
mod tests;

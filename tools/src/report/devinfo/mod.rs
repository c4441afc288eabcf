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
//! Verbose mode (`-v`) prints the `max_*` limits, `device_cap_flags` with one decoded flag name
//! per line, `atomic_cap`, the completion timestamp mask, `hca_core_clock`, `num_comp_vectors`
//! and the per-port details with the GID table. `ibv_devinfo -v` also prints ODP, TSO, RSS,
//! packet-pacing, tag-matching, CQ-moderation, device-memory and `device_cap_flags_ex` sections;
//! those are not produced here.

use std::fmt::Write as _;

mod model;
mod names;

pub(crate) use model::{
    DevinfoDevice, DevinfoGid, DevinfoLimits, DevinfoPort, DevinfoPortExtra, GidType,
};
pub(crate) use names::{link_layer_name, mtu_name, port_state_name, transport_name};

use crate::report::gid::{gid_hex_groups, gid_inet6};
use names::{DEVICE_CAP_NAMES, atomic_cap_name, phys_state_name, speed_name, vl_name, width_name};

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
    dev(o, "num_comp_vectors", l.num_comp_vectors);
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
    if g.gid[8..].iter().all(|&b| b == 0) {
        return;
    }
    let text = match g.gid_type {
        GidType::IbRoceV1 => gid_hex_groups(&g.gid),
        GidType::RoceV2 => gid_inet6(&g.gid),
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

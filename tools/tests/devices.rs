//! `portverbs devices`: ibv_devinfo's keys and layout, `-l`, `-v`, and errors.

mod common;

use common::portverbs;

#[test]
fn lists_both_devices_with_ibv_devinfo_keys() {
    let out = portverbs(&["devices"]).ok().stdout;
    assert!(out.contains("hca_id:\tsoft0\n"), "{out}");
    assert!(out.contains("hca_id:\tsoft1\n"), "{out}");
    // The emulated ConnectX-3s, with what their firmware reports.
    assert!(out.contains("hca_id:\tmlx4_0\n"), "{out}");
    assert!(out.contains("hca_id:\tmlx4_1\n"), "{out}");
    assert!(out.contains("\tfw_ver:\t\t\t\t2.42.5000\n"), "{out}");
    assert!(out.contains("\tvendor_part_id:\t\t\t4099\n"), "{out}");
    assert!(out.contains("\ttransport:\t\t\tInfiniBand (0)\n"), "{out}");
    assert!(out.contains("\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"), "{out}");
    assert!(out.contains("\t\t\tlink_layer:\t\tEthernet\n"), "{out}");
    assert!(out.contains("\t\tport:\t1\n"), "{out}");
    for key in [
        "fw_ver:",
        "node_guid:",
        "sys_image_guid:",
        "vendor_id:",
        "board_id:",
    ] {
        assert!(out.contains(key), "{key} missing from\n{out}");
    }
    // No verbose keys without -v.
    assert!(!out.contains("max_qp:"), "{out}");
}

#[test]
fn list_mode_prints_names_only() {
    let out = portverbs(&["devices", "-l"]).ok().stdout;
    assert_eq!(
        out,
        "4 HCAs found:\n\tsoft0\n\tsoft1\n\tmlx4_0\n\tmlx4_1\n\n"
    );
}

#[test]
fn verbose_mode_prints_limits_and_the_gid_table() {
    let out = portverbs(&["devices", "-v", "-d", "soft0"]).ok().stdout;
    assert!(out.starts_with("hca_id:\tsoft0\n"), "{out}");
    assert!(!out.contains("soft1"), "{out}");
    assert!(out.contains("\tmax_qp:\t\t\t\t"), "{out}");
    assert!(out.contains("\tatomic_cap:\t\t\tATOMIC_HCA (1)\n"), "{out}");
    assert!(out.contains("\t\t\t\t\tMEM_WINDOW\n"), "{out}");
    assert!(
        out.contains("\t\t\tGID[  0]:\t\t::ffff:10.0.0.1, RoCE v2\n"),
        "{out}"
    );
}

#[test]
fn emulated_connectx3_reports_a_40_gbe_port() {
    // mlx4_ib's RoCE port: 40 GbE is 4X QDR (never an EDR code on a ConnectX-3).
    let out = portverbs(&["devices", "-v", "-d", "mlx4_0"]).ok().stdout;
    assert!(out.contains("\t\t\tactive_width:\t\t4X (2)\n"), "{out}");
    assert!(
        out.contains("\t\t\tactive_speed:\t\t10.0 Gbps (4)\n"),
        "{out}"
    );
}

#[test]
fn one_port_only() {
    let out = portverbs(&["devices", "-d", "soft1", "-i", "1"])
        .ok()
        .stdout;
    assert!(out.contains("hca_id:\tsoft1\n") && out.contains("\t\tport:\t1\n"));
    portverbs(&["devices", "-i", "2"]).failed();
}

#[test]
fn unknown_device_fails_with_a_message() {
    let run = portverbs(&["devices", "-d", "nosuch"]).failed();
    assert!(run.stderr.contains("nosuch"), "{}", run.stderr);
    assert!(run.stdout.is_empty());
}

#[test]
fn help_explains_the_subcommand() {
    let out = portverbs(&["devices", "--help"]).ok().stdout;
    assert!(out.contains("ibv_devinfo"), "{out}");
    assert!(out.contains("--ib-dev"), "{out}");
}

//! `portverbs devices`: ibv_devinfo's keys and layout, `-l`, `-v`, and errors.

mod common;

use common::{portverbs, portverbs_with};

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
    // The multicast limits the soft device reports (16 groups, 8 QPs in each, 64 in all).
    assert!(out.contains("\tmax_mcast_grp:\t\t\t16\n"), "{out}");
    assert!(out.contains("\tmax_mcast_qp_attach:\t\t8\n"), "{out}");
    assert!(out.contains("\tmax_total_mcast_qp_attach:\t64\n"), "{out}");
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

/// `PORTVERBS_NO_VFIO=0` keeps the VFIO scan (the library's parsing is unit-tested there) and
/// is accepted; a value that means neither yes nor no, or a `PORTVERBS_MLX4_IP` that is no
/// address, is refused with a message naming the variable.
#[test]
fn malformed_environment_is_refused() {
    for value in ["0", "1", "false", "yes", ""] {
        portverbs_with(&["devices", "-l"], None, &[("PORTVERBS_NO_VFIO", value)]).ok();
    }
    portverbs_with(
        &["devices", "-l"],
        None,
        &[("PORTVERBS_MLX4_IP", "192.0.2.1")],
    )
    .ok();
    for (var, value, args) in [
        ("PORTVERBS_MLX4_IP", "192.0.2", &["devices", "-l"][..]),
        (
            "PORTVERBS_MLX4_IP",
            "mlx4-port",
            &["perf", "write_bw", "-n", "5"],
        ),
        ("PORTVERBS_NO_VFIO", "maybe", &["pingpong", "-n", "5"]),
    ] {
        let run = portverbs_with(args, None, &[(var, value)]).failed();
        assert!(
            run.stderr
                .starts_with(&format!("portverbs: {var}=\"{value}\"")),
            "{}",
            run.stderr
        );
        assert_eq!(run.code, Some(2));
        assert!(run.stdout.is_empty(), "{}", run.stdout);
    }
}

/// `devices -v` on the emulated ConnectX-3 prints every key `ibv_devinfo -v` prints for an
/// mlx4 device, in its order; the capabilities the device lacks print as ibv_devinfo prints
/// them for such a device.
#[test]
fn verbose_connectx3_has_every_ibv_devinfo_key() {
    let out = portverbs(&["devices", "-v", "-d", "mlx4_0"]).ok().stdout;
    let keys = [
        "hca_id:",
        "\ttransport:",
        "\tfw_ver:",
        "\tnode_guid:",
        "\tsys_image_guid:",
        "\tvendor_id:",
        "\tvendor_part_id:",
        "\thw_ver:",
        "\tboard_id:",
        "\tphys_port_cnt:",
        "\tmax_mr_size:",
        "\tpage_size_cap:",
        "\tmax_qp:",
        "\tmax_qp_wr:",
        "\tdevice_cap_flags:",
        "\tmax_sge:",
        "\tmax_sge_rd:",
        "\tmax_cq:",
        "\tmax_cqe:",
        "\tmax_mr:",
        "\tmax_pd:",
        "\tmax_qp_rd_atom:",
        "\tmax_ee_rd_atom:",
        "\tmax_res_rd_atom:",
        "\tmax_qp_init_rd_atom:",
        "\tmax_ee_init_rd_atom:",
        "\tatomic_cap:",
        "\tmax_ee:",
        "\tmax_rdd:",
        "\tmax_mw:",
        "\tmax_raw_ipv6_qp:",
        "\tmax_raw_ethy_qp:",
        "\tmax_mcast_grp:",
        "\tmax_mcast_qp_attach:",
        "\tmax_total_mcast_qp_attach:",
        "\tmax_ah:",
        "\tmax_fmr:",
        "\tmax_srq:",
        "\tmax_srq_wr:",
        "\tmax_srq_sge:",
        "\tmax_pkeys:",
        "\tlocal_ca_ack_delay:",
        "\tgeneral_odp_caps:\n\trc_odp_caps:\n\t\t\t\t\tNO SUPPORT\n\tuc_odp_caps:\n\t\t\t\t\tNO \
         SUPPORT\n\tud_odp_caps:\n\t\t\t\t\tNO SUPPORT\n\txrc_odp_caps:\n\t\t\t\t\tNO SUPPORT\n",
        "\tcompletion",
        "\tcore clock not supported\n",
        "\tdevice_cap_flags_ex:\t\t0x",
        "\ttso_caps:\n\t\tmax_tso:\t\t\t0\n",
        "\trss_caps:\n",
        "\tmax_wq_type_rq:\t\t\t0\n",
        "\tpacket_pacing_caps:\n",
        "\ttag matching not supported\n",
        "\tnum_comp_vectors:",
        "\t\tport:\t1\n",
        "\t\t\tstate:",
        "\t\t\tmax_mtu:",
        "\t\t\tactive_mtu:",
        "\t\t\tsm_lid:",
        "\t\t\tport_lid:",
        "\t\t\tport_lmc:",
        "\t\t\tlink_layer:",
        "\t\t\tmax_msg_sz:\t\t0x",
        "\t\t\tport_cap_flags:\t\t0x",
        "\t\t\tport_cap_flags2:\t0x",
        // mlx4_ib's RoCE ports report two VLs.
        "\t\t\tmax_vl_num:\t\t2 (2)\n",
        "\t\t\tbad_pkey_cntr:\t\t0x0\n",
        "\t\t\tqkey_viol_cntr:\t\t0x0\n",
        "\t\t\tsm_sl:\t\t\t0\n",
        "\t\t\tpkey_tbl_len:",
        "\t\t\tgid_tbl_len:",
        "\t\t\tsubnet_timeout:\t\t0\n",
        "\t\t\tinit_type_reply:\t0\n",
        "\t\t\tactive_width:",
        "\t\t\tactive_speed:",
        "\t\t\tphys_state:\t\tLINK_UP (5)\n",
        "\t\t\tGID[  0]:\t\t::ffff:10.0.0.3, RoCE v2\n",
    ];
    let mut at = 0;
    for key in keys {
        let found = out[at..]
            .find(key)
            .unwrap_or_else(|| panic!("{key:?} missing (or out of order) after byte {at}:\n{out}"));
        at += found + key.len();
    }
    // The soft device keeps one VL, as a software RoCE port reports.
    let soft = portverbs(&["devices", "-v", "-d", "soft0"]).ok().stdout;
    assert!(soft.contains("\t\t\tmax_vl_num:\t\t1 (1)\n"), "{soft}");
}

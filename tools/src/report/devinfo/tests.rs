//! Golden tests for the `ibv_devinfo` layout.
//!
//! The expected text was produced by running `ibv_devinfo`'s own print statements (its format
//! strings, fed with the same values) and is compared byte for byte, tabs included.

use portverbs::hal::Gid;

use super::*;

fn sample_device() -> DevinfoDevice {
    let mut gid_v1 = [0u8; 16];
    gid_v1[..2].copy_from_slice(&[0xfe, 0x80]);
    gid_v1[8..].copy_from_slice(&[0x0e, 0x42, 0xa1, 0xff, 0xfe, 0xa1, 0xb2, 0xc3]);
    let mut gid_v4 = [0u8; 16];
    gid_v4[10..].copy_from_slice(&[0xff, 0xff, 192, 168, 1, 10]);
    let mut link_local_only = [0u8; 16];
    link_local_only[..2].copy_from_slice(&[0xfe, 0x80]);
    DevinfoDevice {
        hca_id: "mlx5_0".into(),
        transport: 0,
        fw_ver: "16.35.2000".into(),
        node_guid: 0x0c42_a103_00a1_b2c3,
        sys_image_guid: 0x0c42_a103_00a1_b2c3,
        vendor_id: 0x02c9,
        vendor_part_id: 4119,
        hw_ver: 0,
        board_id: Some("MT_0000000012".into()),
        phys_port_cnt: 1,
        progress: None,
        limits: DevinfoLimits {
            max_mr_size: u64::MAX,
            page_size_cap: 0xffff_ffff_ffff_f000,
            max_qp: 131_072,
            max_qp_wr: 32_768,
            device_cap_flags: 0xed72_1c36,
            max_sge: 30,
            max_sge_rd: 30,
            max_cq: 16_777_216,
            max_cqe: 4_194_303,
            max_mr: 16_777_216,
            max_pd: 8_388_608,
            max_qp_rd_atom: 16,
            max_ee_rd_atom: 0,
            max_res_rd_atom: 2_097_152,
            max_qp_init_rd_atom: 16,
            max_ee_init_rd_atom: 0,
            atomic_cap: 1,
            max_ee: 0,
            max_rdd: 0,
            max_mw: 16_777_216,
            max_raw_ipv6_qp: 0,
            max_raw_ethy_qp: 0,
            max_mcast_grp: 2_097_152,
            max_mcast_qp_attach: 240,
            max_total_mcast_qp_attach: 503_316_480,
            max_ah: 2_147_483_647,
            max_fmr: 0,
            max_map_per_fmr: 99, // not printed: max_fmr is 0
            max_srq: 8_388_608,
            max_srq_wr: 32_767,
            max_srq_sge: 31,
            max_pkeys: 128,
            local_ca_ack_delay: 16,
            completion_timestamp_mask: 0x7fff_ffff_ffff_ffff,
            hca_core_clock: 156_250,
            num_comp_vectors: 63,
            ext: DevinfoExtCaps::default(),
        },
        ports: vec![DevinfoPort {
            port_num: 1,
            state: 4,
            max_mtu: 5,
            active_mtu: 3,
            sm_lid: 0,
            port_lid: 0,
            port_lmc: 0,
            link_layer: 2,
            extra: DevinfoPortExtra {
                max_msg_sz: 0x4000_0000,
                port_cap_flags: 0x0401_0000,
                port_cap_flags2: 0,
                max_vl_num: 0,
                bad_pkey_cntr: 0,
                qkey_viol_cntr: 0,
                sm_sl: 0,
                pkey_tbl_len: 1,
                gid_tbl_len: 255,
                subnet_timeout: 0,
                init_type_reply: 0,
                active_width: 2,
                active_speed: 32,
                effective_speed: Some(1000),
                phys_state: 5,
                gids: vec![
                    DevinfoGid {
                        index: 0,
                        gid: Gid(gid_v1),
                        gid_type: GidType::IbRoceV1,
                    },
                    DevinfoGid {
                        index: 1,
                        gid: Gid(gid_v1),
                        gid_type: GidType::RoceV2,
                    },
                    // Skipped: interface id is zero.
                    DevinfoGid {
                        index: 2,
                        gid: Gid(link_local_only),
                        gid_type: GidType::RoceV2,
                    },
                    DevinfoGid {
                        index: 3,
                        gid: Gid(gid_v4),
                        gid_type: GidType::RoceV2,
                    },
                    // Skipped: unknown type.
                    DevinfoGid {
                        index: 4,
                        gid: Gid(gid_v4),
                        gid_type: GidType::Unknown,
                    },
                ],
            },
        }],
    }
}

const PLAIN: &str = concat!(
    "hca_id:\tmlx5_0\n",
    "\ttransport:\t\t\tInfiniBand (0)\n",
    "\tfw_ver:\t\t\t\t16.35.2000\n",
    "\tnode_guid:\t\t\t0c42:a103:00a1:b2c3\n",
    "\tsys_image_guid:\t\t\t0c42:a103:00a1:b2c3\n",
    "\tvendor_id:\t\t\t0x02c9\n",
    "\tvendor_part_id:\t\t\t4119\n",
    "\thw_ver:\t\t\t\t0x0\n",
    "\tboard_id:\t\t\tMT_0000000012\n",
    "\tphys_port_cnt:\t\t\t1\n",
    "\t\tport:\t1\n",
    "\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n",
    "\t\t\tmax_mtu:\t\t4096 (5)\n",
    "\t\t\tactive_mtu:\t\t1024 (3)\n",
    "\t\t\tsm_lid:\t\t\t0\n",
    "\t\t\tport_lid:\t\t0\n",
    "\t\t\tport_lmc:\t\t0x00\n",
    "\t\t\tlink_layer:\t\tEthernet\n",
    "\n",
);

#[test]
fn plain_layout() {
    assert_eq!(format_device(&sample_device(), false), PLAIN);
}

const VERBOSE: &str = concat!(
    "hca_id:\tmlx5_0\n",
    "\ttransport:\t\t\tInfiniBand (0)\n",
    "\tfw_ver:\t\t\t\t16.35.2000\n",
    "\tnode_guid:\t\t\t0c42:a103:00a1:b2c3\n",
    "\tsys_image_guid:\t\t\t0c42:a103:00a1:b2c3\n",
    "\tvendor_id:\t\t\t0x02c9\n",
    "\tvendor_part_id:\t\t\t4119\n",
    "\thw_ver:\t\t\t\t0x0\n",
    "\tboard_id:\t\t\tMT_0000000012\n",
    "\tphys_port_cnt:\t\t\t1\n",
    "\tmax_mr_size:\t\t\t0xffffffffffffffff\n",
    "\tpage_size_cap:\t\t\t0xfffffffffffff000\n",
    "\tmax_qp:\t\t\t\t131072\n",
    "\tmax_qp_wr:\t\t\t32768\n",
    "\tdevice_cap_flags:\t\t0xed721c36\n",
    "\t\t\t\t\tBAD_PKEY_CNTR\n",
    "\t\t\t\t\tBAD_QKEY_CNTR\n",
    "\t\t\t\t\tAUTO_PATH_MIG\n",
    "\t\t\t\t\tCHANGE_PHY_PORT\n",
    "\t\t\t\t\tPORT_ACTIVE_EVENT\n",
    "\t\t\t\t\tSYS_IMAGE_GUID\n",
    "\t\t\t\t\tRC_RNR_NAK_GEN\n",
    "\t\t\t\t\tMEM_WINDOW\n",
    "\t\t\t\t\tXRC\n",
    "\t\t\t\t\tMEM_MGT_EXTENSIONS\n",
    "\t\t\t\t\tMEM_WINDOW_TYPE_2B\n",
    "\t\t\t\t\tRAW_IP_CSUM\n",
    "\t\t\t\t\tMANAGED_FLOW_STEERING\n",
    "\t\t\t\t\tUnknown flags: 0xC8400000\n",
    "\tmax_sge:\t\t\t30\n",
    "\tmax_sge_rd:\t\t\t30\n",
    "\tmax_cq:\t\t\t\t16777216\n",
    "\tmax_cqe:\t\t\t4194303\n",
    "\tmax_mr:\t\t\t\t16777216\n",
    "\tmax_pd:\t\t\t\t8388608\n",
    "\tmax_qp_rd_atom:\t\t\t16\n",
    "\tmax_ee_rd_atom:\t\t\t0\n",
    "\tmax_res_rd_atom:\t\t2097152\n",
    "\tmax_qp_init_rd_atom:\t\t16\n",
    "\tmax_ee_init_rd_atom:\t\t0\n",
    "\tatomic_cap:\t\t\tATOMIC_HCA (1)\n",
    "\tmax_ee:\t\t\t\t0\n",
    "\tmax_rdd:\t\t\t0\n",
    "\tmax_mw:\t\t\t\t16777216\n",
    "\tmax_raw_ipv6_qp:\t\t0\n",
    "\tmax_raw_ethy_qp:\t\t0\n",
    "\tmax_mcast_grp:\t\t\t2097152\n",
    "\tmax_mcast_qp_attach:\t\t240\n",
    "\tmax_total_mcast_qp_attach:\t503316480\n",
    "\tmax_ah:\t\t\t\t2147483647\n",
    "\tmax_fmr:\t\t\t0\n",
    "\tmax_srq:\t\t\t8388608\n",
    "\tmax_srq_wr:\t\t\t32767\n",
    "\tmax_srq_sge:\t\t\t31\n",
    "\tmax_pkeys:\t\t\t128\n",
    "\tlocal_ca_ack_delay:\t\t16\n",
    // The ibv_query_device_ex sections, as ibv_devinfo prints a device without the features.
    "\tgeneral_odp_caps:\n",
    "\trc_odp_caps:\n",
    "\t\t\t\t\tNO SUPPORT\n",
    "\tuc_odp_caps:\n",
    "\t\t\t\t\tNO SUPPORT\n",
    "\tud_odp_caps:\n",
    "\t\t\t\t\tNO SUPPORT\n",
    "\txrc_odp_caps:\n",
    "\t\t\t\t\tNO SUPPORT\n",
    "\tcompletion timestamp_mask:\t\t\t0x7fffffffffffffff\n",
    "\thca_core_clock:\t\t\t156250kHZ\n",
    "\tdevice_cap_flags_ex:\t\t0x0\n",
    "\ttso_caps:\n",
    "\t\tmax_tso:\t\t\t0\n",
    "\trss_caps:\n",
    "\t\tmax_rwq_indirection_tables:\t\t\t0\n",
    "\t\tmax_rwq_indirection_table_size:\t\t\t0\n",
    "\t\trx_hash_function:\t\t\t\t0x0\n",
    "\t\trx_hash_fields_mask:\t\t\t\t0x0\n",
    "\tmax_wq_type_rq:\t\t\t0\n",
    "\tpacket_pacing_caps:\n",
    "\t\tqp_rate_limit_min:\t0kbps\n",
    "\t\tqp_rate_limit_max:\t0kbps\n",
    "\ttag matching not supported\n",
    "\tnum_comp_vectors:\t\t63\n",
    "\t\tport:\t1\n",
    "\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n",
    "\t\t\tmax_mtu:\t\t4096 (5)\n",
    "\t\t\tactive_mtu:\t\t1024 (3)\n",
    "\t\t\tsm_lid:\t\t\t0\n",
    "\t\t\tport_lid:\t\t0\n",
    "\t\t\tport_lmc:\t\t0x00\n",
    "\t\t\tlink_layer:\t\tEthernet\n",
    "\t\t\tmax_msg_sz:\t\t0x40000000\n",
    "\t\t\tport_cap_flags:\t\t0x04010000\n",
    "\t\t\tport_cap_flags2:\t0x0000\n",
    "\t\t\tmax_vl_num:\t\tinvalid value (0)\n",
    "\t\t\tbad_pkey_cntr:\t\t0x0\n",
    "\t\t\tqkey_viol_cntr:\t\t0x0\n",
    "\t\t\tsm_sl:\t\t\t0\n",
    "\t\t\tpkey_tbl_len:\t\t1\n",
    "\t\t\tgid_tbl_len:\t\t255\n",
    "\t\t\tsubnet_timeout:\t\t0\n",
    "\t\t\tinit_type_reply:\t0\n",
    "\t\t\tactive_width:\t\t4X (2)\n",
    "\t\t\tactive_speed:\t\t25.0 Gbps (32)\n",
    "\t\t\teffective_speed:\t100.0 Gbps\n",
    "\t\t\tphys_state:\t\tLINK_UP (5)\n",
    "\t\t\tGID[  0]:\t\tfe80:0000:0000:0000:0e42:a1ff:fea1:b2c3, RoCE v1\n",
    "\t\t\tGID[  1]:\t\tfe80::e42:a1ff:fea1:b2c3, RoCE v2\n",
    "\t\t\tGID[  3]:\t\t::ffff:192.168.1.10, RoCE v2\n",
    "\n",
);

#[test]
fn verbose_layout() {
    assert_eq!(format_device(&sample_device(), true), VERBOSE);
}

#[test]
fn optional_lines() {
    let mut d = sample_device();
    d.fw_ver.clear();
    d.board_id = None;
    d.limits.max_fmr = 4;
    d.limits.max_srq = 0;
    d.limits.completion_timestamp_mask = 0;
    d.limits.hca_core_clock = 0;
    d.limits.device_cap_flags = 0;
    d.transport = 1; // not InfiniBand: no phys_state line
    d.ports[0].extra.effective_speed = None;
    let text = format_device(&d, true);
    assert!(!text.contains("fw_ver"));
    assert!(!text.contains("board_id"));
    assert!(text.contains("\ttransport:\t\t\tiWARP (1)\n"));
    assert!(text.contains("\tmax_fmr:\t\t\t4\n\tmax_map_per_fmr:\t\t99\n"));
    assert!(text.contains("\tmax_srq:\t\t\t0\n\tmax_pkeys:"));
    assert!(text.contains("\tdevice_cap_flags:\t\t0x00000000\n\tmax_sge:"));
    assert!(text.contains("\tcompletion_timestamp_mask not supported\n"));
    assert!(text.contains("\tcore clock not supported\n"));
    assert!(!text.contains("phys_state"));
    assert!(!text.contains("effective_speed"));
}

#[test]
fn gid_suffix_only_on_ethernet() {
    let mut d = sample_device();
    d.ports[0].link_layer = 1;
    let text = format_device(&d, true);
    assert!(text.contains("\t\t\tlink_layer:\t\tInfiniBand\n"));
    assert!(text.contains("\t\t\tGID[  0]:\t\tfe80:0000:0000:0000:0e42:a1ff:fea1:b2c3\n"));
    assert!(text.contains("\t\t\tGID[  1]:\t\tfe80::e42:a1ff:fea1:b2c3\n"));
}

#[test]
fn enum_names_and_invalid_codes() {
    assert_eq!(port_state_name(1), "PORT_DOWN");
    assert_eq!(port_state_name(0), "invalid state");
    assert_eq!(mtu_name(1), "256");
    assert_eq!(mtu_name(9), "invalid MTU");
    assert_eq!(link_layer_name(0), "Unspecified");
    assert_eq!(link_layer_name(7), "Unknown");
    assert_eq!(transport_name(-1), "invalid transport");
    let mut d = sample_device();
    d.limits.atomic_cap = 2;
    let x = &mut d.ports[0].extra;
    x.active_width = 16;
    x.active_speed = 4;
    x.max_vl_num = 3;
    x.phys_state = 9;
    let text = format_device(&d, true);
    assert!(text.contains("\tatomic_cap:\t\t\tATOMIC_GLOB (2)\n"));
    assert!(text.contains("\t\t\tactive_width:\t\t2X (16)\n"));
    assert!(text.contains("\t\t\tactive_speed:\t\t10.0 Gbps (4)\n"));
    assert!(text.contains("\t\t\tmax_vl_num:\t\t4 (3)\n"));
    assert!(text.contains("\t\t\tphys_state:\t\tinvalid physical state (9)\n"));
}

#[test]
fn guid_groups() {
    assert_eq!(format_guid(0), "0000:0000:0000:0000");
    assert_eq!(format_guid(0x0002_c903_0010_ab01), "0002:c903:0010:ab01");
}

#[test]
fn list_layout() {
    assert_eq!(
        format_list(&["mlx5_0", "rxe0"]),
        "2 HCAs found:\n\tmlx5_0\n\trxe0\n\n"
    );
    assert_eq!(format_list(&["mlx4_0"]), "1 HCA found:\n\tmlx4_0\n\n");
    assert_eq!(format_list::<&str>(&[]), "0 HCAs found:\n\n");
}

#[test]
fn several_ports_each_end_with_blank_line() {
    let mut d = sample_device();
    let mut second = d.ports[0].clone();
    second.port_num = 2;
    second.state = 1;
    d.ports.push(second);
    d.phys_port_cnt = 2;
    let text = format_device(&d, false);
    assert!(text.contains("\t\tport:\t1\n"));
    assert!(
        text.contains(
            "\tlink_layer:\t\tEthernet\n\n\t\tport:\t2\n\t\t\tstate:\t\t\tPORT_DOWN (1)\n"
        )
    );
    assert!(text.ends_with("\tlink_layer:\t\tEthernet\n\n"));
}

/// Every `ibv_query_device_ex` section with the features present, as `ibv_devinfo -v` prints
/// them (its format strings fed with these values).
#[test]
fn extended_capabilities_when_present() {
    let mut d = sample_device();
    d.limits.ext = DevinfoExtCaps {
        odp_general_caps: 0b111,
        rc_odp_caps: 0x3f,
        uc_odp_caps: 0,
        ud_odp_caps: 0x3,
        xrc_odp_caps: 0x1c0,
        raw_packet_caps: 0xf,
        device_cap_flags_ex: 0x0000_0215_ed72_1c36,
        max_tso: 262_144,
        tso_supported_qpts: (1 << 8) | (1 << 4),
        max_rwq_indirection_tables: 65_536,
        max_rwq_indirection_table_size: 2048,
        rx_hash_function: 1,
        rx_hash_fields_mask: 0x8000_00ff,
        rss_supported_qpts: 1 << 8,
        max_wq_type_rq: 8_388_608,
        qp_rate_limit_min: 1,
        qp_rate_limit_max: 100_000_000,
        packet_pacing_supported_qpts: (1 << 8) | (1 << 2) | 1,
        tm_max_rndv_hdr_size: 64,
        tm_max_num_tags: 127,
        tm_max_ops: 32_768,
        tm_max_sge: 1,
        tm_flags: 1,
        max_cq_count: 65_535,
        max_cq_period: 4095,
        max_dm_size: 131_072,
    };
    let text = format_device(&d, true);
    let want = concat!(
        "\tlocal_ca_ack_delay:\t\t16\n",
        "\tgeneral_odp_caps:\n",
        "\t\t\t\t\tODP_SUPPORT\n",
        "\t\t\t\t\tODP_SUPPORT_IMPLICIT\n",
        "\t\t\t\t\tUnknown flags: 0x4\n",
        "\trc_odp_caps:\n",
        "\t\t\t\t\tSUPPORT_SEND\n",
        "\t\t\t\t\tSUPPORT_RECV\n",
        "\t\t\t\t\tSUPPORT_WRITE\n",
        "\t\t\t\t\tSUPPORT_READ\n",
        "\t\t\t\t\tSUPPORT_ATOMIC\n",
        "\t\t\t\t\tSUPPORT_SRQ\n",
        "\tuc_odp_caps:\n",
        "\t\t\t\t\tNO SUPPORT\n",
        "\tud_odp_caps:\n",
        "\t\t\t\t\tSUPPORT_SEND\n",
        "\t\t\t\t\tSUPPORT_RECV\n",
        "\txrc_odp_caps:\n",
        "\t\t\t\t\tSUPPORT_FLUSH\n",
        "\t\t\t\t\tSUPPORT_ATOMIC_WRITE\n",
        "\t\t\t\t\tUnknown flags: 0x100\n",
        "\tcompletion timestamp_mask:\t\t\t0x7fffffffffffffff\n",
        "\thca_core_clock:\t\t\t156250kHZ\n",
        "\traw packet caps:\n",
        "\t\t\t\t\tC-VLAN stripping offload\n",
        "\t\t\t\t\tScatter FCS offload\n",
        "\t\t\t\t\tIP csum offload\n",
        "\t\t\t\t\tDelay drop\n",
        "\tdevice_cap_flags_ex:\t\t0x215ED721C36\n",
        "\t\t\t\t\tRAW_SCATTER_FCS\n",
        "\t\t\t\t\tPCI_WRITE_END_PADDING\n",
        "\t\t\t\t\tCC_DMA_BOUNCE\n",
        "\t\t\t\t\tUnknown flags: 0x100000000\n",
        "\ttso_caps:\n",
        "\t\tmax_tso:\t\t\t262144\n",
        "\t\tsupported_qp:\n",
        "\t\t\t\t\tSUPPORT_RAW_PACKET\n",
        "\t\t\t\t\tSUPPORT_UD\n",
        "\trss_caps:\n",
        "\t\tmax_rwq_indirection_tables:\t\t\t65536\n",
        "\t\tmax_rwq_indirection_table_size:\t\t\t2048\n",
        "\t\trx_hash_function:\t\t\t\t0x1\n",
        "\t\trx_hash_fields_mask:\t\t\t\t0x800000FF\n",
        "\t\tsupported_qp:\n",
        "\t\t\t\t\tSUPPORT_RAW_PACKET\n",
        "\tmax_wq_type_rq:\t\t\t8388608\n",
        "\tpacket_pacing_caps:\n",
        "\t\tqp_rate_limit_min:\t1kbps\n",
        "\t\tqp_rate_limit_max:\t100000000kbps\n",
        "\t\tsupported_qp:\n",
        "\t\t\t\t\tSUPPORT_RAW_PACKET\n",
        "\t\t\t\t\tSUPPORT_RC\n",
        "\t\t\t\t\tUnknown flags: 0x1\n",
        "\tmax_rndv_hdr_size:\t\t64\n",
        "\tmax_num_tags:\t\t\t127\n",
        "\tmax_ops:\t\t\t32768\n",
        "\tmax_sge:\t\t\t1\n",
        "\tflags:\n",
        "\t\t\t\t\tIBV_TM_CAP_RC\n",
        "\n\tcq moderation caps:\n",
        "\t\tmax_cq_count:\t65535\n",
        "\t\tmax_cq_period:\t4095 us\n\n",
        "\tmaximum available device memory:\t131072Bytes\n\n",
        "\tnum_comp_vectors:\t\t63\n",
    );
    assert!(text.contains(want), "{text}");
}

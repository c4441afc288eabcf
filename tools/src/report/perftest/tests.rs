//! Golden tests for the perftest formatters.
//!
//! The expected rows and address lines are what perftest's own `printf` formats print for the
//! same numbers (checked by running those format strings through a C compiler), tabs included.

use portverbs::hal::Gid;

use super::json::JsonResults;
use super::*;
use crate::report::stats::{BwResult, BwUnits, DurationLatency, LatencyStats};

const RULE: &str =
    "---------------------------------------------------------------------------------------";

#[test]
fn rule_is_87_dashes() {
    assert_eq!(RESULT_RULE.len(), 87);
    assert!(RESULT_RULE.bytes().all(|b| b == b'-'));
    assert_eq!(result_rule(), format!("{RULE}\n"));
}

#[test]
fn banner_write_bw_classic_layout() {
    let mut b = PerftestBanner::new(Verb::Write, TestKind::Bw, "mlx5_0");
    b.mtu = 1024;
    b.link_type = "Ethernet".into();
    b.gid_index = Some(3);
    let want = format!(
        "{RULE}\n\
         \x20                   RDMA_Write BW Test\n\
         \x20Dual-port       : OFF\t\tDevice         : mlx5_0\n\
         \x20Number of qps   : 1\t\tTransport type : IB\n\
         \x20Connection type : RC\t\tUsing SRQ      : OFF\n\
         \x20PCIe relax order: ON\n\
         \x20ibv_wr* API     : ON\n\
         \x20TX depth        : 128\n\
         \x20CQ Moderation   : 100\n\
         \x20Mtu             : 1024[B]\n\
         \x20Link type       : Ethernet\n\
         \x20GID index       : 3\n\
         \x20Max inline data : 0[B]\n\
         \x20rdma_cm QPs\t : OFF\n\
         \x20Data ex. method : Ethernet\n\
         {RULE}\n"
    );
    assert_eq!(format_banner(&b), want);
    assert_eq!(b.title(), "RDMA_Write BW Test");
}

#[test]
fn banner_read_lat_server_current_layout() {
    let mut b = PerftestBanner::new(Verb::Read, TestKind::Lat, "rxe0");
    b.role = BannerRole::Server;
    b.pcie_relax_order = Feature::Off;
    b.lock_free = Some(Feature::Off);
    b.enhanced_reorder = Some(false);
    b.outstanding_reads = 16;
    // Server side of a read latency test: no TX depth, no RX depth, no CQ moderation.
    let want = format!(
        "{RULE}\n\
         \x20                   RDMA_Read Latency Test\n\
         \x20Dual-port       : OFF\t\tDevice         : rxe0\n\
         \x20Number of qps   : 1\t\tTransport type : IB\n\
         \x20Connection type : RC\t\tUsing SRQ      : OFF\n\
         \x20PCIe relax order: OFF\t\tLock-free      : OFF\n\
         \x20ibv_wr* API     : ON\t\tUsing Enhanced Reorder      : OFF\n\
         \x20Mtu             : 4096[B]\n\
         \x20Link type       : IB\n\
         \x20Outstand reads  : 16\n\
         \x20rdma_cm QPs\t : OFF\n\
         \x20Data ex. method : Ethernet\n\
         {RULE}\n"
    );
    assert_eq!(format_banner(&b), want);
}

#[test]
fn banner_send_bw_server_with_options() {
    let mut b = PerftestBanner::new(Verb::Send, TestKind::Bw, "mlx5_1");
    b.role = BannerRole::Server;
    b.bidirectional = true;
    b.post_list = 4;
    b.events_comp_vector = Some(0);
    b.cqe_poll = Some(CqePoll::Dynamic);
    b.max_inline = 236;
    b.rdma_cm_qps = true;
    b.data_ex_rdma_cm = true;
    b.tos = Some(96);
    b.connection = "UD".into();
    let want = format!(
        "{RULE}\n\
         \x20                   Send Bidirectional Post List BW Test\n\
         \x20Test with events. Using mlx5_1_comp0\n\
         \x20Dual-port       : OFF\t\tDevice         : mlx5_1\n\
         \x20Number of qps   : 1\t\tTransport type : IB\n\
         \x20Connection type : UD\t\tUsing SRQ      : OFF\n\
         \x20PCIe relax order: ON\n\
         \x20ibv_wr* API     : ON\n\
         \x20TX depth        : 128\n\
         \x20Post List       : 4\n\
         \x20RX depth        : 512\n\
         \x20CQ Moderation   : 100\n\
         \x20CQE Poll Batch  : Dynamic\n\
         \x20Mtu             : 4096[B]\n\
         \x20Link type       : IB\n\
         \x20Max inline data : 236[B]\n\
         \x20rdma_cm QPs\t : ON\n\
         \x20Data ex. method : rdma_cm \tTOS    : 96\n\
         {RULE}\n\
         \x20Waiting for client rdma_cm QP to connect\n\
         \x20Please run the same command with the IB/RoCE interface IP\n\
         {RULE}\n"
    );
    assert_eq!(format_banner(&b), want);
}

#[test]
fn banner_atomic_title_and_lines() {
    let mut b = PerftestBanner::new(Verb::Atomic, TestKind::Lat, "mlx4_0");
    b.cqe_poll = Some(CqePoll::Batch(16)); // BW-only line: must not appear
    let text = format_banner(&b);
    assert!(text.contains("                    Atomic FETCH_AND_ADD Latency Test\n"));
    assert!(text.contains(" TX depth        : 1\n"));
    assert!(text.contains(" Outstand reads  : 1\n"));
    assert!(!text.contains("Max inline data"));
    assert!(!text.contains("CQ Moderation"));
    assert!(!text.contains("CQE Poll Batch"));
    b.atomic_op = AtomicOp::CmpAndSwap;
    b.kind = TestKind::Bw;
    assert_eq!(b.title(), "Atomic CMP_AND_SWAP BW Test");
    assert!(format_banner(&b).contains(" CQE Poll Batch  : 16\n"));
}

#[test]
fn address_lines() {
    let local = PerftestDest {
        lid: 0,
        qpn: 0x11,
        psn: 0x3c1e52,
        out_reads: Some(16),
        rdma: Some(RdmaBuffer {
            rkey: 0x1fefe2,
            vaddr: 0x7f3c_8a00_0000,
        }),
        srqn: None,
        gid: GidLine::Gid(Gid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 255, 255, 10, 0, 0, 1])),
    };
    assert_eq!(
        format_address(AddressSide::Local, &local),
        " local address: LID 0000 QPN 0x0011 PSN 0x3c1e52 OUT 0x10 RKey 0x1fefe2 \
         VAddr 0x007f3c8a000000\n GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:01\n"
    );
    let zeros = PerftestDest {
        lid: 1,
        qpn: 0,
        psn: 0,
        out_reads: None,
        rdma: Some(RdmaBuffer { rkey: 0, vaddr: 0 }),
        srqn: None,
        gid: GidLine::None,
    };
    assert_eq!(
        format_address(AddressSide::Remote, &zeros),
        " remote address: LID 0x01 QPN 000000 PSN 000000 RKey 00000000 VAddr 0000000000000000\n"
    );
    let plain = PerftestDest {
        lid: 0x1234,
        qpn: 0xabcdef,
        psn: 0x12,
        out_reads: None,
        rdma: None,
        srqn: Some(0x42),
        gid: GidLine::Mgid(Gid([0xff; 16])),
    };
    assert_eq!(
        format_address(AddressSide::Remote, &plain),
        " remote address: LID 0x1234 QPN 0xabcdef PSN 0x0012 SRQn 0x000042\n \
         MGID: 255:255:255:255:255:255:255:255:255:255:255:255:255:255:255:255\n"
    );
}

fn bw(msg_size: u64, iterations: u64, peak: f64, avg: f64, rate: f64, units: BwUnits) -> BwResult {
    BwResult {
        msg_size,
        iterations,
        bw_peak: peak,
        bw_average: avg,
        msg_rate_mpps: rate,
        units,
    }
}

#[test]
fn bw_table_mib() {
    // perftest's bytes, except after the 8-character values of the first row: perftest prints
    // 12 spaces after the peak and two tabs after the average whatever their width, which puts
    // that row's average and message rate 1 and 8 columns right of the second row's; here
    // spaces keep every value in its column.
    let mut text = bw_header(BwUnits::MiBps, false);
    text += &bw_row(
        &bw(65536, 5000, 11586.21, 11583.98, 0.185344, BwUnits::MiBps),
        None,
    );
    text += &bw_row(
        &bw(2, 5000, 0.0, f64::NAN, f64::INFINITY, BwUnits::MiBps),
        Some(12.5),
    );
    text += &result_rule();
    let want = format!(
        "{RULE}\n \
         #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]\n \
         65536      5000             11586.21           11583.98             0.185344\n \
         2          5000             0.00               0.00   \t\t     0.000000\t    12.50\n\
         {RULE}\n"
    );
    assert_eq!(text, want);
}

#[test]
fn bw_table_gbits_with_extended_accuracy() {
    let mut text = bw_header(BwUnits::Gbps, true);
    // Average below 0.1 Gb/s: six decimals and the wider layout.
    text += &bw_row(&bw(2, 1000, 0.0523, 0.04969, 3.10546, BwUnits::Gbps), None);
    text += &bw_row(
        &bw(8388608, 1000, 97.17, 97.16, 0.001448, BwUnits::Gbps),
        None,
    );
    let want = format!(
        "{RULE}\n \
         #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]    \
         CPU_Util[%]\n \
         2          1000           0.052300            0.049690            3.105460\n \
         8388608    1000             97.17              97.16  \t\t     0.001448\n"
    );
    assert_eq!(text, want);
}

/// The display columns (tabs to multiples of 8) where each whitespace-separated word of
/// `line` starts.
fn word_starts(line: &str) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut col = 0;
    let mut in_word = false;
    for c in line.chars() {
        match c {
            '\t' => {
                col = (col / 8 + 1) * 8;
                in_word = false;
            }
            ' ' | '\n' => {
                col += 1;
                in_word = false;
            }
            _ => {
                if !in_word {
                    starts.push(col);
                }
                in_word = true;
                col += 1;
            }
        }
    }
    starts
}

/// Where each column title of a header line starts (titles are separated by at least two
/// spaces, or by one before a `#`).
fn title_starts(header: &str) -> Vec<usize> {
    let line = header.lines().last().expect("a header line");
    assert!(!line.contains('\t'), "{line:?}");
    let mut starts = Vec::new();
    let mut spaces = 2;
    for (col, c) in line.chars().enumerate() {
        if c == ' ' {
            spaces += 1;
        } else {
            if spaces >= 2 || (spaces == 1 && c == '#') {
                starts.push(col);
            }
            spaces = 0;
        }
    }
    starts
}

/// Checks that every row's values start in the same columns, and (rows without a CPU column)
/// that each value starts under its title: at or after the title's first column and before
/// the next title's.
fn assert_aligned(header: &str, rows: &[String], titled: bool) {
    let titles = title_starts(header);
    let first = word_starts(&rows[0]);
    for row in rows {
        let starts = word_starts(row);
        assert_eq!(starts, first, "columns moved:\n{}{}", rows[0], row);
        if titled {
            assert_eq!(starts.len(), titles.len(), "{header}{row}");
            for (i, &at) in starts.iter().enumerate() {
                let next = titles.get(i + 1).copied().unwrap_or(usize::MAX);
                assert!(
                    titles[i] <= at && at < next,
                    "value {i} at column {at} is not under its title (columns {}..{next}):\n\
                     {header}{row}",
                    titles[i]
                );
            }
        }
    }
}

#[test]
fn bw_rows_stay_aligned_for_huge_values() {
    let mib = |size, iters, peak, avg, rate| bw(size, iters, peak, avg, rate, BwUnits::MiBps);
    let rows = [
        mib(2, 1000, 0.0, 0.0, 0.0),
        mib(65536, 1000, 1234.56, 1234.5, 0.02),
        mib(65536, 5000, 11586.21, 11583.98, 0.185344),
        // What `send_bw -c UC -r 1` used to report.
        mib(65536, 1000, 274375.52, 210486.61, 3.367786),
        mib(
            1 << 31,
            123_456_789_012,
            999_999_999_999_999.9,
            99_999_999_999_999.9,
            123_456.789,
        ),
    ];
    for cpu in [None, Some(99.5)] {
        let header = bw_header(BwUnits::MiBps, cpu.is_some());
        let text: Vec<String> = rows.iter().map(|r| bw_row(r, cpu)).collect();
        assert_aligned(&header, &text, cpu.is_none());
    }
    // Extended accuracy (Gb/s, average under 0.1): perftest prints the count unpadded.
    let gb = |iters, peak, avg| bw(2, iters, peak, avg, 3.10546, BwUnits::Gbps);
    let rows = [
        gb(1000, 0.0523, 0.04969),
        gb(5, 123_456_789.5, 0.099),
        gb(123_456_789, 0.0, 0.0),
    ];
    let text: Vec<String> = rows.iter().map(|r| bw_row(r, None)).collect();
    assert_aligned(&bw_header(BwUnits::Gbps, false), &text, true);
}

#[test]
fn lat_rows_stay_aligned_for_huge_values() {
    let stats = |t: f64| LatencyStats {
        kept: 997,
        t_min: t,
        t_max: t * 3.0,
        t_typical: t * 1.1,
        t_avg: t * 1.2,
        t_stdev: t / 10.0,
        p99: t * 2.0,
        p99_9: t * 2.9,
    };
    // The narrowest column, t_max, holds 12 characters: 45000000.00 µs still fits.
    for cpu in [None, Some(3.0)] {
        let text: Vec<String> = [
            (2, 1000, 1.01),
            (65536, 5, 123.456),
            (1 << 23, 99_999, 1.5e7),
        ]
        .iter()
        .map(|&(size, iters, t)| lat_row(size, iters, &stats(t), cpu))
        .collect();
        assert_aligned(&lat_header(cpu.is_some()), &text, cpu.is_none());
    }
    let text: Vec<String> = [
        (2_000_000, 0.97, 1_025_641.03),
        (12, 1.2e9, 1e-3),
        (7, 5.5, 1.5e15),
    ]
    .iter()
    .map(|&(iterations, t_avg, tps)| {
        let r = DurationLatency {
            iterations,
            t_avg,
            tps,
        };
        lat_duration_row(2, &r, None)
    })
    .collect();
    assert_aligned(&lat_duration_header(false), &text, true);
}

#[test]
fn latency_table() {
    let small = LatencyStats {
        kept: 997,
        t_min: 1.01,
        t_max: 3.9,
        t_typical: 1.05,
        t_avg: 1.0512,
        t_stdev: 0.07,
        p99: 1.38,
        p99_9: 3.9,
    };
    let large = LatencyStats {
        kept: 997,
        t_min: 123.456,
        t_max: 1234.567,
        t_typical: 130.0,
        t_avg: 131.125, // exact in binary: printf's tie goes to even (131.12)
        t_stdev: 12.005,
        p99: 200.0,
        p99_9: 1000.0,
    };
    let mut text = lat_header(false);
    text += &lat_row(2, 1000, &small, None);
    text += &lat_row(65536, 1000, &large, Some(3.0));
    let want = format!(
        "{RULE}\n \
         #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    \
         t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n \
         2       1000          1.01           3.90         1.05     \t       1.05        \t0.07   \
         \t\t1.38    \t\t3.90   \n \
         65536   1000          123.46         1234.57      130.00   \t       131.12      \t12.01  \
         \t\t200.00  \t\t1000.00\t    3.00\n"
    );
    assert_eq!(text, want);
}

#[test]
fn latency_duration_table() {
    let r = DurationLatency {
        iterations: 2_000_000,
        t_avg: 0.97,
        tps: 1_025_641.03,
    };
    let text = lat_duration_header(false) + &lat_duration_row(2, &r, None);
    let want = format!(
        "{RULE}\n #bytes        #iterations       t_avg[usec]    tps average\n \
         2             2000000            0.97           1025641.03\n"
    );
    assert_eq!(text, want);
}

#[test]
fn bw_json_document() {
    let b = PerftestBanner::new(Verb::Write, TestKind::Bw, "mlx5_0");
    let r = bw(
        65536,
        5000,
        11586.2149,
        11583.981,
        0.18534377,
        BwUnits::MiBps,
    );
    let want = r#"{
  "test_info": {
    "test": "RDMA_Write_BW_Test",
    "Dual_port": "OFF",
    "Device": "mlx5_0",
    "Number_of_qps": 1,
    "Transport_type": "IB",
    "Connection_type": "RC",
    "Using_SRQ": "OFF",
    "PCIe_relax_order": "ON",
    "ibv_wr_API": "ON",
    "TX_depth": 128,
    "CQ_Moderation": 100,
    "Mtu": 4096,
    "Link_type": "IB",
    "Max_inline_data": 0,
    "rdma_cm_QPs": "OFF",
    "Use_ROCm_memory": "OFF",
    "Use_MUSA_memory": "OFF",
    "Data_ex_method": "Ethernet"
  },
  "results": {
    "MsgSize": 65536,
    "n_iterations": 5000,
    "BW_peak": 11586.21,
    "BW_average": 11583.98,
    "MsgRate": 0.185344
  }
}
"#;
    assert_eq!(json_document(&b, &[bw_results(&r, None)]), want);

    // Extended accuracy in Gb/s keeps six decimals; CPU utilisation is appended.
    let g = bw(2, 1000, 0.05234567, 0.04969123, 3.1054649, BwUnits::Gbps);
    let v: serde_json::Value =
        serde_json::from_str(&json_document(&b, &[bw_results(&g, Some(41.234))])).unwrap();
    assert_eq!(v["results"]["BW_peak"], 0.052346);
    assert_eq!(v["results"]["BW_average"], 0.049691);
    assert_eq!(v["results"]["MsgRate"], 3.105465);
    assert_eq!(v["results"]["CPU_util"], 41.23);
}

/// Several sizes (`-a`): `results` is the last size, as perftest's file ends up holding, and
/// `all_results` has every size in order; one size has no `all_results` (perftest's document).
#[test]
fn json_document_of_every_size() {
    let b = PerftestBanner::new(Verb::Write, TestKind::Bw, "mlx5_0");
    let rows: Vec<JsonResults> = [2u64, 4, 8]
        .iter()
        .map(|&size| bw_results(&bw(size, 1000, 1.0, 1.0, 1.0, BwUnits::MiBps), None))
        .collect();
    let text = json_document(&b, &rows);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let all = v["all_results"].as_array().unwrap();
    let sizes: Vec<u64> = all.iter().map(|r| r["MsgSize"].as_u64().unwrap()).collect();
    assert_eq!(sizes, [2, 4, 8]);
    assert_eq!(v["results"], all[2]);
    assert_eq!(v["test_info"]["test"], "RDMA_Write_BW_Test");
    let at = |key: &str| text.find(&format!("\n  \"{key}\": ")).unwrap();
    assert!(at("test_info") < at("results") && at("results") < at("all_results"));
    assert_eq!(v.as_object().unwrap().len(), 3);
    let one: serde_json::Value = serde_json::from_str(&json_document(&b, &rows[..1])).unwrap();
    assert!(one.get("all_results").is_none());
    assert_eq!(json_document(&b, &[]), "{}\n");
}

#[test]
fn latency_json_documents() {
    let mut b = PerftestBanner::new(Verb::Send, TestKind::Lat, "rxe0");
    b.role = BannerRole::Server;
    b.gid_index = Some(1);
    let st = LatencyStats {
        kept: 998,
        t_min: 1.014,
        t_max: 9.5,
        t_typical: 1.2,
        t_avg: 1.2345,
        t_stdev: f64::NAN,
        p99: 2.0,
        p99_9: 7.777,
    };
    let text = json_document(&b, &[lat_results(2, 1000, &st, None)]);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let info = &v["test_info"];
    assert_eq!(info["test"], "Send_Latency_Test");
    assert_eq!(info["RX_depth"], 512);
    assert_eq!(info["GID_index"], 1);
    assert!(
        info.get("TX_depth").is_none(),
        "server of a one-way test has no TX depth"
    );
    assert!(info.get("CQ_Moderation").is_none());
    let r = &v["results"];
    assert_eq!(r["MsgSize"], 2);
    assert_eq!(r["n_iterations"], 1000);
    assert_eq!(r["t_min"], 1.01);
    assert_eq!(r["t_max"], 9.5);
    assert_eq!(r["t_typical"], 1.2);
    assert_eq!(r["t_avg"], 1.23);
    assert_eq!(r["t_stdev"], 0.0, "NaN is reported as 0");
    assert_eq!(r["percentile_99"], 2.0);
    assert_eq!(r["percentile_99.9"], 7.78);
    // Keys appear in perftest's order.
    let keys = [
        "\"t_min\"",
        "\"t_max\"",
        "\"t_typical\"",
        "\"t_avg\"",
        "\"t_stdev\"",
    ];
    let positions: Vec<usize> = keys.iter().map(|k| text.find(k).unwrap()).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]));

    let d = DurationLatency {
        iterations: 5,
        t_avg: 0.974,
        tps: 1025641.026,
    };
    let v: serde_json::Value = serde_json::from_str(&json_document(
        &b,
        &[lat_duration_results(64, &d, Some(1.0))],
    ))
    .unwrap();
    assert_eq!(v["results"]["MsgSize"], 64);
    assert_eq!(v["results"]["n_iterations"], 5);
    assert_eq!(v["results"]["t_avg"], 0.97);
    assert_eq!(v["results"]["tps_average"], 1025641.03);
    assert_eq!(v["results"]["CPU_util"], 1.0);
}

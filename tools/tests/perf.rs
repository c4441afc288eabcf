//! `portverbs perf`: every test runs and prints a perftest table; JSON, `-a`, duration mode,
//! and the combinations perftest rejects.

mod common;

use common::{json_document, portverbs, table_header, table_rows};

const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]";
const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    \
                          t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% \
                          percentile[usec] ";

/// Runs a BW test and checks its one row: size, iterations, positive bandwidths and rate.
fn bw(test: &str, extra: &[&str], size: f64, iters: f64) -> String {
    let mut args = vec!["perf", test, "-n", "200"];
    args.extend_from_slice(extra);
    let out = portverbs(&args).ok().stdout;
    let units = if extra.contains(&"--report_gbits") {
        "Gb/sec"
    } else {
        "MiB/sec"
    };
    assert_eq!(
        table_header(&out),
        BW_HEADER.replace("MiB/sec", units),
        "{out}"
    );
    let rows = table_rows(&out);
    assert_eq!(rows.len(), 1, "{out}");
    let r = &rows[0];
    assert_eq!(r.len(), 5, "{out}");
    assert_eq!((r[0], r[1]), (size, iters), "{out}");
    let peak_ok = if extra.contains(&"-N") {
        r[2] == 0.0
    } else {
        r[2] > 0.0
    };
    assert!(peak_ok && r[3] > 0.0 && r[4] > 0.0, "{out}");
    out
}

/// Runs a latency test and checks its one row.
fn lat(test: &str, extra: &[&str], size: f64) -> String {
    let mut args = vec!["perf", test, "-n", "200"];
    args.extend_from_slice(extra);
    let out = portverbs(&args).ok().stdout;
    assert_eq!(table_header(&out), LAT_HEADER, "{out}");
    let rows = table_rows(&out);
    assert_eq!(rows.len(), 1, "{out}");
    let r = &rows[0];
    assert_eq!(r.len(), 9, "{out}");
    assert_eq!((r[0], r[1]), (size, 200.0), "{out}");
    assert!(r[2..].iter().all(|&x| x > 0.0), "{out}");
    assert!(r[2] <= r[4] && r[4] <= r[3], "min <= typical <= max: {out}");
    out
}

#[test]
fn write_bw_prints_banner_addresses_and_row() {
    let out = bw("write_bw", &[], 65536.0, 200.0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "-".repeat(87));
    assert_eq!(lines[1], "                    RDMA_Write BW Test");
    assert!(out.contains("\tDevice         : soft0\n"), "{out}");
    assert!(out.contains(" Connection type : RC"), "{out}");
    assert!(out.contains(" Link type       : Ethernet"), "{out}");
    let local = lines
        .iter()
        .find(|l| l.starts_with(" local address: LID 0000 QPN 0x"))
        .expect("local address line");
    assert!(
        local.contains(" RKey 0x") && local.contains(" VAddr 0x"),
        "{local}"
    );
    assert!(out.contains(" remote address: LID 0000 QPN 0x"), "{out}");
    assert!(
        out.contains(" GID: 00:00:00:00:00:00:00:00:00:00:255:255:10:00:00:02\n"),
        "{out}"
    );
}

#[test]
fn bandwidth_tests_run() {
    bw("ib_read_bw", &[], 65536.0, 200.0);
    bw("send_bw", &[], 65536.0, 200.0);
    bw("atomic_bw", &[], 8.0, 200.0);
    bw("atomic_bw", &["-A", "CMP_AND_SWAP"], 8.0, 200.0);
    bw(
        "write_bw",
        &["-s", "8", "-q", "3", "-l", "4", "-t", "16"],
        8.0,
        600.0,
    );
    bw("write_bw", &["-c", "UC", "-s", "1000"], 1000.0, 200.0);
    bw("send_bw", &["-c", "UC"], 65536.0, 200.0);
    bw(
        "send_bw",
        &["-c", "UD", "-s", "1024", "-q", "2"],
        1024.0,
        400.0,
    );
    bw("read_bw", &["-o", "1", "-s", "64"], 64.0, 200.0);
}

/// Display columns (tabs to multiples of 8) where the words of `line` start.
fn word_starts(line: &str) -> Vec<usize> {
    let (mut starts, mut col, mut in_word) = (Vec::new(), 0, false);
    for c in line.chars() {
        match c {
            '\t' => (col, in_word) = ((col / 8 + 1) * 8, false),
            ' ' => (col, in_word) = (col + 1, false),
            _ => {
                if !in_word {
                    starts.push(col);
                }
                (col, in_word) = (col + 1, true);
            }
        }
    }
    starts
}

/// `send_bw -c UC -r 1`: the receiver has one receive posted, so UC drops most messages. The
/// row counts the messages that arrived (the note on stderr says how many of how many), its
/// bandwidth is that count times the size over the time its message rate uses, and its values
/// stay under their titles. Over RC every message arrives.
#[test]
fn send_bw_counts_what_arrived() {
    for conn in ["UC", "RC"] {
        let run = portverbs(&["perf", "send_bw", "-c", conn, "-r", "1", "-n", "200"]).ok();
        let out = &run.stdout;
        let rows = table_rows(out);
        assert_eq!(rows.len(), 1, "{out}");
        let r = &rows[0];
        let (size, iters, avg, rate) = (r[0], r[1], r[3], r[4]);
        assert_eq!(size, 65536.0, "{out}");
        assert!((1.0..=200.0).contains(&iters), "{out}");
        let note = run
            .stderr
            .lines()
            .find(|l| l.contains("messages of 65536 bytes arrived"));
        match note {
            Some(note) => {
                assert_eq!(conn, "UC", "{note}");
                let words: Vec<&str> = note.split_whitespace().collect();
                assert_eq!(words[1].parse::<f64>().ok(), Some(iters), "{note}\n{out}");
                assert_eq!((words[2], words[3]), ("of", "200"), "{note}");
            }
            None => assert_eq!(iters, 200.0, "no note, so all arrived: {out}{}", run.stderr),
        }
        // MiB/s x 2^20 = messages/s x size (both printed rounded: 2 and 6 decimals).
        let bytes = avg * 1_048_576.0;
        let from_rate = rate * 1e6 * size;
        assert!(
            (bytes - from_rate).abs() <= 0.005 * 1_048_576.0 + 0.5e-6 * 1e6 * size,
            "{bytes} vs {from_rate}: {out}"
        );
        let header = word_starts(table_header(out));
        let row = out
            .lines()
            .skip_while(|l| !l.starts_with(" #bytes"))
            .nth(1)
            .expect("a row");
        // Titles: #bytes #iterations BW peak[..] BW average[..] MsgRate[Mpps]; the values
        // start where they do in perftest's rows of 7-character bandwidths, whatever their
        // widths: the rate right under its title.
        let titles = [header[0], header[1], header[2], header[4], header[6]];
        assert_eq!(titles, [1, 12, 27, 47, 69], "{out}");
        assert_eq!(word_starts(row), [1, 12, 29, 48, 69], "{out}");
    }
}

#[test]
fn latency_tests_run() {
    let out = lat("write_lat", &[], 2.0);
    assert!(out.contains("RDMA_Write Latency Test"), "{out}");
    assert!(out.contains(" Max inline data : 220[B]"), "{out}");
    lat("ib_read_lat", &[], 2.0);
    lat("send_lat", &["-s", "1000"], 1000.0);
    lat("atomic_lat", &[], 8.0);
    lat("write_lat", &["-s", "4096", "-c", "UC"], 4096.0);
    lat("send_lat", &["-c", "UD", "-s", "64"], 64.0);
}

#[test]
fn bw_json_has_perftest_keys() {
    let out = bw("write_bw", &["--out_json", "-s", "4096"], 4096.0, 200.0);
    let doc = json_document(&out);
    assert_eq!(doc["test_info"]["test"], "RDMA_Write_BW_Test");
    assert_eq!(doc["test_info"]["Device"], "soft0");
    let r = &doc["results"];
    assert_eq!(r["MsgSize"], 4096);
    assert_eq!(r["n_iterations"], 200);
    for key in ["BW_peak", "BW_average", "MsgRate"] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {doc}");
    }
}

#[test]
fn lat_json_has_perftest_keys_and_can_go_to_a_file() {
    let path = std::env::temp_dir().join(format!("portverbs-lat-{}.json", std::process::id()));
    let file_arg = format!("--out_json_file={}", path.display());
    let out = lat("send_lat", &[&file_arg], 2.0);
    assert!(!out.contains("\n{\n"), "the document goes to the file only");
    let text = std::fs::read_to_string(&path).expect("the JSON file was written");
    let _ = std::fs::remove_file(&path);
    let doc: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let r = &doc["results"];
    for key in [
        "t_min",
        "t_max",
        "t_typical",
        "t_avg",
        "t_stdev",
        "percentile_99",
        "percentile_99.9",
    ] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {doc}");
    }
    assert_eq!(r["MsgSize"], 2);
    assert_eq!(r["n_iterations"], 200);
}

#[test]
fn all_sizes_give_one_row_per_power_of_two() {
    let want: Vec<f64> = (1..=23).map(|p| f64::from(1u32 << p)).collect();
    for test in ["write_bw", "read_lat"] {
        let out = portverbs(&["perf", test, "-a", "-n", "5"]).ok().stdout;
        let sizes: Vec<f64> = table_rows(&out).iter().map(|r| r[0]).collect();
        assert_eq!(sizes, want, "{out}");
    }
    // On UD the sizes stop at the MTU.
    let out = portverbs(&["perf", "send_bw", "-a", "-n", "5", "-c", "UD"])
        .ok()
        .stdout;
    assert_eq!(table_rows(&out).len(), 12, "{out}");
}

#[test]
fn duration_mode_reports_a_window() {
    let out = portverbs(&["perf", "write_bw", "-D", "1", "-s", "4096"])
        .ok()
        .stdout;
    let rows = table_rows(&out);
    assert_eq!(rows.len(), 1, "{out}");
    assert!(rows[0][1] > 0.0 && rows[0][3] > 0.0, "{out}");
    let out = portverbs(&["perf", "read_lat", "-D", "1"]).ok().stdout;
    assert_eq!(
        table_header(&out),
        " #bytes        #iterations       t_avg[usec]    tps average"
    );
    let rows = table_rows(&out);
    assert!(
        rows[0][1] > 0.0 && rows[0][2] > 0.0 && rows[0][3] > 0.0,
        "{out}"
    );
}

#[test]
fn gbits_and_no_peak() {
    let out = bw("write_bw", &["--report_gbits", "-N"], 65536.0, 200.0);
    assert!(out.contains("BW peak[Gb/sec]"), "{out}");
    assert_eq!(table_rows(&out)[0][2], 0.0, "no peak with -N: {out}");
}

#[test]
fn invalid_combinations_fail() {
    let cases: &[&[&str]] = &[
        &["perf", "read_bw", "-c", "UC"],
        &["perf", "atomic_lat", "-c", "UD"],
        &["perf", "write_bw", "-c", "UD"],
        &["perf", "send_bw", "-c", "XRC"],
        &["perf", "nosuch_bw"],
        &["perf", "write_lat", "-q", "2"],
        &["perf", "atomic_bw", "-s", "64"],
        &["perf", "write_bw", "-n", "3"],
        &["perf", "write_bw", "-D", "2", "-n", "100"],
        &["perf", "write_bw", "-a", "-s", "64"],
        &["perf", "write_bw", "-a", "-D", "3"],
        &["perf", "write_lat", "-H"],
        &["perf", "write_bw", "-m", "1000"],
        &["perf", "write_bw", "-I", "100000"],
        &["perf", "read_bw", "-I", "64"],
        &["perf", "read_bw", "-o", "1000"],
        &["perf", "send_bw", "-c", "UD", "-s", "8192"],
        &["perf", "write_bw", "-d", "nosuch"],
        &["perf", "write_bw", "-x", "9"],
        &["perf", "write_bw", "-s", "abc"],
        &["perf", "write_bw", "-l", "64", "-t", "8"],
    ];
    for args in cases {
        let run = portverbs(args).failed();
        assert!(
            !run.stdout.contains("#bytes"),
            "{args:?} ran a test:\n{}",
            run.stdout
        );
    }
}

#[test]
fn help_explains_the_subcommand() {
    let out = portverbs(&["perf", "--help"]).ok().stdout;
    for flag in [
        "--tx-depth",
        "--cq-mod",
        "--out_json",
        "--report_gbits",
        "write_bw",
    ] {
        assert!(out.contains(flag), "{flag} missing from\n{out}");
    }
}

#[test]
fn every_test_runs_on_the_emulated_mlx4() {
    for test in ["write_bw", "read_bw", "send_bw", "atomic_bw"] {
        let size = if test == "atomic_bw" { 8.0 } else { 65536.0 };
        let out = bw(test, &["-d", "mlx4_0"], size, 200.0);
        assert!(out.contains("\tDevice         : mlx4_0\n"), "{out}");
    }
    for test in ["write_lat", "read_lat", "send_lat"] {
        let out = lat(test, &["-d", "mlx4_0"], 2.0);
        assert!(out.contains("\tDevice         : mlx4_0\n"), "{out}");
    }
}

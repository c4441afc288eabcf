//! `portverbs perf`: every test runs and prints a perftest table; JSON, `-a`, duration mode,
//! and the combinations perftest rejects.

mod common;

use std::path::Path;

use common::{ScratchDir, json_file, portverbs, portverbs_with, table_header, table_rows};

const BW_HEADER: &str =
    " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]";
const LAT_HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    \
                          t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% \
                          percentile[usec] ";

/// Runs a BW test and checks its one row: size, iterations, positive bandwidths and rate.
fn bw(test: &str, extra: &[&str], size: f64, iters: f64) -> String {
    bw_in(None, test, extra, size, iters)
}

/// [`bw`] in the working directory `cwd`.
fn bw_in(cwd: Option<&Path>, test: &str, extra: &[&str], size: f64, iters: f64) -> String {
    let mut args = vec!["perf", test, "-n", "200"];
    args.extend_from_slice(extra);
    let out = portverbs_with(&args, cwd, &[]).ok().stdout;
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
fn bw_json_goes_to_perftest_out_json_in_the_working_directory() {
    let dir = ScratchDir::new("bw-json");
    let out = bw_in(
        Some(&dir.0),
        "write_bw",
        &["--out_json", "-s", "4096"],
        4096.0,
        200.0,
    );
    assert!(
        !out.contains("\n{\n"),
        "the document goes to the file only:\n{out}"
    );
    let doc = json_file(&dir.0.join("perftest_out.json"));
    assert_eq!(doc["test_info"]["test"], "RDMA_Write_BW_Test");
    assert_eq!(doc["test_info"]["Device"], "soft0");
    let r = &doc["results"];
    assert_eq!(r["MsgSize"], 4096);
    assert_eq!(r["n_iterations"], 200);
    for key in ["BW_peak", "BW_average", "MsgRate"] {
        assert!(r[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {doc}");
    }
    assert!(doc.get("all_results").is_none(), "one size: {doc}");
}

#[test]
fn lat_json_has_perftest_keys_and_can_go_to_a_file() {
    let dir = ScratchDir::new("lat-json");
    let path = dir.0.join("lat.json");
    let file_arg = format!("--out_json_file={}", path.display());
    let out = lat("send_lat", &[&file_arg], 2.0);
    assert!(!out.contains("\n{\n"), "the document goes to the file only");
    let doc = json_file(&path);
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

/// With `-a` the report holds every size: `results` is the last one (what perftest's file holds
/// after `-a`), `all_results` all of them in order.
#[test]
fn all_sizes_json_holds_every_size() {
    let dir = ScratchDir::new("all-json");
    let run = portverbs_with(
        &["perf", "read_lat", "-a", "-n", "5", "--out_json"],
        Some(&dir.0),
        &[],
    )
    .ok();
    let doc = json_file(&dir.0.join("perftest_out.json"));
    let all = doc["all_results"].as_array().expect("all_results");
    let sizes: Vec<u64> = all.iter().map(|r| r["MsgSize"].as_u64().unwrap()).collect();
    let want: Vec<u64> = (1..=23).map(|p| 1u64 << p).collect();
    assert_eq!(sizes, want, "{doc}");
    assert_eq!(doc["results"], all[22], "{doc}");
    assert!(all.iter().all(|r| r["t_typical"].as_f64().is_some()));
    // The rows printed and the sizes saved agree.
    assert_eq!(table_rows(&run.stdout).len(), 23);
}

/// A report file that cannot be created fails the command before any test runs.
#[test]
fn unwritable_json_file_fails_early() {
    let dir = ScratchDir::new("bad-json");
    let missing = dir.0.join("no-such-dir").join("out.json");
    let arg = format!("--out_json_file={}", missing.display());
    let run = portverbs(&["perf", "write_bw", "-n", "5", &arg]).failed();
    assert!(
        run.stderr
            .contains(&format!("failed to open {}", missing.display())),
        "{}",
        run.stderr
    );
    assert!(run.stdout.is_empty(), "nothing ran:\n{}", run.stdout);
    // A directory is not a file either.
    let arg = format!("--out_json_file={}", dir.0.display());
    let run = portverbs(&["perf", "write_bw", "-n", "5", &arg]).failed();
    assert!(run.stdout.is_empty(), "{}", run.stdout);
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

/// perftest's duration-mode warning comes first on stdout, then the banner; with -N, or on a
/// latency test, there is none.
#[test]
fn duration_mode_warns_that_the_peak_is_not_measured() {
    let out = portverbs(&["perf", "send_bw", "-D", "1", "-s", "1024"])
        .ok()
        .stdout;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0], " WARNING: BW peak won't be measured in this run.",
        "{out}"
    );
    assert_eq!(lines[1], "-".repeat(87), "{out}");
    assert_eq!(table_rows(&out)[0][2], 0.0, "no peak: {out}");
    for args in [
        &["perf", "write_bw", "-D", "1", "-N", "-s", "64"][..],
        &["perf", "write_lat", "-D", "1"],
        &["perf", "write_bw", "-n", "5"],
    ] {
        let out = portverbs(args).ok().stdout;
        assert!(!out.contains("WARNING"), "{args:?}:\n{out}");
    }
}

/// `-s` takes perftest's forms: K and M suffixes, hex and octal.
#[test]
fn sizes_take_perftest_forms() {
    for (text, size) in [
        ("64K", 65536.0),
        ("1M", 1_048_576.0),
        ("0x1000", 4096.0),
        ("0100", 64.0),
    ] {
        bw("write_bw", &["-s", text], size, 200.0);
    }
    for text in ["64k", "abc", "1G", "0", "4096M"] {
        let run = portverbs(&["perf", "write_bw", "-s", text]).failed();
        assert_eq!(run.code, Some(2), "{}", run.stderr);
        assert!(run.stderr.contains("(-s"), "{}", run.stderr);
    }
}

/// Flags perftest refuses for a test are refused here, with its words and a usage exit code.
#[test]
fn flags_of_other_tests_are_refused() {
    for (args, words) in [
        (
            &["perf", "write_bw", "-A", "CMP_AND_SWAP"][..],
            "You are not running the atomic_lat/bw test!",
        ),
        (
            &["perf", "write_bw", "-o", "4"],
            "Setting Outstanding reads only available on READ verb",
        ),
        (
            &["perf", "read_lat", "-I", "0"],
            "Inline feature not available on READ/Atomic verbs",
        ),
        (
            &["perf", "read_bw", "-r", "16"],
            "On RDMA verbs rx depth can be only 1",
        ),
        (
            &["perf", "send_lat", "-N"],
            "NoPeak only valid for BW tests",
        ),
        (
            &["perf", "write_bw", "-H"],
            "Available only on Latency tests",
        ),
    ] {
        let run = portverbs(args).failed();
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(words), "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{args:?} ran:\n{}", run.stdout);
    }
    // perftest refuses a flag given twice; so does the parser here.
    portverbs(&["perf", "write_bw", "-s", "8", "-s", "16"]).failed();
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
        &["perf", "write_bw", "-A", "CMP_AND_SWAP"],
        &["perf", "atomic_bw", "-A", "SWAP"],
        &["perf", "send_bw", "-o", "2"],
        &["perf", "read_bw", "-c", "UD"],
        &["perf", "write_lat", "-N"],
        &["perf", "write_bw", "-n", "100", "-l", "8"],
        &["perf", "write_bw", "-l", "8", "-Q", "3", "-n", "96"],
        &["perf", "write_bw", "-t", "20000"],
        &["perf", "write_bw", "-i", "0"],
        &["perf", "write_bw", "-s", "64k"],
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

/// The QPN and RKey of the ` local address:` line of a run.
fn local_identifiers(stdout: &str) -> (String, String) {
    let line = stdout
        .lines()
        .find(|l| l.starts_with(" local address:"))
        .unwrap_or_else(|| panic!("no local address in:\n{stdout}"));
    let after = |key: &str| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let i = words.iter().position(|w| *w == key).expect(key);
        words[i + 1].to_owned()
    };
    (after("QPN"), after("RKey"))
}

/// Two processes on the embedded fabric do not start from the same QP number and memory key
/// (both used to be 0x0011 and 0x000101 in every process): the devices seed them from the OS.
#[test]
fn two_processes_start_from_different_qp_numbers_and_keys() {
    let run = || {
        let out = portverbs(&["perf", "write_bw", "-n", "5", "-s", "64"]).ok();
        local_identifiers(&out.stdout)
    };
    let (a, b) = (run(), run());
    assert_ne!(a, b, "the same QPN and RKey in two processes");
}

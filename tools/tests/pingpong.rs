//! `portverbs pingpong`: ibv_rc_pingpong's output lines, events, validation, errors.

mod common;

use common::portverbs;

/// Checks the four lines ibv_rc_pingpong prints on the client.
fn check_output(out: &str, size: u64, iters: u64) {
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    for (line, label) in lines[..2]
        .iter()
        .zip(["  local address:  ", "  remote address: "])
    {
        let rest = line
            .strip_prefix(label)
            .unwrap_or_else(|| panic!("{line:?} should start with {label:?}"));
        let fields: Vec<&str> = rest.split(", ").collect();
        assert_eq!(fields.len(), 4, "{line}");
        assert_eq!(fields[0], "LID 0x0000", "{line}");
        for (field, name) in fields[1..3].iter().zip(["QPN", "PSN"]) {
            let hex = field
                .strip_prefix(&format!("{name} 0x"))
                .unwrap_or_else(|| panic!("{field}"));
            assert_eq!(hex.len(), 6, "{line}");
            assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{line}");
        }
        assert!(fields[3].starts_with("GID ::ffff:10.0.0."), "{line}");
    }
    let bytes = size * iters * 2;
    let tput: Vec<&str> = lines[2].split(' ').collect();
    assert_eq!(tput.len(), 8, "{}", lines[2]);
    assert_eq!(tput[0], bytes.to_string());
    assert_eq!(&tput[1..3], ["bytes", "in"]);
    assert_eq!(&tput[4..6], ["seconds", "="]);
    assert_eq!(tput[7], "Mbit/sec");
    assert!(tput[6].parse::<f64>().unwrap() > 0.0, "{}", lines[2]);
    let lat: Vec<&str> = lines[3].split(' ').collect();
    assert_eq!(lat.len(), 8, "{}", lines[3]);
    assert_eq!(lat[0], iters.to_string());
    assert_eq!(&lat[1..3], ["iters", "in"]);
    assert_eq!(lat[7], "usec/iter");
    assert!(lat[6].parse::<f64>().unwrap() > 0.0, "{}", lines[3]);
    for secs in [tput[3], lat[3]] {
        let (_, decimals) = secs.split_once('.').expect("seconds with two decimals");
        assert_eq!(decimals.len(), 2, "{secs}");
    }
}

#[test]
fn runs_both_sides_and_prints_the_c_tool_lines() {
    let out = portverbs(&["pingpong", "-n", "100"]).ok().stdout;
    check_output(&out, 4096, 100);
    assert!(
        out.contains("GID ::ffff:10.0.0.1\n  remote address:"),
        "{out}"
    );
}

#[test]
fn events_validation_and_options() {
    let out = portverbs(&["pingpong", "-n", "50", "-e", "-c", "-s", "1000"])
        .ok()
        .stdout;
    check_output(&out, 1000, 50);
    let out = portverbs(&[
        "pingpong", "-n", "50", "-d", "soft1", "-m", "4096", "-g", "0", "-r", "4",
    ])
    .ok()
    .stdout;
    check_output(&out, 4096, 50);
    assert!(out.starts_with("  local address:  LID 0x0000"), "{out}");
    assert!(
        out.lines().next().unwrap().ends_with("GID ::ffff:10.0.0.2"),
        "{out}"
    );
}

#[test]
fn port_in_use_falls_back_to_an_ephemeral_port() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = taken.local_addr().unwrap().port().to_string();
    let run = portverbs(&["pingpong", "-n", "20", "-p", &port]).ok();
    check_output(&run.stdout, 4096, 20);
    assert!(
        run.stderr.contains(&format!("port {port} is in use")),
        "{}",
        run.stderr
    );
}

#[test]
fn bad_options_fail() {
    for args in [
        &["pingpong", "-m", "100"][..],
        &["pingpong", "-d", "nosuch"],
        &["pingpong", "-s", "0"],
        &["pingpong", "-n", "0"],
        &["pingpong", "-g", "7"],
        &["pingpong", "-i", "3"],
        &["pingpong", "somehost"],
    ] {
        portverbs(args).failed();
    }
}

/// `perf -x` and `pingpong -g` word an unusable GID index the same way.
#[test]
fn gid_index_errors_read_the_same_in_perf_and_pingpong() {
    for (index, why) in [
        ("99", "the GID table has"),
        ("3", "the entry is empty"),
        ("300", "the GID table has"),
    ] {
        let perf = portverbs(&["perf", "write_bw", "-x", index])
            .failed()
            .stderr;
        let pp = portverbs(&["pingpong", "-g", index]).failed().stderr;
        assert_eq!(perf, pp, "-x {index} vs -g {index}");
        let want = format!("portverbs: invalid GID index {index} for soft0 port 1: {why}");
        assert!(perf.starts_with(&want), "{perf}");
    }
}

/// A server that accepts the TCP connection but never answers: the client gives up after
/// `--timeout` seconds, saying so (not `os error 11`).
#[test]
fn silent_server_fails_with_no_reply_within_the_timeout() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().unwrap().port().to_string();
    let silent = std::thread::spawn(move || {
        use std::io::Read as _;
        let (mut s, _) = listener.accept().expect("the client connects");
        let mut sink = [0u8; 256];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    });
    // An emulated ConnectX-3: a SERVERNAME is refused for the soft devices.
    let run = portverbs(&[
        "pingpong",
        "-d",
        "mlx4_0",
        "--timeout",
        "1",
        "-p",
        &port,
        "127.0.0.1",
    ])
    .failed();
    silent.join().unwrap();
    assert_eq!(
        run.stderr, "portverbs: no reply from 127.0.0.1 within 1 s\n",
        "{}",
        run.stderr
    );
    assert_eq!(run.code, Some(1));
    portverbs(&["pingpong", "--timeout", "0"]).failed();
}

#[test]
fn help_explains_the_subcommand() {
    let out = portverbs(&["pingpong", "--help"]).ok().stdout;
    assert!(out.contains("ibv_rc_pingpong"), "{out}");
    assert!(out.contains("--rx-depth"), "{out}");
}

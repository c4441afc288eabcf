//! Unit tests of the flag checks.

use super::*;

#[test]
fn test_names() {
    assert_eq!(
        Test::parse("ib_write_bw").unwrap(),
        Test::parse("write_bw").unwrap()
    );
    assert_eq!(Test::parse("atomic_lat").unwrap().verb, Verb::Atomic);
    assert_eq!(Test::parse("send_lat").unwrap().name(), "send_lat");
    assert!(Test::parse("write").is_err());
    assert!(Test::parse("ib_foo_bw").is_err());
    assert!(Test::parse("write_x").is_err());
}

#[test]
fn transports() {
    assert!(check_transport(Verb::Read, QpType::Uc).is_err());
    assert!(check_transport(Verb::Atomic, QpType::Ud).is_err());
    assert!(check_transport(Verb::Write, QpType::Ud).is_err());
    assert!(check_transport(Verb::Write, QpType::Uc).is_ok());
    assert!(check_transport(Verb::Send, QpType::Ud).is_ok());
    assert!(parse_connection("xrc").is_err());
    assert_eq!(parse_connection("uc").unwrap(), QpType::Uc);
}

#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(flatten)]
    args: PerfArgs,
}

fn cfg(line: &[&str]) -> Result<PerfConfig, CliError> {
    use clap::Parser as _;
    let mut argv = vec!["perf"];
    argv.extend_from_slice(line);
    PerfConfig::from_args(&Cli::try_parse_from(argv).expect("flags parse").args)
}

#[test]
fn perftest_defaults() {
    let c = cfg(&["write_bw"]).unwrap();
    assert_eq!(c.mode, RunMode::Iters(5000));
    assert_eq!(
        c.sizes,
        Sizes::One {
            size: 65536,
            explicit: false
        }
    );
    assert_eq!((c.tx_depth, c.cq_mod, c.inline, c.qps), (128, 100, 0, 1));
    assert_eq!(c.conn, QpType::Rc);
    assert!(c.peak && c.json.is_none());

    let c = cfg(&["ib_write_lat"]).unwrap();
    assert_eq!(c.mode, RunMode::Iters(1000));
    assert_eq!((c.tx_depth, c.inline), (1, 220));
    assert_eq!(
        c.sizes,
        Sizes::One {
            size: 2,
            explicit: false
        }
    );
    assert_eq!(cfg(&["send_lat"]).unwrap().inline, 236);
    assert_eq!(cfg(&["send_lat", "-c", "UD"]).unwrap().inline, 188);
    assert_eq!(cfg(&["read_lat"]).unwrap().inline, 0);
    let atomic = cfg(&["atomic_bw"]).unwrap();
    assert_eq!(atomic.atomic, AtomicOp::FetchAndAdd);
    assert_eq!(
        atomic.sizes,
        Sizes::One {
            size: 8,
            explicit: false
        }
    );
    assert_eq!(cfg(&["send_bw"]).unwrap().rx_depth, 512);
}

#[test]
fn depths_follow_perftest_adjustments() {
    // The TX and RX depths never exceed the iterations.
    let c = cfg(&["send_bw", "-n", "50"]).unwrap();
    assert_eq!((c.tx_depth, c.rx_depth), (50, 50));
    // CQ moderation is at most the TX depth; a post list sets it unless -Q is given (and a
    // given -Q must divide the post list, perftest's rule).
    assert_eq!(cfg(&["write_bw", "-Q", "500"]).unwrap().cq_mod, 128);
    assert_eq!(cfg(&["write_bw", "-l", "8"]).unwrap().cq_mod, 8);
    assert_eq!(cfg(&["write_bw", "-l", "8", "-Q", "4"]).unwrap().cq_mod, 4);
    assert!(cfg(&["write_bw", "-l", "8", "-Q", "16"]).is_err());
    assert!(cfg(&["write_bw", "-l", "8", "-t", "4"]).is_err());
    assert!(cfg(&["write_bw", "-Q", "0"]).is_err());
}

#[test]
fn duration_margins() {
    let secs = std::time::Duration::from_secs;
    assert_eq!(
        cfg(&["write_bw", "-D", "10"]).unwrap().mode,
        RunMode::Duration {
            total: secs(10),
            margin: secs(2)
        }
    );
    assert_eq!(
        cfg(&["write_bw", "-D", "3"]).unwrap().mode,
        RunMode::Duration {
            total: secs(3),
            margin: secs(0)
        }
    );
    assert_eq!(
        cfg(&["write_bw", "-D", "20"]).unwrap().mode,
        RunMode::Duration {
            total: secs(20),
            margin: secs(5)
        }
    );
    assert_eq!(
        cfg(&["write_bw", "-D", "1"]).unwrap().mode,
        RunMode::Duration {
            total: secs(1),
            margin: secs(0)
        }
    );
    assert!(cfg(&["write_bw", "-D", "4", "-f", "2"]).is_err());
    assert!(cfg(&["write_bw", "-D", "0"]).is_err());
}

#[test]
fn rejected_combinations() {
    for line in [
        &["read_bw", "-c", "UC"][..],
        &["write_lat", "-c", "UD"],
        &["atomic_lat", "-s", "16"],
        &["atomic_bw", "-a"],
        &["send_lat", "-q", "2"],
        &["send_lat", "-l", "2"],
        &["write_bw", "-a", "-s", "8"],
        &["write_bw", "-a", "-D", "5"],
        &["write_bw", "-n", "4"],
        &["write_bw", "-s", "0"],
        &["write_bw", "-H"],
        &["read_bw", "-I", "16"],
        &["write_bw", "-m", "3000"],
        &["write_bw", "-u", "32"],
        &["write_bw", "-A", "SWAP"],
        &["write_bw", "-o", "0"],
    ] {
        assert!(
            matches!(cfg(line), Err(CliError::Usage(_))),
            "{line:?} accepted"
        );
    }
}

#[test]
fn json_and_units() {
    // perftest's default file, in the working directory.
    assert_eq!(
        cfg(&["write_bw", "--out_json"]).unwrap().json,
        Some(PathBuf::from("perftest_out.json"))
    );
    let c = cfg(&["write_bw", "--out_json_file=x.json", "--report_gbits", "-N"]).unwrap();
    assert_eq!(c.json, Some(PathBuf::from("x.json")));
    assert_eq!(c.units, BwUnits::Gbps);
    assert!(!c.peak);
    assert_eq!(cfg(&["write_bw"]).unwrap().json, None);
}

/// The message of the usage error `line` gets.
fn refusal(line: &[&str]) -> String {
    match cfg(line) {
        Err(CliError::Usage(msg)) => msg,
        other => panic!("{line:?} should be refused, got {other:?}"),
    }
}

/// Flags perftest accepts only for some tests are refused for the others, in perftest's words.
#[test]
fn perftest_refuses_flags_for_other_tests() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["write_bw", "-A", "CMP_AND_SWAP"],
            "You are not running the atomic_lat/bw test!",
        ),
        (
            &["send_lat", "-A", "FETCH_AND_ADD"],
            "you must run one of the atomic tests",
        ),
        (
            &["write_bw", "-o", "4"],
            "Setting Outstanding reads only available on READ verb",
        ),
        (
            &["send_bw", "-o", "1"],
            "Setting Outstanding reads only available on READ verb",
        ),
        (
            &["read_bw", "-I", "0"],
            "Inline feature not available on READ/Atomic verbs",
        ),
        (
            &["atomic_lat", "-I", "8"],
            "Inline feature not available on READ/Atomic verbs",
        ),
        (
            &["read_bw", "-r", "8"],
            "On RDMA verbs rx depth can be only 1",
        ),
        (
            &["atomic_bw", "-r", "2"],
            "On RDMA verbs rx depth can be only 1",
        ),
        (
            &["read_lat", "-c", "UC"],
            "UC connection not possible in READ/ATOMIC verbs",
        ),
        (
            &["atomic_bw", "-c", "UC"],
            "UC connection not possible in READ/ATOMIC verbs",
        ),
        (
            &["write_bw", "-c", "UD"],
            "UD connection only possible in SEND verb",
        ),
        (
            &["read_bw", "-c", "UD"],
            "UD connection only possible in SEND verb",
        ),
        (
            &["send_lat", "-q", "2"],
            "Multiple QPs only available on bw tests",
        ),
        (
            &["write_lat", "-l", "2"],
            "Post list is supported in BW tests only",
        ),
        (&["write_lat", "-N"], "NoPeak only valid for BW tests"),
        (
            &["write_bw", "-R", "-c", "UC"],
            "UC is not supported in librdmacm",
        ),
        (&["write_bw", "-H"], "Available only on Latency tests"),
        (
            &["atomic_bw", "-s", "16"],
            "Message size cannot be changed for Atomic tests",
        ),
        (
            &["atomic_lat", "-a"],
            "Message size cannot be changed for Atomic tests",
        ),
        (
            &["write_bw", "-D", "5", "-a"],
            "Duration mode currently doesn't support running on all sizes",
        ),
        (
            &["write_bw", "-D", "4", "-f", "2"],
            "please check that DURATION > 2*MARGIN",
        ),
        (&["write_bw", "-D", "0"], "Duration period must be positive"),
        (
            &["write_bw", "-n", "100", "-l", "8"],
            "Number of iterations must be a multiple of post list size",
        ),
        (
            &["write_bw", "-n", "96", "-l", "8", "-Q", "3"],
            "Post list size must be a multiple of CQ moderation",
        ),
        (
            &["write_bw", "-n", "4"],
            "Iteration num should be between 5 and",
        ),
        (
            &["write_bw", "-t", "0"],
            "Tx depth should be between 1 and 15000",
        ),
        (
            &["write_bw", "-t", "15001"],
            "Tx depth should be between 1 and 15000",
        ),
        (
            &["send_bw", "-r", "0"],
            "Rx depth should be between 1 and 16384",
        ),
        (
            &["send_bw", "-r", "16385"],
            "Rx depth should be between 1 and 16384",
        ),
        (
            &["write_bw", "-Q", "0"],
            "CQ moderation should be between 1 and 1024",
        ),
        (
            &["write_bw", "-Q", "1025"],
            "CQ moderation should be between 1 and 1024",
        ),
        (
            &["write_bw", "-q", "0"],
            "num of Qps should be between 1 and 16384",
        ),
        (
            &["write_bw", "-I", "1025"],
            "Max inline should be between 0 and 1024",
        ),
        (&["write_bw", "-S", "16"], "Only 15 Service levels"),
        (&["write_bw", "-i", "0"], "IB Port can't be less than 1"),
        (&["write_bw", "-m", "1000"], "Invalid MTU - 1000"),
        (
            &["atomic_bw", "-A", "SWAP"],
            "Invalid Atomic type! please choose from {CMP_AND_SWAP,FETCH_AND_ADD}",
        ),
        (&["write_bw", "-c", "XY"], "Invalid Connection type"),
        (
            &["write_bw", "-s", "0"],
            "Message Size should be between 1 and 2147483647",
        ),
    ];
    for (line, words) in cases {
        let msg = refusal(line);
        assert!(msg.contains(words), "{line:?}: {msg:?} lacks {words:?}");
    }
    // The same flags are accepted where perftest accepts them.
    for line in [
        &["atomic_bw", "-A", "CMP_AND_SWAP"][..],
        &["atomic_lat", "-A", "FETCH_AND_ADD", "-o", "2"],
        &["read_bw", "-o", "4", "-r", "1"],
        &["write_bw", "-I", "64", "-r", "1"],
        &["send_lat", "-I", "0"],
        &["send_bw", "-c", "UD"],
        &["write_lat", "-c", "UC"],
        &["write_bw", "-n", "96", "-l", "8", "-Q", "4"],
        &["atomic_bw", "-s", "8"],
        &["write_bw", "-t", "15000", "-Q", "1024"],
    ] {
        assert!(cfg(line).is_ok(), "{line:?}: {:?}", cfg(line));
    }
}

#[test]
fn sizes_take_perftest_forms() {
    for (text, want) in [
        ("4096", 4096),
        ("64K", 65_536),
        ("1M", 1_048_576),
        ("0x1000", 4096),
        ("0X1f", 31),
        ("0x10K", 16_384),
        ("010", 8),
        ("0", 0),
        ("2047M", 2047 << 20),
        ("2147483647", 2_147_483_647),
    ] {
        match parse_size(text) {
            Ok(size) => assert_eq!(size, want, "{text}"),
            Err(e) => assert_eq!(want, 0, "{text}: {e}"),
        }
    }
    // Garbage is refused with a hint, not read as 0 or as a prefix (strtol's "64k" = 64).
    for text in [
        "", "abc", "64k", "1m", "1G", "64KB", "K", "0x", "0xZ", "08", "-1", "+5", " 64", "6 4",
        "1.5K",
    ] {
        let msg = parse_size(text).unwrap_err().to_string();
        assert!(
            msg.contains(&format!("invalid message size '{text}'")) && msg.contains("64K"),
            "{text:?}: {msg}"
        );
    }
    // Out of perftest's range: 0 and above UINT_MAX / 2.
    for text in [
        "0",
        "0K",
        "2048M",
        "2147483648",
        "0x80000000",
        "99999999999999999999999",
    ] {
        let msg = parse_size(text).unwrap_err().to_string();
        assert!(
            msg.contains("Message Size should be between 1 and 2147483647"),
            "{text:?}: {msg}"
        );
    }
    assert_eq!(
        cfg(&["write_bw", "-s", "64K"]).unwrap().sizes,
        Sizes::One {
            size: 65_536,
            explicit: true
        }
    );
    assert_eq!(
        cfg(&["send_lat", "--size", "0x40"]).unwrap().sizes,
        Sizes::One {
            size: 64,
            explicit: true
        }
    );
    assert!(matches!(
        cfg(&["write_bw", "-s", "12x"]),
        Err(CliError::Usage(_))
    ));
}

#[test]
fn duration_mode_warns_that_the_peak_is_not_measured() {
    let c = cfg(&["write_bw", "-D", "3"]).unwrap();
    assert!(c.peak_warning && !c.peak);
    // -N already asked for no peak; latency tests have none; iterations mode measures it.
    assert!(!cfg(&["write_bw", "-D", "3", "-N"]).unwrap().peak_warning);
    assert!(!cfg(&["write_lat", "-D", "3"]).unwrap().peak_warning);
    let c = cfg(&["write_bw"]).unwrap();
    assert!(c.peak && !c.peak_warning);
    assert_eq!(
        PEAK_WARNING,
        " WARNING: BW peak won't be measured in this run."
    );
}

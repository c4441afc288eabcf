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
    // CQ moderation is at most the TX depth; a post list sets it unless -Q is given.
    assert_eq!(cfg(&["write_bw", "-Q", "500"]).unwrap().cq_mod, 128);
    assert_eq!(cfg(&["write_bw", "-l", "8"]).unwrap().cq_mod, 8);
    assert_eq!(
        cfg(&["write_bw", "-l", "8", "-Q", "16"]).unwrap().cq_mod,
        16
    );
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
            margin: secs(1)
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
    assert_eq!(cfg(&["write_bw", "--out_json"]).unwrap().json, Some(None));
    let c = cfg(&["write_bw", "--out_json_file=x.json", "--report_gbits", "-N"]).unwrap();
    assert_eq!(c.json, Some(Some("x.json".into())));
    assert_eq!(c.units, BwUnits::Gbps);
    assert!(!c.peak);
}

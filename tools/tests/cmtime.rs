//! `portverbs cmtime`: connections through the connection manager on the embedded fabric,
//! timed per step in cmtime's table.

mod common;

use common::portverbs;

#[test]
fn every_connection_is_made_and_timed_in_cmtimes_table() {
    let run = portverbs(&["cmtime", "-c", "20"]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 3 + 17, "{}", run.stdout);
    assert_eq!(lines[0], "cm_conn                20");
    assert_eq!(lines[1], "threads                 1");
    assert!(lines[2].starts_with("step             avg/conn  total(us)"));
    let row = |name: &str| -> Vec<u64> {
        let line = lines
            .iter()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row in {}", run.stdout));
        line[13..]
            .split_whitespace()
            .map(|f| f.parse().expect("a number"))
            .collect()
    };
    let connect = row("cm connect");
    assert_eq!(connect.len(), 6);
    let [avg, total, per, sum, max, min] = connect[..] else {
        unreachable!()
    };
    assert!(total > 0 && sum > 0, "{connect:?}");
    assert_eq!(avg, total / 20);
    assert_eq!(per, sum / 20);
    assert!(min <= per && per <= max, "{connect:?}");
    assert!(sum <= total, "connections one after another: {connect:?}");
    // The CM moves the QP itself: cmtime's separate transition steps read 0.
    assert_eq!(row("rtr qp"), [0; 6]);
    assert_eq!(
        row("full connect")[3],
        0,
        "cmtime prints no sum for the full connect"
    );
}

#[test]
fn cmtime_needs_a_connection() {
    let run = portverbs(&["cmtime", "-c", "0"]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
}

//! `portverbs rping` on the embedded fabric (both ends in this process, connected by the
//! connection manager over QP1): rping's lines, validation, and its usage errors.

mod common;

use common::portverbs;

#[test]
fn pings_are_validated_and_printed_as_rping_prints_them() {
    let run = portverbs(&["rping", "-v", "-V", "-C", "4", "-S", "40"]);
    assert_eq!(run.code, Some(0), "{}{}", run.stdout, run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", run.stdout);
    for (n, line) in lines.iter().enumerate() {
        let text = line.strip_prefix("ping data: ").expect("rping's prefix");
        assert!(text.starts_with(&format!("rdma-ping-{n}: ")), "{line}");
        assert_eq!(text.len(), 39, "a 40-byte ping less its NUL: {line}");
    }
    // Ping 1 starts its pattern one character after ping 0.
    assert!(
        lines[0].ends_with(": ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].ends_with(": BCDEFGHIJKLMNOPQRSTUVWXYZ["),
        "{}",
        lines[1]
    );
    assert!(
        run.stderr.contains("server DISCONNECT EVENT..."),
        "{}",
        run.stderr
    );
}

#[test]
fn sizes_and_modes_rping_refuses_are_usage_errors() {
    let small = portverbs(&["rping", "-c", "-a", "10.0.0.2", "-S", "10"]);
    assert_eq!(small.code, Some(2), "{}", small.stderr);
    assert!(
        small
            .stderr
            .contains("Invalid size 10 (valid range is 26 to 65536)"),
        "{}",
        small.stderr
    );
    let no_addr = portverbs(&["rping", "-c"]);
    assert_eq!(no_addr.code, Some(2), "{}", no_addr.stderr);
    assert!(no_addr.stderr.contains("-a"), "{}", no_addr.stderr);
    let both = portverbs(&["rping", "-s", "-c"]);
    assert_eq!(both.code, Some(2), "{}", both.stderr);
}

//! `portverbs mckey`: a receiver process and a sender process on UDP-bound devices of their
//! own (two loopback addresses, Linux), joined to one IPv4 group through the CM, with mckey's
//! lines on both sides; and the flags of mckey that have no meaning on RoCE, refused as usage
//! errors.

mod common;

use common::portverbs;

#[cfg(target_os = "linux")]
#[test]
fn a_sender_reaches_every_joined_qp_of_a_receiver_process() {
    use std::io::{BufRead as _, BufReader, Read as _};

    use common::{finish, spawn};

    let group = "239.96.0.1";
    let mut receiver = spawn(
        &[
            "mckey",
            "-m",
            group,
            "-C",
            "5",
            "-c",
            "2",
            "--timeout",
            "60",
        ],
        &[("PORTVERBS_UDP", "127.0.96.2")],
    );
    // The sender starts once both of the receiver's QPs have joined (mckey's own pause then
    // leaves the receiver three seconds to post nothing more: its receives are posted before
    // its joins).
    let mut out = BufReader::new(receiver.stdout.take().expect("piped"));
    let mut seen = String::new();
    while seen.matches("mckey: joined dgid: ").count() < 2 {
        let mut line = String::new();
        let n = out.read_line(&mut line).expect("the receiver's output");
        assert!(n > 0, "the receiver ended before joining: {seen}");
        seen.push_str(&line);
    }
    let sender = spawn(
        &["mckey", "-m", group, "-s", "-C", "5", "-S", "64"],
        &[("PORTVERBS_UDP", "127.0.96.1")],
    );
    let (code, stdout, stderr) = finish(sender);
    assert_eq!(code, Some(0), "sender:\n{stdout}\n{stderr}");
    assert_eq!(
        stdout,
        "mckey: starting client\n\
         mckey: joining\n\
         mckey: joined dgid: ::ffff:239.96.0.1 mlid 0x0 sl 0\n\
         initiating data transfers\n\
         data transfers complete\n\
         test complete\n\
         return status 0\n"
    );
    out.read_to_string(&mut seen)
        .expect("the receiver's output");
    let (code, _, stderr) = finish(receiver);
    assert_eq!(code, Some(0), "receiver:\n{seen}\n{stderr}");
    assert_eq!(
        seen,
        "mckey: starting server\n\
         mckey: joining\n\
         mckey: joined dgid: ::ffff:239.96.0.1 mlid 0x0 sl 0\n\
         mckey: joined dgid: ::ffff:239.96.0.1 mlid 0x0 sl 0\n\
         receiving data transfers\n\
         data transfers complete\n\
         test complete\n\
         return status 0\n"
    );
}

#[test]
fn what_roce_cannot_do_is_a_usage_error() {
    for args in [
        &["mckey", "-M", "ff12:401b::1", "-b", "10.0.0.1"][..],
        &["mckey", "-m", "239.1.2.3", "-p", "0x0002"],
        &["mckey", "-m", "239.1.2.3", "-p", "0x0106"],
        &["mckey", "-m", "239.1.2.3", "-l"],
        &["mckey", "-m", "10.1.2.3"],
        &["mckey", "-m", "239.1.2.3", "-c", "0"],
    ] {
        let run = portverbs(args).failed();
        assert_eq!(run.code, Some(2), "{args:?}: {}", run.stderr);
    }
}

//! Packet capture end to end: two software devices on a stepped fabric that captures to a
//! pcap file run RC SEND, RDMA WRITE, RDMA READ and both atomics, and a UD SEND. Every record
//! of the capture must be an Ethernet frame whose RoCEv2 payload parses and carries a good
//! ICRC; with tshark installed (`#[ignore]`d test, run by CI), every frame must decode as
//! InfiniBand with no malformed packet.

use std::path::{Path, PathBuf};
#[cfg(not(windows))]
use std::process::Command;

use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric, FabricConfig, Mode, SoftDevice};
use portverbs::verbs::ContextOptions;
use portverbs_wire::Opcode;

#[path = "util/pcap/mod.rs"]
mod pcap_util;
use pcap_util::{check_icrcs, tshark_opcodes};

/// Bytes of each message: several packets at the 1024-byte path MTU.
const LEN: usize = 2500;
/// Bytes before a UD payload in a receive buffer (the GRH).
const GRH: usize = 40;

struct End {
    _ctx: Context,
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn end(dev: &SoftDevice, t: QpType) -> End {
    let ctx = Context::open_blocking(AnyDevice::Soft(dev.clone()), ContextOptions::default())
        .expect("open");
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 32,
            ..CqInit::default()
        })
        .unwrap();
    let qp = pd.create_qp_blocking(QpInit::new(t, &cq)).unwrap();
    let access = AccessFlags::LOCAL_WRITE
        | AccessFlags::REMOTE_WRITE
        | AccessFlags::REMOTE_READ
        | AccessFlags::REMOTE_ATOMIC;
    let mr = pd.reg_vec_blocking(vec![0u8; 4 * LEN], access).unwrap();
    End {
        _ctx: ctx,
        pd,
        cq,
        qp,
        mr,
    }
}

/// Runs the fabric until idle, then takes exactly one completion, which must be a success.
fn complete(fabric: &Fabric, cq: &Cq) -> WorkCompletion {
    fabric.run_until_idle().expect("the fabric settles");
    let mut wc = [WorkCompletion::default(); 2];
    assert_eq!(cq.poll(&mut wc).unwrap(), 1, "one completion");
    assert_eq!(wc[0].status, WcStatus::Success, "{:?}", wc[0]);
    wc[0]
}

/// Runs the traffic on a fabric that captures to `path`; returns the fabric's packet count.
fn capture_traffic(path: &Path) -> u64 {
    let fabric = Fabric::new(FabricConfig {
        mode: Mode::Stepped,
        seed: 7,
        capture: Some(path.to_path_buf()),
        ..FabricConfig::default()
    });
    assert!(fabric.is_capturing(), "{:?}", fabric.capture_error());
    // RC between IPv4 addresses, UD between IPv6 ones.
    let devs: Vec<SoftDevice> = ["10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2"]
        .iter()
        .map(|ip| SoftDevice::attach(&fabric, DeviceConfig::with_ip(ip.parse().unwrap())).unwrap())
        .collect();
    let opts = ConnectOptions {
        mtu: Some(Mtu::Mtu1024),
        access: AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC,
        ..ConnectOptions::default()
    };

    // RC: SEND, RDMA WRITE, RDMA READ, fetch-and-add, compare-and-swap.
    let (a, b) = (end(&devs[0], QpType::Rc), end(&devs[1], QpType::Rc));
    let (ep_a, ep_b) = (
        a.qp.endpoint_blocking(&opts).unwrap(),
        b.qp.endpoint_blocking(&opts).unwrap(),
    );
    a.qp.connect_rc_blocking(&ep_b, &opts).unwrap();
    b.qp.connect_rc_blocking(&ep_a, &opts).unwrap();
    let data: Vec<u8> = (0..LEN).map(|i| (i * 7 + 3) as u8).collect();
    a.mr.write(0, &data).unwrap();
    let remote = |offset: usize| RemoteAddr {
        addr: b.mr.addr() + offset as u64,
        rkey: b.mr.rkey().expect("remote access"),
    };

    let recv = [b.mr.sge(0, LEN).unwrap()];
    b.qp.post_recv(&[RecvWr {
        wr_id: 10,
        sges: &recv,
    }])
    .unwrap();
    let sges = [a.mr.sge(0, LEN).unwrap()];
    let send = SendWr::new(1, SendOp::Send).sges(&sges);
    a.qp.post_send(&[send.flags(SendFlags::SIGNALED)]).unwrap();
    complete(&fabric, &a.cq);
    assert_eq!(complete(&fabric, &b.cq).byte_len as usize, LEN);

    let write = SendWr::new(
        2,
        SendOp::RdmaWrite {
            remote: remote(LEN),
        },
    )
    .sges(&sges);
    a.qp.post_send(&[write.flags(SendFlags::SIGNALED)]).unwrap();
    complete(&fabric, &a.cq);

    let back = [a.mr.sge(LEN, LEN).unwrap()];
    let read = SendWr::new(
        3,
        SendOp::RdmaRead {
            remote: remote(LEN),
        },
    )
    .sges(&back);
    a.qp.post_send(&[read.flags(SendFlags::SIGNALED)]).unwrap();
    complete(&fabric, &a.cq);
    let mut got = vec![0u8; LEN];
    a.mr.read(LEN, &mut got).unwrap();
    assert_eq!(got, data, "the READ brought the WRITE's bytes back");

    // The remote word must be 8-byte aligned.
    let at = 3 * LEN + (8 - (b.mr.addr() as usize + 3 * LEN) % 8) % 8;
    let word = [a.mr.sge(2 * LEN, 8).unwrap()];
    let faa = SendWr::new(
        4,
        SendOp::AtomicFetchAdd {
            remote: remote(at),
            add: 5,
        },
    )
    .sges(&word);
    a.qp.post_send(&[faa.flags(SendFlags::SIGNALED)]).unwrap();
    complete(&fabric, &a.cq);
    let cas = SendWr::new(
        5,
        SendOp::AtomicCmpSwp {
            remote: remote(at),
            compare: 5,
            swap: 9,
        },
    )
    .sges(&word);
    a.qp.post_send(&[cas.flags(SendFlags::SIGNALED)]).unwrap();
    complete(&fabric, &a.cq);
    let mut w = [0u8; 8];
    b.mr.read(at, &mut w).unwrap();
    assert_eq!(u64::from_ne_bytes(w), 9, "add 5, then swap 5 for 9");

    // UD: one datagram.
    let (ua, ub) = (end(&devs[2], QpType::Ud), end(&devs[3], QpType::Ud));
    ua.qp.ready_ud_blocking(&opts).unwrap();
    ub.qp.ready_ud_blocking(&opts).unwrap();
    let recv = [ub.mr.sge(0, GRH + 256).unwrap()];
    ub.qp
        .post_recv(&[RecvWr {
            wr_id: 20,
            sges: &recv,
        }])
        .unwrap();
    let to_b = ub.qp.endpoint_blocking(&opts).unwrap();
    let ah = ua
        .pd
        .create_ah_blocking(ua.qp.address_vector_blocking(&to_b, &opts).unwrap())
        .unwrap();
    ua.mr.write(0, b"a datagram").unwrap();
    let sges = [ua.mr.sge(0, 10).unwrap()];
    let send = SendWr::new(6, SendOp::Send)
        .sges(&sges)
        .ud(ah.dest(to_b.qpn, opts.qkey));
    ua.qp.post_send(&[send.flags(SendFlags::SIGNALED)]).unwrap();
    complete(&fabric, &ua.cq);
    assert_eq!(complete(&fabric, &ub.cq).byte_len as usize, GRH + 10);

    let stats = fabric
        .stop_capture()
        .expect("the capture ran without error")
        .expect("a capture was running");
    assert_eq!(stats.skipped, 0);
    drop(ah);
    // The fabric counts a train (the packets of one message on a fault-free link) as one
    // delivery; the capture writes its packets.
    assert!(stats.frames > fabric.stats().delivered, "{stats:?}");
    stats.frames
}

/// Where a capture of this test goes: kept under `target/tmp` for a look with Wireshark
/// (under Wine, in the Windows temporary folder).
fn capture_path(name: &str) -> PathBuf {
    let dir = if cfg!(windows) {
        std::env::temp_dir()
    } else {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
    };
    dir.join(format!("portverbs-capture-{name}.pcap"))
}

/// The opcodes the traffic must put on the wire.
const EXPECTED: [Opcode; 12] = [
    Opcode::SendFirst,
    Opcode::SendMiddle,
    Opcode::SendLast,
    Opcode::WriteFirst,
    Opcode::WriteLast,
    Opcode::ReadRequest,
    Opcode::ReadResponseFirst,
    Opcode::ReadResponseLast,
    Opcode::FetchAdd,
    Opcode::CompareSwap,
    Opcode::AtomicAcknowledge,
    Opcode::UdSendOnly,
];

#[test]
fn every_captured_frame_has_a_good_icrc() {
    let path = capture_path("icrc");
    let frames = capture_traffic(&path);
    let ops = check_icrcs(&path);
    assert_eq!(ops.len() as u64, frames);
    for op in EXPECTED.iter().chain([&Opcode::Acknowledge]) {
        assert!(ops.contains(op), "{} missing from {ops:?}", op.name());
    }
}

#[test]
#[ignore = "needs tshark"]
fn tshark_decodes_every_frame_as_infiniband() {
    let path = capture_path("tshark");
    let frames = capture_traffic(&path);
    let ops = tshark_opcodes(&path);
    assert_eq!(ops.len() as u64, frames, "tshark read every frame");
    for op in EXPECTED {
        assert!(ops.contains(&op), "{} missing from {ops:?}", op.name());
    }
}

/// `PORTVERBS_PCAP` turns the capture on for the embedded fabric of the facade. The embedded
/// fabric is made once per process, so the check runs in a child process: this test binary
/// again, running [`embedded_capture_child`] alone with the variable set.
#[cfg(not(windows))]
#[test]
fn pcap_env_captures_the_embedded_fabric() {
    let path = capture_path("env");
    let _ = std::fs::remove_file(&path);
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(exe)
        .args(["embedded_capture_child", "--exact", "--ignored"])
        .env("PORTVERBS_PCAP", &path)
        .output()
        .expect("the test binary runs");
    assert!(
        out.status.success(),
        "the child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("1 passed"),
        "the child ran"
    );
    let ops = check_icrcs(&path);
    // One RDMA WRITE and its ACK on each backend.
    let writes = ops.iter().filter(|&&op| op == Opcode::WriteOnly).count();
    assert_eq!(writes, 2, "{ops:?}");
}

/// The child of [`pcap_env_captures_the_embedded_fabric`]: an RDMA WRITE between the embedded
/// software devices and one between the embedded emulated HCAs. Does nothing without
/// `PORTVERBS_PCAP` (CI runs the ignored tests of this file).
#[test]
#[ignore = "run by pcap_env_captures_the_embedded_fabric"]
fn embedded_capture_child() {
    if portverbs::capture_env().is_none() {
        return;
    }
    let fabric = portverbs::embedded_fabric();
    assert!(fabric.is_capturing(), "{:?}", fabric.capture_error());
    for [x, y] in [["soft0", "soft1"], ["mlx4_0", "mlx4_1"]] {
        let open = |name| portverbs::open(portverbs::device(name).expect("embedded")).unwrap();
        let (ctx_a, ctx_b) = (open(x), open(y));
        let opts = ConnectOptions::default();
        let side = |ctx: &Context| {
            let pd = ctx.alloc_pd_blocking().unwrap();
            let cq = ctx
                .create_cq_blocking(CqInit {
                    entries: 16,
                    ..CqInit::default()
                })
                .unwrap();
            let qp = pd.create_qp_blocking(QpInit::new(QpType::Rc, &cq)).unwrap();
            let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
            let mr = pd.reg_vec_blocking(vec![0u8; 4096], access).unwrap();
            (pd, cq, qp, mr)
        };
        let (_pd_a, cq_a, qp_a, mr_a) = side(&ctx_a);
        let (_pd_b, _cq_b, qp_b, mr_b) = side(&ctx_b);
        let (ep_a, ep_b) = (
            qp_a.endpoint_blocking(&opts).unwrap(),
            qp_b.endpoint_blocking(&opts).unwrap(),
        );
        qp_a.connect_rc_blocking(&ep_b, &opts).unwrap();
        qp_b.connect_rc_blocking(&ep_a, &opts).unwrap();
        let remote = RemoteAddr {
            addr: mr_b.addr(),
            rkey: mr_b.rkey().unwrap(),
        };
        let sges = [mr_a.sge(0, 64).unwrap()];
        let write = SendWr::new(1, SendOp::RdmaWrite { remote }).sges(&sges);
        qp_a.post_send(&[write.flags(SendFlags::SIGNALED)]).unwrap();
        let mut wc = [WorkCompletion::default(); 1];
        while cq_a.poll(&mut wc).unwrap() == 0 {
            std::thread::yield_now();
        }
        assert_eq!(wc[0].status, WcStatus::Success);
    }
    let stats = fabric.stop_capture().unwrap().expect("it was capturing");
    assert!(stats.frames >= 4, "{stats:?}");
}

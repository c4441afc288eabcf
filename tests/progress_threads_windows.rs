//! The Windows UDP port in each progress mode (the Windows side of `progress_threads.rs`):
//! the threads it costs, counted with a Toolhelp snapshot (`portverbs::windows::
//! thread_count`), while a UD QP on a UDP-bound device receives datagrams from a plain
//! socket and sends its own — in auto progress exactly one thread more (the fabric's engine
//! thread, asleep on the port's completion port), in manual none; and in manual progress a
//! thread blocked in `wait_cq_event` wakes for the datagram that completes its receive,
//! receives it and processes it itself.
//!
//! Two devices of this process cannot talk to each other under Wine (Wine binds every IPv4
//! address but 127.0.0.1 to the wildcard address, so a second device's port 4791 would
//! collide): the peer is a socket that sends sealed UD datagrams, and the device's own sends
//! go to an address nobody listens on. One test in this binary, so that no other test's
//! thread comes or goes meanwhile.
#![cfg(windows)]

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use portverbs::hal::{Gid, Progress};
use portverbs::prelude::*;
use portverbs::udp_port::UdpConfig;
use portverbs::windows::thread_count;
use portverbs_transport::{Packet, PayloadData};
use portverbs_wire::{Bth, Deth, Opcode, TransportHdr, seal_datagram};

/// Bytes before the payload in a UD receive buffer: the GRH (IBA 11.4.1.2).
const GRH: usize = 40;
const MESSAGES: u64 = 8;
/// How long a wait may take: far longer than a datagram on loopback needs, and longer than
/// [`WOKEN`], so that a wait the datagram did not end (one that slept to its deadline and
/// then found the completion in its last look) is told apart.
const T: Option<Duration> = Some(Duration::from_secs(60));
/// A wait that returns sooner than this was ended by its datagram.
const WOKEN: Duration = Duration::from_secs(20);

fn threads() -> usize {
    thread_count().expect("a Toolhelp snapshot")
}

/// Waits (bounded) for the thread count to come to `n`: a thread that ends leaves the
/// snapshot a moment after it returns.
fn settle_to(n: usize, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while threads() != n {
        assert!(
            Instant::now() < deadline,
            "{what}: {} threads, expected {n}",
            threads()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A free UDP port on 127.0.0.1 (the one IPv4 address Wine binds as asked).
fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("a free port")
        .port()
}

/// A UD SEND_ONLY datagram from `src` to QP `qpn` behind `dst`, sealed with its ICRC.
fn ud_datagram(src: SocketAddr, dst: SocketAddr, qpn: u32, qkey: u32, k: u64) -> Vec<u8> {
    let mut hdr = TransportHdr::new(Bth::new(Opcode::UdSendOnly, qpn, k as u32));
    hdr.deth = Some(Deth { qkey, src_qp: 0x77 });
    let pkt = Packet::new(
        Gid::from_ip(src.ip()),
        Gid::from_ip(dst.ip()),
        hdr,
        PayloadData::Bytes(k.to_le_bytes().to_vec()),
    );
    let mut d = Vec::new();
    pkt.write_datagram(&mut d).expect("a datagram");
    seal_datagram(src, dst, &mut d).expect("sealed");
    d
}

/// One device in `progress`: returns how many threads it added while it ran.
fn run(progress: Progress) -> usize {
    // The peer: a socket on a thread of its own, made before the count starts; it sends
    // datagram k when told, a moment later, while the device's thread sleeps.
    let (go, told) = mpsc::channel::<(SocketAddr, u32, u32, u64)>();
    let (counted, counts) = mpsc::channel::<usize>();
    let peer = std::thread::spawn(move || {
        let sock = UdpSocket::bind("127.0.0.1:0").expect("the peer's socket");
        let src = sock.local_addr().expect("bound");
        for (dst, qpn, qkey, k) in told {
            std::thread::sleep(Duration::from_millis(30));
            counted.send(threads()).expect("the test listens");
            sock.send_to(&ud_datagram(src, dst, qpn, qkey, k), dst)
                .expect("sent");
        }
    });
    let before = threads();

    let config = UdpConfig {
        port: free_port(),
        progress,
        ..UdpConfig::new(IpAddr::from([127, 0, 0, 1]))
    };
    let dev = portverbs::udp_device("udpw", config).expect("a UDP device on 127.0.0.1");
    let ctx = portverbs::open(dev.any()).expect("opened");
    assert_eq!(ctx.progress(), progress);
    let pd = ctx.alloc_pd_blocking().unwrap();
    let chan = ctx.create_comp_channel().unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 64,
            channel: Some(&chan),
            ..CqInit::default()
        })
        .unwrap();
    let qp = pd.create_qp_blocking(QpInit::new(QpType::Ud, &cq)).unwrap();
    let opts = ConnectOptions::default();
    qp.ready_ud_blocking(&opts).unwrap();
    let slot = GRH + 64;
    let mr = pd
        .reg_vec_blocking(
            vec![0; slot * 2 * MESSAGES as usize],
            AccessFlags::LOCAL_WRITE,
        )
        .unwrap();
    for k in 0..MESSAGES {
        let sges = [mr.sge(k as usize * slot, slot).unwrap()];
        qp.post_recv(&[RecvWr {
            wr_id: k,
            sges: &sges,
        }])
        .unwrap();
    }
    // The device's own datagrams go to 127.0.0.2, where nobody listens.
    let far = QpEndpoint {
        lid: 0,
        qpn: 0x99,
        psn: 0,
        gid: Gid::from_ip(IpAddr::from([127, 0, 0, 2])),
    };
    let ah = pd
        .create_ah_blocking(qp.address_vector_blocking(&far, &opts).unwrap())
        .unwrap();
    let added = threads() - before;
    let dst = dev.port().local_addr();

    let mut wc = [WorkCompletion::default(); 4];
    let (mut received, mut sent, mut slept) = (0u64, 0u64, 0u32);
    for k in 0..MESSAGES {
        // A send of ours, then sleep until the peer's datagram k completes a receive.
        let src = MESSAGES as usize * slot + k as usize * slot;
        mr.write(src, &k.to_le_bytes()).unwrap();
        let sges = [mr.sge(src, 8).unwrap()];
        let send = SendWr::new(1000 + k, SendOp::Send)
            .sges(&sges)
            .ud(ah.dest(far.qpn, opts.qkey))
            .flags(SendFlags::SIGNALED);
        qp.post_send(&[send]).unwrap();
        cq.req_notify(false);
        go.send((dst, qp.qp_num(), opts.qkey, k)).unwrap();
        let got_k = loop {
            let n = cq.poll(&mut wc).unwrap();
            let mut got = None;
            for c in &wc[..n] {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                if c.wr_id >= 1000 {
                    sent += 1;
                } else {
                    got = Some(c.wr_id);
                }
            }
            if let Some(r) = got {
                break r;
            }
            if n == 0 {
                let t = Instant::now();
                let ev = chan.wait_cq_event(T).expect("the datagram ends the wait");
                assert!(
                    t.elapsed() < WOKEN,
                    "{progress}: the wait for datagram {k} took {:?}: its datagram did not \
                     wake it",
                    t.elapsed()
                );
                slept += 1;
                ev.ack_events(1);
                cq.req_notify(false);
            }
        };
        assert_eq!(got_k, k);
        let mut payload = [0u8; 8];
        mr.read(k as usize * slot + GRH, &mut payload).unwrap();
        assert_eq!(u64::from_le_bytes(payload), k);
        received += 1;
        let during = counts.recv_timeout(Duration::from_secs(20)).unwrap();
        assert_eq!(
            during,
            before + added,
            "{progress}: threads while the device received"
        );
    }
    // The last sends' completions.
    let deadline = Instant::now() + Duration::from_secs(20);
    while sent < MESSAGES {
        assert!(Instant::now() < deadline, "{sent} sends completed");
        sent += cq.poll(&mut wc).unwrap() as u64;
        if progress == Progress::Auto {
            std::thread::yield_now();
        }
    }
    let stats = dev.port().stats();
    assert_eq!(received, MESSAGES);
    // The peer sends a moment after it is told, so the first poll for each datagram finds
    // nothing: the thread waited, and the datagram woke it.
    assert!(slept > 0, "{progress}: no wait slept, so none was tested");
    assert!(stats.rx_packets >= MESSAGES, "{stats:?}");
    assert!(stats.tx_packets >= MESSAGES, "{stats:?}");
    assert_eq!(threads(), before + added, "{progress}: after the run");

    drop(go);
    peer.join().unwrap();
    ah.destroy().unwrap();
    qp.destroy().unwrap();
    cq.destroy().unwrap();
    mr.dereg().unwrap();
    pd.dealloc().unwrap();
    drop(chan);
    drop(ctx);
    drop(dev);
    settle_to(before - 1, &format!("{progress}: after teardown"));
    added
}

#[test]
fn auto_costs_one_thread_manual_none_and_a_manual_wait_wakes_for_its_datagram() {
    // Wine and Winsock may start threads of their own on first use (none was seen); a first
    // run in each mode takes that out of the count.
    let warm = run(Progress::Manual);
    let manual = run(Progress::Manual);
    let auto = run(Progress::Auto);
    eprintln!("threads added: manual {manual} (first run {warm}), auto {auto}");
    assert_eq!(manual, 0, "manual progress runs no thread");
    assert_eq!(auto, 1, "auto progress runs exactly one thread per device");
}

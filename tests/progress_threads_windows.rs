//! The Windows UDP port in each progress mode (the Windows side of `progress_threads.rs`):
//! the threads it costs, counted with a Toolhelp snapshot (`portverbs::windows::
//! thread_count`), while a UD QP on a UDP-bound device receives datagrams from a plain
//! socket and sends its own — in auto progress exactly one thread more (the fabric's engine
//! thread, asleep on the port's completion port), in manual none; and in manual progress a
//! thread that sleeps wakes for the datagram that completes its receive, receives it and
//! processes it itself, whichever way it sleeps: blocked in `wait_cq_event`, in the
//! application's own completion-port loop (the device associated with the application's
//! port, a CQ notify request in flight), or awaiting the CQ under `block_on_port`.
//!
//! Two devices of this process cannot talk to each other under Wine (Wine binds every IPv4
//! address but 127.0.0.1 to the wildcard address, so a second device's port 4791 would
//! collide): the peer is a socket that sends sealed UD datagrams, and the device's own sends
//! go to an address nobody listens on. One test in this binary, so that no other test's
//! thread comes or goes meanwhile.
#![cfg(windows)]

use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use portverbs::hal::{Gid, Progress};
use portverbs::prelude::*;
use portverbs::udp_port::UdpConfig;
use portverbs::windows::{CompletionPort, Overlapped, block_on_port, thread_count};
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

/// How the device's thread sleeps when it has polled its CQ empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sleep {
    /// `CompletionChannel::wait_cq_event`.
    Channel,
    /// The application's completion port: a CQ notify request in flight, the device
    /// associated with the port under [`KEY`], packets handed to `Completions::dispatch`.
    PortLoop,
    /// `block_on_port` on the CQ's notify future.
    Await,
}

/// The application's completion key for the device.
const KEY: usize = 0x5eed;

/// One device in `progress`, sleeping the `sleep` way: returns how many threads it added
/// while it ran.
fn run(progress: Progress, sleep: Sleep) -> usize {
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
    let win = portverbs::windows::open(dev.any()).expect("opened");
    let ctx = win.context().clone();
    let port = Arc::new(CompletionPort::new().expect("the application's port"));
    if sleep == Sleep::PortLoop {
        win.associate(port.clone(), KEY).expect("associated");
    }
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
    let (mut input_packets, mut executor_sleeps) = (0u32, 0usize);
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
                match sleep {
                    Sleep::Channel => {
                        let ev = chan.wait_cq_event(T).expect("the datagram ends the wait");
                        ev.ack_events(1);
                        cq.req_notify(false);
                    }
                    Sleep::PortLoop => {
                        input_packets += port_loop(&win, &port, &cq);
                    }
                    Sleep::Await => {
                        let (ev, n) = block_on_port(bounded(chan.next_cq_event())).unwrap();
                        ev.expect("the datagram ends the await")
                            .expect("an event")
                            .ack_events(1);
                        cq.req_notify(false);
                        executor_sleeps += n;
                    }
                }
                assert!(
                    t.elapsed() < WOKEN,
                    "{progress}, {sleep:?}: the wait for datagram {k} took {:?}: its datagram \
                     did not wake it",
                    t.elapsed()
                );
                slept += 1;
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
    if sleep == Sleep::PortLoop {
        assert!(
            input_packets > 0,
            "no receive reached the application's port: the loop was woken by something else"
        );
    }
    if sleep == Sleep::Await {
        assert!(executor_sleeps > 0, "block_on_port never slept");
    }
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
    drop(win);
    drop(dev);
    settle_to(before - 1, &format!("{progress}: after teardown"));
    added
}

/// `fut`, or `None` after [`T`] (a timer on the process's list, which `block_on_port`
/// applies), so that a wake-up that never comes fails the test instead of hanging it.
async fn bounded<F: std::future::Future>(fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    let mut limit = std::pin::pin!(portverbs::windows::sleep_until(Instant::now() + T.unwrap()));
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(out) = fut.as_mut().poll(cx) {
            return std::task::Poll::Ready(Some(out));
        }
        limit.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// Sleeps on the application's port until the notify request armed here completes: hands
/// every packet to `Completions::dispatch` (the device's receives and doorbell) and runs
/// `progress` when the wait times out for a timer. Returns how many packets were the
/// device's receives.
fn port_loop(
    win: &portverbs::windows::Completions<portverbs::AnyDevice>,
    port: &CompletionPort,
    cq: &Cq,
) -> u32 {
    let ov = Overlapped::new();
    win.notify(cq, NotifyKind::Any, &ov)
        .expect("a notify request");
    let mut inputs = 0;
    let deadline = Instant::now() + T.unwrap();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "the notify request never completed");
        let timeout = win.next_timeout().map_or(left, |t| t.min(left));
        match port.get(Some(timeout)).expect("the port wait") {
            Some(packet) if win.dispatch(&packet).expect("dispatched") => {
                inputs += u32::from(!packet.overlapped.is_null());
            }
            Some(packet) => {
                assert!(ov.is(&packet), "a packet nobody made: {packet:?}");
                ov.get_overlapped_result(false).expect("notified");
                return inputs;
            }
            None => {
                win.progress().expect("progress");
            }
        }
    }
}

/// A manual device's timers run from the application's port loop: an RC SEND to a peer that
/// never answers is retransmitted while the thread only sleeps on its port with
/// `Completions::next_timeout` and calls `progress` when the wait times out (no datagram, no
/// doorbell and no timer of the application's would wake it otherwise).
fn port_loop_runs_the_devices_timers() {
    let config = UdpConfig {
        port: free_port(),
        progress: Progress::Manual,
        ..UdpConfig::new(IpAddr::from([127, 0, 0, 1]))
    };
    let dev = portverbs::udp_device("udpt", config).expect("a UDP device on 127.0.0.1");
    let win = portverbs::windows::open(dev.any()).expect("opened");
    let port = Arc::new(CompletionPort::new().expect("the application's port"));
    win.associate(port.clone(), KEY).expect("associated");
    let ctx = win.context().clone();
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 8,
            ..CqInit::default()
        })
        .unwrap();
    let qp = pd.create_qp_blocking(QpInit::new(QpType::Rc, &cq)).unwrap();
    // 4.096 µs · 2^12 ≈ 17 ms between transmissions, seven retries.
    let opts = ConnectOptions {
        timeout: 12,
        retry_cnt: 7,
        ..ConnectOptions::default()
    };
    let nowhere = QpEndpoint {
        lid: 0,
        qpn: 0x99,
        psn: 0,
        gid: Gid::from_ip(IpAddr::from([127, 0, 0, 2])),
    };
    qp.connect_rc_blocking(&nowhere, &opts).unwrap();
    let send = SendWr::new(1, SendOp::Send)
        .inline(b"nobody")
        .flags(SendFlags::SIGNALED);
    qp.post_send(&[send]).unwrap();
    win.progress().unwrap();
    let first = dev.port().stats().tx_packets;
    assert!(first >= 1, "the SEND left");
    let (mut timeouts, mut waits) = (0u32, 0u32);
    let deadline = Instant::now() + T.unwrap();
    while dev.port().stats().tx_packets < first + 2 {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "no retransmission: {:?}",
            dev.port().stats()
        );
        let timeout = win.next_timeout().map_or(left, |t| t.min(left));
        waits += 1;
        match port.get(Some(timeout)).expect("the port wait") {
            Some(packet) => {
                win.dispatch(&packet).expect("dispatched");
            }
            None => {
                timeouts += 1;
                win.progress().expect("progress");
            }
        }
    }
    eprintln!("two retransmissions after {waits} port waits, {timeouts} of them timed out");
    assert!(
        timeouts >= 2,
        "the retransmissions came from timed-out waits"
    );
    drop(qp);
    drop(cq);
    drop(pd);
    drop(ctx);
    drop(win);
}

#[test]
fn auto_costs_one_thread_manual_none_and_a_manual_wait_wakes_for_its_datagram() {
    // Wine and Winsock may start threads of their own on first use (none was seen); a first
    // run in each mode takes that out of the count.
    let warm = run(Progress::Manual, Sleep::Channel);
    let manual = run(Progress::Manual, Sleep::Channel);
    let port_loop = run(Progress::Manual, Sleep::PortLoop);
    let awaited = run(Progress::Manual, Sleep::Await);
    let auto = run(Progress::Auto, Sleep::Channel);
    eprintln!(
        "threads added: manual {manual} (first run {warm}; port loop {port_loop}, awaited \
         {awaited}), auto {auto}"
    );
    assert_eq!(manual, 0, "manual progress runs no thread");
    assert_eq!(
        port_loop, 0,
        "manual progress on the application's port runs no thread"
    );
    assert_eq!(
        awaited, 0,
        "manual progress under block_on_port runs no thread"
    );
    assert_eq!(auto, 1, "auto progress runs exactly one thread per device");
    port_loop_runs_the_devices_timers();
}

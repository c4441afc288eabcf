//! Waits on a device in manual progress: nothing of ours runs, so a thread that sleeps for a
//! completion must wake for the packet that brings it, receive and process it on its own
//! thread, and go back to sleep. The receiving side of two UDP-bound manual devices sleeps —
//! in a blocking wait on a completion channel, or awaiting it on a tokio runtime — while
//! the sending side, on another thread, posts SENDs; every SEND's completion event arrives.
#![cfg(target_os = "linux")]

use std::net::IpAddr;
use std::thread;
use std::time::Duration;

use portverbs::hal::Progress;
use portverbs::prelude::*;
use portverbs::udp_port::UdpConfig;
use portverbs::{UdpDevice, udp_device};

const MESSAGES: u64 = 16;

struct End {
    _dev: UdpDevice,
    ctx: Context,
    chan: CompletionChannel,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn end(name: &str, ip: &str) -> End {
    let mut config = UdpConfig::new(ip.parse::<IpAddr>().unwrap());
    config.progress = Progress::Manual;
    let dev = udp_device(name, config).unwrap();
    let ctx = portverbs::open(dev.any()).unwrap();
    assert_eq!(ctx.progress(), Progress::Manual);
    let chan = ctx.create_comp_channel().unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 64,
            channel: Some(&chan),
            ..CqInit::default()
        })
        .unwrap();
    let pd = ctx.alloc_pd_blocking().unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.caps.max_recv_wr = 32;
    let qp = pd.create_qp_blocking(init).unwrap();
    let mr = pd
        .reg_vec_blocking(vec![0u8; 4096], AccessFlags::LOCAL_WRITE)
        .unwrap();
    End {
        _dev: dev,
        ctx,
        chan,
        cq,
        qp,
        mr,
    }
}

/// Two manual devices, connected; `b` has a receive posted for every message.
fn pair(ips: [&str; 2]) -> (End, End) {
    let (a, b) = (end("mw_a", ips[0]), end("mw_b", ips[1]));
    let opts = ConnectOptions::default();
    let (ea, eb) = (
        a.qp.endpoint_blocking(&opts).unwrap(),
        b.qp.endpoint_blocking(&opts).unwrap(),
    );
    a.qp.connect_rc_blocking(&eb, &opts).unwrap();
    b.qp.connect_rc_blocking(&ea, &opts).unwrap();
    for i in 0..MESSAGES {
        b.qp.post_recv(&[RecvWr {
            wr_id: i,
            sges: &[b.mr.sge(0, 64).unwrap()],
        }])
        .unwrap();
    }
    (a, b)
}

/// The sender: a SEND every millisecond, each waited for (its own waits drive its device).
fn send_all(a: End) -> End {
    for i in 0..MESSAGES {
        thread::sleep(Duration::from_millis(1));
        let sge = [a.mr.sge(0, 64).unwrap()];
        a.cq.req_notify(false);
        a.qp.post_send(&[SendWr::new(i, SendOp::Send).sges(&sge).signaled()])
            .unwrap();
        let cq = a.chan.wait_cq_event(Some(Duration::from_secs(20))).unwrap();
        cq.ack_events(1);
        let mut wc = [WorkCompletion::default()];
        while a.cq.poll(&mut wc).unwrap() == 0 {}
        assert_eq!(wc[0].status, WcStatus::Success);
    }
    a
}

/// Takes the completions a CQ event announced; returns how many.
fn drain(b: &End) -> u64 {
    let mut wc = [WorkCompletion::default(); 8];
    let mut n = 0;
    loop {
        let got = b.cq.poll(&mut wc).unwrap();
        for w in &wc[..got] {
            assert_eq!(w.status, WcStatus::Success, "{w:?}");
        }
        n += got as u64;
        if got == 0 {
            return n;
        }
    }
}

#[test]
fn a_blocked_thread_wakes_for_the_packet_and_processes_it_itself() {
    let (a, b) = pair(["127.0.64.1", "127.0.64.2"]);
    let sender = thread::spawn(move || send_all(a));
    let mut got = 0;
    while got < MESSAGES {
        b.cq.req_notify(false);
        got += drain(&b);
        if got == MESSAGES {
            break;
        }
        // No timeout: only a datagram on b's socket can end this wait.
        let cq = b.chan.wait_cq_event(None).unwrap();
        cq.ack_events(1);
        got += drain(&b);
    }
    let _a = sender.join().unwrap();
    assert_eq!(b.ctx.dispatch(), None, "nothing left to do");
}

/// The same awaited on a tokio runtime: the device's socket sits in tokio's reactor beside
/// the channel's eventfd (feature `tokio`), so a datagram wakes the task.
#[cfg(feature = "tokio")]
#[test]
fn an_awaiting_task_wakes_for_the_packet() {
    let (a, b) = pair(["127.0.64.3", "127.0.64.4"]);
    let sender = thread::spawn(move || send_all(a));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut got = 0;
        while got < MESSAGES {
            b.cq.req_notify(false);
            got += drain(&b);
            if got == MESSAGES {
                break;
            }
            let cq = b.chan.next_cq_event().await.unwrap();
            cq.ack_events(1);
            got += drain(&b);
        }
    });
    let _a = sender.join().unwrap();
}

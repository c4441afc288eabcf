//! The layer creates no thread. A stepped fabric (which runs none either),
//! a completion port, and many notify/complete cycles through every route; the process's
//! thread count (a Toolhelp snapshot) never moves, timers included. One test in this binary, so that no other
//! test's thread comes or goes meanwhile.
#![cfg(windows)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Net, PATIENCE, collect, send, which};
use portverbs_verbs::{NotifyKind, SendFlags, WorkCompletion};
use portverbs_windows::{
    Event, Overlapped, block_on_port, sleep_alertable, sleep_until, thread_count,
};

const CYCLES: u64 = 50;

#[test]
fn no_thread_is_created() {
    let before = thread_count().unwrap();
    let net = Net::stepped(21);
    let port = net.port_for_b();
    let chan = net.b.ctx.create_comp_channel().unwrap();
    let (cq1, cq2) = (net.b.cq(None), net.b.cq(Some(&chan)));
    let (qa1, qb1, cqa1) = net.pair_with_cq(&cq1);
    let (qa2, qb2, cqa2) = net.pair_with_cq(&cq2);
    assert_eq!(
        thread_count().unwrap(),
        before,
        "opening, associating, creating"
    );

    let w = &net.b.platform;
    let (ov_port, ov_event) = (
        Overlapped::new(),
        Overlapped::event_only(Arc::new(Event::new().unwrap())),
    );
    let mut wc = [WorkCompletion::default(); 4];
    for i in 0..CYCLES {
        // Port route on cq1, event route on cq2, and the channel's blocking wait.
        w.notify(&cq1, NotifyKind::Any, &ov_port).unwrap();
        w.notify(&cq2, NotifyKind::Any, &ov_event).unwrap();
        cq2.req_notify(false);
        net.b.post_recv(&qb1, i);
        net.b.post_recv(&qb2, i);
        send(&qa1, i, SendFlags::SIGNALED);
        send(&qa2, i, SendFlags::SIGNALED);
        net.settle();
        let got = collect(&port, w, 1);
        assert_eq!(which(&got, &[&ov_port]), [0]);
        assert_eq!(w.wait_for(&ov_event, Some(PATIENCE)).unwrap(), 0);
        let ev = chan.wait_cq_event(Some(PATIENCE)).unwrap();
        ev.ack_events(1);
        assert_eq!(cq1.poll(&mut wc).unwrap(), 1);
        assert_eq!(cq2.poll(&mut wc).unwrap(), 1);
        // The senders' completions free their send queues.
        assert_eq!(cqa1.poll(&mut wc).unwrap(), 1);
        assert_eq!(cqa2.poll(&mut wc).unwrap(), 1);
    }
    // And one APC cycle.
    let ov_apc = Overlapped::new();
    w.notify_apc(&cq1, NotifyKind::Any, &ov_apc, |r| r.unwrap())
        .unwrap();
    net.b.post_recv(&qb1, 0);
    send(&qa1, 0, SendFlags::empty());
    net.settle();
    w.progress().unwrap();
    assert!(sleep_alertable(Some(Duration::from_secs(5))));
    assert_eq!(
        thread_count().unwrap(),
        before,
        "{CYCLES} notify/complete cycles"
    );

    // Timers: an operation that only sleeps completes its OVERLAPPED through the
    // application's port loop (the wait's timeout is the deadline), and block_on_port
    // sleeps until one; neither starts a thread.
    let ov_timer = Overlapped::new();
    let deadline = Instant::now() + Duration::from_millis(30);
    let op = w
        .start(&ov_timer, async move {
            sleep_until(deadline).await;
            Ok::<_, ()>(Instant::now())
        })
        .unwrap();
    let guard = Instant::now() + PATIENCE;
    loop {
        assert!(Instant::now() < guard, "the sleep never ended");
        // (`or`: only so that a broken timer fails the test instead of hanging it.)
        match port.get(w.next_timeout().or(Some(PATIENCE))).unwrap() {
            Some(p) if ov_timer.is(&p) => break,
            Some(p) => assert!(w.dispatch(&p).unwrap(), "only the doorbell or the timer"),
            None => {
                w.progress().unwrap();
            }
        }
    }
    assert!(op.take().unwrap().unwrap() >= deadline);
    let ((), _) = block_on_port(sleep_until(Instant::now() + Duration::from_millis(20))).unwrap();
    assert_eq!(thread_count().unwrap(), before, "timers on the port loop");

    // The count does see a thread: the check above can fail.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || rx.recv());
    assert_eq!(
        thread_count().unwrap(),
        before + 1,
        "a thread of the test's own"
    );
    drop(tx);
    t.join().unwrap().unwrap_err();
}

//! Rust `async` on Windows without a thread of this crate. The task sleeps
//! on a completion port ([`block_on_port`]); its waker is a packet, posted by whoever raised
//! the interrupt (the soft device's engine thread, which plays the hardware) or completed the
//! command. The CQ notify future and the async verbs need nothing else.
#![cfg(windows)]

mod common;

use std::time::Duration;

use common::{Net, send};
use portverbs_verbs::{NotifyKind, SendFlags, WorkCompletion};
use portverbs_windows::block_on_port;

#[test]
fn the_notify_future_wakes_its_task_through_the_port() {
    let net = Net::threaded();
    let cq = net.b.cq(None);
    let (qa, qb) = net.pair(&cq);
    for round in 0..5u64 {
        net.b.post_recv(&qb, round);
        let (r, _sleeps) = block_on_port(async {
            let notified = cq.notified(NotifyKind::Any); // arm first …
            send(&qa, round, SendFlags::empty()); // … then let the completion happen
            notified.await
        })
        .unwrap();
        r.unwrap();
        let mut wc = [WorkCompletion::default(); 2];
        let mut n = 0;
        let deadline = std::time::Instant::now() + common::PATIENCE;
        while n == 0 {
            n = cq.poll(&mut wc).unwrap();
            assert!(std::time::Instant::now() < deadline);
        }
        assert_eq!(wc[0].wr_id, round);
    }
}

#[test]
fn a_channel_event_is_awaited_on_the_port() {
    let net = Net::threaded();
    let chan = net.b.ctx.create_comp_channel().unwrap();
    let cq = net.b.cq(Some(&chan));
    let (qa, qb) = net.pair(&cq);
    cq.req_notify(false);
    net.b.post_recv(&qb, 1);
    let (got, _) = block_on_port(async {
        send(&qa, 1, SendFlags::empty());
        chan.next_cq_event().await
    })
    .unwrap();
    let got = got.unwrap();
    assert_eq!(got.cqn(), cq.cqn());
    got.ack_events(1);
}

#[test]
fn async_verbs_run_on_the_port_executor() {
    let net = Net::threaded();
    let ctx = net.b.ctx.clone();
    let (pd, _) = block_on_port(ctx.alloc_pd()).unwrap();
    let pd = pd.unwrap();
    let (mr, _) =
        block_on_port(pd.reg_vec(vec![0u8; 4096], portverbs_verbs::AccessFlags::LOCAL_WRITE))
            .unwrap();
    assert!(mr.is_ok());
    // And a blocking wait of the portable API sleeps on the event queue's private port.
    let chan = ctx.create_comp_channel().unwrap();
    assert!(matches!(
        chan.wait_cq_event(Some(Duration::from_millis(5))),
        Err(portverbs_verbs::WaitError::TimedOut)
    ));
}

//! The crate creates no thread: everything below runs on a stepped fabric (which runs none
//! either) and the thread count of the process never moves. One test in this binary, so that
//! no other test's thread comes or goes meanwhile.

mod common;

use std::time::Duration;

use common::{Net, send, thread_count};
use portverbs_verbs::{AsyncEventKind, NotifyKind, SendFlags};

#[test]
fn no_thread_is_created() {
    let before = thread_count();
    let net = Net::stepped(9);
    let chan = net.b.ctx.create_comp_channel().unwrap();
    let (_cq_a, cq_b, qa, qb) = net.link(Some(&chan));
    assert_eq!(thread_count(), before, "opening and creating");

    cq_b.req_notify(false);
    let mut req = cq_b.notify(NotifyKind::Any);
    net.b.post_recv(&qb, 1);
    send(&qa, 10, SendFlags::empty());
    net.settle();
    cq_b.wait_notify(&mut req, Some(Duration::from_secs(5)))
        .unwrap();
    let got = chan.wait_cq_event(Some(Duration::from_secs(5))).unwrap();
    assert_eq!(got.cqn(), cq_b.cqn());
    got.ack_events(1);
    net.devs[0].set_port_active(1, false);
    let ev = net
        .a
        .ctx
        .wait_async_event(Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(ev.kind, AsyncEventKind::PortErr);
    assert_eq!(thread_count(), before, "delivering events and waiting");
}

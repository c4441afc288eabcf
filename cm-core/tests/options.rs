//! The connection options librdmacm's `rdma_conn_param` and `rdma_set_option` carry, as the
//! agent puts them on the wire and into the QP transitions: end-to-end flow control and the
//! SRQ bit (REQ and REP), the traffic class (REQ path, both address vectors), the local ACK
//! timeout (our QP only), the path MTU (REQ; the passive side takes the smaller of the REQ's
//! and its own), and remote READ/atomic rights only with responder resources.

mod common;

use common::{Pair, SERVICE};
use portverbs_cm::wire::{AttrId, CmMessage};
use portverbs_cm::{AcceptParams, CmEvent, QpTarget, RtrAttrs, RtsAttrs};

/// The RTR and RTS a node's agent asked for (the first two QP actions).
fn rtr_rts(t: &Pair, n: usize) -> (RtrAttrs, RtsAttrs) {
    let qp = &t.nodes[n].qp;
    let (QpTarget::Rtr(rtr), QpTarget::Rts(rts)) = (qp[0].target, qp[1].target) else {
        panic!("RTR then RTS: {qp:?}");
    };
    (rtr, rts)
}

/// Node 1 listens, node 0 connects with `p` (edited by `edit`); returns the passive ID and
/// whether the request said the sender uses an SRQ.
fn request(
    t: &mut Pair,
    edit: impl FnOnce(&mut portverbs_cm::ConnectParams),
) -> (portverbs_cm::CmId, bool) {
    let listener = t.nodes[1].agent.create_id().expect("id");
    t.nodes[1].agent.listen(listener, SERVICE).expect("listen");
    let a = t.nodes[0].agent.create_id().expect("id");
    let mut p = t.params(0, 0x11, 0x100);
    edit(&mut p);
    t.nodes[0]
        .agent
        .connect(t.now, a, &p, &[])
        .expect("connect");
    t.deliver();
    let ev = t.take_events(1);
    let [CmEvent::ConnectRequest { id, request }] = ev.as_slice() else {
        panic!("one connect request expected, got {ev:?}");
    };
    (*id, request.srq)
}

#[test]
fn options_reach_the_wire_and_the_qps() {
    let mut t = Pair::new();
    let (passive, srq) = request(&mut t, |p| {
        p.flow_control = true;
        p.srq = true;
        p.ack_timeout = Some(9);
        p.path.path_mtu = 5;
        p.path.traffic_class = 0x60;
    });
    assert!(srq);
    let req = &t.sent(0, AttrId::Req)[0].1;
    let CmMessage::Req(r) = &req.msg else {
        unreachable!()
    };
    assert!(r.end_to_end_flow_control);
    assert!(r.srq);
    assert_eq!(r.path_mtu, 5);
    assert_eq!(r.primary.traffic_class, 0x60);
    // The ACK timeout is ours alone: the REQ's path keeps the one the path gives.
    assert_ne!(r.primary.local_ack_timeout, 9);

    let mut accept = AcceptParams::new(0x22, 0x200);
    accept.flow_control = true;
    accept.srq = true;
    accept.ack_timeout = Some(12);
    accept.path_mtu = 4;
    t.nodes[1]
        .agent
        .accept(t.now, passive, &accept, &[])
        .expect("accept");
    t.deliver();
    let rep = &t.sent(1, AttrId::Rep)[0].1;
    let CmMessage::Rep(r) = &rep.msg else {
        unreachable!()
    };
    assert!(r.end_to_end_flow_control);
    assert!(r.srq);

    let (rtr, rts) = rtr_rts(&t, 1);
    // The passive side's port takes 2048: the smaller of the REQ's 4096 and that.
    assert_eq!(rtr.path_mtu, 4);
    assert_eq!(rtr.traffic_class, 0x60);
    assert_eq!(rts.timeout, 12);
    let (rtr, rts) = rtr_rts(&t, 0);
    // The REP carries no MTU: the active side keeps what it asked for.
    assert_eq!(rtr.path_mtu, 5);
    assert_eq!(rtr.traffic_class, 0x60);
    assert_eq!(rts.timeout, 9);
}

#[test]
fn without_options_the_bits_are_clear_and_the_path_sets_the_timeout() {
    let mut t = Pair::new();
    let (passive, srq) = request(&mut t, |_| {});
    assert!(!srq);
    let CmMessage::Req(r) = &t.sent(0, AttrId::Req)[0].1.msg else {
        unreachable!()
    };
    assert!(!r.end_to_end_flow_control);
    t.nodes[1]
        .agent
        .accept(t.now, passive, &AcceptParams::new(0x22, 0x200), &[])
        .expect("accept");
    t.deliver();
    let CmMessage::Rep(r) = &t.sent(1, AttrId::Rep)[0].1.msg else {
        unreachable!()
    };
    assert!(!r.end_to_end_flow_control && !r.srq);
    // MTU 1024 asked, 4096 allowed: 1024.
    assert_eq!(rtr_rts(&t, 1).0.path_mtu, 3);
    // av.timeout = cm_ack_timeout(REP target ACK delay 15, PLT 10) = 15.
    assert_eq!(rtr_rts(&t, 0).1.timeout, 15);
}

#[test]
fn a_req_without_a_valid_mtu_gets_1024_at_most() {
    for bad in [0, 6, 15] {
        let mut t = Pair::new();
        let (passive, _) = request(&mut t, |p| p.path.path_mtu = bad);
        t.nodes[1]
            .agent
            .accept(t.now, passive, &AcceptParams::new(0x22, 0x200), &[])
            .expect("accept");
        t.deliver();
        assert_eq!(rtr_rts(&t, 1).0.path_mtu, 3, "REQ path MTU {bad}");
    }
}

#[test]
fn no_responder_resources_no_remote_read_or_atomics() {
    let mut t = Pair::new();
    let (passive, _) = request(&mut t, |_| {});
    let mut accept = AcceptParams::new(0x22, 0x200);
    accept.responder_resources = 0;
    t.nodes[1]
        .agent
        .accept(t.now, passive, &accept, &[])
        .expect("accept");
    t.deliver();
    let (rtr, _) = rtr_rts(&t, 1);
    assert_eq!((rtr.max_dest_rd_atomic, rtr.remote_read_atomic), (0, false));
    // The active side may issue none either (the REP's responder resources are 0), and its
    // own QP, with the resources it offered, grants READ.
    let (rtr, rts) = rtr_rts(&t, 0);
    assert_eq!(rts.max_rd_atomic, 0);
    assert_eq!((rtr.max_dest_rd_atomic, rtr.remote_read_atomic), (1, true));
}

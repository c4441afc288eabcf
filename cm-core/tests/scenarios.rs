//! State-machine scenarios between two agents, one section per phase (as Linux `cm.c` behaves).

mod common;

use common::{MS, Pair, SERVICE, established, is, rej_reason, rejected};
use portverbs_cm::time::timeout_ns;
use portverbs_cm::wire::{AttrId, CmMessage, Dreq, Mad, MsgKind, RejReason, Rep, Rtu};
use portverbs_cm::{AcceptParams, CmError, CmEvent, CmState, QpTarget, SidrParams};

// ---- establishment -------------------------------------------------------------------------

#[test]
fn establish_moves_both_qps_and_reports_once() {
    let mut t = Pair::new();
    let (_, a, p) = t.establish();
    // Active: RTR with the passive QPN and its own PSN, RTS with the passive's PSN, then RTU.
    let qa = &t.nodes[0].qp;
    let QpTarget::Rtr(rtr) = qa[0].target else {
        panic!("RTR first: {qa:?}");
    };
    assert_eq!((qa[0].id, qa[0].qpn), (a, 0x11));
    assert_eq!((rtr.dest_qpn, rtr.rq_psn, rtr.path_mtu), (0x22, 0x100, 3));
    let QpTarget::Rts(rts) = qa[1].target else {
        panic!("RTS second: {qa:?}");
    };
    assert_eq!(rts.sq_psn, 0x200);
    // av.timeout = cm_ack_timeout(REP target ACK delay 15, PLT 10) = 15.
    assert_eq!(rts.timeout, 15);
    // The active side's outputs: REQ, then RTR, RTS, RTU, Established in that order.
    assert_eq!(t.nodes[0].order, ['S', 'Q', 'Q', 'S', 'E']);
    // Passive: QP to RTR/RTS before the REP leaves.
    let qp = &t.nodes[1].qp;
    let (QpTarget::Rtr(rtr), QpTarget::Rts(rts)) = (qp[0].target, qp[1].target) else {
        panic!("{qp:?}");
    };
    assert_eq!((rtr.dest_qpn, rtr.rq_psn, rts.sq_psn), (0x11, 0x200, 0x100));
    assert_eq!(&t.nodes[1].order[..4], ['E', 'Q', 'Q', 'S']);
    assert_eq!(t.nodes[0].agent.state(a), Some(CmState::Established));
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::Established));
    // TIDs: REP and RTU reuse the REQ's.
    let req_tid = t.sent(0, AttrId::Req)[0].1.tid;
    assert_eq!(req_tid & 0xffff_ffff, u64::from(a.comm_id()));
    assert_eq!(t.sent(1, AttrId::Rep)[0].1.tid, req_tid);
    assert_eq!(t.sent(0, AttrId::Rtu)[0].1.tid, req_tid);
}

#[test]
fn rep_depths_beyond_the_req_offer_are_cut_to_it() {
    // Linux's perftest server answers with its device's maximum (128 on rxe) whatever the
    // REQ offered; the active side's QP must not get more than it asked for.
    let mut t = Pair::new();
    let listener = t.nodes[1].agent.create_id().expect("id");
    t.nodes[1].agent.listen(listener, SERVICE).expect("listen");
    let a = t.nodes[0].agent.create_id().expect("id");
    let mut p = t.params(0, 0x11, 0x100);
    p.responder_resources = 16;
    p.initiator_depth = 4;
    t.nodes[0]
        .agent
        .connect(t.now, a, &p, &[])
        .expect("connect");
    t.deliver();
    let ev = t.take_events(1);
    let [CmEvent::ConnectRequest { id: passive, .. }] = ev.as_slice() else {
        panic!("one connect request expected, got {ev:?}");
    };
    let mut accept = AcceptParams::new(0x22, 0x200);
    accept.responder_resources = 128;
    accept.initiator_depth = 128;
    t.nodes[1]
        .agent
        .accept(t.now, *passive, &accept, &[])
        .expect("accept");
    t.deliver();
    let qa = &t.nodes[0].qp;
    let (QpTarget::Rtr(rtr), QpTarget::Rts(rts)) = (qa[0].target, qa[1].target) else {
        panic!("RTR then RTS: {qa:?}");
    };
    assert_eq!((rtr.max_dest_rd_atomic, rtr.remote_read_atomic), (16, true));
    assert_eq!(rts.max_rd_atomic, 4);
    assert_eq!(t.nodes[0].agent.state(a), Some(CmState::Established));
}

#[test]
fn no_listener_is_rejected_with_invalid_service_id() {
    let mut t = Pair::new();
    let a = t.nodes[0].agent.create_id().expect("id");
    let p = t.params(0, 0x11, 1);
    t.nodes[0].agent.connect(0, a, &p, &[]).expect("connect");
    t.deliver();
    let rej = &t.sent(1, AttrId::Rej)[0].1;
    let CmMessage::Rej(r) = &rej.msg else {
        unreachable!()
    };
    assert_eq!((r.local_comm_id, r.remote_comm_id), (0, a.comm_id()));
    assert_eq!(
        (r.reason, r.msg_rejected),
        (RejReason::InvalidServiceId, MsgKind::Req)
    );
    assert_eq!(t.take_shapes(0), [rejected(a, RejReason::InvalidServiceId)]);
    assert_eq!(t.nodes[0].agent.state(a), Some(CmState::Idle));
    assert_eq!(t.nodes[1].agent.live_endpoints(), 0);
}

#[test]
fn consumer_reject_reaches_the_active_side() {
    let mut t = Pair::new();
    let (_, a, p) = t.request();
    t.nodes[1].agent.reject(t.now, p, b"no").expect("reject");
    t.deliver();
    let rej = t.sent(1, AttrId::Rej);
    assert_eq!(rej_reason(&rej[0].1), Some(RejReason::ConsumerReject));
    let mut data = vec![0u8; 148];
    data[..2].copy_from_slice(b"no");
    assert_eq!(
        t.take_events(0),
        [CmEvent::Rejected {
            id: a,
            reason: RejReason::ConsumerReject,
            private_data: data
        }]
    );
    // The active QP goes to ERROR.
    assert_eq!(
        t.nodes[0].qp.last().map(|q| q.target),
        Some(QpTarget::Error)
    );
}

// ---- timeouts, retries, MRA ---------------------------------------------------------------

#[test]
fn req_is_retried_then_unreachable() {
    let mut t = Pair::new();
    let a = t.nodes[0].agent.create_id().expect("id");
    let p = t.params(0, 0x11, 1);
    t.nodes[0].agent.connect(0, a, &p, &[]).expect("connect");
    t.run_until_if(10_000 * MS, |_, _| false);
    let reqs = t.sent(0, AttrId::Req);
    assert_eq!(
        reqs.len(),
        1 + 3,
        "one REQ and max_cm_retries retransmissions"
    );
    // Interval: 2·convert(PLT 10) + convert(remote response timeout 14) = 2·4 + 64 ms.
    for w in reqs.windows(2) {
        assert_eq!(w[1].0 - w[0].0, 72 * MS);
        assert_eq!(w[0].1, w[1].1, "the same MAD, same TID");
    }
    assert_eq!(t.take_events(0), [CmEvent::Unreachable { id: a }]);
    assert_eq!(t.nodes[0].agent.stats().retransmits, 3);
    assert_eq!(t.nodes[0].agent.state(a), Some(CmState::Idle));
}

#[test]
fn mra_pushes_the_req_timer_out() {
    let mut t = Pair::new();
    let (_, a, p) = t.request();
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::MraReqSent));
    assert!(t.sent(1, AttrId::Mra).is_empty(), "the MRA is delayed");
    // The REQ retransmission (72 ms) is a duplicate: node 1 answers with the MRA.
    t.run_until(72 * MS);
    let mra = t.sent(1, AttrId::Mra);
    assert_eq!(mra.len(), 1);
    let CmMessage::Mra(m) = &mra[0].1.msg else {
        unreachable!()
    };
    assert_eq!((m.msg_mraed, m.service_timeout), (MsgKind::Req, 20));
    assert_eq!(t.nodes[0].agent.state(a), Some(CmState::MraReqRcvd));
    // Next retransmission only after convert(20) + convert(av.timeout 11) = 4096 + 8 ms.
    let due = t.nodes[0].agent.poll_timeout().expect("timer");
    assert_eq!(due, 72 * MS + timeout_ns(20) + timeout_ns(11));
    t.run_until(due - 1);
    assert_eq!(t.sent(0, AttrId::Req).len(), 2);
    t.nodes[1]
        .agent
        .accept(t.now, p, &AcceptParams::new(0x22, 2), &[])
        .expect("accept");
    t.deliver();
    assert_eq!(t.take_shapes(0), [established(a)]);
}

#[test]
fn the_retry_budget_is_what_an_unanswered_req_spends() {
    // rdma_cm's values on RoCE: 16 sends, each waited for 2·256 + 4 096 ms.
    let path = portverbs_cm::PathParams::roce(Default::default(), Default::default());
    let rdma_cm = portverbs_cm::ConnectParams::new(SERVICE, 1, 1, path);
    assert_eq!(rdma_cm.retry_budget_ns(), 73_728 * MS);
    // The short timers of these tests: 4 sends of 72 ms; Unreachable exactly when it ends.
    let mut t = Pair::new();
    let a = t.nodes[0].agent.create_id().expect("id");
    let p = t.params(0, 0x11, 1);
    assert_eq!(p.retry_budget_ns(), 4 * 72 * MS);
    t.nodes[0].agent.connect(0, a, &p, &[]).expect("connect");
    t.run_until_if(p.retry_budget_ns() - 1, |_, _| false);
    assert!(t.take_events(0).is_empty(), "still trying");
    t.run_until_if(p.retry_budget_ns(), |_, _| false);
    assert_eq!(t.take_events(0), [CmEvent::Unreachable { id: a }]);
}

#[test]
fn an_application_deadline_ends_a_req_early_whatever_an_mra_asks() {
    // Unanswered: the deadline comes before the second retransmission.
    let mut t = Pair::new();
    let a = t.nodes[0].agent.create_id().expect("id");
    let mut p = t.params(0, 0x11, 1);
    p.give_up_at = Some(100 * MS);
    t.nodes[0].agent.connect(0, a, &p, &[]).expect("connect");
    t.run_until_if(10_000 * MS, |_, _| false);
    assert_eq!(t.sent(0, AttrId::Req).len(), 2, "sent at 0 and 72 ms");
    assert_eq!(t.take_events(0), [CmEvent::Unreachable { id: a }]);
    assert_eq!(t.nodes[0].agent.state(a), Some(CmState::Idle));
    // Answered with an MRA asking for 4 s more: the deadline still holds.
    let mut t = Pair::new();
    let listener = t.nodes[1].agent.create_id().expect("id");
    t.nodes[1].agent.listen(listener, SERVICE).expect("listen");
    let a = t.nodes[0].agent.create_id().expect("id");
    let mut p = t.params(0, 0x11, 0x100);
    p.give_up_at = Some(500 * MS);
    t.nodes[0].agent.connect(0, a, &p, &[]).expect("connect");
    t.run_until(200 * MS);
    assert_eq!(t.nodes[0].agent.state(a), Some(CmState::MraReqRcvd));
    assert!(t.nodes[0].agent.poll_timeout().expect("timer") <= 500 * MS);
    t.run_until(500 * MS);
    let ev = t.take_events(0);
    assert_eq!(ev, [CmEvent::Unreachable { id: a }]);
}

#[test]
fn duplicate_req_in_req_rcvd_and_rep_sent_is_silent() {
    let mut t = Pair::with(|mut c| {
        c.request_mra_timeout = None;
        c
    });
    let (_, _, p) = t.request();
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::ReqRcvd));
    t.run_until(72 * MS); // REQ retransmitted: ignored
    assert_eq!(t.nodes[1].sent.len(), 0);
    assert_eq!(t.nodes[1].agent.stats().duplicates, 1);
    // Accept, but lose every RTU: only the REP timer re-sends the REP, never a duplicate REQ.
    t.nodes[1]
        .agent
        .accept(t.now, p, &AcceptParams::new(0x22, 2), &[])
        .expect("accept");
    t.deliver_if(|_, m| !is(m, AttrId::Rtu));
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::RepSent));
    let dup = t.sent(0, AttrId::Req)[0].1.emit();
    let from = t.nodes[0].gid;
    t.nodes[1].agent.handle_mad(t.now, from, &dup).expect("ok");
    t.drain(1);
    assert_eq!(t.sent(1, AttrId::Rep).len(), 1);
}

#[test]
fn lost_rtu_is_recovered_by_rep_retransmission() {
    let mut t = Pair::new();
    let (_, a, p) = t.request();
    t.nodes[1]
        .agent
        .accept(t.now, p, &AcceptParams::new(0x22, 2), &[])
        .expect("accept");
    let mut first = true;
    t.run_until_if(1000 * MS, |_, m| {
        if is(m, AttrId::Rtu) && first {
            first = false;
            return false;
        }
        true
    });
    assert_eq!(t.sent(1, AttrId::Rep).len(), 2, "REP re-sent by its timer");
    assert_eq!(
        t.sent(0, AttrId::Rtu).len(),
        2,
        "the duplicate REP gets the RTU again"
    );
    // REP interval: convert(REQ local response timeout 13) = 32 ms.
    let reps = t.sent(1, AttrId::Rep);
    assert_eq!(reps[1].0 - reps[0].0, 32 * MS);
    assert_eq!(t.take_shapes(0), [established(a)]);
    assert_eq!(t.take_shapes(1), [established(p)]);
}

#[test]
fn rep_retries_exhausted_is_unreachable_for_the_passive_side() {
    let mut t = Pair::new();
    let (_, _, p) = t.request();
    t.nodes[1]
        .agent
        .accept(t.now, p, &AcceptParams::new(0x22, 2), &[])
        .expect("accept");
    t.run_until_if(10_000 * MS, |to, _| to == 1);
    assert_eq!(t.sent(1, AttrId::Rep).len(), 4);
    assert_eq!(t.take_events(1), [CmEvent::Unreachable { id: p }]);
    assert_eq!(
        t.nodes[1].qp.last().map(|q| q.target),
        Some(QpTarget::Error)
    );
}

// ---- teardown ------------------------------------------------------------------------------

#[test]
fn disconnect_drep_timewait_and_exit() {
    let mut t = Pair::new();
    let (l, a, p) = t.establish();
    t.nodes[0].agent.disconnect(t.now, a, b"bye").expect("dreq");
    assert_eq!(
        t.nodes[0]
            .agent
            .poll_output()
            .map(|o| matches!(o, portverbs_cm::CmOutput::Qp(q) if q.target == QpTarget::Error)),
        Some(true)
    );
    t.deliver();
    assert_eq!(t.take_events(1), [CmEvent::Disconnected { id: p }]);
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::DreqRcvd));
    // DREQ carries the passive QPN; DREP echoes the DREQ's TID.
    let dreq = &t.sent(0, AttrId::Dreq)[0].1;
    let CmMessage::Dreq(d) = &dreq.msg else {
        unreachable!()
    };
    assert_eq!(d.remote_qpn, 0x22);
    t.nodes[1].agent.disconnect(t.now, p, &[]).expect("drep");
    t.deliver();
    assert_eq!(t.sent(1, AttrId::Drep)[0].1.tid, dreq.tid);
    assert_eq!(t.take_events(0), [CmEvent::Disconnected { id: a }]);
    assert_eq!(t.nodes[0].agent.state(a), Some(CmState::Timewait));
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::Timewait));
    t.run_until(t.now + 10_000 * MS);
    assert_eq!(t.take_events(0), [CmEvent::TimewaitExit { id: a }]);
    assert_eq!(t.take_events(1), [CmEvent::TimewaitExit { id: p }]);
    for (n, id) in [(0, a), (1, p), (1, l)] {
        t.nodes[n].agent.destroy(t.now, id).expect("destroy");
    }
    for n in 0..2 {
        assert_eq!(t.nodes[n].agent.live_endpoints(), 0);
        assert_eq!(t.nodes[n].agent.map_entries(), 0);
    }
}

#[test]
fn lost_dreps_end_in_disconnected_after_dreq_retries() {
    let mut t = Pair::new();
    let (_, a, p) = t.establish();
    t.nodes[0].agent.disconnect(t.now, a, &[]).expect("dreq");
    t.deliver();
    t.nodes[1].agent.disconnect(t.now, p, &[]).expect("drep");
    // Every DREP lost: the DREQs retransmitted hit TIMEWAIT and get the stored DREP again.
    t.run_until_if(t.now + 10_000 * MS, |_, m| !is(m, AttrId::Drep));
    assert_eq!(t.sent(0, AttrId::Dreq).len(), 4);
    assert_eq!(t.sent(1, AttrId::Drep).len(), 4);
    assert_eq!(
        t.take_events(0),
        [
            CmEvent::Disconnected { id: a },
            CmEvent::TimewaitExit { id: a }
        ]
    );
}

#[test]
fn simultaneous_disconnects_both_complete() {
    let mut t = Pair::new();
    let (_, a, p) = t.establish();
    t.nodes[0].agent.disconnect(t.now, a, &[]).expect("dreq");
    t.nodes[1].agent.disconnect(t.now, p, &[]).expect("dreq");
    t.deliver();
    assert_eq!(t.take_events(0), [CmEvent::Disconnected { id: a }]);
    assert_eq!(t.take_events(1), [CmEvent::Disconnected { id: p }]);
    assert_eq!(t.nodes[0].agent.state(a), Some(CmState::Timewait));
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::Timewait));
}

#[test]
fn a_dreq_crossing_ours_ends_our_disconnect_without_retransmission() {
    // perftest -R's teardown against Linux: our DREQ crosses the one Linux sends when perftest
    // destroys its ID (sent once, straight to TIMEWAIT); Linux never answers ours then. The
    // peer's DREQ must end our disconnect: a DREP, and our DREQ's timer cancelled.
    let mut t = Pair::new();
    let (_, a, p) = t.establish();
    t.nodes[0].agent.disconnect(t.now, a, &[]).expect("dreq");
    t.nodes[1].agent.destroy(t.now, p).expect("destroy");
    t.run_until_if(60_000 * MS, |to, m| !(to == 0 && is(m, AttrId::Drep)));
    assert_eq!(t.sent(0, AttrId::Dreq).len(), 1, "our DREQ went once");
    assert_eq!(
        t.sent(0, AttrId::Drep).len(),
        1,
        "the peer's DREQ got its DREP"
    );
    assert_eq!(t.nodes[0].agent.stats().retransmits, 0);
    assert_eq!(
        t.take_events(0),
        [
            CmEvent::Disconnected { id: a },
            CmEvent::TimewaitExit { id: a }
        ]
    );
}

#[test]
fn dreq_before_rtu_completes_the_accept_first() {
    let mut t = Pair::new();
    let (_, a, p) = t.request();
    t.nodes[1]
        .agent
        .accept(t.now, p, &AcceptParams::new(0x22, 2), &[])
        .expect("accept");
    t.deliver_if(|_, m| !is(m, AttrId::Rtu));
    t.nodes[0].agent.disconnect(t.now, a, &[]).expect("dreq");
    t.deliver();
    assert_eq!(
        t.take_shapes(1),
        [established(p), CmEvent::Disconnected { id: p }]
    );
}

// ---- unmatched and stale messages ----------------------------------------------------------

#[test]
fn unmatched_dreq_gets_a_drep_and_other_strays_are_dropped() {
    let mut t = Pair::new();
    let from = t.nodes[0].gid;
    let dreq = Mad::new(
        0x77,
        CmMessage::Dreq(Dreq {
            local_comm_id: 0x1234,
            remote_comm_id: 0x5678,
            remote_qpn: 9,
            private_data: [0; 220],
        }),
    );
    t.nodes[1]
        .agent
        .handle_mad(0, from, &dreq.emit())
        .expect("ok");
    t.drain(1);
    let drep = &t.sent(1, AttrId::Drep)[0].1;
    let CmMessage::Drep(d) = &drep.msg else {
        unreachable!()
    };
    assert_eq!(
        (drep.tid, d.local_comm_id, d.remote_comm_id),
        (0x77, 0x5678, 0x1234)
    );
    let rtu = Mad::new(
        1,
        CmMessage::Rtu(Rtu {
            local_comm_id: 1,
            remote_comm_id: 2,
            private_data: [0; 224],
        }),
    );
    t.nodes[1]
        .agent
        .handle_mad(0, from, &rtu.emit())
        .expect("ok");
    t.drain(1);
    assert_eq!(t.nodes[1].sent.len(), 1, "RTU dropped silently");
    assert_eq!(t.nodes[1].agent.stats().unmatched, 2);
    assert_eq!(
        t.nodes[1].agent.handle_mad(0, from, &[0; 100]),
        Err(portverbs_cm::MadError::Length { len: 100 })
    );
    assert_eq!(t.nodes[1].agent.stats().malformed, 1);
}

#[test]
fn dreq_with_the_wrong_qpn_is_ignored() {
    let mut t = Pair::new();
    let (_, a, p) = t.establish();
    let from = t.nodes[0].gid;
    let dreq = Mad::new(
        1,
        CmMessage::Dreq(Dreq {
            local_comm_id: a.comm_id(),
            remote_comm_id: p.comm_id(),
            remote_qpn: 0x23,
            private_data: [0; 220],
        }),
    );
    t.nodes[1]
        .agent
        .handle_mad(0, from, &dreq.emit())
        .expect("ok");
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::Established));
}

#[test]
fn a_reused_id_is_not_reached_by_stale_messages() {
    let mut t = Pair::new();
    let (l, a, p) = t.establish();
    t.nodes[0].agent.destroy(t.now, a).expect("destroy");
    t.deliver();
    assert_eq!(t.take_events(1), [CmEvent::Disconnected { id: p }]);
    t.run_until(t.now + 10_000 * MS);
    assert_eq!(t.nodes[0].agent.live_endpoints(), 0, "freed after TIMEWAIT");
    // The slot comes back with a new generation: another communication ID.
    let b = t.nodes[0].agent.create_id().expect("id");
    assert_ne!(b.comm_id(), a.comm_id());
    assert_eq!(t.nodes[0].agent.state(a), None);
    assert_eq!(
        t.nodes[0].agent.disconnect(t.now, a, &[]),
        Err(CmError::UnknownId(a))
    );
    let mut params = t.params(0, 0x33, 5);
    params.service_id = 0x999;
    t.nodes[0]
        .agent
        .connect(t.now, b, &params, &[])
        .expect("connect");
    t.drain(0);
    t.wire.clear();
    // A late REP for the old connection names the old ID: it must not complete the new one.
    let rep = Mad::new(
        1,
        CmMessage::Rep(Rep {
            local_comm_id: p.comm_id(),
            remote_comm_id: a.comm_id(),
            local_qkey: 0,
            local_qpn: 0x22,
            local_eecn: 0,
            starting_psn: 0,
            vendor_id: 0,
            responder_resources: 0,
            initiator_depth: 0,
            target_ack_delay: 0,
            failover_accepted: 0,
            end_to_end_flow_control: false,
            rnr_retry_count: 0,
            srq: false,
            local_ca_guid: 0,
            private_data: [0; 196],
        }),
    );
    let from = t.nodes[1].gid;
    t.nodes[0]
        .agent
        .handle_mad(t.now, from, &rep.emit())
        .expect("ok");
    assert_eq!(t.nodes[0].agent.state(b), Some(CmState::ReqSent));
    t.nodes[0].agent.destroy(t.now, b).expect("destroy");
    t.nodes[1].agent.destroy(t.now, p).expect("destroy");
    t.nodes[1].agent.destroy(t.now, l).expect("destroy");
    t.run_until(t.now + 10_000 * MS);
    assert_eq!(t.nodes[0].agent.live_endpoints(), 0);
    assert_eq!(t.nodes[1].agent.live_endpoints(), 0);
}

#[test]
fn a_req_from_a_live_qp_is_stale() {
    let mut t = Pair::new();
    let (_, a, p) = t.establish();
    // Node 0 "restarts" the same QP: a new REQ with the same QPN and CA GUID.
    let b = t.nodes[0].agent.create_id().expect("id");
    let params = t.params(0, 0x11, 0x300);
    t.nodes[0]
        .agent
        .connect(t.now, b, &params, &[])
        .expect("connect");
    t.deliver();
    let rej = t.sent(1, AttrId::Rej);
    assert_eq!(rej_reason(&rej[0].1), Some(RejReason::StaleConnection));
    assert!(
        t.take_shapes(0)
            .contains(&rejected(b, RejReason::StaleConnection))
    );
    // The old connection is disconnected with a DREQ.
    assert_eq!(t.sent(1, AttrId::Dreq).len(), 1);
    assert!(t.take_events(1).contains(&CmEvent::Disconnected { id: p }));
    let _ = a;
}

// ---- destroy in each phase ------------------------------------------------------------------

#[test]
fn destroy_while_waiting_for_rep_sends_rej_timeout() {
    let mut t = Pair::new();
    let (_, a, p) = t.request();
    t.nodes[0].agent.destroy(t.now, a).expect("destroy");
    assert_eq!(t.nodes[0].agent.live_endpoints(), 0);
    t.deliver();
    let rej = &t.sent(0, AttrId::Rej)[0].1;
    let CmMessage::Rej(r) = &rej.msg else {
        unreachable!()
    };
    assert_eq!((r.reason, r.ari_len), (RejReason::Timeout, 8));
    assert_eq!(r.ari[..8], (0x0200_00ff_fe00_0001u64).to_be_bytes());
    assert_eq!(t.take_shapes(1), [rejected(p, RejReason::Timeout)]);
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::Idle));
}

#[test]
fn destroy_of_a_request_rejects_it() {
    let mut t = Pair::new();
    let (_, a, p) = t.request();
    t.nodes[1].agent.destroy(t.now, p).expect("destroy");
    t.deliver();
    assert_eq!(t.take_shapes(0), [rejected(a, RejReason::ConsumerReject)]);
}

#[test]
fn destroy_while_established_sends_one_dreq() {
    let mut t = Pair::new();
    let (_, a, p) = t.establish();
    t.nodes[0].agent.destroy(t.now, a).expect("destroy");
    t.run_until_if(t.now + 10_000 * MS, |to, _| to == 0);
    assert_eq!(t.sent(0, AttrId::Dreq).len(), 1, "no retransmission");
    assert!(t.take_events(0).is_empty(), "nothing after destroy");
    assert_eq!(t.nodes[0].agent.live_endpoints(), 0);
    let _ = p;
}

// ---- API errors ----------------------------------------------------------------------------

#[test]
fn illegal_calls_are_typed_errors() {
    let mut t = Pair::new();
    let (l, a, p) = t.request();
    let ag = &mut t.nodes[1].agent;
    assert!(matches!(
        ag.accept(0, l, &AcceptParams::new(1, 1), &[]),
        Err(CmError::State {
            op: "accept",
            state: CmState::Listen,
            ..
        })
    ));
    assert!(matches!(
        ag.accept(0, p, &AcceptParams::new(1, 1), &[0; 197]),
        Err(CmError::PrivateData {
            max: 196,
            len: 197,
            ..
        })
    ));
    assert!(matches!(
        ag.accept(0, p, &AcceptParams::new(1 << 24, 1), &[]),
        Err(CmError::Param { name: "qpn", .. })
    ));
    let other = ag.create_id().expect("id");
    assert_eq!(
        ag.listen(other, SERVICE),
        Err(CmError::ServiceInUse(SERVICE))
    );
    assert!(matches!(
        ag.disconnect(0, p, &[]),
        Err(CmError::State {
            op: "disconnect",
            ..
        })
    ));
    // A refused call changed nothing: the request can still be accepted.
    assert_eq!(ag.state(p), Some(CmState::MraReqSent));
    let params = t.params(0, 1, 1);
    let ag0 = &mut t.nodes[0].agent;
    assert!(matches!(
        ag0.connect(0, a, &params, &[]),
        Err(CmError::State { .. })
    ));
}

// ---- SIDR ----------------------------------------------------------------------------------

#[test]
fn sidr_resolves_and_reports_missing_services() {
    let mut t = Pair::new();
    let l = t.nodes[1].agent.create_id().expect("id");
    t.nodes[1].agent.listen(l, SERVICE).expect("listen");
    let s = t.nodes[0].agent.create_id().expect("id");
    let to = t.nodes[1].gid;
    let params = SidrParams {
        service_id: SERVICE,
        pkey: 0xffff,
        timeout: 12,
        max_retries: 2,
    };
    t.nodes[0]
        .agent
        .sidr_request(0, s, to, &params, b"asking")
        .expect("sidr");
    t.deliver();
    let ev = t.take_events(1);
    let [
        CmEvent::SidrRequest {
            id,
            listener,
            service_id,
            peer,
            private_data,
        },
    ] = ev.as_slice()
    else {
        panic!("{ev:?}");
    };
    assert_eq!((*listener, *service_id), (l, SERVICE));
    assert_eq!(*peer, t.nodes[0].gid);
    assert_eq!(private_data.len(), 216, "the whole field, zero-padded");
    assert_eq!(&private_data[..6], b"asking");
    assert!(private_data[6..].iter().all(|&b| b == 0));
    // Too much private data is refused before anything is sent.
    assert!(matches!(
        t.nodes[1].agent.sidr_reply(
            *id,
            portverbs_cm::wire::SidrStatus::Success,
            0x42,
            0x0123_4567,
            &[0; 137],
        ),
        Err(CmError::PrivateData {
            msg: "SIDR_REP",
            len: 137,
            max: 136
        })
    ));
    let mut answer = [0u8; 136];
    answer[135] = 0xA5;
    t.nodes[1]
        .agent
        .sidr_reply(
            *id,
            portverbs_cm::wire::SidrStatus::Success,
            0x42,
            0x0123_4567,
            &answer,
        )
        .expect("reply");
    t.deliver();
    assert_eq!(
        t.take_events(0),
        [CmEvent::SidrResolved {
            id: s,
            status: portverbs_cm::wire::SidrStatus::Success,
            qpn: 0x42,
            qkey: 0x0123_4567,
            private_data: answer.to_vec(),
        }]
    );
    let params = SidrParams {
        service_id: 0x5,
        ..params
    };
    t.nodes[0]
        .agent
        .sidr_request(t.now, s, to, &params, &[])
        .expect("sidr");
    t.deliver();
    let ev = t.take_events(0);
    assert!(matches!(
        ev.as_slice(),
        [CmEvent::SidrResolved {
            status: portverbs_cm::wire::SidrStatus::ServiceNotSupported,
            ..
        }]
    ));
}

// ---- LAP / APR and stale REPs --------------------------------------------------------------

#[test]
fn lap_and_apr_are_ignored_as_on_a_linux_roce_port() {
    let mut t = Pair::new();
    let (_, a, p) = t.establish();
    let from = t.nodes[0].gid;
    for attr in [AttrId::Lap, AttrId::Apr] {
        let m = Mad::new(
            1,
            CmMessage::AltPath {
                attr,
                local_comm_id: a.comm_id(),
                remote_comm_id: p.comm_id(),
            },
        );
        t.nodes[1]
            .agent
            .handle_mad(t.now, from, &m.emit())
            .expect("parses");
    }
    t.drain(1);
    assert_eq!(
        t.sent(1, AttrId::Apr).len() + t.sent(1, AttrId::Rej).len(),
        0
    );
    assert!(t.take_events(1).is_empty());
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::Established));
    assert_eq!(t.nodes[1].agent.stats().unmatched, 2);
}

#[test]
fn a_rep_from_a_live_qp_is_rejected_as_stale() {
    let mut t = Pair::new();
    let (_, a, p) = t.establish();
    // A second connection whose REP names the passive QP of the live one.
    let b = t.nodes[0].agent.create_id().expect("id");
    let mut params = t.params(0, 0x12, 0x400);
    params.service_id = SERVICE;
    t.nodes[0]
        .agent
        .connect(t.now, b, &params, &[])
        .expect("connect");
    t.deliver();
    let ev = t.take_events(1);
    let [CmEvent::ConnectRequest { id: q, .. }] = ev.as_slice() else {
        panic!("{ev:?}");
    };
    t.nodes[1]
        .agent
        .accept(t.now, *q, &AcceptParams::new(0x22, 9), &[])
        .expect("accept");
    t.deliver();
    let rej = t.sent(0, AttrId::Rej);
    assert_eq!(rej_reason(&rej[0].1), Some(RejReason::StaleConnection));
    let CmMessage::Rej(r) = &rej[0].1.msg else {
        unreachable!()
    };
    assert_eq!(r.msg_rejected, MsgKind::Rep);
    let ev = t.take_shapes(0);
    assert!(
        ev.contains(&rejected(b, RejReason::StaleConnection)),
        "{ev:?}"
    );
    assert!(ev.contains(&CmEvent::Disconnected { id: a }), "{ev:?}");
    assert_eq!(t.nodes[0].agent.state(b), Some(CmState::Timewait));
    // The REJ reaches the passive side of the new connection.
    assert!(
        t.take_shapes(1)
            .contains(&rejected(*q, RejReason::StaleConnection))
    );
    let _ = p;
}

//! The agent against a lying peer (one that forges its source address and proposes any value
//! a field can hold), on virtual time: timers a peer proposes are clamped and every wait for
//! a peer ends, an unanswered request is withdrawn once its sender has given up, and
//! messages acting on a connection are taken only from the connection's peer.

mod common;

use common::{MS, Pair};
use portverbs_cm::wire::{AttrId, CmMessage, Drep, Dreq, Mad, Mra, MsgKind, Rej, RejReason, Rtu};
use portverbs_cm::{AcceptParams, CmEvent, CmState, QpTarget, SidrParams};
use portverbs_hal::Gid;

/// The longest a single wait on a peer-proposed timeout lasts: 2^15 ms (exponent 23).
const MAX_STEP: u64 = (1 << 15) * MS;
/// The longest the CM waits for a peer to answer one message: five minutes.
const MAX_WAIT: u64 = 300_000 * MS;

/// A stranger: neither node's address.
fn stranger() -> Gid {
    common::gid(9)
}

fn longest(t: &Pair) -> portverbs_cm::ConnectParams {
    let mut p = t.params(0, 0x11, 0x100);
    p.remote_cm_response_timeout = 31;
    p.local_cm_response_timeout = 31;
    p.path.packet_life_time = 31;
    p.max_cm_retries = 15;
    p
}

/// A REQ proposing every timeout at 31 (2^23 ms, 2.3 hours, by Linux's rounding) and 15
/// retries: the passive side retransmits its REP at most every 2^15 ms and gives up within
/// five minutes; the active side, whose own REQ waits as long, also gives up within five
/// minutes.
#[test]
fn the_longest_timers_a_peer_proposes_are_clamped() {
    let mut t = Pair::new();
    let listener = t.nodes[1].agent.create_id().expect("id");
    t.nodes[1]
        .agent
        .listen(listener, common::SERVICE)
        .expect("listen");
    let a = t.nodes[0].agent.create_id().expect("id");
    let p = longest(&t);
    t.nodes[0].agent.connect(0, a, &p, &[]).expect("connect");
    t.deliver();
    let ev = t.take_events(1);
    let [CmEvent::ConnectRequest { id, .. }] = ev.as_slice() else {
        panic!("{ev:?}");
    };
    let pid = *id;
    t.nodes[1]
        .agent
        .accept(t.now, pid, &AcceptParams::new(0x22, 2), &[])
        .expect("accept");
    // Node 0 never hears the REP; both sides give up within five minutes.
    t.run_until_if(MAX_WAIT, |to, _| to == 1);
    let reps = t.sent(1, AttrId::Rep);
    assert!(reps.len() > 1, "the REP is retransmitted");
    for w in reps.windows(2) {
        assert!(w[1].0 - w[0].0 <= MAX_STEP, "{} ms", (w[1].0 - w[0].0) / MS);
    }
    let unreachable = |n: usize, id| t.nodes[n].events.contains(&CmEvent::Unreachable { id });
    assert!(unreachable(1, pid), "the passive side gave up");
    assert!(unreachable(0, a), "the active side gave up");
    assert_eq!(t.nodes[1].agent.state(pid), Some(CmState::Idle));
}

/// The CM's own wait is bounded too: a REQ whose application asked for the longest timers
/// (its first retransmission would come after 7 hours) is given up within five minutes.
#[test]
fn no_wait_for_a_peer_lasts_more_than_five_minutes() {
    let mut t = Pair::new();
    let a = t.nodes[0].agent.create_id().expect("id");
    let p = longest(&t);
    t.nodes[0].agent.connect(0, a, &p, &[]).expect("connect");
    t.run_until_if(MAX_WAIT, |_, _| false);
    assert_eq!(t.take_events(0), [CmEvent::Unreachable { id: a }]);
    assert_eq!(t.nodes[0].agent.poll_timeout(), None);
}

/// An MRA asking for 2^23 ms more is granted 2^15 ms at most.
#[test]
fn an_mra_cannot_stretch_a_wait_for_hours() {
    let mut t = Pair::new();
    let a = t.nodes[0].agent.create_id().expect("id");
    let p = t.params(0, 0x11, 1);
    t.nodes[0].agent.connect(0, a, &p, &[]).expect("connect");
    t.drain(0);
    t.wire.clear();
    let mra = Mad::new(
        7,
        CmMessage::Mra(Mra {
            local_comm_id: 0x5151_5151,
            remote_comm_id: a.comm_id(),
            msg_mraed: MsgKind::Req,
            service_timeout: 31,
            private_data: [0; 222],
        }),
    )
    .emit();
    let from = t.nodes[1].gid;
    t.nodes[0].agent.handle_mad(t.now, from, &mra).expect("ok");
    assert_eq!(t.nodes[0].agent.state(a), Some(CmState::MraReqRcvd));
    let due = t.nodes[0].agent.poll_timeout().expect("timer");
    // The service timeout (clamped) plus the path's ACK timeout (11: 8 ms).
    assert!(due <= t.now + MAX_STEP + 8 * MS, "{} ms", due / MS);
}

/// A connection whose peer proposed a local ACK timeout of 31 leaves TIMEWAIT within 2^15 ms,
/// and its QP's ACK timeout is clamped as well.
#[test]
fn timewait_and_the_qp_timeout_are_clamped() {
    let mut t = Pair::new();
    let listener = t.nodes[1].agent.create_id().expect("id");
    t.nodes[1]
        .agent
        .listen(listener, common::SERVICE)
        .expect("listen");
    let a = t.nodes[0].agent.create_id().expect("id");
    let mut p = longest(&t);
    p.remote_cm_response_timeout = 14;
    p.local_cm_response_timeout = 13;
    p.max_cm_retries = 3;
    t.nodes[0].agent.connect(0, a, &p, &[]).expect("connect");
    t.deliver();
    let ev = t.take_events(1);
    let [CmEvent::ConnectRequest { id: pid, .. }] = ev.as_slice() else {
        panic!("{ev:?}");
    };
    let pid = *pid;
    t.nodes[1]
        .agent
        .accept(t.now, pid, &AcceptParams::new(0x22, 2), &[])
        .expect("accept");
    t.deliver();
    let rts = t.nodes[1]
        .qp
        .iter()
        .find_map(|q| match q.target {
            QpTarget::Rts(r) => Some(r),
            _ => None,
        })
        .expect("RTS");
    assert!(rts.timeout <= 23, "QP timeout {}", rts.timeout);
    t.nodes[1].agent.disconnect(t.now, pid, &[]).expect("dreq");
    t.deliver();
    // Node 0 answers (its application disconnects too): node 1 enters TIMEWAIT.
    t.nodes[0].agent.disconnect(t.now, a, &[]).expect("drep");
    t.deliver();
    assert_eq!(t.nodes[1].agent.state(pid), Some(CmState::Timewait));
    let due = t.nodes[1].agent.poll_timeout().expect("TIMEWAIT");
    assert!(due <= t.now + MAX_STEP, "{} ms", (due - t.now) / MS);
}

/// A request nobody answers (the sender vanished, or never existed: a forged REQ) is
/// withdrawn once its sender has given up, as if its REJ Timeout had come: the listener's
/// backlog does not keep it forever.
#[test]
fn an_unanswered_request_is_withdrawn_when_its_sender_gave_up() {
    let mut t = Pair::new();
    let (_, _, p) = t.request();
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::MraReqSent));
    // Node 0 vanishes: nothing it sends arrives any more.
    t.run_until_if(10_000 * MS, |to, _| to == 0);
    assert_eq!(
        t.take_events(1),
        [CmEvent::Rejected {
            id: p,
            reason: RejReason::Timeout,
            private_data: Vec::new()
        }]
    );
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::Idle));
    assert_eq!(t.nodes[1].agent.stats().withdrawn, 1);
    // The sender's budget: (2·4 + 64 ms) × (3 retries + 1) = 288 ms, plus nothing for the
    // MRA it was never sent.
    assert_eq!(t.nodes[1].agent.poll_timeout(), None);
}

/// A SIDR_REQ nobody answers is withdrawn after the CM's longest wait for a peer (its sender
/// proposes no timeout): a forged one does not hold a UDP listener's backlog for ever.
#[test]
fn an_unanswered_sidr_request_is_withdrawn() {
    let mut t = Pair::new();
    let l = t.nodes[1].agent.create_id().expect("id");
    t.nodes[1].agent.listen(l, common::SERVICE).expect("listen");
    let s = t.nodes[0].agent.create_id().expect("id");
    let to = t.nodes[1].gid;
    let params = SidrParams {
        service_id: common::SERVICE,
        pkey: 0xffff,
        timeout: 12,
        max_retries: 0,
    };
    t.nodes[0]
        .agent
        .sidr_request(0, s, to, &params, &[])
        .expect("sidr");
    t.deliver();
    let ev = t.take_events(1);
    let [CmEvent::SidrRequest { id, .. }] = ev.as_slice() else {
        panic!("{ev:?}");
    };
    let id = *id;
    t.run_until(MAX_WAIT - 1);
    assert_eq!(t.nodes[1].agent.state(id), Some(CmState::SidrReqRcvd));
    t.run_until(MAX_WAIT);
    assert_eq!(
        t.take_events(1),
        [CmEvent::Rejected {
            id,
            reason: RejReason::Timeout,
            private_data: Vec::new()
        }]
    );
    assert_eq!(t.nodes[1].agent.state(id), Some(CmState::Idle));
}

/// Messages that act on a live connection, with the right communication IDs, from another
/// address than the peer's, change nothing; the same DREQ from the peer disconnects.
#[test]
fn only_the_peer_acts_on_a_connection() {
    let mut t = Pair::new();
    let (_, a, p) = t.establish();
    let (ia, ip) = (a.comm_id(), p.comm_id());
    let mads = [
        CmMessage::Dreq(Dreq {
            local_comm_id: ia,
            remote_comm_id: ip,
            remote_qpn: 0x22,
            private_data: [0; 220],
        }),
        CmMessage::Drep(Drep {
            local_comm_id: ia,
            remote_comm_id: ip,
            private_data: [0; 224],
        }),
        CmMessage::Rej(Rej {
            local_comm_id: ia,
            remote_comm_id: ip,
            msg_rejected: MsgKind::Other,
            ari_len: 0,
            reason: RejReason::ConsumerReject,
            ari: [0; 72],
            private_data: [0; 148],
        }),
        CmMessage::Rtu(Rtu {
            local_comm_id: ia,
            remote_comm_id: ip,
            private_data: [0; 224],
        }),
    ];
    for m in &mads {
        let bytes = Mad::new(3, m.clone()).emit();
        t.nodes[1]
            .agent
            .handle_mad(t.now, stranger(), &bytes)
            .expect("well-formed");
        t.drain(1);
        assert_eq!(
            t.nodes[1].agent.state(p),
            Some(CmState::Established),
            "{m:?}"
        );
        assert!(
            t.wire.is_empty(),
            "nothing answers the stranger: {:?}",
            t.wire
        );
        assert!(t.take_events(1).is_empty());
    }
    assert_eq!(t.nodes[1].agent.stats().foreign_source, mads.len() as u64);
    let bytes = Mad::new(3, mads[0].clone()).emit();
    let peer = t.nodes[0].gid;
    t.nodes[1]
        .agent
        .handle_mad(t.now, peer, &bytes)
        .expect("ok");
    t.drain(1);
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::DreqRcvd));
    assert_eq!(t.take_events(1), [CmEvent::Disconnected { id: p }]);
}

/// A REQ naming a live connection's QPN and CA GUID is stale only when it comes from that
/// connection's peer: from a stranger it tears nothing down.
#[test]
fn a_stale_req_from_a_stranger_tears_nothing_down() {
    let mut t = Pair::new();
    let (_, a, p) = t.establish();
    let b = t.nodes[0].agent.create_id().expect("id");
    let params = t.params(0, 0x11, 0x300);
    t.nodes[0]
        .agent
        .connect(t.now, b, &params, &[])
        .expect("connect");
    t.drain(0);
    let (_, req) = t.wire.pop_back().expect("the REQ");
    t.wire.clear();
    t.nodes[1]
        .agent
        .handle_mad(t.now, stranger(), &req)
        .expect("ok");
    t.drain(1);
    assert_eq!(t.nodes[1].agent.state(p), Some(CmState::Established));
    assert!(t.sent(1, AttrId::Dreq).is_empty());
    assert!(t.take_events(1).is_empty());
    assert_eq!(t.nodes[1].agent.stats().foreign_source, 1);
    let _ = a;
}

/// A DREP that reaches an established connection from its peer means the peer's side is
/// gone (it answered a DREQ sent in our name): the connection is torn down and its owner
/// hears DISCONNECTED instead of waiting forever.
#[test]
fn a_drep_from_the_peer_ends_an_established_connection() {
    let mut t = Pair::new();
    let (_, a, p) = t.establish();
    let drep = Mad::new(
        3,
        CmMessage::Drep(Drep {
            local_comm_id: p.comm_id(),
            remote_comm_id: a.comm_id(),
            private_data: [0; 224],
        }),
    )
    .emit();
    let peer = t.nodes[1].gid;
    t.nodes[0].agent.handle_mad(t.now, peer, &drep).expect("ok");
    t.drain(0);
    assert_eq!(t.take_events(0), [CmEvent::Disconnected { id: a }]);
    assert_eq!(
        t.nodes[0].qp.last().map(|q| q.target),
        Some(QpTarget::Error)
    );
    assert_eq!(t.nodes[0].agent.state(a), Some(CmState::Timewait));
}

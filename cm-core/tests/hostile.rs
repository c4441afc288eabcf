//! The agent against a lying peer, on virtual time (DESIGN §3 decision 12): messages acting
//! on a connection are taken only from the connection's peer.

mod common;

use common::Pair;
use portverbs_cm::wire::{AttrId, CmMessage, Drep, Dreq, Mad, MsgKind, Rej, RejReason, Rtu};
use portverbs_cm::{CmEvent, CmState, QpTarget};
use portverbs_hal::Gid;

/// A stranger: neither node's address.
fn stranger() -> Gid {
    common::gid(9)
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

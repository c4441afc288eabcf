//! Arbitrary bytes never panic the MAD parser or the agent, and whatever parses is emitted
//! canonically: parse → emit → parse gives the same message.

use portverbs_cm::wire::{AttrId, CmMessage, Mad};
use portverbs_cm::{AgentConfig, CmAgent, CmEvent, CmOutput, ConnectParams, PathParams};
use portverbs_hal::Gid;
use proptest::prelude::*;

/// 256 bytes that pass the header checks most of the time, so the message parsers are reached.
fn cm_mad() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(any::<u8>(), 256),
        0x0010u16..=0x001b,
        any::<bool>(),
    )
        .prop_map(|(mut b, attr, fix)| {
            if fix {
                b[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
                b[16..18].copy_from_slice(&attr.to_be_bytes());
            }
            b
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn any_length_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = Mad::parse(&bytes);
    }

    #[test]
    fn what_parses_round_trips(bytes in cm_mad()) {
        if let Ok(mad) = Mad::parse(&bytes) {
            let again = Mad::parse(&mad.emit());
            prop_assert_eq!(again.as_ref(), Ok(&mad));
            prop_assert!(AttrId::from_u16(u16::from_be_bytes([bytes[16], bytes[17]])).is_some());
        }
    }

    /// The body of the `cm_mad` fuzz target (fuzz/), on stable: an agent with a listener and
    /// an active connection fed arbitrary MADs frees everything once destroyed.
    #[test]
    fn the_agent_frees_everything_after_any_mads(mads in proptest::collection::vec(cm_mad(), 1..12)) {
        let peer = Gid([9; 16]);
        let mut agent = CmAgent::new(AgentConfig::new(1, 0x5eed));
        let listener = agent.create_id().expect("id");
        let active = agent.create_id().expect("id");
        let mut ids = vec![listener, active];
        let params = ConnectParams::new(7, 0x11, 0, PathParams::roce(Gid([1; 16]), peer));
        agent.connect(0, active, &params, &[]).expect("connect");
        let mut now = 0;
        for (i, mad) in mads.iter().enumerate() {
            if let Ok(Mad { msg: CmMessage::Req(r), .. }) = Mad::parse(mad) {
                let _ = agent.listen(listener, r.service_id);
            }
            now = i as u64 * 1_000_000;
            let _ = agent.handle_mad(now, peer, mad);
            agent.handle_timeout(now);
            while let Some(out) = agent.poll_output() {
                match out {
                    CmOutput::Event(CmEvent::ConnectRequest { id, .. })
                    | CmOutput::Event(CmEvent::SidrRequest { id, .. }) => ids.push(id),
                    _ => {}
                }
            }
        }
        for id in ids {
            let _ = agent.destroy(now, id);
        }
        while let Some(t) = agent.poll_timeout() {
            agent.handle_timeout(t);
        }
        prop_assert_eq!(agent.live_endpoints(), 0);
        prop_assert_eq!(agent.map_entries(), 0);
    }

    #[test]
    fn the_agent_survives_any_mad(mads in proptest::collection::vec(cm_mad(), 1..20)) {
        let mut agent = CmAgent::new(AgentConfig::new(1, 0));
        let l = agent.create_id().expect("id");
        // A listener on the service ID of every REQ, so REQs reach the state machine.
        for b in &mads {
            if let Ok(Mad { msg: portverbs_cm::wire::CmMessage::Req(r), .. }) = Mad::parse(b) {
                let _ = agent.listen(l, r.service_id);
                break;
            }
        }
        for (i, b) in mads.iter().enumerate() {
            let _ = agent.handle_mad(i as u64, Gid([7; 16]), b);
            while agent.poll_output().is_some() {}
        }
        agent.handle_timeout(u64::MAX);
        while agent.poll_output().is_some() {}
    }
}

//! Arbitrary bytes never panic the MAD parser or the agent, and whatever parses is emitted
//! canonically: parse → emit → parse gives the same message.

use portverbs_cm::wire::{AttrId, Mad};
use portverbs_cm::{AgentConfig, CmAgent};
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

//! Arbitrary bytes as CM MADs from the wire. The parser must not panic, and a MAD it accepts
//! must emit canonically (parse ∘ emit ∘ parse = parse). The same bytes, cut into 256-byte
//! MADs, then drive a CM agent with a listener and an active connection: it must not panic,
//! and once every timer has run, destroying every endpoint leaves its tables empty.
#![no_main]

use libfuzzer_sys::fuzz_target;
use portverbs_cm::wire::{CmMessage, MAD_LEN, Mad};
use portverbs_cm::{AgentConfig, CmAgent, CmEvent, CmOutput, ConnectParams, PathParams};
use portverbs_hal::Gid;

fuzz_target!(|data: &[u8]| {
    if let Ok(mad) = Mad::parse(data) {
        let again = Mad::parse(&mad.emit()).expect("our own MAD parses");
        assert_eq!(again, mad);
    }
    let peer = Gid([9; 16]);
    let mut agent = CmAgent::new(AgentConfig::new(1, 0x5eed));
    let mut ids = Vec::new();
    let listener = agent.create_id().expect("id");
    ids.push(listener);
    let active = agent.create_id().expect("id");
    ids.push(active);
    let path = PathParams::roce(Gid([1; 16]), peer);
    let params = ConnectParams::new(7, 0x11, 0, path);
    agent.connect(0, active, &params, &[]).expect("connect");
    let mut listening = false;
    let mut now = 0;
    for (i, chunk) in data.chunks(MAD_LEN).enumerate() {
        let mut mad = [0u8; MAD_LEN];
        mad[..chunk.len()].copy_from_slice(chunk);
        // Reach the state machine: a valid CM header unless the input says otherwise.
        if chunk.first() != Some(&0xff) {
            mad[..4].copy_from_slice(&[1, 0x07, 2, 0x03]);
        }
        if let (
            false,
            Ok(Mad {
                msg: CmMessage::Req(r),
                ..
            }),
        ) = (listening, Mad::parse(&mad))
        {
            listening = agent.listen(listener, r.service_id).is_ok();
        }
        now = i as u64 * 1_000_000;
        let _ = agent.handle_mad(now, peer, &mad);
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
    while agent.poll_output().is_some() {}
    assert_eq!(agent.live_endpoints(), 0);
    assert_eq!(agent.map_entries(), 0);
});

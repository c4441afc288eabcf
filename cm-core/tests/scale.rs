//! CM state at scale, as far as the protocol core goes: CM state per connection stays under
//! 2 KiB with thousands of connections, and establishing and tearing them down leaves nothing.
//! `many_connections_release` (ignored, run with `--release -- --ignored --nocapture`) prints
//! the rate and the footprint at 1 000, 10 000 and 100 000 connections; no test asserts a
//! time.

use std::collections::VecDeque;
use std::time::Instant;

use portverbs_cm::{
    AcceptParams, AgentConfig, CmAgent, CmEvent, CmOutput, ConnectParams, PathParams,
};
use portverbs_hal::Gid;

const SERVICE: u64 = 0x0106_0001;

struct Two {
    agents: [CmAgent; 2],
    gids: [Gid; 2],
    wire: VecDeque<(usize, [u8; 256])>,
    events: [Vec<CmEvent>; 2],
}

impl Two {
    fn new() -> Self {
        let cfg = |n| {
            let mut c = AgentConfig::new(n, n as u32 * 0x1234_5678);
            c.request_mra_timeout = None;
            CmAgent::new(c)
        };
        Self {
            agents: [cfg(1), cfg(2)],
            gids: [Gid([1; 16]), Gid([2; 16])],
            wire: VecDeque::new(),
            events: [Vec::new(), Vec::new()],
        }
    }

    fn pump(&mut self, now: u64) {
        loop {
            for n in 0..2 {
                while let Some(o) = self.agents[n].poll_output() {
                    match o {
                        CmOutput::Send(m) => {
                            let to = usize::from(m.to == self.gids[1]);
                            self.wire.push_back((to, m.mad));
                        }
                        CmOutput::Event(e) => self.events[n].push(e),
                        CmOutput::Qp(_) => {}
                    }
                }
            }
            let Some((to, mad)) = self.wire.pop_front() else {
                break;
            };
            let from = self.gids[1 - to];
            self.agents[to].handle_mad(now, from, &mad).expect("parses");
        }
    }
}

/// Establishes `count` connections (REQ, REP, RTU each), then disconnects and destroys them;
/// returns the CM state bytes per connection of each agent at the peak.
fn run(count: u32) -> [usize; 2] {
    let mut t = Two::new();
    let l = t.agents[1].create_id().expect("id");
    t.agents[1].listen(l, SERVICE).expect("listen");
    let path = PathParams::roce(t.gids[0], t.gids[1]);
    let mut active = Vec::new();
    for i in 0..count {
        let id = t.agents[0].create_id().expect("id");
        let p = ConnectParams::new(SERVICE, 0x100 + i, i, path);
        t.agents[0].connect(0, id, &p, &[]).expect("connect");
        active.push(id);
        t.pump(0);
        for ev in std::mem::take(&mut t.events[1]) {
            if let CmEvent::ConnectRequest { id, .. } = ev {
                let a = AcceptParams::new(0x10_0000 + i, i);
                t.agents[1].accept(0, id, &a, &[]).expect("accept");
            }
        }
        t.pump(0);
    }
    let established = t.events[0]
        .iter()
        .filter(|e| matches!(e, CmEvent::Established { .. }))
        .count();
    assert_eq!(established, count as usize);
    let per = [0, 1].map(|n| t.agents[n].state_bytes() / t.agents[n].live_endpoints());
    for id in active {
        t.agents[0].disconnect(1, id, &[]).expect("disconnect");
        t.pump(1);
    }
    let passive: Vec<_> = t.events[1]
        .iter()
        .filter_map(|e| match e {
            CmEvent::Disconnected { id } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(passive.len(), count as usize);
    for id in passive {
        t.agents[1].destroy(1, id).expect("destroy");
    }
    t.pump(1);
    let ids: Vec<_> = t.events[0]
        .iter()
        .filter_map(|e| match e {
            CmEvent::Established { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    for id in ids {
        t.agents[0].destroy(1, id).expect("destroy");
    }
    t.agents[1].destroy(1, l).expect("destroy");
    for n in 0..2 {
        while let Some(due) = t.agents[n].poll_timeout() {
            t.agents[n].handle_timeout(due);
        }
    }
    t.pump(u64::MAX / 2);
    for n in 0..2 {
        assert_eq!(t.agents[n].live_endpoints(), 0);
        assert_eq!(t.agents[n].map_entries(), 0);
    }
    per
}

#[test]
fn ten_thousand_connections_stay_under_2_kib_each() {
    let per = run(10_000);
    for bytes in per {
        assert!(bytes <= 2048, "{bytes} bytes of CM state per connection");
    }
}

#[test]
#[ignore = "a measurement: run with --release -- --ignored --nocapture"]
fn many_connections_release() {
    // How the rate and the footprint grow from 1 000 to 100 000 connections held at once.
    for n in [1_000u32, 10_000, 100_000] {
        let start = Instant::now();
        let per = run(n);
        let secs = start.elapsed().as_secs_f64();
        eprintln!(
            "{n:>6} connections established, disconnected and destroyed in {secs:.3} s \
             ({:.0} connections/s, both agents on one core); CM state per connection: \
             active {} B, passive {} B",
            f64::from(n) / secs,
            per[0],
            per[1]
        );
    }
}

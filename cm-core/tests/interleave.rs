//! Random interleavings at protocol level: 1 000 seeded runs of two or three agents exchanging MADs
//! through an in-memory network that loses, duplicates, delays and reorders them, while a
//! random application connects, accepts, rejects, disconnects, destroys and lets timers run.
//!
//! Checked on every run: nothing panics; virtual time stays bounded (no hang); every
//! `connect`/`accept` ends in exactly one of Established, Rejected or Unreachable unless it was
//! destroyed first; every successful `disconnect` gets exactly one Disconnected unless
//! destroyed first; no event for a destroyed endpoint; and once everything is destroyed and
//! TIMEWAIT is over, every agent's tables are empty. `PORTVERBS_CM_SEEDS=50000` runs more
//! seeds (about 4 s in a release build).

use std::collections::{BTreeMap, BinaryHeap};

use portverbs_cm::wire::MAD_LEN;
use portverbs_cm::{
    AcceptParams, AgentConfig, CmAgent, CmError, CmEvent, CmId, CmOutput, CmState, ConnectParams,
    PathParams, QpTarget,
};
use portverbs_hal::Gid;

const MS: u64 = 1_000_000;
const SERVICE: u64 = 0x0000_0000_0106_4e20;
/// Seeds per run; `PORTVERBS_CM_SEEDS` raises it for a longer hunt.
fn seeds() -> u64 {
    std::env::var("PORTVERBS_CM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000)
}

/// splitmix64: small, seedable, good enough to pick actions.
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What the test knows about one endpoint it owns.
#[derive(Debug, Default)]
struct Track {
    listener: bool,
    /// `connect` or `accept` succeeded.
    asked: bool,
    outcomes: u32,
    established: bool,
    /// destroyed while the connect/accept had no outcome yet.
    outcome_cancelled: bool,
    disconnect_called: bool,
    disconnected: u32,
    disconnect_cancelled: bool,
    /// A ConnectRequest not answered yet.
    request_pending: bool,
    destroyed: bool,
}

#[derive(Debug)]
struct Packet {
    at: u64,
    seq: u64,
    to: usize,
    from: Gid,
    mad: [u8; MAD_LEN],
}

impl PartialEq for Packet {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Packet {}
impl PartialOrd for Packet {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Packet {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        // Min-heap on (time, sequence).
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Debug)]
struct Sim {
    rng: Rng,
    now: u64,
    agents: Vec<CmAgent>,
    gids: Vec<Gid>,
    tracks: Vec<BTreeMap<CmId, Track>>,
    net: BinaryHeap<Packet>,
    seq: u64,
    loss: u64,
    dup: u64,
    max_delay_us: u64,
    next_qpn: u32,
    stats: Stats,
}

#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    established: u64,
    rejected: u64,
    unreachable: u64,
    disconnected: u64,
    destroyed: u64,
    mads: u64,
    retransmits: u64,
    duplicates: u64,
    unmatched: u64,
}

fn gid(n: usize) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[15] = n as u8 + 1;
    Gid(g)
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let n = 2 + rng.below(2) as usize;
        let mut agents = Vec::new();
        for i in 0..n {
            let mut cfg = AgentConfig::new(0x1000 + i as u64, rng.next() as u32);
            cfg.request_mra_timeout = if rng.chance(50) { Some(12) } else { None };
            agents.push(CmAgent::new(cfg));
        }
        let loss = rng.below(31);
        let dup = rng.below(10);
        let max_delay_us = 50 + rng.below(3000);
        Self {
            rng,
            now: 0,
            agents,
            gids: (0..n).map(gid).collect(),
            tracks: (0..n).map(|_| BTreeMap::new()).collect(),
            net: BinaryHeap::new(),
            seq: 0,
            loss,
            dup,
            max_delay_us,
            next_qpn: 0x100,
            stats: Stats::default(),
        }
    }

    fn transmit(&mut self, from: usize, to_gid: Gid, mad: [u8; MAD_LEN]) {
        self.stats.mads += 1;
        let to = self
            .gids
            .iter()
            .position(|g| *g == to_gid)
            .expect("known peer");
        let copies = if self.rng.chance(self.dup) { 2 } else { 1 };
        for _ in 0..copies {
            if self.rng.chance(self.loss) {
                continue;
            }
            let at = self.now + 1_000 * (1 + self.rng.below(self.max_delay_us));
            self.seq += 1;
            self.net.push(Packet {
                at,
                seq: self.seq,
                to,
                from: self.gids[from],
                mad,
            });
        }
    }

    fn track(&mut self, n: usize, id: CmId) -> &mut Track {
        self.tracks[n]
            .get_mut(&id)
            .unwrap_or_else(|| panic!("event for an endpoint the application never saw: {id:?}"))
    }

    /// Drains agent `n`'s outputs, checking every event against the application's view.
    fn drain(&mut self, n: usize) {
        while let Some(out) = self.agents[n].poll_output() {
            match out {
                CmOutput::Send(m) => self.transmit(n, m.to, m.mad),
                CmOutput::Qp(q) => {
                    let t = self.track(n, q.id);
                    assert!(!t.destroyed, "QP action for a destroyed endpoint");
                    if let QpTarget::Rtr(a) = q.target {
                        assert!(a.dest_qpn >= 0x100);
                    }
                }
                CmOutput::Event(ev) => self.on_event(n, ev),
            }
        }
    }

    fn on_event(&mut self, n: usize, ev: CmEvent) {
        match ev {
            CmEvent::ConnectRequest { id, request } => {
                assert!(self.tracks[n][&request.listener].listener);
                let fresh = self.tracks[n].insert(
                    id,
                    Track {
                        request_pending: true,
                        ..Track::default()
                    },
                );
                assert!(fresh.is_none(), "an ID handed out twice: {id:?}");
                // Half the servers answer at once, like an rdma_cm accept in the callback.
                if self.rng.chance(50) {
                    let qpn = self.next_qpn;
                    self.next_qpn += 1;
                    let now = self.now;
                    self.agents[n]
                        .accept(now, id, &AcceptParams::new(qpn, 7), b"at once")
                        .expect("accept right after the request");
                    let t = self.track(n, id);
                    t.request_pending = false;
                    t.asked = true;
                }
            }
            CmEvent::Established { id, .. } => {
                self.stats.established += 1;
                let t = self.track(n, id);
                assert!(
                    !t.destroyed && t.asked,
                    "Established without connect/accept"
                );
                t.outcomes += 1;
                t.established = true;
                assert_eq!(t.outcomes, 1, "second outcome for {id:?}");
            }
            CmEvent::Rejected { id, .. } => {
                self.stats.rejected += 1;
                let t = self.track(n, id);
                assert!(!t.destroyed);
                if t.asked {
                    t.outcomes += 1;
                    assert_eq!(t.outcomes, 1, "second outcome for {id:?}");
                } else {
                    // The peer withdrew a request we had not answered.
                    assert!(t.request_pending);
                    t.request_pending = false;
                }
            }
            CmEvent::Unreachable { id } => {
                self.stats.unreachable += 1;
                let t = self.track(n, id);
                assert!(!t.destroyed && t.asked);
                t.outcomes += 1;
                assert_eq!(t.outcomes, 1, "second outcome for {id:?}");
            }
            CmEvent::Disconnected { id } => {
                self.stats.disconnected += 1;
                let t = self.track(n, id);
                assert!(
                    !t.destroyed && t.established,
                    "Disconnected before Established"
                );
                t.disconnected += 1;
                assert_eq!(t.disconnected, 1, "second Disconnected for {id:?}");
            }
            CmEvent::TimewaitExit { id } => {
                let t = self.track(n, id);
                assert!(!t.destroyed);
            }
            other => panic!("unexpected event {other:?}"),
        }
    }

    /// Runs the network and the timers up to `until`, in time order.
    fn run_to(&mut self, until: u64) {
        loop {
            let next_packet = self.net.peek().map(|p| p.at);
            let next_timer = (0..self.agents.len())
                .filter_map(|n| self.agents[n].poll_timeout())
                .min();
            let next = match (next_packet, next_timer) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => match a.or(b) {
                    Some(t) => t,
                    None => break,
                },
            };
            if next > until {
                break;
            }
            self.now = self.now.max(next);
            if next_packet == Some(next) {
                let p = self.net.pop().expect("peeked");
                let r = self.agents[p.to].handle_mad(self.now, p.from, &p.mad);
                assert!(r.is_ok(), "our own MADs parse: {r:?}");
                self.drain(p.to);
            } else {
                for n in 0..self.agents.len() {
                    self.agents[n].handle_timeout(self.now);
                    self.drain(n);
                }
            }
        }
        self.now = self.now.max(until);
    }

    fn params(&mut self, from: usize, to: usize) -> ConnectParams {
        let mut path = PathParams::roce(self.gids[from], self.gids[to]);
        path.packet_life_time = 8; // 1 ms
        let qpn = self.next_qpn;
        self.next_qpn += 1;
        let service = if self.rng.chance(5) { 0x42 } else { SERVICE };
        let mut p = ConnectParams::new(service, qpn, self.rng.below(1 << 24) as u32, path);
        p.remote_cm_response_timeout = 10; // 4 ms
        p.local_cm_response_timeout = 9; // 2 ms
        p.max_cm_retries = 1 + self.rng.below(4) as u8;
        p
    }

    fn pick(&mut self, n: usize, want: impl Fn(&Track) -> bool) -> Option<CmId> {
        let ids: Vec<CmId> = self.tracks[n]
            .iter()
            .filter(|(_, t)| !t.destroyed && want(t))
            .map(|(id, _)| *id)
            .collect();
        if ids.is_empty() {
            return None;
        }
        let i = self.rng.below(ids.len() as u64) as usize;
        Some(ids[i])
    }

    fn destroy(&mut self, n: usize, id: CmId) {
        let now = self.now;
        self.agents[n]
            .destroy(now, id)
            .expect("destroy of a live endpoint");
        self.stats.destroyed += 1;
        let t = self.track(n, id);
        t.destroyed = true;
        if t.asked && t.outcomes == 0 {
            t.outcome_cancelled = true;
        }
        if t.disconnect_called && t.disconnected == 0 {
            t.disconnect_cancelled = true;
        }
        self.drain(n);
    }

    /// One random application action.
    fn act(&mut self) {
        let n = self.rng.below(self.agents.len() as u64) as usize;
        let now = self.now;
        match self.rng.below(10) {
            0..=2 => {
                let to = (n + 1 + self.rng.below(self.agents.len() as u64 - 1) as usize)
                    % self.agents.len();
                let p = self.params(n, to);
                let id = self.agents[n].create_id().expect("id");
                self.tracks[n].insert(id, Track::default());
                self.agents[n]
                    .connect(now, id, &p, b"req")
                    .expect("connect from IDLE");
                self.track(n, id).asked = true;
                self.drain(n);
            }
            3..=4 => {
                let Some(id) = self.pick(n, |t| t.request_pending) else {
                    return;
                };
                self.track(n, id).request_pending = false;
                let r = match self.rng.below(4) {
                    0 => self.agents[n].reject(now, id, b"no"),
                    1 => {
                        self.destroy(n, id);
                        Ok(())
                    }
                    _ => {
                        let qpn = self.next_qpn;
                        self.next_qpn += 1;
                        let r = self.agents[n].accept(now, id, &AcceptParams::new(qpn, 7), &[]);
                        if r.is_ok() {
                            self.track(n, id).asked = true;
                        }
                        r
                    }
                };
                // The peer may have withdrawn the request meanwhile (REJ Timeout): then
                // accept/reject are refused with a state error and nothing changes.
                match r {
                    Ok(()) | Err(CmError::State { .. }) => {}
                    Err(e) => panic!("{e}"),
                }
                self.drain(n);
            }
            5..=6 => {
                let Some(id) = self.pick(n, |t| t.established) else {
                    return;
                };
                match self.agents[n].disconnect(now, id, &[]) {
                    Ok(()) => self.track(n, id).disconnect_called = true,
                    Err(CmError::State { state, .. }) => {
                        assert!(!matches!(state, CmState::Established | CmState::DreqRcvd));
                    }
                    Err(e) => panic!("{e}"),
                }
                self.drain(n);
            }
            7 => {
                if let Some(id) = self.pick(n, |t| !t.listener) {
                    self.destroy(n, id);
                }
            }
            _ => {
                // Let time pass.
                let dt = self.rng.below(20) * MS;
                self.run_to(now + dt);
            }
        }
    }
}

fn run(seed: u64) -> Stats {
    let mut sim = Sim::new(seed);
    for n in 0..sim.agents.len() {
        let l = sim.agents[n].create_id().expect("id");
        sim.agents[n].listen(l, SERVICE).expect("listen");
        sim.tracks[n].insert(
            l,
            Track {
                listener: true,
                ..Track::default()
            },
        );
    }
    let steps = 20 + sim.rng.below(60);
    for _ in 0..steps {
        sim.act();
        let dt = sim.rng.below(3) * MS;
        let until = sim.now + dt;
        sim.run_to(until);
    }
    // Settle: no new calls for a long while, so every operation in flight must complete on
    // its own (answers, retries, MRA-extended timers), none being excused by a destroy.
    let settle = sim.now + 20_000 * MS;
    sim.run_to(settle);
    for (n, tracks) in sim.tracks.iter().enumerate() {
        for (id, t) in tracks.iter().filter(|(_, t)| !t.destroyed) {
            if t.asked {
                assert_eq!(
                    t.outcomes, 1,
                    "seed {seed}: agent {n} {id:?} unfinished: {t:?}"
                );
            }
            if t.disconnect_called {
                assert_eq!(t.disconnected, 1, "seed {seed}: agent {n} {id:?}: {t:?}");
            }
        }
    }
    // Tear everything down at random moments while traffic still flows.
    loop {
        let live: Vec<(usize, CmId)> = (0..sim.agents.len())
            .flat_map(|n| {
                sim.tracks[n]
                    .iter()
                    .filter(|(_, t)| !t.destroyed)
                    .map(move |(id, _)| (n, *id))
                    .collect::<Vec<_>>()
            })
            .collect();
        if live.is_empty() {
            break;
        }
        let (n, id) = live[sim.rng.below(live.len() as u64) as usize];
        sim.destroy(n, id);
        let until = sim.now + sim.rng.below(5) * MS;
        sim.run_to(until);
    }
    // Quiesce: TIMEWAITs and in-flight MADs. Bounded virtual time: no hang.
    let deadline = sim.now + 60_000 * MS;
    sim.run_to(deadline);
    assert!(
        sim.net.is_empty(),
        "seed {seed}: traffic after a minute of virtual time"
    );
    for agent in &sim.agents {
        let st = agent.stats();
        sim.stats.retransmits += st.retransmits;
        sim.stats.duplicates += st.duplicates;
        sim.stats.unmatched += st.unmatched;
    }
    for (n, agent) in sim.agents.iter_mut().enumerate() {
        assert_eq!(
            agent.poll_timeout(),
            None,
            "seed {seed}: agent {n} still has timers"
        );
        assert_eq!(
            agent.live_endpoints(),
            0,
            "seed {seed}: agent {n} leaked endpoints"
        );
        assert_eq!(
            agent.map_entries(),
            0,
            "seed {seed}: agent {n} leaked lookup keys"
        );
    }
    for (n, tracks) in sim.tracks.iter().enumerate() {
        for (id, t) in tracks {
            if t.asked {
                assert_eq!(
                    t.outcomes + u32::from(t.outcome_cancelled),
                    1,
                    "seed {seed}: agent {n} {id:?} connect/accept completed {} times, {t:?}",
                    t.outcomes
                );
            }
            if t.disconnect_called {
                assert_eq!(
                    t.disconnected + u32::from(t.disconnect_cancelled && t.disconnected == 0),
                    1,
                    "seed {seed}: agent {n} {id:?} disconnect: {t:?}"
                );
            }
        }
    }
    sim.stats
}

#[test]
fn a_thousand_seeded_interleavings_leak_nothing() {
    let seeds = seeds();
    let mut total = Stats::default();
    for seed in 0..seeds {
        let s = run(seed);
        total.established += s.established;
        total.rejected += s.rejected;
        total.unreachable += s.unreachable;
        total.disconnected += s.disconnected;
        total.destroyed += s.destroyed;
        total.mads += s.mads;
        total.retransmits += s.retransmits;
        total.duplicates += s.duplicates;
        total.unmatched += s.unmatched;
    }
    // The runs must actually exercise every outcome, or the invariants above prove little.
    assert!(total.established > seeds, "{total:?}");
    assert!(total.rejected > 100, "{total:?}");
    assert!(total.unreachable > 10, "{total:?}");
    assert!(total.disconnected > 100, "{total:?}");
    assert!(total.retransmits > 1000, "{total:?}");
    assert!(total.duplicates > 1000, "{total:?}");
    assert!(total.unmatched > 100, "{total:?}");
    eprintln!("{seeds} seeds: {total:?}");
}

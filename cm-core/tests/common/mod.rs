//! A two-agent harness on virtual time: outputs are collected per node, MADs travel through a
//! FIFO wire that a test may filter (drop) message by message.

#![allow(dead_code, unreachable_pub)] // each test file uses a different part of the harness

use std::collections::VecDeque;

use portverbs_cm::wire::{AttrId, CmMessage, Mad};
use portverbs_cm::{
    AgentConfig, CmAgent, CmEvent, CmId, CmOutput, ConnectParams, PathParams, QpAction,
};
use portverbs_hal::Gid;

pub const MS: u64 = 1_000_000;
pub const SERVICE: u64 = 0x0000_0000_0106_1d2f;

pub fn gid(n: u8) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[10, 0, 0, n]);
    Gid(g)
}

#[derive(Debug)]
pub struct Node {
    pub agent: CmAgent,
    pub gid: Gid,
    pub events: Vec<CmEvent>,
    pub qp: Vec<QpAction>,
    /// Every MAD this node sent, parsed, with the time it left.
    pub sent: Vec<(u64, Mad)>,
    /// Outputs in order, as kinds: 'S'end, 'Q'p, 'E'vent.
    pub order: Vec<char>,
}

#[derive(Debug)]
pub struct Pair {
    pub now: u64,
    pub nodes: [Node; 2],
    /// (to node, MAD bytes)
    pub wire: VecDeque<(usize, [u8; 256])>,
}

impl Pair {
    pub fn new() -> Self {
        Self::with(|c| c)
    }

    pub fn with(cfg: impl Fn(AgentConfig) -> AgentConfig) -> Self {
        let node = |n: u8| Node {
            agent: CmAgent::new(cfg(AgentConfig::new(
                0x0200_00ff_fe00_0000 | u64::from(n),
                0x3c5a_0000 * u32::from(n),
            ))),
            gid: gid(n),
            events: Vec::new(),
            qp: Vec::new(),
            sent: Vec::new(),
            order: Vec::new(),
        };
        Self {
            now: 0,
            nodes: [node(1), node(2)],
            wire: VecDeque::new(),
        }
    }

    /// rdma_cm-like parameters from node `from` to the other, with short timers.
    pub fn params(&self, from: usize, qpn: u32, psn: u32) -> ConnectParams {
        let mut path = PathParams::roce(self.nodes[from].gid, self.nodes[1 - from].gid);
        path.packet_life_time = 10; // 4 ms
        let mut p = ConnectParams::new(SERVICE, qpn, psn, path);
        p.remote_cm_response_timeout = 14; // 64 ms
        p.local_cm_response_timeout = 13; // 32 ms
        p.max_cm_retries = 3;
        p
    }

    /// Moves node `n`'s outputs into its logs and the wire.
    pub fn drain(&mut self, n: usize) {
        while let Some(out) = self.nodes[n].agent.poll_output() {
            match out {
                CmOutput::Send(m) => {
                    self.nodes[n].order.push('S');
                    let to = self
                        .nodes
                        .iter()
                        .position(|x| x.gid == m.to)
                        .expect("MAD to a known node");
                    let parsed = Mad::parse(&m.mad).expect("our own MADs parse");
                    self.nodes[n].sent.push((self.now, parsed));
                    self.wire.push_back((to, m.mad));
                }
                CmOutput::Qp(a) => {
                    self.nodes[n].order.push('Q');
                    self.nodes[n].qp.push(a);
                }
                CmOutput::Event(e) => {
                    self.nodes[n].order.push('E');
                    self.nodes[n].events.push(e);
                }
            }
        }
    }

    /// Delivers MADs until the wire is empty, dropping those `keep` refuses.
    pub fn deliver_if(&mut self, mut keep: impl FnMut(usize, &Mad) -> bool) {
        self.drain(0);
        self.drain(1);
        while let Some((to, bytes)) = self.wire.pop_front() {
            let mad = Mad::parse(&bytes).expect("parses");
            if keep(to, &mad) {
                let from = self.nodes[1 - to].gid;
                self.nodes[to]
                    .agent
                    .handle_mad(self.now, from, &bytes)
                    .expect("well-formed");
            }
            self.drain(0);
            self.drain(1);
        }
    }

    pub fn deliver(&mut self) {
        self.deliver_if(|_, _| true);
    }

    /// Runs timers (and delivers what they send through `keep`) up to time `until`.
    pub fn run_until_if(&mut self, until: u64, mut keep: impl FnMut(usize, &Mad) -> bool) {
        self.deliver_if(&mut keep);
        loop {
            let next = [0, 1]
                .into_iter()
                .filter_map(|n| self.nodes[n].agent.poll_timeout())
                .min();
            match next {
                Some(t) if t <= until => {
                    self.now = self.now.max(t);
                    for n in 0..2 {
                        self.nodes[n].agent.handle_timeout(self.now);
                    }
                    self.deliver_if(&mut keep);
                }
                _ => break,
            }
        }
        self.now = self.now.max(until);
    }

    pub fn run_until(&mut self, until: u64) {
        self.run_until_if(until, |_, _| true);
    }

    /// The MADs node `n` sent with attribute `attr`.
    pub fn sent(&self, n: usize, attr: AttrId) -> Vec<(u64, Mad)> {
        self.nodes[n]
            .sent
            .iter()
            .filter(|(_, m)| m.msg.attr() == attr)
            .cloned()
            .collect()
    }

    pub fn take_events(&mut self, n: usize) -> Vec<CmEvent> {
        std::mem::take(&mut self.nodes[n].events)
    }

    /// Node `n`'s events with the private data left out (see [`shape`]).
    pub fn take_shapes(&mut self, n: usize) -> Vec<CmEvent> {
        self.take_events(n).into_iter().map(shape).collect()
    }

    /// Node 1 listens; node 0 connects; returns (listener, active id, passive id) once node 1
    /// got the request.
    pub fn request(&mut self) -> (CmId, CmId, CmId) {
        let listener = self.nodes[1].agent.create_id().expect("id");
        self.nodes[1]
            .agent
            .listen(listener, SERVICE)
            .expect("listen");
        let active = self.nodes[0].agent.create_id().expect("id");
        let p = self.params(0, 0x11, 0x100);
        self.nodes[0]
            .agent
            .connect(self.now, active, &p, b"hello")
            .expect("connect");
        self.deliver();
        let ev = self.take_events(1);
        let [CmEvent::ConnectRequest { id, request }] = ev.as_slice() else {
            panic!("one connect request expected, got {ev:?}");
        };
        assert_eq!(request.listener, listener);
        assert_eq!(&request.private_data[..5], b"hello");
        (listener, active, *id)
    }

    /// A full establishment: returns (listener, active, passive).
    pub fn establish(&mut self) -> (CmId, CmId, CmId) {
        let (l, a, p) = self.request();
        let accept = portverbs_cm::AcceptParams::new(0x22, 0x200);
        self.nodes[1]
            .agent
            .accept(self.now, p, &accept, b"welcome")
            .expect("accept");
        self.deliver();
        let mut rep_data = vec![0u8; 196];
        rep_data[..7].copy_from_slice(b"welcome");
        assert_eq!(
            self.take_events(0),
            [CmEvent::Established {
                id: a,
                private_data: rep_data
            }]
        );
        assert_eq!(
            self.take_events(1),
            [CmEvent::Established {
                id: p,
                private_data: vec![0; 224]
            }]
        );
        (l, a, p)
    }
}

pub fn is(m: &Mad, attr: AttrId) -> bool {
    m.msg.attr() == attr
}

pub fn rej_reason(m: &Mad) -> Option<portverbs_cm::wire::RejReason> {
    match &m.msg {
        CmMessage::Rej(r) => Some(r.reason),
        _ => None,
    }
}

/// An event with its private data emptied, to compare what happened, not what was carried.
pub fn shape(ev: CmEvent) -> CmEvent {
    match ev {
        CmEvent::Established { id, .. } => established(id),
        CmEvent::Rejected { id, reason, .. } => rejected(id, reason),
        other => other,
    }
}

pub fn established(id: CmId) -> CmEvent {
    CmEvent::Established {
        id,
        private_data: Vec::new(),
    }
}

pub fn rejected(id: CmId, reason: portverbs_cm::wire::RejReason) -> CmEvent {
    CmEvent::Rejected {
        id,
        reason,
        private_data: Vec::new(),
    }
}

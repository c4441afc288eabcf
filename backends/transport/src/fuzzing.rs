//! A stateful driver of the engine for fuzzing: the `engine` target in `fuzz/` runs it on
//! libFuzzer's inputs, and a seeded test (`tests/fuzz.rs`) on a few thousand random ones in
//! every `cargo test`.
//!
//! Two engines with one RC QP each are connected back to back over a wire the input
//! controls. The input is decoded ([`run`]) into the connection's settings and a sequence of
//! actions: posting sends (SEND, WRITE, READ, atomics, of sizes from empty to many packets,
//! now and then at a wrong key or a misaligned address) and receives, delivering, dropping,
//! duplicating and reordering packets in flight, injecting packets mutated from those seen on
//! the wire or made up (opcodes, PSNs around either side's window and in the stale half,
//! AETH syndromes, RETH and atomic fields, payload and pad lengths, the source address), work
//! turns, timers firing, a QP error, the MR going away and coming back.
//!
//! After every engine call it checks that the call emitted a bounded number of packets and
//! that the engine's queues stay bounded; at the end it cleans the wire and lets time run
//! until both sides are idle: every posted send must then have completed exactly once.
//! Anything else panics, which is what the fuzzer looks for.

use std::collections::HashSet;
use std::sync::Arc;

use portverbs_hal::attr::{AddressVector, QpAttr, QpAttrMask, QpCaps};
use portverbs_hal::types::{AccessFlags, Gid, Mtu, QpState, QpType};
use portverbs_hal::wc::WcStatus;
use portverbs_hal::wr::{RemoteAddr, SendFlags, SendOp, Sge};
use smallvec::smallvec;

use crate::dma::SoftDma;
use crate::memory::MrSpec;
use crate::packet::psn;
use crate::wire::{
    Aeth, AethSyndrome, AtomicAckEth, AtomicEth, Bth, NakCode, Opcode, Reth, TransportHdr,
};
use crate::{
    Engine, EngineConfig, Packet, PayloadData, PortInfo, QpInit, RecvWqe, SendWqe, VecHca,
};

/// Bytes of each side's registered buffer.
const BUF: usize = 64 << 10;
/// Its virtual address.
const VA: u64 = 0x10_0000;
/// Packets the wire holds per direction; more are lost (except on a clean run).
const WIRE_MAX: usize = 4096;
/// Packets remembered per direction as bases for mutation.
const SEEN_MAX: usize = 16;
/// Send WQEs a side may have posted and not completed (its send queue's size).
const SQ_DEPTH: usize = 64;
/// Timer entries one engine may hold (each QP has two timers; stale entries wait for their
/// deadline).
const TIMERS_MAX: usize = 64;
/// Rounds of the final drain before the driver gives up on the sides becoming idle.
const DRAIN_ROUNDS: usize = 100_000;

/// What a run did (for the seeded test to see that the inputs reach the code).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Report {
    /// Actions decoded from the input.
    pub actions: u64,
    /// Packets delivered to an engine.
    pub delivered: u64,
    /// Of those, packets the input made up or mutated.
    pub injected: u64,
    /// Send WQEs posted, both sides.
    pub posted: u64,
    /// Of those, completed successfully.
    pub succeeded: u64,
    /// Most packets one engine call emitted.
    pub most_per_call: usize,
    /// Work turns that emitted READ responses and left more for later.
    pub partial_turns: u64,
    /// The two engines' counters added up.
    pub dropped: u64,
    /// Sends that completed with an error other than a flush, both sides.
    pub failed: u64,
    /// Responses dropped as outside the requests in flight, both engines.
    pub psn_out_of_window: u64,
}

/// Reads the input a byte at a time; zeros once it is used up.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }

    fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// One of `options`.
    fn pick<T: Copy>(&mut self, options: &[T]) -> T {
        options[usize::from(self.byte()) % options.len()]
    }
}

fn gid(side: usize) -> Gid {
    Gid::from_ip(std::net::IpAddr::from([10, 0, 0, side as u8 + 1]))
}

/// One side: an engine with one QP, its device and its memory.
struct End {
    engine: Engine,
    hca: VecHca,
    mem: Arc<SoftDma>,
    /// The key of the buffer, while it is registered.
    key: Option<u32>,
    /// The last key it had (WQEs still name it after a deregistration).
    last_key: u32,
    qpn: u32,
}

/// The connection's settings, from the input's first bytes.
#[derive(Debug, Clone, Copy)]
struct Settings {
    /// A clean run: nothing lost, reordered, made up or refused, every SEND finds a
    /// receive, time moves only when both sides are idle. Then every send must succeed
    /// without a single retransmission.
    clean: bool,
    cfg: EngineConfig,
    max_train: u32,
    mtu: Mtu,
    /// Per side: what it may have outstanding, and what it grants.
    max_rd_atomic: [u8; 2],
    max_dest_rd_atomic: [u8; 2],
    retry_cnt: u8,
    rnr_retry: u8,
    timeout: u8,
    min_rnr_timer: u8,
}

impl Settings {
    fn decode(inp: &mut Input<'_>) -> Self {
        let clean = inp.byte() % 4 == 0;
        let cfg = EngineConfig {
            burst: inp.pick(&[1, 2, 4, 8, 64]),
            psn_window: inp.pick(&[4, 16, 128]),
            ack_req_every: inp.pick(&[1, 4, 64]),
            max_qp: 8,
            max_keys: 64,
            // Fixed key bytes: a run repeats from its input alone.
            seed: 0,
            cc: crate::CcConfig {
                enabled: inp.byte() % 4 != 0,
                initial_window: inp.pick(&[1, 3, 16, 128]),
                min_window: inp.pick(&[1, 2]),
                ..crate::CcConfig::default()
            },
        };
        let depth = |b: u8| 1 + b % 4;
        let (a, b, grant) = (inp.byte(), inp.byte(), inp.byte());
        // Mostly what the other side grants; now and then more (the responder must refuse).
        let max_rd_atomic = if grant % 8 == 0 && !clean {
            [depth(a), depth(b)]
        } else {
            [depth(b).min(depth(a)), depth(a).min(depth(b))]
        };
        Self {
            clean,
            cfg,
            max_train: inp.pick(&[1, 1, 4, 16]),
            mtu: inp.pick(&[Mtu::Mtu256, Mtu::Mtu1024]),
            max_rd_atomic,
            max_dest_rd_atomic: [depth(a), depth(b)],
            retry_cnt: inp.byte() % 8,
            // 7 (retry forever) would make an RNR loop endless.
            rnr_retry: inp.byte() % 7,
            timeout: 10 + inp.byte() % 8,
            min_rnr_timer: inp.byte() % 32,
        }
    }

    fn mtu_bytes(&self) -> usize {
        self.mtu.bytes() as usize
    }

    /// Most packets (or trains) one engine call may emit: a burst from the requester, a burst
    /// of READ and atomic responses, the ACK and NAK held behind them, and one response per
    /// part of a received train.
    fn limit(&self) -> usize {
        2 * self.cfg.burst as usize + self.max_train as usize + 4
    }
}

impl End {
    fn new(side: usize, s: &Settings) -> Self {
        let mut engine = Engine::new(
            s.cfg,
            vec![PortInfo {
                gids: vec![gid(side)],
                mtu: Mtu::Mtu1024,
                active: true,
            }],
        );
        engine.set_max_train(s.max_train);
        let qpn = side as u32 + 1;
        let init = QpInit {
            qp_type: QpType::Rc,
            pd: 1,
            send_cqn: 1,
            recv_cqn: 2,
            srqn: None,
            sq_entries: SQ_DEPTH as u32,
            caps: QpCaps::default(),
        };
        engine
            .create_qp(qpn, init)
            .expect("a fresh engine takes the QP");
        let mem = SoftDma::alloc(BUF).expect("64 KiB");
        let mut end = Self {
            engine,
            hca: VecHca::default(),
            mem,
            key: None,
            last_key: 0,
            qpn,
        };
        end.register();
        let access = AccessFlags::LOCAL_WRITE
            | AccessFlags::REMOTE_WRITE
            | AccessFlags::REMOTE_READ
            | AccessFlags::REMOTE_ATOMIC;
        let attr = QpAttr {
            port_num: 1,
            qp_access_flags: access,
            path_mtu: s.mtu,
            dest_qp_num: 2 - side as u32,
            rq_psn: if side == 0 { 0xff_fff0 } else { 0x7f_fff8 },
            sq_psn: if side == 0 { 0x7f_fff8 } else { 0xff_fff0 },
            max_rd_atomic: s.max_rd_atomic[side],
            max_dest_rd_atomic: s.max_dest_rd_atomic[side],
            min_rnr_timer: s.min_rnr_timer,
            timeout: s.timeout,
            retry_cnt: s.retry_cnt,
            rnr_retry: s.rnr_retry,
            ah_attr: AddressVector {
                dgid: gid(1 - side),
                ..AddressVector::default()
            },
            ..QpAttr::default()
        };
        let mask = QpAttrMask::PORT
            | QpAttrMask::ACCESS_FLAGS
            | QpAttrMask::PATH_MTU
            | QpAttrMask::DEST_QPN
            | QpAttrMask::RQ_PSN
            | QpAttrMask::SQ_PSN
            | QpAttrMask::MAX_QP_RD_ATOMIC
            | QpAttrMask::MAX_DEST_RD_ATOMIC
            | QpAttrMask::MIN_RNR_TIMER
            | QpAttrMask::TIMEOUT
            | QpAttrMask::RETRY_CNT
            | QpAttrMask::RNR_RETRY
            | QpAttrMask::AV
            | QpAttrMask::STATE;
        for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
            let attr = QpAttr {
                qp_state: state,
                ..attr
            };
            let mut out = Vec::new();
            end.engine
                .modify_qp(0, qpn, &attr, mask, &mut end.hca, &mut out)
                .expect("the QP comes up");
        }
        end
    }

    fn register(&mut self) {
        let key = self
            .engine
            .memory_mut()
            .register(MrSpec {
                pd: 1,
                access: AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
                va: VA,
                len: BUF as u64,
                mem: self.mem.clone(),
                mem_offset: 0,
            })
            .expect("the key space has room");
        self.key = Some(key);
        self.last_key = key;
    }

    /// The QP's transport state, for a failure message.
    fn describe(&self) -> String {
        let Some(qp) = self.engine.qps.get(self.qpn).map(|q| &**q) else {
            return "no QP".into();
        };
        let r = &qp.req;
        let slots: Vec<String> = (r.comp..r.fetched)
            .map(|c| {
                let s = r.slot(c);
                format!(
                    "{c}:{:?}@{:#x}+{} done={:?} read={}",
                    s.wqe.op.kind(),
                    s.first_psn,
                    s.npsn,
                    s.done,
                    s.read_done
                )
            })
            .collect();
        format!(
            "{:?} comp={} tx={}+{} fetched={} una={:#x} next={:#x} sent_end={:#x} rto={} \
             rnr_wait={} stalled={} retries={}/{} [{}]; responder epsn={:#x} responding={}",
            qp.state,
            r.comp,
            r.tx,
            r.tx_offset,
            r.fetched,
            r.una,
            r.next_psn,
            r.sent_end,
            r.rto_armed,
            r.rnr_wait,
            r.stalled,
            r.retries_left,
            r.rnr_left,
            slots.join(", "),
            qp.resp.epsn,
            qp.resp.responding
        )
    }

    fn sends_completed(&self) -> usize {
        self.hca.cqes.iter().filter(|c| c.wqe.is_send).count()
    }
}

/// The driver's state.
struct Driver {
    s: Settings,
    ends: [End; 2],
    /// Packets in flight to each side.
    wire: [Vec<Packet>; 2],
    /// Recent packets sent to each side, to mutate.
    seen: [Vec<Packet>; 2],
    now: u64,
    report: Report,
}

/// Runs the driver on `data` (see the module documentation).
///
/// # Panics
/// When the engine breaks one of the properties checked: an engine call emits more than a
/// bounded number of packets, its timer heap or work lists grow past their bounds, or a
/// posted send never completes, or completes twice, once the wire is clean again.
pub fn run(data: &[u8]) -> Report {
    let mut inp = Input { data, pos: 0 };
    let s = Settings::decode(&mut inp);
    let mut d = Driver {
        s,
        ends: [End::new(0, &s), End::new(1, &s)],
        wire: [Vec::new(), Vec::new()],
        seen: [Vec::new(), Vec::new()],
        now: 1_000_000,
        report: Report::default(),
    };
    while !inp.done() {
        d.report.actions += 1;
        d.step(&mut inp);
    }
    d.drain();
    for e in &d.ends {
        let st = e.engine.stats();
        d.report.dropped += st.dropped;
        d.report.psn_out_of_window += st.psn_out_of_window;
    }
    d.report
}

impl Driver {
    /// Checks one engine call's output and the engine's queues, then puts the packets on the
    /// wire toward the other side.
    fn emitted(&mut self, side: usize, out: Vec<Packet>, what: &str) {
        let limit = self.s.limit();
        assert!(
            out.len() <= limit,
            "{what} on side {side} emitted {} packets (limit {limit})",
            out.len()
        );
        self.report.most_per_call = self.report.most_per_call.max(out.len());
        let core = &self.ends[side].engine.core;
        assert!(
            core.timers.len() <= TIMERS_MAX,
            "side {side}: {} timer entries",
            core.timers.len()
        );
        assert!(core.work.len() <= 1 && core.acks.len() <= 1);
        let to = 1 - side;
        for p in out {
            if self.seen[to].len() == SEEN_MAX {
                self.seen[to].remove(0);
            }
            self.seen[to].push(p.clone());
            // A clean link loses nothing (what it holds is bounded by the input's length).
            if self.s.clean || self.wire[to].len() < WIRE_MAX {
                self.wire[to].push(p);
            }
        }
    }

    fn step(&mut self, inp: &mut Input<'_>) {
        let op = inp.byte();
        let side = usize::from(op >> 7);
        let mut action = op % 12;
        if self.s.clean && matches!(action, 4 | 6 | 7 | 9 | 11) {
            // Only what a faultless link does: deliver (duplicates are harmless).
            action = 3;
        }
        match action {
            0 | 1 => self.post_send(side, inp),
            2 => {
                for _ in 0..=inp.byte() % 4 {
                    self.post_recv(side, inp);
                }
            }
            3 => {
                let n = 1 + usize::from(inp.byte() % 16);
                self.deliver(side, n);
            }
            4 => {
                let w = &mut self.wire[side];
                if !w.is_empty() {
                    let i = usize::from(inp.byte()) % w.len();
                    w.remove(i);
                }
            }
            5 => {
                let w = &mut self.wire[side];
                if !w.is_empty() && w.len() < WIRE_MAX {
                    let i = usize::from(inp.byte()) % w.len();
                    let p = w[i].clone();
                    w.push(p);
                }
            }
            6 => {
                let w = &mut self.wire[side];
                if w.len() > 1 {
                    let i = usize::from(inp.byte()) % w.len();
                    let j = usize::from(inp.byte()) % w.len();
                    w.swap(i, j);
                }
            }
            7 => self.inject(side, inp),
            8 => self.turn(side),
            9 => {
                let ns = match inp.byte() % 4 {
                    0 => u64::from(inp.byte()) * 1_000,
                    1 => u64::from(inp.byte()) * 1_000_000,
                    _ => self
                        .next_deadline()
                        .map_or(0, |t| t.saturating_sub(self.now)),
                };
                self.advance(ns);
            }
            10 => {
                for side in 0..2 {
                    let mut out = Vec::new();
                    self.ends[side].engine.flush_acks(&mut out);
                    self.emitted(side, out, "flush_acks");
                }
            }
            _ => match inp.byte() % 16 {
                0 => {
                    let e = &mut self.ends[side];
                    e.engine.qp_fatal(e.qpn, &mut e.hca);
                }
                1 => {
                    let e = &mut self.ends[side];
                    if let Some(key) = e.key.take() {
                        e.engine
                            .memory_mut()
                            .deregister(key)
                            .expect("the MR has no windows");
                    }
                }
                2 if self.ends[side].key.is_none() => self.ends[side].register(),
                _ => {
                    for side in 0..2 {
                        let n = self.wire[side].len();
                        self.deliver(side, n);
                    }
                }
            },
        }
    }

    /// A length for a message: empty, tiny, around the MTU, many packets.
    fn length(&self, inp: &mut Input<'_>) -> usize {
        let mtu = self.s.mtu_bytes();
        let len = match inp.byte() % 12 {
            0 => 0,
            1 => 1,
            2 => 8,
            3 => 31,
            4 => 200,
            5 => mtu - 1,
            6 => mtu,
            7 => mtu + 1,
            8 => 3 * mtu,
            9 => 8 * mtu + 5,
            10 => 40 * mtu,
            _ => usize::from(inp.byte()) * 97,
        };
        len.min(BUF / 2)
    }

    fn post_send(&mut self, side: usize, inp: &mut Input<'_>) {
        let peer_key = self.ends[1 - side].last_key;
        let e = &self.ends[side];
        if e.hca.sq.len().saturating_sub(e.sends_completed()) >= SQ_DEPTH {
            return;
        }
        let kind = inp.byte();
        let flags = inp.byte();
        let mut len = self.length(inp);
        let atomic = matches!(kind % 10, 7 | 8);
        if atomic {
            len = 8;
        }
        let align = if atomic { 8 } else { 1 };
        let room = (BUF - len) as u64;
        let loff = (u64::from(inp.byte()) * 256) % (room + 1) / align * align;
        let mut roff = (u64::from(inp.byte()) * 256) % (room + 1) / align * align;
        // Now and then a request the responder must refuse (which ends the connection).
        let mut rkey = peer_key;
        match if self.s.clean { 63 } else { flags % 64 } {
            0 => rkey ^= 0x100,
            1 => roff = roff.wrapping_add(BUF as u64 - 4),
            2 if atomic => roff += 4,
            _ => {}
        }
        let remote = RemoteAddr {
            addr: VA.wrapping_add(roff),
            rkey,
        };
        let imm = inp.u32();
        let op = match kind % 10 {
            0 | 1 => SendOp::Send,
            2 => SendOp::SendWithImm { imm },
            3 => SendOp::RdmaWrite { remote },
            4 => SendOp::RdmaWriteWithImm { remote, imm },
            5 | 6 => SendOp::RdmaRead { remote },
            7 => SendOp::AtomicFetchAdd { remote, add: 1 },
            8 => SendOp::AtomicCmpSwp {
                remote,
                compare: 0,
                swap: u64::from(imm),
            },
            // Invalidating the peer's MR is refused (and ends the connection): rarely.
            _ if flags & 0x20 != 0 && flags & 3 == 0 && !self.s.clean => {
                SendOp::SendWithInv { rkey }
            }
            _ => SendOp::Send,
        };
        let mut wqe = SendWqe {
            op,
            signaled: true,
            sges: smallvec![Sge {
                addr: VA + loff,
                length: len as u32,
                lkey: e.last_key,
            }],
            ..SendWqe::default()
        };
        if flags & 0x40 != 0 {
            wqe.flags |= SendFlags::FENCE;
        }
        if flags & 0x80 != 0 {
            wqe.flags |= SendFlags::SOLICITED;
        }
        if self.s.clean
            && matches!(
                wqe.op,
                SendOp::Send | SendOp::SendWithImm { .. } | SendOp::RdmaWriteWithImm { .. }
            )
        {
            // A receive waits for every message that needs one.
            let peer = &mut self.ends[1 - side];
            let wqe_index = peer.hca.rq.len() as u32;
            peer.hca.rq.push_back(RecvWqe {
                wqe_index,
                pd: 0,
                sges: smallvec![Sge {
                    addr: VA,
                    length: (BUF / 2) as u32,
                    lkey: peer.last_key,
                }],
            });
        }
        let e = &mut self.ends[side];
        wqe.counter = e.hca.sq.len() as u32;
        e.hca.sq.push(wqe);
        self.report.posted += 1;
        let mut out = Vec::new();
        e.engine.doorbell(self.now, e.qpn, &mut e.hca, &mut out);
        self.emitted(side, out, "doorbell");
    }

    fn post_recv(&mut self, side: usize, inp: &mut Input<'_>) {
        // Mostly room for any SEND the driver posts; now and then too little.
        let len = if inp.byte() % 8 == 0 && !self.s.clean {
            self.length(inp)
        } else {
            BUF / 2
        };
        let off = (u64::from(inp.byte()) * 256) % ((BUF - len) as u64 + 1);
        let e = &mut self.ends[side];
        if e.hca.rq.len() >= SQ_DEPTH {
            return;
        }
        let wqe_index = e.hca.rq.len() as u32;
        e.hca.rq.push_back(RecvWqe {
            wqe_index,
            pd: 0,
            sges: smallvec![Sge {
                addr: VA + off,
                length: len as u32,
                lkey: e.last_key,
            }],
        });
        // A receive posted to a QP in error is flushed at the doorbell.
        if e.engine.qp_state(e.qpn) == Some(QpState::Err) {
            let mut out = Vec::new();
            e.engine.doorbell(self.now, e.qpn, &mut e.hca, &mut out);
            self.emitted(side, out, "receive doorbell");
        }
    }

    /// Delivers up to `n` packets in flight to `side` as one burst, then its ACKs.
    fn deliver(&mut self, side: usize, n: usize) {
        let n = n.min(self.wire[side].len());
        let pkts: Vec<Packet> = self.wire[side].drain(..n).collect();
        self.receive(side, &pkts, false);
    }

    fn receive(&mut self, side: usize, pkts: &[Packet], injected: bool) {
        for p in pkts {
            self.report.delivered += 1;
            self.report.injected += u64::from(injected);
            let e = &mut self.ends[side];
            let mut out = Vec::new();
            e.engine.receive(self.now, 1, p, &mut e.hca, &mut out);
            self.emitted(side, out, "receive");
        }
        let mut out = Vec::new();
        self.ends[side].engine.flush_acks(&mut out);
        self.emitted(side, out, "flush_acks");
    }

    fn turn(&mut self, side: usize) {
        let e = &mut self.ends[side];
        let mut out = Vec::new();
        e.engine.run_work(self.now, &mut e.hca, &mut out);
        let partial =
            e.engine.has_work() && out.iter().any(|p| p.hdr.bth.opcode.is_read_response());
        self.report.partial_turns += u64::from(partial);
        self.emitted(side, out, "run_work");
    }

    fn next_deadline(&self) -> Option<u64> {
        let [a, b] = &self.ends;
        match (a.engine.poll_timeout(), b.engine.poll_timeout()) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        }
    }

    fn advance(&mut self, ns: u64) {
        self.now += ns;
        for side in 0..2 {
            let e = &mut self.ends[side];
            let mut out = Vec::new();
            e.engine.handle_timeout(self.now, &mut e.hca, &mut out);
            self.emitted(side, out, "handle_timeout");
        }
    }

    /// A packet toward `side`, from one seen on the wire or made up, mutated as the input says.
    fn inject(&mut self, side: usize, inp: &mut Input<'_>) {
        let pick = inp.byte();
        let mut pkt = match self.seen[side].len() {
            n if n > 0 && pick % 4 != 0 => self.seen[side][usize::from(pick) % n].clone(),
            _ => self.made_up(side, inp),
        };
        let m = inp.byte();
        if m & 1 != 0 {
            let b = inp.byte();
            // Mostly RC opcodes (0x00–0x1f), now and then anything.
            pkt.hdr.bth.opcode = Opcode::from_u8(if b & 0x80 != 0 { b } else { b & 0x1f });
        }
        if m & 2 != 0 {
            pkt.hdr.bth.psn = self.psn_near(side, inp);
        }
        if m & 4 != 0 {
            let b = inp.byte();
            pkt.hdr.aeth = (b != 0).then(|| Aeth {
                syndrome: AethSyndrome::from_u8(b),
                msn: inp.u32() & psn::MASK,
            });
        }
        if m & 8 != 0 {
            let b = inp.byte();
            pkt.hdr.reth = (b & 1 != 0).then(|| Reth {
                va: self.address(side, inp),
                rkey: self.rkey(side, inp),
                dma_len: self.length(inp) as u32 + u32::from(b >> 6),
            });
        }
        if m & 16 != 0 {
            let b = inp.byte();
            pkt.hdr.atomic = (b & 1 != 0).then(|| AtomicEth {
                va: self.address(side, inp),
                rkey: self.rkey(side, inp),
                swap_add: 1,
                compare: 0,
            });
            pkt.hdr.atomic_ack = (b & 2 != 0).then(|| AtomicAckEth { orig: u64::from(b) });
        }
        if m & 32 != 0 {
            let len = self.length(inp).min(2 * self.s.mtu_bytes() + 3);
            pkt.payload = PayloadData::from_slice(&vec![0xa5; len]);
        }
        if m & 64 != 0 {
            let b = inp.byte();
            pkt.hdr.bth.ack_req = b & 1 != 0;
            pkt.hdr.bth.pad_count = (b >> 1) & 3;
            pkt.hdr.imm = (b & 8 != 0).then_some(u32::from(b));
            pkt.hdr.ieth = (b & 16 != 0).then(|| self.ends[side].last_key);
        }
        if m & 128 != 0 {
            let b = inp.byte();
            match b % 3 {
                0 => pkt.src_gid = gid(7),
                1 => pkt.hdr.bth.pkey = u16::from(b) << 8,
                _ => pkt.hdr.bth.dest_qp = u32::from(b) % 4,
            }
        }
        if m != 0 {
            // A mutated packet is one packet, as any from the wire.
            pkt.train = 1;
            pkt.train_last = pkt.hdr.bth.opcode;
        }
        // Usually what the wire can carry: the packet made into a frame and parsed back, as
        // the UDP port receives it. Otherwise as it is (an in-process sender's packet).
        if inp.byte() % 4 != 0 {
            let mut frame = Vec::new();
            if pkt.train > 1 || pkt.to_frame(&mut frame).is_err() {
                return;
            }
            match Packet::from_frame(&frame) {
                Ok(Some(p)) => pkt = p,
                _ => return,
            }
        }
        self.receive(side, &[pkt], true);
    }

    /// A PSN around what `side` expects or has in flight, or in the stale half.
    fn psn_near(&self, side: usize, inp: &mut Input<'_>) -> u32 {
        let e = &self.ends[side];
        let qp = e.engine.qps.get(e.qpn).map(|q| &**q);
        let anchor = match (inp.byte() % 5, qp) {
            (0, Some(q)) => q.req.una,
            (1, Some(q)) => q.req.sent_end,
            (2, Some(q)) => q.resp.epsn,
            (3, _) => inp.u32(),
            _ => 0x7f_fff8,
        };
        let delta = i32::from(inp.byte() as i8);
        let p = psn::add(anchor, delta as u32);
        if inp.byte() % 8 == 0 {
            psn::add(p, 1 << 23)
        } else {
            p
        }
    }

    /// An address in (or just outside) `side`'s buffer.
    fn address(&self, _side: usize, inp: &mut Input<'_>) -> u64 {
        match inp.byte() % 8 {
            0 => u64::from(inp.u32()) << 8,
            1 => VA + BUF as u64 - 4,
            b => VA + u64::from(b) * 1024,
        }
    }

    /// `side`'s key, mostly.
    fn rkey(&self, side: usize, inp: &mut Input<'_>) -> u32 {
        let k = self.ends[side].last_key;
        match inp.byte() % 8 {
            0 => k ^ 0x100,
            1 => inp.u32(),
            _ => k,
        }
    }

    /// A packet from `side`'s peer of a plausible shape.
    fn made_up(&self, side: usize, inp: &mut Input<'_>) -> Packet {
        let opcode = inp.pick(&[
            Opcode::Acknowledge,
            Opcode::ReadResponseOnly,
            Opcode::ReadResponseFirst,
            Opcode::AtomicAcknowledge,
            Opcode::SendOnly,
            Opcode::WriteOnly,
            Opcode::ReadRequest,
            Opcode::FetchAdd,
        ]);
        let dest = self.ends[side].qpn;
        let mut hdr = TransportHdr::new(Bth::new(opcode, dest, self.psn_near(side, inp)));
        let mut payload = Vec::new();
        match opcode {
            Opcode::Acknowledge => {
                hdr.aeth = Some(Aeth {
                    syndrome: inp.pick(&[
                        AethSyndrome::ACK_UNLIMITED,
                        AethSyndrome::RnrNak { timer: 31 },
                        AethSyndrome::Nak(NakCode::PsnSequenceError),
                        AethSyndrome::Nak(NakCode::RemoteAccessError),
                        AethSyndrome::Reserved(0x40),
                    ]),
                    msn: 0,
                });
            }
            Opcode::ReadResponseOnly | Opcode::ReadResponseFirst => {
                hdr.aeth = Some(Aeth {
                    syndrome: AethSyndrome::ACK_UNLIMITED,
                    msn: 0,
                });
                payload = vec![0x3c; self.length(inp).min(self.s.mtu_bytes())];
            }
            Opcode::AtomicAcknowledge => {
                hdr.aeth = Some(Aeth {
                    syndrome: AethSyndrome::ACK_UNLIMITED,
                    msn: 0,
                });
                hdr.atomic_ack = Some(AtomicAckEth { orig: 7 });
            }
            Opcode::WriteOnly | Opcode::ReadRequest => {
                hdr.reth = Some(Reth {
                    va: self.address(side, inp),
                    rkey: self.rkey(side, inp),
                    dma_len: self.length(inp) as u32,
                });
                if opcode == Opcode::WriteOnly {
                    let len = hdr.reth.map_or(0, |r| r.dma_len as usize);
                    payload = vec![0x3c; len.min(self.s.mtu_bytes())];
                }
            }
            Opcode::FetchAdd => {
                hdr.atomic = Some(AtomicEth {
                    va: self.address(side, inp),
                    rkey: self.rkey(side, inp),
                    swap_add: 1,
                    compare: 0,
                });
            }
            _ => payload = vec![0x3c; self.length(inp).min(self.s.mtu_bytes())],
        }
        hdr.bth.ack_req = true;
        hdr.bth.pad_count = ((4 - payload.len() % 4) % 4) as u8;
        Packet::new(
            gid(1 - side),
            gid(side),
            hdr,
            PayloadData::from_slice(&payload),
        )
    }

    /// Cleans the wire and runs time until both sides are idle; then every posted send has
    /// completed exactly once.
    fn drain(&mut self) {
        for _ in 0..DRAIN_ROUNDS {
            let mut moved = false;
            for side in 0..2 {
                while !self.wire[side].is_empty() {
                    moved = true;
                    self.deliver(side, 64);
                }
            }
            for side in 0..2 {
                if self.ends[side].engine.has_work() {
                    moved = true;
                    self.turn(side);
                }
            }
            if moved {
                continue;
            }
            if self
                .ends
                .iter()
                .all(|e| e.sends_completed() >= e.hca.sq.len())
            {
                break;
            }
            match self.next_deadline() {
                Some(t) => {
                    let ns = t.saturating_sub(self.now);
                    self.advance(ns);
                }
                None => break,
            }
        }
        for (side, e) in self.ends.iter().enumerate() {
            let sends: Vec<_> = e.hca.cqes.iter().filter(|c| c.wqe.is_send).collect();
            let distinct: HashSet<u16> = sends.iter().map(|c| c.wqe.index).collect();
            assert_eq!(
                distinct.len(),
                sends.len(),
                "side {side}: a send completed twice"
            );
            assert_eq!(
                sends.len(),
                e.hca.sq.len(),
                "side {side}: {} of {} sends completed once the wire was clean: {}",
                sends.len(),
                e.hca.sq.len(),
                e.describe()
            );
            if self.s.clean {
                let st = e.engine.stats();
                assert!(
                    sends.iter().all(|c| c.wc.status == WcStatus::Success),
                    "side {side}: a send failed on a clean link: {:?}",
                    sends
                        .iter()
                        .filter(|c| c.wc.status != WcStatus::Success)
                        .map(|c| (c.wqe.index, c.wc.status))
                        .collect::<Vec<_>>()
                );
                assert_eq!(
                    (st.timeouts, st.retransmits, st.seq_naks, st.rnr_naks),
                    (0, 0, 0, 0),
                    "side {side}: recovery on a clean link"
                );
            }
            self.report.succeeded += sends
                .iter()
                .filter(|c| c.wc.status == WcStatus::Success)
                .count() as u64;
            self.report.failed += sends
                .iter()
                .filter(|c| !matches!(c.wc.status, WcStatus::Success | WcStatus::WrFlushErr))
                .count() as u64;
        }
    }
}

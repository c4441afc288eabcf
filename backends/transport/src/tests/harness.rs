//! The shared test bench: [`TestHca`] (the crate's `VecHca`: queues as vectors, completions and events collected),
//! [`Side`] (an engine with one QP in RTS or RTR, one registered buffer, its own clock), and
//! packet builders for what the peer would send.

use std::sync::Arc;

use portverbs_hal::DmaMemory;
use portverbs_hal::attr::{AddressVector, QpAttr, QpAttrMask, QpCaps};
use portverbs_hal::event::{DeviceEvent, QpEventKind};
use portverbs_hal::types::{AccessFlags, Gid, Mtu, QpState, QpType};
use portverbs_hal::wc::Cqe;
use portverbs_hal::wr::{SendOp, Sge};
use smallvec::smallvec;

use super::super::memory::MrSpec;
use super::super::{Engine, EngineConfig, Packet, PayloadData, PortInfo, QpInit, RecvWqe, SendWqe};
use crate::dma::SoftDma;
use crate::wire::{Aeth, AethSyndrome, Bth, NakCode, Opcode, TransportHdr};

/// The QP under test.
pub(super) const QPN: u32 = 1;
/// The peer's QP.
pub(super) const PEER_QPN: u32 = 2;
/// First PSN the QP under test sends.
pub(super) const SQ_PSN: u32 = 100;
/// First PSN the QP under test expects.
pub(super) const RQ_PSN: u32 = 500;
/// Path MTU in bytes.
pub(super) const MTU: usize = 1024;
/// Virtual address of the registered buffer.
pub(super) const VA: u64 = 0x10_0000;
/// Size of the registered buffer.
pub(super) const BUF: usize = 64 * 1024;
/// Q_Key of UD QPs.
pub(super) const QKEY: u32 = 0x1111_0000;
/// The local ACK timeout code the QP uses (4.096 µs · 2^14 ≈ 67 ms).
pub(super) const TIMEOUT: u8 = 14;
/// The RNR timer code the responder asks for.
pub(super) const MIN_RNR_TIMER: u8 = 5;

/// The device of the tests: queues as vectors (the crate's [`VecHca`]).
pub(super) type TestHca = crate::VecHca;

/// Attributes of the QP under test, changed by a test before [`Side::with`] brings it up.
#[derive(Debug, Clone, Copy)]
pub(super) struct Setup {
    pub(super) qp_type: QpType,
    pub(super) cfg: EngineConfig,
    pub(super) max_rd_atomic: u8,
    pub(super) max_dest_rd_atomic: u8,
    pub(super) retry_cnt: u8,
    pub(super) rnr_retry: u8,
    pub(super) access: AccessFlags,
    /// Stop in RTR (a pure responder).
    pub(super) rtr_only: bool,
    /// The QP's number and its peer's.
    pub(super) qpn: u32,
    pub(super) peer_qpn: u32,
    /// Last octet of the side's address and of its peer's (10.0.0.x).
    pub(super) me: u8,
    pub(super) peer: u8,
    /// First PSN sent and first PSN expected.
    pub(super) sq_psn: u32,
    pub(super) rq_psn: u32,
    /// Size of the registered buffer.
    pub(super) buf: usize,
    /// Path MTU.
    pub(super) path_mtu: Mtu,
}

impl Setup {
    pub(super) fn rc() -> Self {
        Self {
            qp_type: QpType::Rc,
            // The machines as IBTA defines them; congestion control (its window, its probe
            // timeout before the local ACK timeout) has tests of its own (`congestion.rs`).
            cfg: EngineConfig {
                cc: crate::CcConfig {
                    enabled: false,
                    ..crate::CcConfig::default()
                },
                ..EngineConfig::default()
            },
            max_rd_atomic: 4,
            max_dest_rd_atomic: 4,
            retry_cnt: 3,
            rnr_retry: 3,
            access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            rtr_only: false,
            qpn: QPN,
            peer_qpn: PEER_QPN,
            me: 1,
            peer: 2,
            sq_psn: SQ_PSN,
            rq_psn: RQ_PSN,
            buf: BUF,
            path_mtu: Mtu::Mtu1024,
        }
    }

    /// The other end of a connection set up like this one.
    pub(super) fn mirrored(self) -> Self {
        Self {
            qpn: self.peer_qpn,
            peer_qpn: self.qpn,
            me: self.peer,
            peer: self.me,
            sq_psn: self.rq_psn,
            rq_psn: self.sq_psn,
            ..self
        }
    }

    pub(super) fn of(qp_type: QpType) -> Self {
        Self {
            qp_type,
            ..Self::rc()
        }
    }
}

/// One engine with one QP, its device, its memory and its clock.
#[derive(Debug)]
pub(super) struct Side {
    pub(super) engine: Engine,
    /// The QP under test (`QPN` unless set up otherwise).
    pub(super) qpn: u32,
    pub(super) hca: TestHca,
    pub(super) mem: Arc<SoftDma>,
    /// lkey = rkey of the buffer.
    pub(super) key: u32,
    pub(super) now: u64,
    /// The attributes and mask the QP was brought up with.
    pub(super) attr: QpAttr,
    pub(super) mask: QpAttrMask,
}

fn gid(last: u8) -> Gid {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[10, 0, 0, last]);
    Gid(g)
}

impl Side {
    /// An RC QP in RTS.
    pub(super) fn rc() -> Self {
        Self::with(Setup::rc())
    }

    pub(super) fn with(s: Setup) -> Self {
        let mut engine = Engine::new(
            s.cfg,
            vec![PortInfo {
                gids: vec![gid(s.me)],
                mtu: Mtu::Mtu4096,
                active: true,
            }],
        );
        let init = QpInit {
            qp_type: s.qp_type,
            pd: 1,
            send_cqn: 10,
            recv_cqn: 11,
            srqn: None,
            sq_entries: 64,
            caps: QpCaps::default(),
        };
        engine.create_qp(s.qpn, init).unwrap();
        let mem = SoftDma::alloc(s.buf).unwrap();
        let key = engine
            .memory_mut()
            .register(MrSpec {
                pd: 1,
                access: s.access,
                va: VA,
                len: s.buf as u64,
                mem: mem.clone(),
                mem_offset: 0,
            })
            .unwrap();
        let mut side = Self {
            engine,
            qpn: s.qpn,
            hca: TestHca::default(),
            mem,
            key,
            now: 1_000_000,
            attr: QpAttr::default(),
            mask: QpAttrMask::empty(),
        };
        let attr = QpAttr {
            port_num: 1,
            qkey: QKEY,
            qp_access_flags: s.access,
            path_mtu: s.path_mtu,
            dest_qp_num: s.peer_qpn,
            rq_psn: s.rq_psn,
            sq_psn: s.sq_psn,
            max_rd_atomic: s.max_rd_atomic,
            max_dest_rd_atomic: s.max_dest_rd_atomic,
            min_rnr_timer: MIN_RNR_TIMER,
            timeout: TIMEOUT,
            retry_cnt: s.retry_cnt,
            rnr_retry: s.rnr_retry,
            ah_attr: AddressVector {
                dgid: gid(s.peer),
                ..AddressVector::default()
            },
            ..QpAttr::default()
        };
        let all = QpAttrMask::PORT
            | QpAttrMask::QKEY
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
            | QpAttrMask::AV;
        side.attr = attr;
        side.mask = all;
        let mut states = vec![QpState::Init, QpState::Rtr];
        if !s.rtr_only {
            states.push(QpState::Rts);
        }
        for st in states {
            side.modify(st, &attr, all).unwrap();
        }
        side
    }

    /// Applies a modify to the QP under test.
    pub(super) fn modify(
        &mut self,
        to: QpState,
        attr: &QpAttr,
        mask: QpAttrMask,
    ) -> Result<Vec<Packet>, portverbs_hal::error::CommandError> {
        let mut out = Vec::new();
        let attr = QpAttr {
            qp_state: to,
            ..*attr
        };
        self.engine.modify_qp(
            self.now,
            self.qpn,
            &attr,
            mask | QpAttrMask::STATE,
            &mut self.hca,
            &mut out,
        )?;
        Ok(out)
    }

    pub(super) fn state(&self) -> QpState {
        self.engine.qp_state(self.qpn).unwrap()
    }

    /// Posts a send WQE and rings the doorbell; returns what went out.
    pub(super) fn post(&mut self, mut wqe: SendWqe) -> Vec<Packet> {
        wqe.counter = self.hca.sq.len() as u32;
        self.hca.sq.push(wqe);
        let mut out = Vec::new();
        self.engine
            .doorbell(self.now, self.qpn, &mut self.hca, &mut out);
        out
    }

    /// Posts a receive WQE of `len` bytes at buffer offset `off`.
    pub(super) fn post_recv(&mut self, off: u64, len: u32) {
        let wqe_index = self.hca.rq.len() as u32;
        self.hca.rq.push_back(RecvWqe {
            wqe_index,
            pd: 0,
            sges: smallvec![Sge {
                addr: VA + off,
                length: len,
                lkey: self.key,
            }],
        });
    }

    /// Feeds one burst of packets, then flushes the ACKs coalesced during it.
    pub(super) fn burst(&mut self, pkts: &[Packet]) -> Vec<Packet> {
        let mut out = Vec::new();
        for p in pkts {
            self.engine.receive(self.now, 1, p, &mut self.hca, &mut out);
        }
        self.engine.flush_acks(&mut out);
        out
    }

    /// Feeds one packet (a burst of one).
    pub(super) fn feed(&mut self, pkt: Packet) -> Vec<Packet> {
        self.burst(&[pkt])
    }

    /// Advances the clock to `at` and fires the timers due.
    pub(super) fn advance_to(&mut self, at: u64) -> Vec<Packet> {
        self.now = at;
        let mut out = Vec::new();
        self.engine
            .handle_timeout(self.now, &mut self.hca, &mut out);
        out
    }

    pub(super) fn write_mem(&self, off: u64, bytes: &[u8]) {
        self.mem.write(off as usize, bytes).unwrap();
    }

    pub(super) fn read_mem(&self, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read(off as usize, &mut v).unwrap();
        v
    }

    /// Completions taken so far (and forgotten).
    pub(super) fn take_cqes(&mut self) -> Vec<Cqe> {
        std::mem::take(&mut self.hca.cqes)
    }

    pub(super) fn has_event(&self, kind: QpEventKind) -> bool {
        self.hca.events.iter().any(
            |e| matches!(e, DeviceEvent::Qp { qpn, kind: k } if *qpn == self.qpn && *k == kind),
        )
    }

    /// The engine's state of the QP under test.
    pub(super) fn qp(&self) -> &crate::qp::QpCtx {
        self.engine
            .qps
            .get(self.qpn)
            .expect("the QP under test exists")
    }

    /// Retries left: (transport retries, RNR retries).
    pub(super) fn retries_left(&self) -> (u8, u8) {
        let qp = self.qp();
        (qp.req.retries_left, qp.req.rnr_left)
    }

    /// Runs one engine work turn (the QPs left with work by a bounded turn); what went out.
    pub(super) fn turn(&mut self) -> Vec<Packet> {
        let mut out = Vec::new();
        self.engine.run_work(self.now, &mut self.hca, &mut out);
        out
    }

    /// An SGE over buffer bytes `[off, off + len)`.
    pub(super) fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: VA + off,
            length: len,
            lkey: self.key,
        }
    }

    /// A signaled send WQE of `op` gathering buffer bytes `[off, off + len)`.
    pub(super) fn wqe(&self, op: SendOp, off: u64, len: u32) -> SendWqe {
        SendWqe {
            op,
            signaled: true,
            sges: smallvec![self.sge(off, len)],
            ..SendWqe::default()
        }
    }
}

/// A deterministic byte pattern.
pub(super) fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// A BTH from the peer to the QP under test.
pub(super) fn bth(opcode: Opcode, psn: u32, ack_req: bool) -> Bth {
    Bth {
        ack_req,
        ..Bth::new(opcode, QPN, psn)
    }
}

/// A packet from the peer with these headers and payload.
pub(super) fn from_peer(hdr: TransportHdr, payload: &[u8]) -> Packet {
    let mut hdr = hdr;
    hdr.bth.pad_count = ((4 - payload.len() % 4) % 4) as u8;
    Packet::new(gid(2), gid(1), hdr, PayloadData::from_slice(payload))
}

/// A request packet from the peer (no extension headers).
pub(super) fn request(opcode: Opcode, psn: u32, ack_req: bool, payload: &[u8]) -> Packet {
    from_peer(TransportHdr::new(bth(opcode, psn, ack_req)), payload)
}

/// An ACK or NAK from the peer.
pub(super) fn aeth(psn: u32, syndrome: AethSyndrome) -> Packet {
    let mut hdr = TransportHdr::new(bth(Opcode::Acknowledge, psn, false));
    hdr.aeth = Some(Aeth { syndrome, msn: 0 });
    from_peer(hdr, &[])
}

/// A positive ACK from the peer.
pub(super) fn ack(psn: u32) -> Packet {
    aeth(psn, AethSyndrome::ACK_UNLIMITED)
}

/// A NAK from the peer.
pub(super) fn nak(psn: u32, code: NakCode) -> Packet {
    aeth(psn, AethSyndrome::Nak(code))
}

/// The AETH syndrome of a response, if it carries one.
pub(super) fn syndrome(p: &Packet) -> Option<AethSyndrome> {
    p.hdr.aeth.map(|a| a.syndrome)
}

/// Opcodes and PSNs of a batch of packets.
pub(super) fn summary(pkts: &[Packet]) -> Vec<(Opcode, u32)> {
    pkts.iter()
        .map(|p| (p.hdr.bth.opcode, p.hdr.bth.psn))
        .collect()
}

/// Which way a packet travels between the two sides of a [`Pair`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dir {
    AtoB,
    BtoA,
}

/// Two engines with one QP each, connected back to back: `a` set up as the [`Setup`] says,
/// `b` as its mirror image. Packets in flight wait in `to_a` and `to_b` until a round
/// delivers them.
#[derive(Debug)]
pub(super) struct Pair {
    pub(super) a: Side,
    pub(super) b: Side,
    pub(super) to_a: Vec<Packet>,
    pub(super) to_b: Vec<Packet>,
}

impl Pair {
    pub(super) fn new(setup: Setup) -> Self {
        Self {
            a: Side::with(setup),
            b: Side::with(setup.mirrored()),
            to_a: Vec::new(),
            to_b: Vec::new(),
        }
    }

    /// One round: every packet in flight that `keep` lets through is delivered (one burst per
    /// side, its ACKs flushed), then each side runs one work turn. False when nothing moved.
    pub(super) fn round(&mut self, keep: &mut impl FnMut(Dir, &Packet) -> bool) -> bool {
        let to_b: Vec<Packet> = std::mem::take(&mut self.to_b)
            .into_iter()
            .filter(|p| keep(Dir::AtoB, p))
            .collect();
        let to_a: Vec<Packet> = std::mem::take(&mut self.to_a)
            .into_iter()
            .filter(|p| keep(Dir::BtoA, p))
            .collect();
        let moved = !to_a.is_empty()
            || !to_b.is_empty()
            || self.a.engine.has_work()
            || self.b.engine.has_work();
        let out = self.b.burst(&to_b);
        self.to_a.extend(out);
        let out = self.a.burst(&to_a);
        self.to_b.extend(out);
        if self.a.engine.has_work() {
            let out = self.a.turn();
            self.to_b.extend(out);
        }
        if self.b.engine.has_work() {
            let out = self.b.turn();
            self.to_a.extend(out);
        }
        moved
    }

    /// Rounds until nothing moves; returns how many ran (at most `limit`).
    pub(super) fn settle(
        &mut self,
        limit: usize,
        mut keep: impl FnMut(Dir, &Packet) -> bool,
    ) -> usize {
        for n in 0..limit {
            if !self.round(&mut keep) {
                return n;
            }
        }
        limit
    }

    /// Advances both clocks by `ns` and fires the timers due; what they send goes in flight.
    pub(super) fn advance(&mut self, ns: u64) {
        let at = self.a.now.max(self.b.now) + ns;
        let out = self.a.advance_to(at);
        self.to_b.extend(out);
        let out = self.b.advance_to(at);
        self.to_a.extend(out);
    }
}

//! Per-QP transport state: the attributes set by modify, the requester's send window and the
//! responder's receive state. The three machines (requester in `requester.rs`, completer in
//! `completer.rs`, responder in `responder/`) each own their part and meet only through the
//! QP's state and the completions they deliver. The state itself is changed only by
//! `modify::set_state`.

use portverbs_hal::attr::{QpAttr, QpCaps};
use portverbs_hal::types::{QpState, QpType};
use portverbs_hal::wc::WcStatus;

use super::hca::{RecvSource, RecvWqe, SendWqe};
use super::memory::Span;
use crate::wire::AethSyndrome;

/// How a QP was created.
#[derive(Debug, Clone, Copy)]
pub struct QpInit {
    /// Transport.
    pub qp_type: QpType,
    /// Protection domain.
    pub pd: u32,
    /// CQ for send completions.
    pub send_cqn: u32,
    /// CQ for receive completions.
    pub recv_cqn: u32,
    /// SRQ, if receives come from one.
    pub srqn: Option<u32>,
    /// Send-queue ring entries (power of two): bounds the WQEs in flight.
    pub sq_entries: u32,
    /// Granted capacities.
    pub caps: QpCaps,
}

/// Engine bookkeeping for one send WQE in flight.
#[derive(Debug, Clone, Default)]
pub(crate) struct SendSlot {
    pub(crate) wqe: SendWqe,
    /// PSNs were assigned (the WQE was transmitted at least once).
    pub(crate) assigned: bool,
    pub(crate) first_psn: u32,
    pub(crate) npsn: u32,
    /// Final status once known.
    pub(crate) done: Option<WcStatus>,
    /// Bytes of an RDMA READ response received so far.
    pub(crate) read_done: u64,
    /// Bytes reported in the completion.
    pub(crate) byte_len: u32,
}

/// The requester/completer side of a QP.
#[derive(Debug, Default)]
pub(crate) struct Requester {
    pub(crate) slots: Vec<SendSlot>,
    pub(crate) mask: u32,
    /// Next counter to fetch from the send queue.
    pub(crate) fetched: u32,
    /// Counter of the WQE being transmitted.
    pub(crate) tx: u32,
    /// Bytes of WQE `tx` already packetised.
    pub(crate) tx_offset: u64,
    /// Oldest WQE not yet completed.
    pub(crate) comp: u32,
    /// PSN of the next packet to (re)transmit.
    pub(crate) next_psn: u32,
    /// One past the highest PSN ever sent.
    pub(crate) sent_end: u32,
    /// Oldest unacknowledged PSN.
    pub(crate) una: u32,
    pub(crate) retries_left: u8,
    pub(crate) rnr_left: u8,
    /// Waiting for an RNR back-off to expire.
    pub(crate) rnr_wait: bool,
    /// Packets since the last one with AckReq.
    pub(crate) since_ackreq: u32,
    /// A local error stopped transmission at `tx`.
    pub(crate) stalled: bool,
    /// PSN of the last sequence NAK acted on since the last progress.
    pub(crate) last_nak: Option<u32>,
    /// Generation of the retransmit timer's heap entry.
    pub(crate) rto_generation: u64,
    /// The local ACK timeout is running.
    pub(crate) rto_armed: bool,
    /// When it expires (engine time).
    pub(crate) rto_deadline: u64,
    /// Due time of this QP's retransmit entry in the timer heap, if one is queued. Re-arming
    /// only moves `rto_deadline`; the queued entry, when it comes due early, queues itself again
    /// for the deadline (so an ACK costs no heap operation).
    pub(crate) rto_queued: Option<u64>,
    pub(crate) rnr_generation: u64,
}

impl Requester {
    pub(crate) fn new(entries: u32) -> Self {
        let entries = entries.max(1).next_power_of_two();
        Self {
            slots: (0..entries).map(|_| SendSlot::default()).collect(),
            mask: entries - 1,
            ..Self::default()
        }
    }

    pub(crate) fn slot(&self, counter: u32) -> &SendSlot {
        &self.slots[(counter & self.mask) as usize]
    }

    pub(crate) fn slot_mut(&mut self, counter: u32) -> &mut SendSlot {
        let mask = self.mask;
        &mut self.slots[(counter & mask) as usize]
    }

    /// READ/atomic requests sent and not yet completed. Each holds a responder resource until
    /// it completes *in order* (IBA 9.5.3), so a response arriving early does not free it.
    pub(crate) fn rd_atomic_outstanding(&self) -> u32 {
        let mut n = 0;
        let mut c = self.comp;
        while c != self.tx {
            if self.slot(c).wqe.op.is_read_or_atomic() {
                n += 1;
            }
            c = c.wrapping_add(1);
        }
        n
    }

    pub(crate) fn reset(&mut self) {
        let entries = self.slots.len() as u32;
        let slots = std::mem::take(&mut self.slots);
        *self = Self {
            slots,
            mask: entries - 1,
            ..Self::default()
        };
        for s in &mut self.slots {
            s.assigned = false;
            s.done = None;
        }
    }
}

/// A responder resource (IBA 9.5.3): what the responder keeps of an RDMA READ or an atomic,
/// to send its responses as the link drains them (`responder::respond`) and to answer a
/// duplicate of it again (IBA 9.9.2.2). A QP has `max_dest_rd_atomic` of them, in a ring.
#[derive(Debug, Clone)]
pub(crate) enum Resource {
    Read(ReadResource),
    Atomic(AtomicResource),
}

/// An RDMA READ: the request as accepted, and the cursor of its responses.
#[derive(Debug, Clone)]
pub(crate) struct ReadResource {
    pub(crate) first_psn: u32,
    /// PSNs the READ reserved: one per response packet.
    pub(crate) npsn: u32,
    pub(crate) va: u64,
    pub(crate) rkey: u32,
    pub(crate) len: u32,
    /// The MSN its responses carry.
    pub(crate) msn: u32,
    /// Index (from `first_psn`) of the next response to send; `npsn` when none is owed.
    pub(crate) next: u32,
    /// Every response was sent once; what is owed now is a replay for a duplicate.
    pub(crate) sent: bool,
    /// Where the bytes from response `next` on live, as the key check that let the request
    /// (or the duplicate) in found them; `None` for a zero-length READ, or once a turn used
    /// it (the next turn checks the key again, so a deregistered MR ends the READ).
    pub(crate) span: Option<Span>,
}

/// An atomic: its PSN and the original value its ACK carries (once executed, never again).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AtomicResource {
    pub(crate) psn: u32,
    pub(crate) orig: u64,
    pub(crate) msn: u32,
    /// Its atomic ACK is owed (behind responses before it, or replayed for a duplicate).
    pub(crate) owed: bool,
    /// The ACK was sent once.
    pub(crate) sent: bool,
}

impl Resource {
    /// Responses still to send.
    pub(crate) fn owed(&self) -> bool {
        match self {
            Self::Read(r) => r.next < r.npsn,
            Self::Atomic(a) => a.owed,
        }
    }

    /// Responses of the request itself still to send (not a replay): the requester cannot
    /// have completed it, so it still counts against `max_dest_rd_atomic`.
    pub(crate) fn unanswered(&self) -> bool {
        match self {
            Self::Read(r) => !r.sent,
            Self::Atomic(a) => !a.sent,
        }
    }
}

/// A multi-packet message being received.
#[derive(Debug, Clone)]
pub(crate) enum InMsg {
    /// A SEND: scatter into the held receive WQE.
    Send,
    /// An RDMA WRITE: bytes land at `span` + `written`.
    Write { span: Option<Span>, len: u64 },
}

/// The responder side of a QP.
#[derive(Debug, Default)]
pub(crate) struct Responder {
    /// Expected PSN.
    pub(crate) epsn: u32,
    /// Message sequence number (messages completed).
    pub(crate) msn: u32,
    /// A PSN-sequence NAK was sent for the current gap.
    pub(crate) nak_sent: bool,
    pub(crate) msg: Option<InMsg>,
    /// Bytes of the current message received so far.
    pub(crate) offset: u64,
    /// Receive WQE held for the current message.
    pub(crate) recv: RecvWqe,
    pub(crate) recv_held: bool,
    /// The responder resources, oldest at `next_resource` once all are used.
    pub(crate) resources: Vec<Option<Resource>>,
    pub(crate) next_resource: usize,
    /// Some resource owes responses: what the responder sends for later PSNs waits behind
    /// them (`responder::respond` sends it when they are out).
    pub(crate) responding: bool,
    /// An ACK owed for this PSN (sent when the current burst ends, or behind the responses
    /// owed before it).
    pub(crate) pending_ack: Option<u32>,
    /// A sequence or RNR NAK held back behind the responses owed before it.
    pub(crate) held_nak: Option<(u32, AethSyndrome)>,
    /// UC: drop packets until the next FIRST/ONLY.
    pub(crate) drop_msg: bool,
    /// COMM_EST already reported.
    pub(crate) established: bool,
}

impl Responder {
    /// Forgets every READ and atomic response owed, and what waited behind them (the QP went
    /// to ERR: it answers nothing any more).
    pub(crate) fn drop_responses(&mut self) {
        for r in &mut self.resources {
            *r = None;
        }
        self.responding = false;
        self.pending_ack = None;
        self.held_nak = None;
    }

    pub(crate) fn reset(&mut self) {
        let recv = std::mem::take(&mut self.recv);
        *self = Self {
            recv,
            ..Self::default()
        };
    }
}

/// All transport state of one QP.
#[derive(Debug)]
pub(crate) struct QpCtx {
    pub(crate) qpn: u32,
    pub(crate) init: QpInit,
    pub(crate) state: QpState,
    pub(crate) attr: QpAttr,
    pub(crate) req: Requester,
    pub(crate) resp: Responder,
    /// SQD entered and the drained event not yet reported.
    pub(crate) draining: bool,
    /// Queued in the engine's work list.
    pub(crate) scheduled: bool,
    /// Queued for an ACK flush.
    pub(crate) ack_scheduled: bool,
    /// Its part in its path's congestion control.
    pub(crate) cc: crate::congestion::QpCc,
}

impl QpCtx {
    pub(crate) fn new(qpn: u32, init: QpInit) -> Self {
        Self {
            qpn,
            init,
            state: QpState::Reset,
            attr: QpAttr {
                cap: init.caps,
                ..QpAttr::default()
            },
            req: Requester::new(init.sq_entries),
            resp: Responder::default(),
            draining: false,
            scheduled: false,
            ack_scheduled: false,
            cc: crate::congestion::QpCc::default(),
        }
    }

    pub(crate) fn recv_source(&self) -> RecvSource {
        match self.init.srqn {
            Some(srqn) => RecvSource::Srq { srqn },
            None => RecvSource::Rq { qpn: self.qpn },
        }
    }

    /// Path MTU in bytes (UD uses the port MTU, given by the caller).
    #[inline]
    pub(crate) fn mtu(&self, port_mtu: u32) -> u32 {
        match self.init.qp_type {
            QpType::Ud => port_mtu,
            _ => self.attr.path_mtu.bytes().min(port_mtu),
        }
    }

    /// True when the send side may transmit.
    pub(crate) fn can_send(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd)
    }

    /// True when the receive side accepts requests.
    pub(crate) fn can_receive(&self) -> bool {
        matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }

    /// Query view: attributes plus the live state.
    pub(crate) fn query(&self) -> QpAttr {
        QpAttr {
            qp_state: self.state,
            cur_qp_state: self.state,
            sq_draining: self.draining,
            ..self.attr
        }
    }
}

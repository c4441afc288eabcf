//! What goes in and out of a [`super::CmAgent`]: handles, states, parameters, events, MADs to
//! send and QP transitions for the caller to apply.

use core::fmt;

use portverbs_hal::Gid;

use crate::time::{MAX_WAIT_NS, timeout_ns};
use crate::wire::{MAD_LEN, RejReason, SidrStatus};

/// A connection endpoint's handle: its 32-bit local communication ID. The ID encodes a slot
/// index and the slot's generation, so a handle (or a message) for a destroyed endpoint never
/// reaches the endpoint that reuses the slot.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CmId(pub(crate) u32);

impl CmId {
    /// The local communication ID this endpoint puts on the wire.
    pub const fn comm_id(self) -> u32 {
        self.0
    }

    /// The handle of the endpoint whose local communication ID is `comm_id`: the ID an
    /// outgoing MAD of that endpoint carries. A handle for no live endpoint is simply not
    /// found by the agent's calls.
    pub const fn from_comm_id(comm_id: u32) -> Self {
        Self(comm_id)
    }
}

impl fmt::Debug for CmId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CmId({:#010x})", self.0)
    }
}

/// CM states, named and ordered as IBA and Linux's `enum ib_cm_state` (`include/rdma/ib_cm.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CmState {
    /// No connection.
    #[default]
    Idle,
    /// Waiting for REQs or SIDR_REQs for a service ID.
    Listen,
    /// Active: REQ sent, waiting for REP/REJ/MRA.
    ReqSent,
    /// Passive: REQ received, the consumer decides.
    ReqRcvd,
    /// Passive: REQ received and MRA (possibly delayed) given.
    MraReqSent,
    /// Active: the peer sent MRA for our REQ.
    MraReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    /// Active: REP received (not held here: this CM answers a REP with RTU at once).
    RepRcvd,
    /// Active: MRA sent for a REP (not entered by this CM).
    MraRepSent,
    /// Passive: the peer sent MRA for our REP.
    MraRepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, waiting for DREP.
    DreqSent,
    /// DREQ received, the consumer answers with `disconnect` (DREP).
    DreqRcvd,
    /// Disconnected; the ID is held so late messages find it, then freed.
    Timewait,
    /// SIDR_REQ sent.
    SidrReqSent,
    /// SIDR_REQ received, the consumer answers.
    SidrReqRcvd,
}

impl fmt::Display for CmState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Idle => "IDLE",
            Self::Listen => "LISTEN",
            Self::ReqSent => "REQ_SENT",
            Self::ReqRcvd => "REQ_RCVD",
            Self::MraReqSent => "MRA_REQ_SENT",
            Self::MraReqRcvd => "MRA_REQ_RCVD",
            Self::RepSent => "REP_SENT",
            Self::RepRcvd => "REP_RCVD",
            Self::MraRepSent => "MRA_REP_SENT",
            Self::MraRepRcvd => "MRA_REP_RCVD",
            Self::Established => "ESTABLISHED",
            Self::DreqSent => "DREQ_SENT",
            Self::DreqRcvd => "DREQ_RCVD",
            Self::Timewait => "TIMEWAIT",
            Self::SidrReqSent => "SIDR_REQ_SENT",
            Self::SidrReqRcvd => "SIDR_REQ_RCVD",
        })
    }
}

/// The path of a connection as the active side knows it (RoCEv2 values as Linux `cma.c` sets them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathParams {
    /// Our GID (the REQ's local GID).
    pub local_gid: Gid,
    /// The peer's GID: where the MADs go, and the REQ's remote GID.
    pub remote_gid: Gid,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit (64 on routed RoCEv2).
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Path MTU, IB enum (1 = 256 … 5 = 4096).
    pub path_mtu: u8,
    /// Packet life time (5-bit exponent; rdma_cm uses 16 on RoCE).
    pub packet_life_time: u8,
    /// Partition key.
    pub pkey: u16,
}

impl PathParams {
    /// A RoCEv2 path between two GIDs with rdma_cm's values: hop limit 64, packet life time
    /// 16, default P_Key, everything else zero, and MTU 1024 until the caller sets the port's
    /// (rdma_cm takes the netdev's MTU, rounded down to an IB MTU: the CM service sets the
    /// port's active MTU).
    pub const fn roce(local_gid: Gid, remote_gid: Gid) -> Self {
        Self {
            local_gid,
            remote_gid,
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 64,
            sl: 0,
            path_mtu: 3,
            packet_life_time: 16,
            pkey: 0xFFFF,
        }
    }
}

/// Transport service of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
}

/// What `connect` puts in the REQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectParams {
    /// Service ID (rdma_cm: `(port_space << 16) | port`).
    pub service_id: u64,
    /// Our QPN (24 bits).
    pub qpn: u32,
    /// The PSN the peer starts sending with = our receive PSN (24 bits).
    pub starting_psn: u32,
    /// READ/ATOMIC we accept as responder.
    pub responder_resources: u8,
    /// READ/ATOMIC we issue at once.
    pub initiator_depth: u8,
    /// RC or UC.
    pub transport: Transport,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// RNR retry count for the peer's QP (3 bits).
    pub rnr_retry_count: u8,
    /// CM retransmissions (4 bits; rdma_cm: 15).
    pub max_cm_retries: u8,
    /// Time the peer may take to answer (5 bits; rdma_cm: 20).
    pub remote_cm_response_timeout: u8,
    /// Time we take to answer a REP (5 bits; rdma_cm: 20).
    pub local_cm_response_timeout: u8,
    /// We use an SRQ.
    pub srq: bool,
    /// End-to-end flow control (the REQ's bit; librdmacm's `flow_control`).
    pub flow_control: bool,
    /// Our QP's local ACK timeout (5-bit exponent), as rdma_cm's
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: local only, not negotiated. `None`: the path's (from the
    /// packet life time and the peer's ACK delay, as Linux `cm.c` computes it).
    pub ack_timeout: Option<u8>,
    /// The path.
    pub path: PathParams,
    /// The application's own limit on the wait for an answer, in the clock `connect` is
    /// given (`now + limit`): the REQ is given up then — `Unreachable`, as when its retries
    /// run out — however many retries are left and whatever an MRA asked for. `None`: the
    /// retry budget alone ([`ConnectParams::retry_budget_ns`]).
    pub give_up_at: Option<u64>,
}

impl ConnectParams {
    /// How long an unanswered REQ is retried before the connect ends `Unreachable`:
    /// `max_cm_retries + 1` sends, each waited for 2·PLT + the remote CM response timeout
    /// (Linux's rounding, [`crate::time::timeout_ms`]), at most
    /// [`crate::time::MAX_WAIT_NS`]. rdma_cm's values (PLT 16 on RoCE, timeout 20, 15
    /// retries) make 16 × (2·256 + 4 096) ms = 73.7 s.
    pub const fn retry_budget_ns(&self) -> u64 {
        let interval = 2 * timeout_ns(self.path.packet_life_time)
            + timeout_ns(self.remote_cm_response_timeout);
        let budget = interval * (self.max_cm_retries as u64 + 1);
        if budget < MAX_WAIT_NS {
            budget
        } else {
            MAX_WAIT_NS
        }
    }

    /// rdma_cm's defaults for an RC connection on `path`.
    pub const fn new(service_id: u64, qpn: u32, starting_psn: u32, path: PathParams) -> Self {
        Self {
            service_id,
            qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            transport: Transport::Rc,
            retry_count: 7,
            rnr_retry_count: 7,
            max_cm_retries: 15,
            remote_cm_response_timeout: 20,
            local_cm_response_timeout: 20,
            srq: false,
            flow_control: false,
            ack_timeout: None,
            path,
            give_up_at: None,
        }
    }
}

/// What `accept` puts in the REP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AcceptParams {
    /// Our QPN (24 bits).
    pub qpn: u32,
    /// The PSN the active side starts sending with = our receive PSN (24 bits).
    pub starting_psn: u32,
    /// READ/ATOMIC we accept as responder.
    pub responder_resources: u8,
    /// READ/ATOMIC we issue at once.
    pub initiator_depth: u8,
    /// RNR retry count for the active side's QP (3 bits).
    pub rnr_retry_count: u8,
    /// We use an SRQ.
    pub srq: bool,
    /// End-to-end flow control (the REP's bit).
    pub flow_control: bool,
    /// Our QP's local ACK timeout (5-bit exponent), local only; `None`: the REQ's path's.
    pub ack_timeout: Option<u8>,
    /// The largest path MTU (IB enum) our port takes: the QP's path MTU is the smaller of
    /// this and the REQ's (the REP carries none). 5 (4096): the REQ's.
    pub path_mtu: u8,
}

impl AcceptParams {
    /// Defaults: one READ/ATOMIC each way, RNR retry 7 (infinite), no SRQ, no flow control,
    /// the path's ACK timeout and MTU.
    pub const fn new(qpn: u32, starting_psn: u32) -> Self {
        Self {
            qpn,
            starting_psn,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            srq: false,
            flow_control: false,
            ack_timeout: None,
            path_mtu: 5,
        }
    }
}

/// What `sidr_request` puts in the SIDR_REQ, and its timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SidrParams {
    /// Service ID.
    pub service_id: u64,
    /// Partition key.
    pub pkey: u16,
    /// Retransmission interval (5-bit exponent; rdma_cm: 20).
    pub timeout: u8,
    /// Retransmissions (rdma_cm: 15).
    pub max_retries: u8,
}

/// Attributes for INIT→RTR, computed as Linux's `ib_cm_init_qp_attr` does (`core/cm.c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrAttrs {
    /// The peer's QPN.
    pub dest_qpn: u32,
    /// The first PSN we expect.
    pub rq_psn: u32,
    /// Path MTU (IB enum).
    pub path_mtu: u8,
    /// Responder resources (max_dest_rd_atomic).
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer (Linux's CM: 0 = 655.36 ms).
    pub min_rnr_timer: u8,
    /// Whether remote READ/ATOMIC are allowed on the QP (responder resources > 0; remote
    /// WRITE always is), as Linux `cm.c` grants them.
    pub remote_read_atomic: bool,
    /// Our GID (the SGID of the address vector).
    pub sgid: Gid,
    /// The peer's GID.
    pub dgid: Gid,
    /// Flow label.
    pub flow_label: u32,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Service level.
    pub sl: u8,
}

/// Attributes for RTR→RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttrs {
    /// Our first send PSN.
    pub sq_psn: u32,
    /// Transport retry count.
    pub retry_cnt: u8,
    /// RNR retry count.
    pub rnr_retry: u8,
    /// Initiator depth (max_rd_atomic).
    pub max_rd_atomic: u8,
    /// Local ACK timeout (5-bit exponent).
    pub timeout: u8,
}

/// The QP state a [`QpAction`] asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpTarget {
    /// Ready to receive.
    Rtr(RtrAttrs),
    /// Ready to send.
    Rts(RtsAttrs),
    /// Error: every posted request is flushed.
    Error,
}

/// A QP transition the caller applies (the CM never touches a QP itself).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAction {
    /// The connection.
    pub id: CmId,
    /// The QP given to `connect` or `accept`.
    pub qpn: u32,
    /// Where it goes.
    pub target: QpTarget,
}

/// What a REQ asked for, as the passive consumer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The listener it arrived on.
    pub listener: CmId,
    /// Service ID.
    pub service_id: u64,
    /// The sender's GID (where our answers go).
    pub peer: Gid,
    /// The sender's QPN.
    pub remote_qpn: u32,
    /// The sender's responder resources.
    pub responder_resources: u8,
    /// The sender's initiator depth.
    pub initiator_depth: u8,
    /// The sender uses an SRQ.
    pub srq: bool,
    /// REQ private data (rdma_cm: the 36-byte CMA header first).
    pub private_data: [u8; 92],
}

/// An event for the application (librdmacm-like).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CmEvent {
    /// A REQ arrived on a listener; `id` is a new endpoint the application now owns (accept,
    /// reject or destroy it).
    ConnectRequest {
        /// The new endpoint.
        id: CmId,
        /// What was asked.
        request: Box<ConnectRequest>,
    },
    /// `connect` or `accept` completed: the connection is up.
    Established {
        /// The endpoint.
        id: CmId,
        /// The REP's private data (active side), the RTU's (passive side), or none when a
        /// DREQ completed the accept.
        private_data: Vec<u8>,
    },
    /// `connect` or `accept` ended with a REJ from the peer (or the peer withdrew a REQ
    /// the application had not answered yet).
    Rejected {
        /// The endpoint.
        id: CmId,
        /// The peer's reason.
        reason: RejReason,
        /// The REJ's private data (empty when this CM gave up on a stale connection).
        private_data: Vec<u8>,
    },
    /// `connect`, `accept` or `sidr_request` ended without an answer: the CM retries ran out.
    Unreachable {
        /// The endpoint.
        id: CmId,
    },
    /// An established connection ended: DREQ received, our DREQ answered or timed out, or a
    /// REJ on a connected endpoint. Delivered at most once per endpoint.
    Disconnected {
        /// The endpoint.
        id: CmId,
    },
    /// TIMEWAIT ended; the endpoint is IDLE and may be destroyed or reused.
    TimewaitExit {
        /// The endpoint.
        id: CmId,
    },
    /// A SIDR_REQ arrived on a listener; `id` is a new endpoint answered with `sidr_reply`.
    SidrRequest {
        /// The new endpoint.
        id: CmId,
        /// The listener.
        listener: CmId,
        /// Service ID.
        service_id: u64,
        /// The sender's GID (where the SIDR_REP goes).
        peer: Gid,
        /// The SIDR_REQ's private data, all 216 bytes (rdma_cm: the 36-byte CMA header
        /// first).
        private_data: Vec<u8>,
    },
    /// `sidr_request` got its SIDR_REP.
    SidrResolved {
        /// The endpoint.
        id: CmId,
        /// The status.
        status: SidrStatus,
        /// The UD QPN.
        qpn: u32,
        /// Its Q_Key.
        qkey: u32,
        /// The SIDR_REP's private data, all 136 bytes.
        private_data: Vec<u8>,
    },
}

/// A MAD for the caller to send to the peer's QP1 (P_Key, Q_Key 0x80010000 and the UD
/// encapsulation are the caller's job, as in Linux `drivers/infiniband/core/mad.c`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutMad {
    /// The peer's GID.
    pub to: Gid,
    /// The 256 bytes.
    pub mad: [u8; MAD_LEN],
}

/// One output of the agent, in the order the caller must act on them (a QP goes to RTS before
/// the RTU that follows it leaves).
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // MADs are fixed 256-byte buffers, not worth a heap box each
pub enum CmOutput {
    /// Send a MAD.
    Send(OutMad),
    /// Apply a QP transition.
    Qp(QpAction),
    /// Deliver an event.
    Event(CmEvent),
}

//! # Portverbs CM core
//!
//! The InfiniBand Communication Manager as a sans-IO protocol core: CM MADs in and out, the
//! connection state machine of Linux's `drivers/infiniband/core/cm.c`, timers as
//! data. One [`CmAgent`] serves one port.
//!
//! What this layer does:
//!
//! * [`wire`]: the CM MADs (REQ, MRA, REJ, REP, RTU, DREQ, DREP, SIDR_REQ, SIDR_REP; LAP and
//!   APR recognised and ignored as Linux does on RoCE) as a checked header view and one
//!   representation per message. Parsing never panics; bad bytes give a [`MadError`]. Also
//!   rdma_cm's 36-byte CMA private-data header and IP-CM service IDs (codec only).
//! * [`CmAgent`]: communication IDs (slab index + generation, XORed with a caller-chosen
//!   salt) with INVALID / RESERVED / VALID slots, matching by local and remote IDs, response
//!   timeouts from the packet life time and CM response timeouts, retransmission and retries,
//!   MRA, duplicate REQ/REP/DREQ handling and the answers Linux gives to unmatched messages,
//!   TIMEWAIT, REJ reasons, and `destroy` in any state sending the REJ/DREQ/DREP Linux sends.
//!   Its outputs — MADs to send, QP transitions to apply, application events — come out of
//!   one ordered queue ([`CmAgent::poll_output`]). Every state change goes through one
//!   funnel that traces `old => new` (IBA state names) at `tracing`'s trace level.
//! * [`time`]: Linux's timeout arithmetic.
//!
//! The CM for applications — the agent driven over a device's QP1 through verbs-core, with
//! rdma_cm's IP addressing and a `Listener` / `Connector` API — is the crate
//! `portverbs-cm-service` (`cm-core/service`, `portverbs::cm::service` in the facade). It
//! reads the clock and does the I/O; this crate does neither.
//!
//! ## What is bounded and clamped
//!
//! Everything from the wire is hostile: a peer may lie, forge its source address and
//! propose any value a field can hold. The agent holds:
//!
//! * A received MAD is exactly 256 bytes (the bytes that arrived, never a whole receive
//!   buffer), else it is dropped as malformed ([`AgentStats::malformed`]).
//! * Every 5-bit timeout a peer proposes (a REQ's two CM response timeouts and local ACK
//!   timeout, a REP's target ACK delay, an MRA's service timeout) is clamped to 23
//!   ([`time::MAX_PEER_TIMEOUT`]: 2^15 ms = 32.8 s by Linux's rounding, the largest under
//!   the 60 s Linux's MAD layer allows one retry interval; 31 would be 2^23 ms, 2.3 hours)
//!   before it becomes a retransmission interval, a QP ACK timeout or a TIMEWAIT.
//! * No wait for a peer lasts more than five minutes ([`time::MAX_WAIT_NS`], Linux's
//!   `IB_MAD_MAX_DEADLINE`): a REQ, REP, DREQ or SIDR_REQ still unanswered then is given up
//!   whatever its interval and retries (at most 15, a 4-bit field); an MRA extends the wait
//!   once, by its clamped service timeout.
//! * A received connection request nobody answers is withdrawn once its sender must have
//!   given up: its REQ interval (2·PLT + its remote CM response timeout, both clamped) times
//!   its tries, at most five minutes, plus the MRA we sent, once. It is reported as a REJ
//!   Timeout would be ([`AgentStats::withdrawn`]), so a forged REQ does not hold a listener's
//!   backlog for ever. A SIDR_REQ, which proposes no timeout, is withdrawn after five
//!   minutes.
//! * A message that finds an endpoint by its communication IDs (REP, MRA, REJ, RTU, DREQ,
//!   DREP, SIDR_REP, a duplicate REQ) is taken only from the endpoint's peer GID, and a REQ
//!   or REP makes a connection stale only when it comes from that connection's peer
//!   ([`AgentStats::foreign_source`] counts the rest). Linux matches by the IDs alone.
//! * A DREP reaching an established connection from its peer (someone disconnected it in
//!   our name) ends the connection: its owner hears DISCONNECTED rather than waiting.
//! * Strangers leave no state: a REQ for no listener, a DREQ for no connection and a
//!   SIDR_REQ for no service are answered without an endpoint; a REQ to a listener makes one
//!   endpoint, freed at once when refused; the lookup maps and the timer heap hold only live
//!   endpoints (and TIMEWAIT, at most 2^15 ms); the output queue gives its room back after a
//!   burst.
//!
//! What the agent and the codecs must never do: I/O of any kind (no sockets, no QP1, no
//! device), spawn a thread, sleep, read a clock (time is an argument in nanoseconds), draw
//! random numbers, touch a QP (QP transitions are data for the caller), panic on input from
//! the wire, or use `unsafe`. The crate depends on `portverbs-hal` only (for GIDs), never
//! on verbs-core, a backend or a platform crate.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod agent;
mod error;
pub mod time;
pub mod wire;

pub use agent::{
    AcceptParams, AgentConfig, AgentStats, CmAgent, CmEvent, CmId, CmOutput, CmState,
    ConnectParams, ConnectRequest, OutMad, PathParams, QpAction, QpTarget, RtrAttrs, RtsAttrs,
    SidrParams, Transport,
};
pub use error::{CmError, CmaError, MadError};

//! # Portverbs CM core
//!
//! The InfiniBand Communication Manager as a sans-IO protocol core: CM MADs in and out, the
//! connection state machine of Linux's `cm.c` (facts/ib-cm-and-rocev2.md §2–3), timers as
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

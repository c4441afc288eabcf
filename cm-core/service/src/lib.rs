//! # Portverbs CM service
//!
//! The CM for applications (issue 17 items 2–5): the sans-IO
//! [`CmAgent`](portverbs_cm::CmAgent) of `portverbs-cm` driven over a device's QP1, with
//! rdma_cm's IP addressing and an application API. The protocol lives in the core; this
//! crate adds what the core must not do: I/O through verbs-core and a monotonic clock.
//!
//! * [`CmDevice`]: one per opened [`Context`] (port 1) and local IP address. It owns QP1
//!   ([`QpInit::gsi`]) with receive buffers posted, an address handle per peer GID, the
//!   agent, and which QP belongs to which connection. It has no thread: every call and every
//!   wait drives it ([`CmDevice::progress`]): QP1's completions feed the agent, the agent's
//!   outputs are acted on in order (MADs posted on QP1, QP transitions applied through
//!   verbs-core, events queued per connection), and expired CM timers fire from a monotonic
//!   clock read here.
//! * [`Listener`] / [`Connector`]: rdma_cm's passive and active sides for RC
//!   (`RDMA_PS_TCP`), each call async with a `_blocking` twin.
//! * [`addr`]: IP ↔ GID for RoCEv2.
//!
//! Waiting: a blocking wait sleeps in [`Cq::wait_notify`] on QP1's CQ, at most until the next
//! CM timer and never more than [`MAX_SLEEP`] (several threads may wait on one device and
//! one of them may consume the completion another is waiting for; the cap bounds that).
//! An async wait awaits QP1's CQ notification or a wake from another waiter's progress, and
//! the next CM timer (retransmissions, TIMEWAIT) through the [`CmTimer`] the application
//! lends with [`CmDevice::set_timer`] (e.g. its runtime's `sleep_until`): this layer has no
//! clock to wake a task with, no thread, and names no runtime or platform. Without a timer,
//! CM timers in async code fire only when something wakes the task (a MAD, another call);
//! [`CmDevice::next_deadline`] then says when an event loop should call
//! [`CmDevice::progress`]. [`CmDevice::run`] is the async driver of a device nobody else
//! waits on.
//!
//! QP transitions the CM asks for are applied with verbs-core's blocking `modify` inside
//! progress, also from async calls (they complete at once on the soft device; a device
//! with slow commands would stall the task for that time).
//!
//! The QP ↔ connection association is one map entry per QP, made and cleared under the
//! device lock. The CM keeps only a weak handle ([`portverbs_verbs::WeakQp`]), so the
//! application may destroy a QP at any time: the next progress finds it gone and destroys
//! the endpoint (REJ during setup, DREQ when connected). A failed device (QP1 flushed) gives
//! every endpoint `DEVICE_REMOVAL` and ends every wait.
//!
//! UD services (`RDMA_PS_UDP`): [`Listener::bind_udp`] and [`Listener::get_service_request`]
//! on the passive side, [`Connector::resolve_service`] (SIDR) on the active side.
//!
//! Not here yet: the passive checks on a SIDR_REQ's CMA header (any SIDR_REQ on a UDP
//! listener is offered to the application), IPv6 link-local scope handling, and choosing
//! among several devices by IP ([`CmDevice::open`] takes the context whose GID table holds
//! the IP).
//!
//! What this layer must never do: spawn a thread, name a backend or platform crate, use
//! `unsafe`, or leave a connection's QP associated after its endpoint is gone.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod addr;
mod api;
mod engine;
mod error;
mod events;
mod timer;

pub use api::{
    AcceptParams, ConnParam, ConnectParams, ConnectionRequest, Connector, Listener, REQ_USER_DATA,
    ServiceRequest, UdService,
};
pub use engine::{CmDevice, MAX_SLEEP, MadCounts};
pub use error::ServiceError;
pub use events::RdmaCmEvent;
pub use timer::{CmTimer, Sleep};

#[cfg(doc)]
use portverbs_verbs::{Context, Cq, QpInit};

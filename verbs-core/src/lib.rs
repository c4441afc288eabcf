//! # Portverbs verbs core
//!
//! The portable InfiniBand verbs: devices opened as [`Context`]s, protection domains, memory
//! regions and windows, completion queues with NetworkDirect-style notification requests and
//! libibverbs-style completion channels, queue pairs (RC, UC, UD) whose every modify is checked
//! against the HAL's one IBTA transition table ([`portverbs_hal::qp_state`]), UD multicast
//! groups ([`Qp::attach_mcast`], [`Qp::detach_mcast`]), shared receive queues, address
//! handles, and asynchronous events. It runs on any backend that
//! implements the HAL ([`portverbs_hal::Device`]); applications choose the backend at run time
//! through the `portverbs` facade.
//!
//! ## The data path
//! [`Qp::post_send`] / [`Qp::post_recv`] validate each work request, record its `wr_id` and let
//! the backend encode it into its WQE slot, then ring the doorbell once. A send request is
//! admitted against rules precomputed when the QP was created (a few compares); only a refused
//! one goes through the check that names the broken rule. [`Cq::poll`] runs one loop inside the
//! backend (`CompletionQueue::poll_with`): the backend decodes each device CQE (after its
//! ownership check) straight into the caller's array and a closure of this crate, inlined
//! there, checks every field it uses and maps it back to its `wr_id`. Both take only the lock of the
//! queue concerned (a `parking_lot` mutex: no poison bookkeeping on the hot path) and allocate
//! nothing. The backend's queue objects are the device's associated types, so this code is
//! compiled per backend with the backend's encoder and decoder inlined into it.
//!
//! ## Memory safety around the device
//! Memory the device may write is a [`Buffer`] that is only ever copied into and out of; no
//! Rust reference into it exists, so safe code cannot race the device. Handles are `Arc`-owned
//! and cheap to clone; every object keeps alive what it depends on (a QP its PD, CQs and SRQ; a
//! CQ its context and event queue), and explicit `destroy`/`dealloc` calls return the handle
//! with a `Busy` error while something still uses it.
//!
//! ## Sync or async
//! Every slow operation (create, modify, register …) is an `async fn` with a `*_blocking` twin
//! that is a thin wrapper over it; nothing here chooses a blocking model for the application.
//!
//! ## Events: read, block or await
//! Every event queue interrupts a sink chosen by the context's [`SinkFactory`]. The core
//! drives the queues itself, on the application's calls, with one discipline (clear the sink,
//! process and look, then wait): [`CompletionChannel::get_cq_event`] /
//! [`CompletionChannel::wait_cq_event`] / [`CompletionChannel::next_cq_event`],
//! [`Cq::wait_notify`] / [`Cq::notified`], [`Context::get_async_event`] /
//! [`Context::wait_async_event`] / [`Context::next_async_event`]. How a thread blocks or a
//! task is woken is the sink's business: an eventfd in poll(2) or a reactor with the Linux
//! platform's sinks, a condition variable and wakers with [`LatchSinks`]; [`PollingSinks`]
//! refuses to wait.
//!
//! ## Progress: manual or auto
//! Who makes a device progress is the device's choice, made when it was created
//! ([`portverbs_hal::Progress`], [`Context::progress`]). On an *auto* device (the default;
//! hardware, and software devices with their one progress thread) this layer only posts,
//! polls and waits. On a *manual* device nothing runs unless the application calls, so this
//! layer drives it: [`Cq::poll`] dispatches the device before it takes the CQ's lock ("polling
//! any CQ of a device makes the whole device progress"), [`Context::process_events`],
//! `get_cq_event` and `get_async_event` do too, every blocking wait dispatches it on each
//! round and sleeps on its sink and the device's input together until the device's next
//! timer, and every await dispatches it on each poll; [`Context::dispatch`] does it alone.
//! A posted request is sent by the device's doorbell on the posting thread.
//! [`Context::attach_agent`] lets a layer above (the CM) have its own work run wherever the
//! device progresses.
//!
//! ## What this layer must never do
//! Spawn a thread, sleep or read a clock (the blocking waits an application asks for read it
//! once, for the deadline, and block inside the sink; on a manual device they also read it to
//! tell the caller's deadline from the device's timers), name a backend or a platform crate,
//! or use `unsafe`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod ah;
mod ah_wc;
pub mod bringup;
mod buffer;
mod channel;
mod connect;
mod context;
mod cq;
mod eq_ref;
pub mod error;
pub mod events;
mod mr;
mod mw;
pub mod notify;
mod notify_wait;
mod pd;
mod qp;

mod send_rules;
mod shared;
mod sink;
mod srq;
mod wait;
mod wc;

pub use ah::AddressHandle;
pub use ah_wc::{GRH_LEN, GrhError, REPLY_HOP_LIMIT, ReceivedGrh};
pub use buffer::Buffer;
pub use channel::CompletionChannel;
pub use connect::{ConnectError, ConnectOptions, QpEndpoint};
pub use context::{Context, ContextOptions};
pub use cq::{Cq, CqInit};
pub use eq_ref::EventQueueRef;
pub use error::*;
pub use events::{AsyncEvent, AsyncEventKind, EventElement};
pub use mr::{Mr, Rereg};
pub use mw::{Mw, inc_rkey};
pub use notify::{NotifyKind, NotifyRequest};
pub use pd::Pd;
pub use portverbs_hal::ObjectCounts;
pub use qp::{Qp, QpInit, RecvWr, WeakQp};
pub use sink::{LatchSink, LatchSinks, PollingSinks, SinkFactory};
pub use srq::{Srq, SrqInit};
pub use wc::WorkCompletion;

/// The HAL this crate is built on. Hidden here: its device commands bypass this crate's
/// checks, so the facade shows it only as `portverbs::backends::hal`, for backend authors.
#[doc(hidden)]
pub use portverbs_hal as hal;
pub use portverbs_hal::attr::{AddressVector, QpAttr, QpAttrMask, QpCaps};
pub use portverbs_hal::types::{
    AccessFlags, Gid, Mtu, MwType, PortState, QpState, QpType, SpecialQp,
};
pub use portverbs_hal::wc::{WcFlags, WcOpcode, WcStatus};
pub use portverbs_hal::wr::{MwBind, Payload, RemoteAddr, SendFlags, SendOp, SendWr, Sge, UdDest};

//! # Portverbs on Linux: event queues behind eventfds
//!
//! This layer makes what the device tells the host — "CQ n has a completion", "port 1 went
//! down" — a file descriptor that becomes readable, Linux's own mechanism for it. [`open`]
//! opens a device with [`LinuxSinks`]: every event queue the portable core creates interrupts
//! an [`EventFd`] through an [`EventFdSink`]. A VFIO backend binds an MSI-X vector to the same
//! eventfd ([`portverbs_hal::notify::InterruptSink::eventfd`]), so the kernel's interrupt
//! handler signals it with no code of ours in between.
//!
//! Everything an application calls is in `portverbs-verbs` (or the `portverbs` facade); this
//! crate only decides how those calls block and wake:
//!
//! | libibverbs | Portverbs | On Linux |
//! |---|---|---|
//! | `ibv_open_device` | [`open`] → [`Context`] | an eventfd per event queue |
//! | `ibv_create_comp_channel` | [`Context::create_comp_channel`](portverbs_verbs::Context::create_comp_channel) | a channel on its own eventfd |
//! | `comp_channel->fd` | [`CompletionChannel::as_fd`](portverbs_verbs::CompletionChannel::as_fd) | for poll, epoll (either mode), any reactor |
//! | `ibv_get_cq_event`, nonblocking fd | [`CompletionChannel::get_cq_event`](portverbs_verbs::CompletionChannel::get_cq_event) | drains the eventfd, then reads |
//! | `ibv_get_cq_event`, blocking fd | [`CompletionChannel::wait_cq_event`](portverbs_verbs::CompletionChannel::wait_cq_event) | poll(2) on the caller's thread |
//! | — | [`CompletionChannel::next_cq_event`](portverbs_verbs::CompletionChannel::next_cq_event) | tokio's reactor (feature `tokio`) |
//! | `context->async_fd` | [`Context::async_fd`](portverbs_verbs::Context::async_fd), [`Context::wait_async_event`](portverbs_verbs::Context::wait_async_event) | the same, for asynchronous events |
//! | (NetworkDirect `Notify`) | [`Cq::wait_notify`](portverbs_verbs::Cq::wait_notify), [`Cq::notified`](portverbs_verbs::Cq::notified) | a per-CQ notify request, blocking or awaited |
//!
//! ## Readiness, exactly
//! A wait ends when the fd is readable; readiness only says "something may be waiting". The
//! reading side drains the eventfd, processes the event queue (which re-arms it), takes one
//! event, and, if any is left queued, signals the eventfd again. So a level-triggered poller
//! sees the fd readable until everything was read, an edge-triggered one (EPOLLET, tokio) gets a
//! fresh edge for what is left, and no event waits behind a quiet fd. The price is the
//! occasional spurious wakeup: a read that finds nothing right after one is normal. Several
//! threads may read one fd; each event goes to exactly one of them.
//!
//! ## Manual progress
//! A device in manual progress ([`portverbs_hal::Progress::Manual`], a UDP-bound software
//! device made so) runs nothing unless the application calls; a thread that waits for one of
//! its events must wake for the datagram that brings it. So every sink here also waits on the
//! device's input ([`portverbs_hal::WaitSource`], the port's epoll set): a blocking wait is
//! one poll(2) on the eventfd and that fd, until the earlier of the caller's deadline and the
//! device's next timer (verbs-core then dispatches the device on the waiting thread and looks
//! again); with feature `tokio`, an awaiting task's sink registers a duplicate of that fd
//! with tokio's reactor too, so a datagram wakes the task, and arms a timerfd there for the
//! device's next timer, so retransmissions and the connection manager's timers run while the
//! task only awaits (no timer of the application's is needed; the runtime needs its I/O
//! driver, not its time driver). Without a reactor, a task is woken by raises only.
//!
//! ## Async
//! With feature `tokio`, an eventfd is registered with tokio's reactor the first time a task
//! awaits it inside a runtime (and stays with that runtime), so interrupts the kernel signals
//! wake tasks too. Without the feature, or outside a runtime, a task is woken by the in-process
//! raise of the software and emulated devices only; hardware behind VFIO needs the feature.
//!
//! ## By operating system
//! | OS | Mechanism | Where |
//! |---|---|---|
//! | Linux, software or emulated device | eventfd signalled by the device's interrupt sink | this crate |
//! | Linux, VFIO hardware | MSI-X vector → the same eventfd (`VFIO_DEVICE_SET_IRQS`, `DATA_EVENTFD \| ACTION_TRIGGER`) | this crate's sinks, bound by the backend |
//! | Linux, async Rust | the fds above in tokio's reactor (`AsyncFd`, edge-triggered) | this crate, feature `tokio` |
//! | Windows | OVERLAPPED requests completing to an event, a completion port, or an APC | `portverbs-windows` |
//!
//! ## What this layer must never do
//! * Spawn a thread, or sleep. Progress happens in the application's calls; the only blocking
//!   is a poll(2) the application asked for, on its own thread, with its own timeout.
//! * Hold portable logic. Routing events to CQs, notify-request semantics, the
//!   clear-look-wait discipline, acknowledgement counting and the destroy barrier live in
//!   `portverbs-verbs`; this crate only turns interrupts into fd readiness and back.
//! * Name a backend. It works with any [`portverbs_hal::Device`].
//! * Use `unsafe`, except in `sys` (feature `tokio` only): the system calls go through
//!   `rustix`; the two `unsafe` calls register the crate's own eventfds, and its own
//!   duplicates of a manual device's input, with tokio's reactor, whose `AsyncFd::register*`
//!   became `unsafe` in tokio 1.54.
//!
//! ## Example: epoll
//! ```no_run
//! use portverbs_verbs::CqInit;
//! use rustix::event::epoll;
//!
//! # fn demo<D: portverbs_hal::Device>(dev: D) -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = portverbs_linux::open_blocking(dev)?;
//! let chan = ctx.create_comp_channel()?;
//! let cq = ctx.create_cq_blocking(CqInit { entries: 64, channel: Some(&chan), ..CqInit::default() })?;
//! let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
//! let fd = chan.as_fd().expect("Linux sinks have an eventfd");
//! epoll::add(&ep, fd, epoll::EventData::new_u64(1), epoll::EventFlags::IN)?;
//! cq.req_notify(false);
//! // … post work …
//! let mut ready = [epoll::Event { flags: epoll::EventFlags::empty(), data: epoll::EventData::new_u64(0) }; 4];
//! epoll::wait(&ep, &mut ready[..], None)?;
//! while let Some(cq) = chan.get_cq_event()? {
//!     cq.ack_events(1);
//!     cq.req_notify(false);
//!     // poll the CQ until empty
//! }
//! # Ok(()) }
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod eventfd;
#[cfg(feature = "tokio")]
mod reactor;
mod sinks;
#[cfg(feature = "tokio")]
mod sys;
mod wait;

use portverbs_hal::block_on;
use portverbs_hal::device::Device;
use portverbs_verbs::{Context, ContextOptions, OpenError};

pub use eventfd::{EventFd, EventFdSink};
pub use sinks::LinuxSinks;

/// Opens `dev` with an eventfd behind every event queue ([`LinuxSinks`]). `eq_entries` as in
/// [`ContextOptions::eq_entries`].
///
/// # Errors
/// No eventfd could be created, or the device could not be opened.
pub async fn open_with<D: Device>(dev: D, eq_entries: u32) -> Result<Context<D>, OpenError> {
    let opts = ContextOptions {
        sinks: LinuxSinks::new().map_err(OpenError::Sinks)?,
        eq_entries,
    };
    Context::open(dev, opts).await
}

/// [`open_with`] with the default event-queue size.
///
/// # Errors
/// As [`open_with`].
pub async fn open<D: Device>(dev: D) -> Result<Context<D>, OpenError> {
    open_with(dev, ContextOptions::default().eq_entries).await
}

/// Blocking form of [`open`].
///
/// # Errors
/// As [`open`].
pub fn open_blocking<D: Device>(dev: D) -> Result<Context<D>, OpenError> {
    block_on(open(dev))
}

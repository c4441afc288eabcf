//! # Portverbs on Linux: completions and events through file descriptors
//!
//! This layer delivers what the device tells the host — "CQ n has a completion", "port 1 went
//! down" — through Linux's own mechanism for it: a file descriptor that becomes readable. Every
//! event queue the portable core creates interrupts an [`EventFd`] ([`EventFdSink`]); the
//! application waits on those fds however it likes — poll(2), epoll in level- or edge-triggered
//! mode, tokio's `AsyncFd`, or the blocking `wait` helpers here — and then calls into the core
//! to process the queue. A VFIO backend binds an MSI-X vector to the same eventfd
//! ([`portverbs_hal::notify::InterruptSink::eventfd`]), so the kernel's interrupt handler
//! signals it with no code of ours in between.
//!
//! | Piece | libibverbs | What it is |
//! |---|---|---|
//! | [`open`] → ([`Context`], [`AsyncEvents`]) | `ibv_open_device`, `context->async_fd` | a context whose event queues interrupt eventfds ([`LinuxSinks`]) |
//! | [`AsyncEvents::get_event`] | `ibv_get_async_event` (no ack needed: events name objects by number) | the next asynchronous event, `WouldBlock` when none |
//! | [`CompChannel::new`] | `ibv_create_comp_channel` | an eventfd plus the core's [`portverbs_verbs::CompletionChannel`] |
//! | `CqInit { channel: Some(ch.channel()), .. }` | `ibv_create_cq(.., channel, ..)` | a CQ reporting to the channel |
//! | [`Cq::req_notify`](portverbs_verbs::Cq::req_notify) | `ibv_req_notify_cq` | one-shot arming: one event per call |
//! | [`CompChannel::get_cq_event`] | `ibv_get_cq_event` on an `O_NONBLOCK` fd | the CQ whose event arrived, `WouldBlock` when none |
//! | [`Cq::ack_events`](portverbs_verbs::Cq::ack_events) | `ibv_ack_cq_events` | [`Cq::destroy`](portverbs_verbs::Cq::destroy) is refused while events are unacknowledged |
//! | [`CompChannel::wait`], [`AsyncEvents::wait`] | the same calls on a blocking fd | poll(2) on the caller's thread |
//! | [`CompChannel::wait_notify`], `TokioCompChannel::notify` | (NetworkDirect `INDCompletionQueue::Notify`) | a per-CQ notify request, blocking or as a `Future` |
//!
//! ## Readiness, exactly
//! A wait ends when the fd is readable; readiness only says "something may be waiting". The
//! reading side drains the eventfd, processes the event queue (which re-arms it), takes one
//! event, and, if any is left queued, signals the eventfd again. So a level-triggered poller
//! sees the fd readable until everything was read, an edge-triggered one (EPOLLET, tokio) gets a
//! fresh edge for what is left, and no event waits behind a quiet fd. The price is the
//! occasional spurious wakeup: a get that returns `WouldBlock` right after one is normal.
//! Several threads may read one fd; each event goes to exactly one of them.
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
//! * Hold portable logic. Routing events to CQs, notify-request semantics, acknowledgement
//!   counting and the destroy barrier live in `portverbs-verbs`; this crate only turns
//!   interrupts into fd readiness and readiness into calls to the core.
//! * Name a backend. It works with any [`portverbs_hal::Device`].
//! * Use `unsafe`, except in `sys` (feature `tokio` only): the system calls go through
//!   `rustix`; the one `unsafe` call registers the crate's own eventfds with tokio's reactor,
//!   whose `AsyncFd::register*` became `unsafe` in tokio 1.54.
//!
//! ## Example: epoll
//! ```no_run
//! use std::os::fd::AsFd;
//! use portverbs_linux::CompChannel;
//! use portverbs_verbs::CqInit;
//! use rustix::event::epoll;
//!
//! # fn demo<D: portverbs_hal::Device>(dev: D) -> Result<(), Box<dyn std::error::Error>> {
//! let (ctx, _events) = portverbs_linux::open_blocking(dev)?;
//! let chan = CompChannel::new(&ctx)?;
//! let cq = ctx.create_cq_blocking(CqInit { entries: 64, channel: Some(chan.channel()), ..CqInit::default() })?;
//! let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
//! epoll::add(&ep, chan.as_fd(), epoll::EventData::new_u64(1), epoll::EventFlags::IN)?;
//! cq.req_notify(false);
//! // … post work …
//! let mut ready = [epoll::Event { flags: epoll::EventFlags::empty(), data: epoll::EventData::new_u64(0) }; 4];
//! epoll::wait(&ep, &mut ready[..], None)?;
//! while let Ok(cq) = chan.get_cq_event() {
//!     cq.ack_events(1);
//!     cq.req_notify(false);
//!     // poll the CQ until empty
//! }
//! # Ok(()) }
//! ```
//!
//! ## Example: tokio (feature `tokio`)
//! See `TokioCompChannel` (a notify request as a `Future`, async `get_cq_event`) and
//! `TokioAsyncEvents`; both are built on `tokio::io::unix::AsyncFd`, and their `async_fd()`
//! hands out the registration for direct `readable().await` / `try_io` use.
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod channel;
mod error;
mod eventfd;
mod events;
mod sinks;
#[cfg(feature = "tokio")]
mod sys;
#[cfg(feature = "tokio")]
mod tokio_rt;
mod wait;

use std::sync::Arc;

use portverbs_hal::block_on;
use portverbs_hal::device::Device;
use portverbs_verbs::{Context, ContextOptions};

pub use channel::CompChannel;
pub use error::{ChannelError, NotifyWaitError, OpenError};
pub use eventfd::{EventFd, EventFdSink};
pub use events::AsyncEvents;
pub use sinks::LinuxSinks;
#[cfg(feature = "tokio")]
pub use tokio_rt::{TokioAsyncEvents, TokioCompChannel};

/// Opens `dev` with an eventfd behind every event queue ([`LinuxSinks`]) and returns the
/// context with its asynchronous events. `eq_entries` as in [`ContextOptions::eq_entries`].
///
/// # Errors
/// No eventfd could be created, or the device could not be opened.
pub async fn open_with<D: Device>(
    dev: D,
    eq_entries: u32,
) -> Result<(Context<D>, AsyncEvents<D>), OpenError> {
    let sinks = LinuxSinks::new().map_err(OpenError::EventFd)?;
    let opts = ContextOptions {
        sinks: sinks.clone() as Arc<dyn portverbs_verbs::SinkFactory>,
        eq_entries,
    };
    let ctx = Context::open(dev, opts).await?;
    let events = AsyncEvents::new(ctx.clone(), sinks);
    Ok((ctx, events))
}

/// [`open_with`] with the default event-queue size.
///
/// # Errors
/// As [`open_with`].
pub async fn open<D: Device>(dev: D) -> Result<(Context<D>, AsyncEvents<D>), OpenError> {
    open_with(dev, ContextOptions::default().eq_entries).await
}

/// Blocking form of [`open`].
///
/// # Errors
/// As [`open`].
pub fn open_blocking<D: Device>(dev: D) -> Result<(Context<D>, AsyncEvents<D>), OpenError> {
    block_on(open(dev))
}

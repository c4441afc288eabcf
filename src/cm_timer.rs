//! Ready-made [`CmTimer`]s: what an application lends a CM device
//! ([`CmDevice::set_timer`](portverbs_cm_service::CmDevice::set_timer)) so that its async
//! calls retransmit lost MADs and leave TIMEWAIT while the application only awaits.
//!
//! * [`TokioTimer`] (feature `tokio`): `tokio::time::sleep_until`, for a task on a tokio
//!   runtime with its time driver enabled.
//! * [`PortTimer`] (Windows): the completion-port timers of `portverbs-windows`, for the CM's
//!   async calls run as OVERLAPPED requests ([`crate::windows::Completions::start`]) or on
//!   [`crate::windows::block_on_port`]. The application's port loop applies
//!   [`Completions::next_timeout`](crate::windows::Completions::next_timeout) as its wait's
//!   timeout and calls [`Completions::progress`](crate::windows::Completions::progress) when
//!   it passes; no thread is involved.
//!
//! There is no plain-`std` timer: a future can only complete at an instant if whoever runs it
//! wakes then, and a generic `block_on` sleeps until a waker fires. Blocking applications use
//! the CM's blocking calls, which sleep at most until the next CM timer.

#[cfg(any(feature = "tokio", windows))]
use std::time::Instant;

#[cfg(any(feature = "tokio", windows))]
use portverbs_cm_service::{CmTimer, Sleep};

/// A [`CmTimer`](portverbs_cm_service::CmTimer) over `tokio::time::sleep_until`. The
/// device's async waits must then run inside a tokio runtime whose time driver is enabled
/// (`enable_time`/`enable_all`); otherwise the sleep panics when first polled, as tokio's
/// does.
#[cfg(feature = "tokio")]
#[derive(Debug, Clone, Copy, Default)]
pub struct TokioTimer;

#[cfg(feature = "tokio")]
impl CmTimer for TokioTimer {
    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(tokio::time::sleep_until(deadline.into()))
    }
}

/// A [`CmTimer`](portverbs_cm_service::CmTimer) over the completion-port timers of
/// `portverbs-windows` ([`crate::windows::sleep_until`]): its sleeps end when a wait of that
/// crate — [`crate::windows::block_on_port`], the `Completions` waits, or the application's
/// port loop with [`Completions::next_timeout`](crate::windows::Completions::next_timeout)
/// and [`Completions::progress`](crate::windows::Completions::progress) — returns after the
/// deadline.
#[cfg(windows)]
#[derive(Debug, Clone, Copy, Default)]
pub struct PortTimer;

#[cfg(windows)]
impl CmTimer for PortTimer {
    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(portverbs_windows::sleep_until(deadline))
    }
}

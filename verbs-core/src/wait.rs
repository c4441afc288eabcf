//! The one waiting discipline of the core, for completion channels, notify requests and
//! asynchronous events: *clear the sink, look, and only then wait* (see
//! [`portverbs_hal::notify`]). A look processes the event queue, which re-arms it, and takes
//! what it wants; whoever leaves something queued raises the sink again, so another waiter
//! wakes for it.

use std::sync::Arc;
use std::task::{Context, Poll, Wake};
use std::time::{Duration, Instant};

use portverbs_hal::notify::InterruptSink;

use crate::error::WaitError;

/// Blocks until `look` finds something, waiting on `sink` in between, or until `timeout`
/// passes (then `look` gets a last try). `None` waits for ever.
pub(crate) fn block_until<T>(
    sink: &dyn InterruptSink,
    timeout: Option<Duration>,
    mut look: impl FnMut() -> Result<Option<T>, WaitError>,
) -> Result<T, WaitError> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        sink.clear().map_err(WaitError::Sink)?;
        if let Some(v) = look()? {
            return Ok(v);
        }
        if !sink.wait(deadline).map_err(WaitError::Sink)? {
            return look()?.ok_or(WaitError::TimedOut);
        }
    }
}

/// The `async` form of [`block_until`]: one poll. `look` receives the task's context so that
/// it may register the waker elsewhere too (a notify request).
pub(crate) fn poll_until<T>(
    sink: &dyn InterruptSink,
    cx: &mut Context<'_>,
    mut look: impl FnMut(&mut Context<'_>) -> Result<Option<T>, WaitError>,
) -> Poll<Result<T, WaitError>> {
    loop {
        if let Err(e) = sink.clear() {
            return Poll::Ready(Err(WaitError::Sink(e)));
        }
        match look(cx) {
            Ok(Some(v)) => return Poll::Ready(Ok(v)),
            Ok(None) => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
        match sink.poll_raised(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Poll::Ready(Err(WaitError::Sink(e))),
            Poll::Pending => return Poll::Pending,
        }
    }
}

/// A waker that raises a sink: given to a notify request that a blocking thread waits for,
/// so that another thread completing the request wakes it.
pub(crate) struct RaiseOnWake(pub(crate) Arc<dyn InterruptSink>);

impl Wake for RaiseOnWake {
    fn wake(self: Arc<Self>) {
        self.0.raise();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.raise();
    }
}

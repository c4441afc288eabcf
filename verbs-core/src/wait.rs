//! The one waiting discipline of the core, for completion channels, notify requests and
//! asynchronous events: *clear the sink, look, and only then wait* (see
//! [`portverbs_hal::notify`]). A look processes the event queue, which re-arms it, and takes
//! what it wants; whoever leaves something queued raises the sink again, so another waiter
//! wakes for it.
//!
//! A device in manual progress ([`Progress::Manual`]) makes progress only inside calls, so a
//! wait on one drives it: each round dispatches the device ([`Device::dispatch`]) before it
//! looks, and sleeps on the sink and the device's input together
//! ([`InterruptSink::wait_with`], [`Device::wait_source`]) until the earlier of the caller's
//! deadline and the device's next timer — a packet wakes it, it is received and processed on
//! this thread, and the wait sleeps again. A sink that cannot watch the device's input is
//! waited on in slices of at most [`SLICE`], the device dispatched between them.

use std::io;
use std::sync::Arc;
use std::task::{Context, Poll, Wake};
use std::time::{Duration, Instant};

use portverbs_hal::Progress;
use portverbs_hal::device::Device;
use portverbs_hal::notify::InterruptSink;

use crate::error::WaitError;

/// The longest a manual device's wait sleeps on a sink that cannot watch the device's input.
pub(crate) const SLICE: Duration = Duration::from_millis(1);

/// The device, when it progresses only inside calls (manual): waits drive it.
#[inline]
pub(crate) fn manual<D: Device>(dev: &D) -> Option<&D> {
    (dev.info().progress == Progress::Manual).then_some(dev)
}

/// Blocks until `look` finds something, waiting on `sink` in between, or until `timeout`
/// passes (then `look` gets a last try). `None` waits for ever. With a manual device
/// (`manual`), every round dispatches it first and the sleep includes its input and ends at
/// its next timer.
pub(crate) fn block_until<D: Device, T>(
    manual: Option<&D>,
    sink: &dyn InterruptSink,
    timeout: Option<Duration>,
    mut look: impl FnMut() -> Result<Option<T>, WaitError>,
) -> Result<T, WaitError> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        sink.clear().map_err(WaitError::Sink)?;
        let Some(dev) = manual else {
            if let Some(v) = look()? {
                return Ok(v);
            }
            if !sink.wait(deadline).map_err(WaitError::Sink)? {
                return look()?.ok_or(WaitError::TimedOut);
            }
            continue;
        };
        let next = dev.dispatch();
        if let Some(v) = look()? {
            return Ok(v);
        }
        let wake_at = match (deadline, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let raised = match sink.wait_with(dev.wait_source(), wake_at) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::Unsupported && !dev.wait_source().is_none() => {
                let slice = Instant::now() + SLICE;
                sink.wait(Some(wake_at.map_or(slice, |w| w.min(slice))))
                    .map_err(WaitError::Sink)?
            }
            Err(e) => return Err(WaitError::Sink(e)),
        };
        if !raised && deadline.is_some_and(|d| Instant::now() >= d) {
            dev.dispatch();
            return look()?.ok_or(WaitError::TimedOut);
        }
    }
}

/// The `async` form of [`block_until`]: one poll. `look` receives the task's context so that
/// it may register the waker elsewhere too (a notify request). With a manual device, each
/// round dispatches it and the task is also woken by the device's input and at the device's
/// next timer where the sink can watch them ([`InterruptSink::poll_raised_until`]: on Linux
/// inside a tokio runtime); elsewhere the device's timers fire when something wakes the
/// task.
pub(crate) fn poll_until<D: Device, T>(
    manual: Option<&D>,
    sink: &dyn InterruptSink,
    cx: &mut Context<'_>,
    mut look: impl FnMut(&mut Context<'_>) -> Result<Option<T>, WaitError>,
) -> Poll<Result<T, WaitError>> {
    loop {
        if let Err(e) = sink.clear() {
            return Poll::Ready(Err(WaitError::Sink(e)));
        }
        let next = manual.and_then(D::dispatch);
        match look(cx) {
            Ok(Some(v)) => return Poll::Ready(Ok(v)),
            Ok(None) => {}
            Err(e) => return Poll::Ready(Err(e)),
        }
        let raised = match manual {
            Some(dev) => sink.poll_raised_until(dev.wait_source(), next, cx),
            None => sink.poll_raised(cx),
        };
        match raised {
            // The device's timer is due: yield to the executor, and the next poll dispatches
            // it (a device whose next timer is always due cannot hold this poll in a loop).
            Poll::Ready(Ok(())) if next.is_some_and(|t| t <= Instant::now()) => {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
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

//! Where each event queue's interrupts go, chosen when a context is opened
//! ([`crate::ContextOptions::sinks`]): [`PollingSinks`] for applications that only poll,
//! [`LatchSinks`] for blocking and awaiting on any operating system with the software and
//! emulated devices, and the platform crates' factories (an eventfd per event queue on Linux)
//! for everything, hardware interrupts included.

use std::fmt;
use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use portverbs_hal::WaitSource;
use portverbs_hal::device::EqKind;
use portverbs_hal::notify::{InterruptSink, NullSink, WakerSet};

use crate::context::lock;

/// Provides the interrupt sink of each event queue the core creates. Platform crates implement
/// it (an eventfd per EQ on Linux).
pub trait SinkFactory: Send + Sync + fmt::Debug {
    /// The sink for a new asynchronous or completion-vector event queue. Cannot fail: a
    /// factory that runs out of OS objects hands out a [`NullSink`] and reports it its own way.
    fn sink(&self, kind: EqKind) -> Arc<dyn InterruptSink>;

    /// The sink for the event queue of a new completion channel.
    ///
    /// # Errors
    /// The platform could not provide one (out of file descriptors, …); the channel is not
    /// created.
    fn channel_sink(&self) -> io::Result<Arc<dyn InterruptSink>> {
        Ok(Arc::new(NullSink))
    }
}

/// Sinks that ignore interrupts: the application polls (CQs, [`crate::Context::process_events`]).
/// Blocking or awaiting an event queue of such a context is refused with
/// [`io::ErrorKind::Unsupported`] inside [`crate::WaitError::Sink`].
#[derive(Debug, Default, Clone, Copy)]
pub struct PollingSinks;

impl SinkFactory for PollingSinks {
    fn sink(&self, _kind: EqKind) -> Arc<dyn InterruptSink> {
        Arc::new(NullSink)
    }

    fn channel_sink(&self) -> io::Result<Arc<dyn InterruptSink>> {
        Ok(Arc::new(NullSink))
    }
}

/// A [`LatchSink`] for every event queue: portable blocking and awaiting, woken by the
/// backend's [`InterruptSink::raise`]. Right for the software device and the emulated HCA on
/// any OS; hardware behind VFIO signals an eventfd in the kernel and needs the platform's
/// sinks instead (its interrupts would never reach a latch).
#[derive(Debug, Default, Clone, Copy)]
pub struct LatchSinks;

impl SinkFactory for LatchSinks {
    fn sink(&self, _kind: EqKind) -> Arc<dyn InterruptSink> {
        Arc::new(LatchSink::default())
    }

    fn channel_sink(&self) -> io::Result<Arc<dyn InterruptSink>> {
        Ok(Arc::new(LatchSink::default()))
    }
}

/// A flag set by [`raise`](InterruptSink::raise) and reset by [`clear`](InterruptSink::clear),
/// with a condition variable for blocked threads and a [`WakerSet`] for tasks.
#[derive(Debug, Default)]
pub struct LatchSink {
    raised: Mutex<bool>,
    cond: Condvar,
    wakers: WakerSet,
}

impl InterruptSink for LatchSink {
    fn raise(&self) {
        *lock(&self.raised) = true;
        self.cond.notify_all();
        self.wakers.wake_all();
    }

    fn clear(&self) -> io::Result<()> {
        *lock(&self.raised) = false;
        Ok(())
    }

    fn wait(&self, deadline: Option<Instant>) -> io::Result<bool> {
        let mut raised = lock(&self.raised);
        while !*raised {
            raised = match deadline {
                None => self.cond.wait(raised).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Ok(false);
                    }
                    let (guard, _) = self
                        .cond
                        .wait_timeout(raised, left)
                        .unwrap_or_else(|e| e.into_inner());
                    guard
                }
            };
        }
        Ok(true)
    }

    fn poll_raised(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Register before looking: a raise between the two wakes this task.
        self.wakers.register(cx.waker());
        if *lock(&self.raised) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    /// A device input given as an [`InputWait`](portverbs_hal::InputWait) (a UDP port's
    /// receive signal on Windows) is slept on with a waker the raise wakes; a file descriptor
    /// cannot be (refused: [`io::ErrorKind::Unsupported`], and the caller waits in slices).
    fn wait_with(&self, source: WaitSource<'_>, deadline: Option<Instant>) -> io::Result<bool> {
        if let Some(input) = source.input() {
            return self
                .wakers
                .wait_on_input(input, &|| *lock(&self.raised), deadline);
        }
        if source.is_none() {
            return self.wait(deadline);
        }
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "a latch cannot watch a file descriptor",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::task::{Wake, Waker};
    use std::time::Duration;

    #[derive(Default)]
    struct Flag(AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    // Threads blocked in `wait` are woken in tests/waits.rs (two readers of one channel).
    #[test]
    fn latch_keeps_a_raise_until_cleared() {
        let s = LatchSink::default();
        let soon = || Some(Instant::now() + Duration::from_millis(1));
        assert!(!s.wait(soon()).unwrap(), "nothing raised yet");
        s.raise();
        assert!(s.wait(None).unwrap(), "a raise before the wait is kept");
        assert!(s.wait(soon()).unwrap(), "waiting does not consume it");
        s.clear().unwrap();
        assert!(!s.wait(soon()).unwrap(), "cleared");
    }

    #[test]
    fn latch_wakes_every_polling_task() {
        let s = LatchSink::default();
        let flags: Vec<_> = (0..2).map(|_| Arc::new(Flag::default())).collect();
        for f in &flags {
            let waker = Waker::from(f.clone());
            assert!(s.poll_raised(&mut Context::from_waker(&waker)).is_pending());
        }
        s.raise();
        assert!(flags.iter().all(|f| f.0.load(Ordering::SeqCst)));
        let waker = Waker::from(flags[0].clone());
        assert!(s.poll_raised(&mut Context::from_waker(&waker)).is_ready());
    }
}

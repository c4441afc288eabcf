//! The sink factory: a private completion port per event queue, which a blocking waiter sleeps
//! on, and the device's doorbell, which tells the application's own port or event that an
//! event queue wants processing.

use std::io;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use portverbs_hal::WaitSource;
use portverbs_hal::device::EqKind;
use portverbs_hal::notify::{InterruptSink, NullSink, WakerSet};
use portverbs_verbs::SinkFactory;

use crate::event::Event;
use crate::port::CompletionPort;
use crate::timer::Alarm;

/// Blocking waits of [`PortSink`]s that slept on their port, in this process.
static PORT_SLEEPS: AtomicU64 = AtomicU64::new(0);

/// How many blocking waits of this process slept in `GetQueuedCompletionStatusEx` on an event
/// queue's port (each [`PortSink`] wait that was not satisfied at once): shows that the
/// portable blocking calls — `wait_cq_event` in `portverbs pingpong -e`, `wait_notify`,
/// `wait_async_event` — sleep on a port on Windows.
pub fn port_sleeps() -> u64 {
    PORT_SLEEPS.load(Ordering::Relaxed)
}

/// The doorbell of one opened device: rung by every raise of its event queues and by every
/// asynchronous operation that can make progress. It signals [`Doorbell::event`] and, once the
/// device is associated with a port, queues one packet `(key, null OVERLAPPED)` there, at most
/// one at a time (the next one is posted after [`crate::Completions::dispatch`] took it).
#[derive(Debug)]
pub(crate) struct Doorbell {
    pub(crate) event: Event,
    pub(crate) port: OnceLock<(Arc<CompletionPort>, usize)>,
    posted: AtomicBool,
    errors: Mutex<Vec<io::Error>>,
}

impl Doorbell {
    fn new() -> io::Result<Self> {
        Ok(Self {
            event: Event::new()?,
            port: OnceLock::new(),
            posted: AtomicBool::new(false),
            errors: Mutex::new(Vec::new()),
        })
    }

    pub(crate) fn keep(&self, r: io::Result<()>) {
        if let Err(e) = r {
            self.errors
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(e);
        }
    }

    /// Something wants processing. Never blocks.
    pub(crate) fn ring(&self) {
        self.keep(self.event.set());
        if let Some((port, key)) = self.port.get() {
            if !self.posted.swap(true, Ordering::AcqRel) {
                self.keep(port.post(*key, ptr::null_mut(), 0));
            }
        }
    }

    /// Called before processing: forget the rings so far (a later ring is kept).
    pub(crate) fn clear(&self) -> io::Result<()> {
        self.posted.store(false, Ordering::Release);
        self.event.reset()
    }

    pub(crate) fn take_errors(&self) -> Vec<io::Error> {
        std::mem::take(&mut *self.errors.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// The sink of one event queue:
/// * [`raise`](InterruptSink::raise) queues a packet on the sink's private completion port
///   (one until the next [`clear`](InterruptSink::clear)), wakes the tasks awaiting it, and
///   rings the device's doorbell;
/// * a blocking [`wait`](InterruptSink::wait) sleeps in `GetQueuedCompletionStatusEx` on the
///   private port, on the caller's thread;
/// * `async` waiters are woken by the raise itself (no reactor thread); awaiting a
///   manual-progress device, they are also woken for its input under [`crate::block_on_port`]
///   (which sleeps on the input's event as well) and at the device's next timer (an entry on
///   the process's [`crate::TimerList`], which every wait of this crate applies).
///
/// The private port is never closed while someone waits on it (waiters hold the sink), so
/// nothing relies on a close waking a waiter, which Wine 8 does not do.
#[derive(Debug)]
pub struct PortSink {
    raised: AtomicBool,
    port: CompletionPort,
    wakers: WakerSet,
    doorbell: Arc<Doorbell>,
    /// The next timer of the manual device an awaiting task waits on.
    alarm: Alarm,
}

impl PortSink {
    fn new(doorbell: Arc<Doorbell>) -> io::Result<Self> {
        Ok(Self {
            raised: AtomicBool::new(false),
            port: CompletionPort::new()?,
            wakers: WakerSet::default(),
            doorbell,
            alarm: Alarm::default(),
        })
    }

    /// The private port a blocking waiter sleeps on.
    pub fn port(&self) -> &CompletionPort {
        &self.port
    }
}

impl InterruptSink for PortSink {
    fn raise(&self) {
        if !self.raised.swap(true, Ordering::AcqRel) {
            self.doorbell.keep(self.port.post(0, ptr::null_mut(), 0));
        }
        self.wakers.wake_all();
        self.doorbell.ring();
    }

    fn clear(&self) -> io::Result<()> {
        self.raised.store(false, Ordering::Release);
        // Drop the packets of earlier raises; a raise from now on sets the flag again.
        let mut stale = Vec::new();
        while let crate::port::Dequeued::Packets(_) =
            self.port
                .get_many(&mut stale, 16, Some(Duration::ZERO), false)?
        {
            stale.clear();
        }
        Ok(())
    }

    fn wait(&self, deadline: Option<Instant>) -> io::Result<bool> {
        if self.raised.load(Ordering::Acquire) {
            return Ok(true);
        }
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        PORT_SLEEPS.fetch_add(1, Ordering::Relaxed);
        Ok(self.port.get(timeout)?.is_some() || self.raised.load(Ordering::Acquire))
    }

    fn poll_raised(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Register before looking: a raise in between wakes this task.
        self.wakers.register(cx.waker());
        if self.raised.load(Ordering::Acquire) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    /// A manual-progress device's input (a UDP port's receive signal) cannot join a wait on
    /// the private port — a port hands each packet to one thread, and the input has its own
    /// — so the thread sleeps on the input's signal and on a waker the raise wakes
    /// ([`portverbs_hal::InputWait`]) instead; the raise's packet on the private port is
    /// dropped by the next clear.
    fn wait_with(&self, source: WaitSource<'_>, deadline: Option<Instant>) -> io::Result<bool> {
        match source.input() {
            Some(input) => {
                self.wakers
                    .wait_on_input(input, &|| self.raised.load(Ordering::Acquire), deadline)
            }
            None => self.wait(deadline),
        }
    }

    /// Also ready for the device's input when polled by [`crate::block_on_port`], which
    /// then sleeps on the input's event beside its own.
    fn poll_raised_with(
        &self,
        source: WaitSource<'_>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(event) = source.input().and_then(|i| i.event()) {
            crate::executor::watch(event);
        }
        self.poll_raised(cx)
    }

    /// And at `wake_at`: the waker is put on the process's timer list, which shortens the
    /// next wait of this crate or of the application's port loop.
    fn poll_raised_until(
        &self,
        source: WaitSource<'_>,
        wake_at: Option<Instant>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if wake_at.is_some_and(|t| t <= Instant::now()) {
            return Poll::Ready(Ok(()));
        }
        self.alarm.set(wake_at, cx.waker());
        self.poll_raised_with(source, cx)
    }
}

/// Gives every event queue of one opened device a [`PortSink`], all ringing one doorbell (a
/// [`SinkFactory`] for [`portverbs_verbs::ContextOptions::sinks`]). Use one factory per
/// device: [`crate::open`] does.
#[derive(Debug)]
pub struct WindowsSinks {
    pub(crate) doorbell: Arc<Doorbell>,
}

impl WindowsSinks {
    /// Creates the factory and the device's doorbell event.
    ///
    /// # Errors
    /// The event could not be created.
    pub fn new() -> io::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            doorbell: Arc::new(Doorbell::new()?),
        }))
    }

    /// Ports that could not be created for event queues (those fell back to a sink that does
    /// nothing, so their CQs are found only by polling) and packets that could not be
    /// posted. Taking them clears the list.
    pub fn take_errors(&self) -> Vec<io::Error> {
        self.doorbell.take_errors()
    }

    fn fresh(&self) -> io::Result<Arc<dyn InterruptSink>> {
        Ok(Arc::new(PortSink::new(self.doorbell.clone())?))
    }
}

impl SinkFactory for WindowsSinks {
    fn sink(&self, _kind: EqKind) -> Arc<dyn InterruptSink> {
        self.fresh().unwrap_or_else(|e| {
            self.doorbell.keep(Err(e));
            Arc::new(NullSink)
        })
    }

    fn channel_sink(&self) -> io::Result<Arc<dyn InterruptSink>> {
        self.fresh()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Wine 8 deviation avoided: the sleeping thread is woken by a posted packet;
    // nothing here closes a port to wake a waiter, which Wine 8 would leave asleep.
    #[test]
    fn a_raise_is_kept_until_cleared_and_a_waiter_sleeps_on_the_port() {
        let sinks = WindowsSinks::new().unwrap();
        let s = PortSink::new(sinks.doorbell.clone()).unwrap();
        let soon = || Some(Instant::now() + Duration::from_millis(5));
        assert!(!s.wait(soon()).unwrap(), "nothing raised yet");
        s.raise();
        s.raise();
        assert!(s.wait(None).unwrap(), "a raise before the wait is kept");
        assert!(sinks.doorbell.event.is_set().unwrap(), "the doorbell rang");
        s.clear().unwrap();
        assert!(!s.wait(soon()).unwrap(), "cleared, and no stale packet");
        let s = Arc::new(s);
        let t = {
            let s = s.clone();
            std::thread::spawn(move || s.wait(Some(Instant::now() + Duration::from_secs(20))))
        };
        std::thread::sleep(Duration::from_millis(20));
        s.raise();
        assert!(
            t.join().unwrap().unwrap(),
            "the packet woke the sleeping thread"
        );
        assert!(sinks.take_errors().is_empty());
    }
}

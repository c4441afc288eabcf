//! How a device tells the host "look at this event queue": the interrupt contract.
//!
//! Each event queue is created with an [`InterruptSink`]. A hardware-emulating backend calls
//! [`InterruptSink::raise`] when it writes an EQE into an armed EQ; a VFIO backend instead binds
//! the EQ's MSI-X vector to the sink's eventfd in the kernel. Platform crates provide the sinks
//! (an eventfd on Linux, an event or completion port on Windows); [`NullSink`] is for callers that
//! poll.
//!
//! The same sink is the host's side of the interrupt: whoever waits for an event queue (a
//! blocking `wait`, an `async` task) waits on its sink. The protocol, used by the portable core,
//! is *clear, look, then wait*: [`InterruptSink::clear`] forgets the raises seen so far, the
//! caller processes the event queue (which re-arms it) and looks for what it wants, and only
//! when it found nothing it waits ([`InterruptSink::wait`] or [`InterruptSink::poll_raised`]).
//! A raise after the clear is kept, so the wait returns at once and no interrupt is lost between
//! the look and the wait.

use std::fmt::Debug;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use crate::progress::{InputWait, WaitSource};

/// Receives the interrupts of one event queue, and lets the host wait for them.
///
/// [`raise`](Self::raise) must be cheap and must not block: it may be called from a
/// device-emulation thread with internal locks held. The waiting methods have defaults that
/// refuse with [`io::ErrorKind::Unsupported`], for sinks that only poll.
pub trait InterruptSink: Send + Sync + Debug {
    /// The device wrote at least one EQE while the EQ was armed.
    fn raise(&self);

    /// The pollable file descriptor behind this sink, if any: readable after a raise until
    /// [`clear`](Self::clear). A VFIO backend routes an MSI-X vector to it
    /// (`VFIO_DEVICE_SET_IRQS`); an application may watch it with poll, epoll or a reactor.
    #[cfg(unix)]
    fn as_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }

    /// The raw number of [`as_fd`](Self::as_fd), for the kernel interfaces that take one.
    fn eventfd(&self) -> Option<i32> {
        #[cfg(unix)]
        {
            use std::os::fd::AsRawFd;
            self.as_fd().map(|fd| fd.as_raw_fd())
        }
        #[cfg(not(unix))]
        None
    }

    /// Forgets the raises seen so far. Called *before* the event queue is processed, so that a
    /// raise during or after processing is kept for the next wait.
    ///
    /// # Errors
    /// The platform object behind the sink failed.
    fn clear(&self) -> io::Result<()> {
        Ok(())
    }

    /// Blocks the calling thread until the sink was raised since the last
    /// [`clear`](Self::clear) (`Ok(true)`) or `deadline` passed (`Ok(false)`; `None` waits for
    /// ever). May return `Ok(true)` spuriously.
    ///
    /// # Errors
    /// The sink cannot block ([`io::ErrorKind::Unsupported`]), or the platform's wait failed.
    fn wait(&self, deadline: Option<Instant>) -> io::Result<bool> {
        let _ = deadline;
        Err(cannot_wait())
    }

    /// The `async` form of [`wait`](Self::wait): ready when the sink was raised since the last
    /// [`clear`](Self::clear); otherwise `cx`'s waker is woken at the next raise. Any number
    /// of tasks may poll one sink; each is woken.
    ///
    /// # Errors
    /// The sink cannot be awaited ([`io::ErrorKind::Unsupported`]), or the platform's reactor
    /// failed.
    fn poll_raised(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let _ = cx;
        Poll::Ready(Err(cannot_wait()))
    }

    /// [`wait`](Self::wait) that also ends when `source` — the input of a device in manual
    /// progress ([`crate::Progress::Manual`]) — is ready, so that a thread waiting for an
    /// event wakes for the packet that brings it. With [`WaitSource::none`] it is `wait`.
    ///
    /// # Errors
    /// As [`wait`](Self::wait); by default, a source this sink cannot watch is refused with
    /// [`io::ErrorKind::Unsupported`] (the caller then waits in short slices, driving the
    /// device between them).
    fn wait_with(&self, source: WaitSource<'_>, deadline: Option<Instant>) -> io::Result<bool> {
        if source.is_none() {
            self.wait(deadline)
        } else {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this sink cannot watch a device's input",
            ))
        }
    }

    /// [`poll_raised`](Self::poll_raised) that is also ready when `source` is (see
    /// [`wait_with`](Self::wait_with)); the waker is woken by a raise or by the source's
    /// readiness. By default the source is not watched: the task wakes on raises only.
    ///
    /// # Errors
    /// As [`poll_raised`](Self::poll_raised).
    fn poll_raised_with(
        &self,
        source: WaitSource<'_>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        let _ = source;
        self.poll_raised(cx)
    }

    /// [`poll_raised_with`](Self::poll_raised_with) that is also ready once `wake_at` has
    /// passed: a manual-progress device's next timer (a retransmission, the connection
    /// manager's timers), so that a task that only awaits the device runs them without a
    /// timer of the application's. By default the instant is only compared with the clock
    /// when the task is polled; a sink that has a timer (a timerfd in tokio's reactor on
    /// Linux) wakes the task then.
    ///
    /// # Errors
    /// As [`poll_raised`](Self::poll_raised).
    fn poll_raised_until(
        &self,
        source: WaitSource<'_>,
        wake_at: Option<Instant>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if wake_at.is_some_and(|t| t <= Instant::now()) {
            return Poll::Ready(Ok(()));
        }
        self.poll_raised_with(source, cx)
    }
}

fn cannot_wait() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "this event queue's interrupt sink cannot be waited on (the context was opened for \
         polling; open it with the platform's sinks to block or await)",
    )
}

/// A sink that ignores interrupts; the application polls the event queue instead. Waiting on
/// it is refused ([`io::ErrorKind::Unsupported`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct NullSink;

impl InterruptSink for NullSink {
    fn raise(&self) {}
}

/// The wakers of the tasks awaiting one sink. [`register`](Self::register) adds one (once per
/// task), [`wake_all`](Self::wake_all) wakes and forgets them all. As a [`Wake`] it is itself
/// a waker that wakes them all, for reactors that keep a single waker per registration.
#[derive(Debug, Default)]
pub struct WakerSet {
    wakers: Mutex<Vec<Waker>>,
}

impl WakerSet {
    /// An empty set.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Waker>> {
        self.wakers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds `waker` unless an equivalent one is already waiting.
    pub fn register(&self, waker: &Waker) {
        let mut wakers = self.lock();
        if !wakers.iter().any(|w| w.will_wake(waker)) {
            wakers.push(waker.clone());
        }
    }

    /// For sinks whose raise wakes this set, [`InterruptSink::wait_with`] on an
    /// [`InputWait`] source: sleeps on `input` until it may be ready, the sink is raised
    /// (`raised`, looked at after the sleeper's waker is registered here, so a raise in
    /// between ends the sleep at once), or `deadline` passes. Returns false only when the
    /// deadline passed.
    ///
    /// # Errors
    /// The input's wait failed.
    pub fn wait_on_input(
        &self,
        input: &dyn InputWait,
        raised: &dyn Fn() -> bool,
        deadline: Option<Instant>,
    ) -> io::Result<bool> {
        input.wait(deadline, &mut |waker| {
            self.register(waker);
            raised()
        })
    }

    /// Wakes every registered waker and empties the set.
    pub fn wake_all(&self) {
        let wakers = std::mem::take(&mut *self.lock());
        for w in wakers {
            w.wake();
        }
    }

    /// How many wakers are waiting.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// True when no waker is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Wake for WakerSet {
    fn wake(self: Arc<Self>) {
        self.wake_all();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// An input that becomes ready when told, and whose sleep a waker ends: what a UDP port's
    /// receive signal is to a manual device's wait, with a condition variable for the OS.
    #[derive(Default)]
    struct FakeInput {
        state: std::sync::Mutex<(bool, bool)>, // (input ready, woken)
        cv: std::sync::Condvar,
    }

    struct WakeInput(Arc<FakeInput>);

    impl Wake for WakeInput {
        fn wake(self: Arc<Self>) {
            self.0.state.lock().unwrap().1 = true;
            self.0.cv.notify_all();
        }
    }

    impl FakeInput {
        fn arrive(&self) {
            self.state.lock().unwrap().0 = true;
            self.cv.notify_all();
        }
    }

    impl InputWait for Arc<FakeInput> {
        fn wait(
            &self,
            deadline: Option<Instant>,
            arm: &mut dyn FnMut(&Waker) -> bool,
        ) -> io::Result<bool> {
            self.state.lock().unwrap().1 = false;
            let waker = Waker::from(Arc::new(WakeInput(self.clone())));
            if arm(&waker) {
                return Ok(true);
            }
            let mut st = self.state.lock().unwrap();
            loop {
                if st.0 || st.1 {
                    return Ok(true);
                }
                let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                if left.is_some_and(|l| l.is_zero()) {
                    return Ok(false);
                }
                st = match left {
                    Some(l) => self.cv.wait_timeout(st, l).unwrap().0,
                    None => self.cv.wait(st).unwrap(),
                };
            }
        }
    }

    /// `wait_on_input` ends for a raise (the sink's waker set, woken from another thread),
    /// for input, or at the deadline; and does not sleep when the raise came first.
    #[test]
    fn a_wait_on_input_ends_for_a_raise_for_input_or_at_its_deadline() {
        use std::sync::atomic::AtomicBool;
        use std::time::Duration;
        let set = Arc::new(WakerSet::new());
        let input = Arc::new(FakeInput::default());
        let raised = Arc::new(AtomicBool::new(false));
        let look = {
            let raised = raised.clone();
            move || raised.load(Ordering::SeqCst)
        };
        let soon = || Some(Instant::now() + Duration::from_millis(20));
        let long = || Some(Instant::now() + Duration::from_secs(60));

        assert!(
            !set.wait_on_input(&input, &look, soon()).unwrap(),
            "nothing"
        );
        assert_eq!(set.len(), 1, "the sleeper's waker stays registered");

        // A raise from another thread: it sets the flag and wakes the set.
        let raiser = {
            let (set, raised) = (set.clone(), raised.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                raised.store(true, Ordering::SeqCst);
                set.wake_all();
            })
        };
        let t = Instant::now();
        assert!(set.wait_on_input(&input, &look, long()).unwrap());
        assert!(t.elapsed() < Duration::from_secs(30), "the raise ended it");
        raiser.join().unwrap();

        // Raised before the wait: no sleep at all (the look after registering sees it).
        assert!(set.wait_on_input(&input, &look, None).unwrap());
        raised.store(false, Ordering::SeqCst);

        // Input from another thread.
        let sender = {
            let input = input.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                input.arrive();
            })
        };
        let t = Instant::now();
        assert!(set.wait_on_input(&input, &look, long()).unwrap());
        assert!(t.elapsed() < Duration::from_secs(30), "the input ended it");
        sender.join().unwrap();
    }

    #[test]
    fn waker_set_wakes_each_task_once() {
        let set = WakerSet::new();
        let a = Arc::new(Count::default());
        let b = Arc::new(Count::default());
        let wa = Waker::from(a.clone());
        set.register(&wa);
        set.register(&wa);
        set.register(&Waker::from(b.clone()));
        assert_eq!(set.len(), 2, "a task registers once");
        Waker::from(set.clone()).wake_by_ref();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
        assert!(set.is_empty(), "woken wakers are forgotten");
        set.wake_all();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn null_sink_refuses_to_wait() {
        let s = NullSink;
        assert_eq!(s.wait(None).unwrap_err().kind(), io::ErrorKind::Unsupported);
        let waker = Waker::from(Arc::new(Count::default()));
        let mut cx = Context::from_waker(&waker);
        match s.poll_raised(&mut cx) {
            Poll::Ready(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::Unsupported),
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(s.eventfd(), None);
        assert!(s.clear().is_ok());
    }
}

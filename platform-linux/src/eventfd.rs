//! The eventfd: a kernel counter that is readable while non-zero. Every event queue of a
//! context opened here interrupts one (through [`EventFdSink`]); a VFIO backend makes the
//! kernel's MSI-X handler signal the same fd directly.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use portverbs_hal::WaitSource;
use portverbs_hal::notify::{InterruptSink, WakerSet};
use rustix::event::{EventfdFlags, eventfd};
use rustix::io::Errno;

use crate::wait;

/// A nonblocking, close-on-exec eventfd in counter mode (not `EFD_SEMAPHORE`): each
/// [`signal`](Self::signal) adds one, one [`drain`](Self::drain) returns the sum and resets it.
/// Pollable (readable while the counter is non-zero), so it fits poll, epoll and tokio's
/// `AsyncFd`.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// Creates an eventfd with a zero counter.
    ///
    /// # Errors
    /// The kernel refused (out of file descriptors or memory).
    pub fn new() -> io::Result<Self> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Self { fd })
    }

    /// Adds one to the counter, waking every poller. Never blocks: a saturated counter (which
    /// is readable anyway) is not an error.
    ///
    /// # Errors
    /// Any other failure of `write(2)`.
    pub fn signal(&self) -> io::Result<()> {
        loop {
            match rustix::io::write(&self.fd, &1u64.to_ne_bytes()) {
                Ok(_) | Err(Errno::AGAIN) => return Ok(()),
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Reads and resets the counter: how many signals arrived since the last drain (0 when
    /// none; never blocks).
    ///
    /// # Errors
    /// Any failure of `read(2)` other than "would block".
    pub fn drain(&self) -> io::Result<u64> {
        let mut buf = [0u8; 8];
        loop {
            match rustix::io::read(&self.fd, &mut buf) {
                Ok(8) => return Ok(u64::from_ne_bytes(buf)),
                Ok(n) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        format!("eventfd read returned {n} bytes instead of 8"),
                    ));
                }
                Err(Errno::AGAIN) => return Ok(0),
                Err(Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// True when the counter is non-zero (a poll(2) that does not wait).
    ///
    /// # Errors
    /// poll(2) failed.
    pub fn is_signalled(&self) -> io::Result<bool> {
        wait::readable(self, Some(Instant::now()))
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// The interrupt sink of one event queue, backed by an [`EventFd`]:
///
/// * an interrupt ([`raise`](InterruptSink::raise)) signals the fd, or the kernel does (VFIO
///   MSI-X routed to [`as_fd`](InterruptSink::as_fd));
/// * [`clear`](InterruptSink::clear) drains it;
/// * a blocking [`wait`](InterruptSink::wait) is poll(2) on the caller's thread;
/// * an `async` wait ([`poll_raised`](InterruptSink::poll_raised)) registers the fd with
///   tokio's reactor when polled inside a tokio runtime (feature `tokio`), so even interrupts
///   the kernel signals wake the task; elsewhere the task is woken by `raise` only, which
///   covers every device whose interrupts are raised in process (software, emulated), not
///   hardware behind VFIO.
///
/// `raise` is cheap and never blocks, as the HAL requires.
#[derive(Debug)]
pub struct EventFdSink {
    fd: Arc<EventFd>,
    wakers: Arc<WakerSet>,
    #[cfg(feature = "tokio")]
    reactor: crate::reactor::Reactor,
}

impl EventFdSink {
    /// A sink that signals `fd`.
    pub fn new(fd: Arc<EventFd>) -> Self {
        Self {
            fd,
            wakers: WakerSet::new(),
            #[cfg(feature = "tokio")]
            reactor: crate::reactor::Reactor::default(),
        }
    }

    /// The eventfd behind the sink.
    pub fn event_fd(&self) -> &Arc<EventFd> {
        &self.fd
    }
}

impl InterruptSink for EventFdSink {
    fn raise(&self) {
        // Only an invalid fd could fail here, and the sink owns its fd: nothing to report.
        let _ = self.fd.signal();
        self.wakers.wake_all();
    }

    fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }

    fn clear(&self) -> io::Result<()> {
        self.fd.drain().map(drop)
    }

    fn wait(&self, deadline: Option<Instant>) -> io::Result<bool> {
        wait::readable(&*self.fd, deadline)
    }

    fn poll_raised(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Register before looking: a raise in between wakes this task.
        self.wakers.register(cx.waker());
        #[cfg(feature = "tokio")]
        if let Some(ready) = self.reactor.poll_readable(&self.fd, &self.wakers) {
            return ready;
        }
        match self.fd.is_signalled() {
            Ok(true) => Poll::Ready(Ok(())),
            Ok(false) => Poll::Pending,
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// poll(2) on the eventfd and the device's input together. An input that is not a file
    /// descriptor is refused ([`io::ErrorKind::Unsupported`]: the caller waits in slices);
    /// no Linux device gives one.
    fn wait_with(&self, source: WaitSource<'_>, deadline: Option<Instant>) -> io::Result<bool> {
        if source.fd().is_none() && !source.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "an eventfd sink watches file descriptors only",
            ));
        }
        wait::readable_any(&*self.fd, source.fd(), deadline)
    }

    /// With feature `tokio`, inside a runtime, the device's input is registered with the
    /// reactor too (a duplicate of its fd, made on first use and kept with the sink), so a
    /// datagram wakes the task; elsewhere only a raise does, and the input is looked at when
    /// the task is polled.
    fn poll_raised_with(
        &self,
        source: WaitSource<'_>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if let Poll::Ready(r) = self.poll_raised(cx) {
            return Poll::Ready(r);
        }
        let Some(fd) = source.fd() else {
            return Poll::Pending;
        };
        #[cfg(feature = "tokio")]
        if let Some(ready) = self.reactor.poll_source(fd, &self.wakers) {
            return ready;
        }
        match wait::readable(fd, Some(Instant::now())) {
            Ok(true) => Poll::Ready(Ok(())),
            Ok(false) => Poll::Pending,
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// With feature `tokio`, inside a runtime, `wake_at` arms a timerfd of the sink's in the
    /// reactor (kept with the sink, armed for the earliest instant asked), so the task wakes
    /// for the device's next timer; elsewhere the instant is only compared with the clock.
    fn poll_raised_until(
        &self,
        source: WaitSource<'_>,
        wake_at: Option<Instant>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if let Poll::Ready(r) = self.poll_raised_with(source, cx) {
            return Poll::Ready(r);
        }
        let Some(at) = wake_at else {
            return Poll::Pending;
        };
        #[cfg(feature = "tokio")]
        if let Some(ready) = self.reactor.poll_timer(at, &self.wakers) {
            return ready;
        }
        if at <= Instant::now() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::{Wake, Waker};
    use std::time::Duration;

    #[test]
    fn counts_and_resets() {
        let fd = EventFd::new().unwrap();
        assert_eq!(fd.drain().unwrap(), 0, "a fresh eventfd is empty");
        assert!(!fd.is_signalled().unwrap());
        for _ in 0..3 {
            fd.signal().unwrap();
        }
        assert!(fd.is_signalled().unwrap());
        assert_eq!(fd.drain().unwrap(), 3, "counter mode returns the sum");
        assert_eq!(fd.drain().unwrap(), 0, "a drain resets the counter");
    }

    #[test]
    fn sink_raises_its_eventfd_and_clear_drains_it() {
        let fd = Arc::new(EventFd::new().unwrap());
        let sink = EventFdSink::new(fd.clone());
        assert_eq!(sink.eventfd(), Some(fd.as_raw_fd()));
        let soon = || Some(Instant::now() + Duration::from_millis(1));
        assert!(!sink.wait(soon()).unwrap());
        sink.raise();
        sink.raise();
        assert!(
            sink.wait(soon()).unwrap(),
            "a raise before the wait is kept"
        );
        sink.clear().unwrap();
        assert!(!sink.wait(soon()).unwrap(), "cleared");
        fd.signal().unwrap();
        assert!(
            sink.wait(None).unwrap(),
            "a signal from elsewhere (MSI-X) counts"
        );
    }

    struct Flag(std::sync::atomic::AtomicBool);

    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    #[test]
    fn a_raise_wakes_a_polling_task_without_a_reactor() {
        let sink = EventFdSink::new(Arc::new(EventFd::new().unwrap()));
        let flag = Arc::new(Flag(false.into()));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(sink.poll_raised(&mut cx).is_pending());
        sink.raise();
        assert!(flag.0.load(std::sync::atomic::Ordering::SeqCst));
        assert!(matches!(sink.poll_raised(&mut cx), Poll::Ready(Ok(()))));
    }

    /// The device's next timer wakes a task that awaits nothing else, in a runtime with no
    /// time driver; two instants asked for in turn are each slept until.
    #[cfg(feature = "tokio")]
    #[test]
    fn a_task_wakes_at_the_instant_it_asked_for() {
        let sink = EventFdSink::new(Arc::new(EventFd::new().unwrap()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap();
        for delay in [Duration::from_millis(60), Duration::from_millis(20)] {
            let at = Instant::now() + delay;
            let mut polls = 0;
            rt.block_on(std::future::poll_fn(|cx| {
                polls += 1;
                sink.poll_raised_until(WaitSource::none(), Some(at), cx)
            }))
            .unwrap();
            assert!(Instant::now() >= at, "woke before the instant");
            assert!(polls <= 3, "slept, not spun: {polls} polls");
        }
    }

    #[test]
    fn is_nonblocking_and_cloexec() {
        let fd = EventFd::new().unwrap();
        let status = rustix::fs::fcntl_getfl(&fd).unwrap();
        assert!(status.contains(rustix::fs::OFlags::NONBLOCK));
        let flags = rustix::io::fcntl_getfd(&fd).unwrap();
        assert!(flags.contains(rustix::io::FdFlags::CLOEXEC));
    }
}

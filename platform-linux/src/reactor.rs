//! An [`crate::EventFdSink`] in tokio's reactor (feature `tokio`): registered lazily, the
//! first time a task awaits it inside a tokio runtime, and then woken by the kernel's
//! readiness, whoever signalled the eventfd (a raise in process, or a device's MSI-X). For a
//! manual-progress device, the reactor also watches the device's input and a timerfd armed
//! for the device's next timer, so that a task that only awaits still receives and runs
//! retransmissions and the connection manager's timers.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use portverbs_hal::notify::WakerSet;
use rustix::event::Timespec;
use rustix::time::{
    Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags, timerfd_create, timerfd_settime,
};
use tokio::io::unix::AsyncFd;

use crate::eventfd::EventFd;
use crate::sys::{Registered, register_readable, register_source};

/// The registration of one eventfd, made on first use; and of the input of a manual-progress
/// device its waiters also sleep on (a duplicate of that fd, keyed by the original's number).
#[derive(Debug, Default)]
pub(crate) struct Reactor {
    registration: Mutex<Option<Arc<AsyncFd<Registered>>>>,
    source: Mutex<Option<(RawFd, Arc<AsyncFd<OwnedFd>>)>>,
    timer: Mutex<Option<Timer>>,
}

/// A timerfd in the reactor, and the instant it is armed for (`None`: disarmed or fired).
#[derive(Debug)]
struct Timer {
    fd: Arc<AsyncFd<OwnedFd>>,
    armed: Option<Instant>,
}

impl Timer {
    fn new() -> io::Result<Self> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        Ok(Self {
            fd: Arc::new(register_source(fd)?),
            armed: None,
        })
    }

    /// Arms the timer for `at` unless it is armed for an instant at or before it that has
    /// not passed yet. One timer serves every task waiting on the sink: each wakes at the
    /// earliest instant any of them asked for, and asks again for its own.
    fn arm(&mut self, at: Instant, now: Instant) -> io::Result<()> {
        if self.armed.is_some_and(|a| a <= at && a > now) {
            return Ok(());
        }
        let left = at
            .saturating_duration_since(now)
            .max(Duration::from_nanos(1));
        let value = Timespec::try_from(left).unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        });
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let spec = Itimerspec {
            it_interval: zero,
            it_value: value,
        };
        timerfd_settime(self.fd.get_ref(), TimerfdTimerFlags::empty(), &spec)?;
        self.armed = Some(at);
        Ok(())
    }
}

impl Reactor {
    /// The registration, made now if this is the first call inside a tokio runtime; `None`
    /// outside one.
    fn registration(&self, fd: &Arc<EventFd>) -> Option<io::Result<Arc<AsyncFd<Registered>>>> {
        let mut slot = self.registration.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = slot.as_ref() {
            return Some(Ok(r.clone()));
        }
        tokio::runtime::Handle::try_current().ok()?;
        Some(register_readable(fd.clone()).map(|r| {
            let r = Arc::new(r);
            *slot = Some(r.clone());
            r
        }))
    }

    /// Ready when the device input `fd` is readable; otherwise the reactor wakes every task in
    /// `wakers` when it becomes so. `None` outside a tokio runtime.
    pub(crate) fn poll_source(
        &self,
        fd: BorrowedFd<'_>,
        wakers: &Arc<WakerSet>,
    ) -> Option<Poll<io::Result<()>>> {
        tokio::runtime::Handle::try_current().ok()?;
        let registration = {
            let mut slot = self.source.lock().unwrap_or_else(|e| e.into_inner());
            match slot.as_ref() {
                Some((raw, r)) if *raw == fd.as_raw_fd() => r.clone(),
                _ => {
                    let made = fd.try_clone_to_owned().and_then(register_source);
                    match made {
                        Ok(r) => {
                            let r = Arc::new(r);
                            *slot = Some((fd.as_raw_fd(), r.clone()));
                            r
                        }
                        Err(e) => return Some(Poll::Ready(Err(e))),
                    }
                }
            }
        };
        let fanout = Waker::from(wakers.clone());
        let mut cx = Context::from_waker(&fanout);
        loop {
            match registration.poll_read_ready(&mut cx) {
                Poll::Pending => return Some(Poll::Pending),
                Poll::Ready(Err(e)) => return Some(Poll::Ready(Err(e))),
                Poll::Ready(Ok(mut guard)) => {
                    // Readiness is cached until cleared: ask the kernel whether input waits.
                    match crate::wait::readable(fd, Some(Instant::now())) {
                        Ok(true) => return Some(Poll::Ready(Ok(()))),
                        Ok(false) => guard.clear_ready(),
                        Err(e) => return Some(Poll::Ready(Err(e))),
                    }
                }
            }
        }
    }

    /// Ready when `at` has passed; otherwise the sink's timerfd is armed for it (or sooner)
    /// and the reactor wakes every task in `wakers` when it fires. `None` outside a tokio
    /// runtime.
    pub(crate) fn poll_timer(
        &self,
        at: Instant,
        wakers: &Arc<WakerSet>,
    ) -> Option<Poll<io::Result<()>>> {
        tokio::runtime::Handle::try_current().ok()?;
        let mut slot = self.timer.lock().unwrap_or_else(|e| e.into_inner());
        let timer = match slot.as_mut() {
            Some(t) => t,
            None => match Timer::new() {
                Ok(t) => slot.insert(t),
                Err(e) => return Some(Poll::Ready(Err(e))),
            },
        };
        let fanout = Waker::from(wakers.clone());
        let mut cx = Context::from_waker(&fanout);
        loop {
            let now = Instant::now();
            if at <= now {
                return Some(Poll::Ready(Ok(())));
            }
            if let Err(e) = timer.arm(at, now) {
                return Some(Poll::Ready(Err(e)));
            }
            match timer.fd.poll_read_ready(&mut cx) {
                Poll::Pending => return Some(Poll::Pending),
                Poll::Ready(Err(e)) => return Some(Poll::Ready(Err(e))),
                Poll::Ready(Ok(mut guard)) => {
                    // Fired (or readiness left from an earlier expiry): take the expiry
                    // count, and look at the clock again.
                    let mut count = [0u8; 8];
                    match rustix::io::read(timer.fd.get_ref(), &mut count) {
                        Ok(_) => timer.armed = None,
                        Err(rustix::io::Errno::AGAIN) => {}
                        Err(e) => return Some(Poll::Ready(Err(e.into()))),
                    }
                    guard.clear_ready();
                }
            }
        }
    }

    /// Ready when `fd` is signalled; otherwise the reactor wakes every task in `wakers` when
    /// it becomes readable. `None` when not inside a tokio runtime (the caller falls back to
    /// waking on raises). The reactor keeps one waker per registration, so it is given the
    /// set itself, which wakes them all.
    pub(crate) fn poll_readable(
        &self,
        fd: &Arc<EventFd>,
        wakers: &Arc<WakerSet>,
    ) -> Option<Poll<io::Result<()>>> {
        let registration = match self.registration(fd)? {
            Ok(r) => r,
            Err(e) => return Some(Poll::Ready(Err(e))),
        };
        let fanout = Waker::from(wakers.clone());
        let mut cx = Context::from_waker(&fanout);
        loop {
            match registration.poll_read_ready(&mut cx) {
                Poll::Pending => return Some(Poll::Pending),
                Poll::Ready(Err(e)) => return Some(Poll::Ready(Err(e))),
                Poll::Ready(Ok(mut guard)) => {
                    // Tokio caches readiness until cleared; the counter says whether a raise
                    // is still unread.
                    match fd.is_signalled() {
                        Ok(true) => return Some(Poll::Ready(Ok(()))),
                        Ok(false) => guard.clear_ready(),
                        Err(e) => return Some(Poll::Ready(Err(e))),
                    }
                }
            }
        }
    }
}

//! The eventfd: a kernel counter that is readable while non-zero. Every event queue of an
//! opened device interrupts one (through [`EventFdSink`]); a VFIO backend makes the kernel's
//! MSI-X handler signal the same fd directly.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::Arc;

use portverbs_hal::notify::InterruptSink;
use rustix::event::{EventfdFlags, eventfd};
use rustix::io::Errno;

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

/// The interrupt sink of one event queue: an interrupt is a [`EventFd::signal`]. Cheap and
/// never blocking, as the HAL requires (a device-emulation thread may call it with locks held).
#[derive(Debug, Clone)]
pub struct EventFdSink {
    fd: Arc<EventFd>,
}

impl EventFdSink {
    /// A sink that signals `fd`.
    pub fn new(fd: Arc<EventFd>) -> Self {
        Self { fd }
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
    }

    fn eventfd(&self) -> Option<i32> {
        Some(self.fd.as_raw_fd())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_resets() {
        let fd = EventFd::new().unwrap();
        assert_eq!(fd.drain().unwrap(), 0, "a fresh eventfd is empty");
        for _ in 0..3 {
            fd.signal().unwrap();
        }
        assert_eq!(fd.drain().unwrap(), 3, "counter mode returns the sum");
        assert_eq!(fd.drain().unwrap(), 0, "a drain resets the counter");
    }

    #[test]
    fn sink_raises_its_eventfd() {
        let fd = Arc::new(EventFd::new().unwrap());
        let sink = EventFdSink::new(fd.clone());
        assert_eq!(sink.eventfd(), Some(fd.as_raw_fd()));
        sink.raise();
        sink.raise();
        assert_eq!(fd.drain().unwrap(), 2);
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

//! Blocking waits on one fd with poll(2), for the `wait*` methods (callers that use epoll or
//! tokio never come here).

use std::io;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;

/// When a blocking wait gives up.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline(Option<Instant>);

impl Deadline {
    /// `None` waits for ever.
    pub(crate) fn after(timeout: Option<Duration>) -> Self {
        Self(timeout.and_then(|t| Instant::now().checked_add(t)))
    }

    fn remaining(self) -> Option<Duration> {
        self.0.map(|d| d.saturating_duration_since(Instant::now()))
    }
}

/// Waits until `fd` is readable or the deadline passes; returns whether it is readable.
/// A signal interrupting the wait is not an error (the wait goes on).
pub(crate) fn readable(fd: impl AsFd, deadline: Deadline) -> io::Result<bool> {
    loop {
        let timeout = deadline.remaining().map(|d| {
            Timespec::try_from(d).unwrap_or(Timespec {
                tv_sec: i64::MAX,
                tv_nsec: 0,
            })
        });
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match poll(&mut fds, timeout.as_ref()) {
            Ok(0) => return Ok(false),
            Ok(_) => {
                let got = fds[0].revents();
                if got.contains(PollFlags::NVAL) {
                    return Err(io::Error::from_raw_os_error(Errno::BADF.raw_os_error()));
                }
                return Ok(true);
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// The error of a wait that ran out of time.
pub(crate) fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "no event before the timeout")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventFd;

    #[test]
    fn poll_sees_a_signal_and_times_out_without_one() {
        let fd = EventFd::new().unwrap();
        let soon = || Deadline::after(Some(Duration::from_millis(1)));
        assert!(!readable(&fd, soon()).unwrap());
        fd.signal().unwrap();
        assert!(readable(&fd, Deadline::after(None)).unwrap());
        fd.drain().unwrap();
        assert!(!readable(&fd, soon()).unwrap());
    }
}

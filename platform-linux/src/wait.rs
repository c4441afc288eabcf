//! Blocking waits on one fd, or on an event queue's eventfd and a manual-progress device's
//! input together, with poll(2), for [`crate::EventFdSink`]'s `wait` and `wait_with` (callers
//! that use epoll or tokio never come here).

use std::io;
use std::os::fd::AsFd;
use std::time::Instant;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;

/// Waits until `fd` is readable or `deadline` passes (`None`: for ever); returns whether it
/// is readable. A signal interrupting the wait is not an error (the wait goes on).
pub(crate) fn readable(fd: impl AsFd, deadline: Option<Instant>) -> io::Result<bool> {
    readable_any(fd, None::<std::os::fd::BorrowedFd<'_>>, deadline)
}

/// Waits until `fd` or `also` is readable or `deadline` passes; returns whether one is.
pub(crate) fn readable_any(
    fd: impl AsFd,
    also: Option<impl AsFd>,
    deadline: Option<Instant>,
) -> io::Result<bool> {
    loop {
        let timeout = deadline.map(|d| {
            let left = d.saturating_duration_since(Instant::now());
            Timespec::try_from(left).unwrap_or(Timespec {
                tv_sec: i64::MAX,
                tv_nsec: 0,
            })
        });
        let mut both = [
            PollFd::new(&fd, PollFlags::IN),
            PollFd::new(&fd, PollFlags::IN),
        ];
        if let Some(also) = &also {
            both[1] = PollFd::new(also, PollFlags::IN);
        }
        let fds = &mut both[..if also.is_some() { 2 } else { 1 }];
        match poll(fds, timeout.as_ref()) {
            Ok(0) => return Ok(false),
            Ok(_) => {
                if fds.iter().any(|f| f.revents().contains(PollFlags::NVAL)) {
                    return Err(io::Error::from_raw_os_error(Errno::BADF.raw_os_error()));
                }
                return Ok(true);
            }
            Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EventFd;
    use std::time::Duration;

    #[test]
    fn poll_sees_a_signal_and_times_out_without_one() {
        let fd = EventFd::new().unwrap();
        let soon = || Some(Instant::now() + Duration::from_millis(1));
        assert!(!readable(&fd, soon()).unwrap());
        fd.signal().unwrap();
        assert!(readable(&fd, None).unwrap());
        fd.drain().unwrap();
        assert!(!readable(&fd, soon()).unwrap());
        assert!(
            !readable(&fd, Some(Instant::now())).unwrap(),
            "a past deadline does not wait"
        );
    }

    #[test]
    fn either_fd_ends_the_wait() {
        let (a, b) = (EventFd::new().unwrap(), EventFd::new().unwrap());
        let soon = || Some(Instant::now() + Duration::from_millis(1));
        assert!(!readable_any(&a, Some(&b), soon()).unwrap());
        b.signal().unwrap();
        assert!(readable_any(&a, Some(&b), None).unwrap(), "the second fd");
        b.drain().unwrap();
        a.signal().unwrap();
        assert!(readable_any(&a, Some(&b), None).unwrap(), "the first fd");
    }
}

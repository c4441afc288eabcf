//! Blocking waits on one fd with poll(2), for [`crate::EventFdSink`]'s `wait` (callers that use
//! epoll or tokio never come here).

use std::io;
use std::os::fd::AsFd;
use std::time::Instant;

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::Errno;

/// Waits until `fd` is readable or `deadline` passes (`None`: for ever); returns whether it
/// is readable. A signal interrupting the wait is not an error (the wait goes on).
pub(crate) fn readable(fd: impl AsFd, deadline: Option<Instant>) -> io::Result<bool> {
    loop {
        let timeout = deadline.map(|d| {
            let left = d.saturating_duration_since(Instant::now());
            Timespec::try_from(left).unwrap_or(Timespec {
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
}

//! Bounded waits: every wait of the guest test ends after a timeout, so a device that never
//! answers fails one check instead of hanging the boot until the host's hard timeout.

use std::error::Error;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use portverbs_linux::EventFd;
use rustix::event::{PollFd, PollFlags, Timespec, poll};

/// How long any single device operation may take under TCG before it counts as lost.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(5);

/// Waits until the eventfd is readable, then drains it; returns the counter and the time it
/// took, or an error naming `what` on timeout.
pub(crate) fn eventfd(fd: &EventFd, what: &str) -> Result<(u64, Duration), Box<dyn Error>> {
    let start = Instant::now();
    loop {
        let left = TIMEOUT.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(format!("no {what} on the eventfd within {TIMEOUT:?}").into());
        }
        let ts = Timespec::try_from(left)?;
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        match poll(&mut fds, Some(&ts)) {
            Ok(0) => {}
            Ok(_) => {
                let n = fd.drain()?;
                if n > 0 {
                    return Ok((n, start.elapsed()));
                }
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Polls `cond` until it returns `Some`, sleeping briefly between tries; an error naming `what`
/// on timeout.
pub(crate) fn until<T>(
    what: &str,
    mut cond: impl FnMut() -> Result<Option<T>, Box<dyn Error>>,
) -> Result<(T, Duration), Box<dyn Error>> {
    let start = Instant::now();
    loop {
        if let Some(v) = cond()? {
            return Ok((v, start.elapsed()));
        }
        if start.elapsed() > TIMEOUT {
            return Err(format!("{what}: not within {TIMEOUT:?}").into());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Kernel log records, read without blocking from `/dev/kmsg` (opened once, so later reads
/// return only what came after).
#[derive(Debug)]
pub(crate) struct Kmsg(Option<File>);

impl Kmsg {
    /// Opens `/dev/kmsg` positioned at the end of the log; without it, `seen` finds nothing.
    pub(crate) fn open() -> Self {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
            .open("/dev/kmsg")
            .ok();
        let mut k = Self(file);
        // Skip what is already there.
        while k.next_record().is_some() {}
        k
    }

    fn next_record(&mut self) -> Option<String> {
        let f = self.0.as_mut()?;
        let mut buf = vec![0u8; 8192];
        loop {
            match f.read(&mut buf) {
                Ok(n) if n > 0 => return Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
                // EPIPE: records were overwritten; the next read goes on.
                Err(e) if e.raw_os_error() == Some(rustix::io::Errno::PIPE.raw_os_error()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                _ => return None,
            }
        }
    }

    /// Waits up to `wait` for a new record containing every string of `needles`; returns its
    /// text.
    pub(crate) fn seen(&mut self, needles: &[&str], wait: Duration) -> Option<String> {
        let start = Instant::now();
        loop {
            while let Some(rec) = self.next_record() {
                if needles.iter().all(|n| rec.contains(n)) {
                    let text = rec.split_once(';').map_or(rec.as_str(), |(_, t)| t);
                    return Some(text.trim().to_string());
                }
            }
            if start.elapsed() > wait {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

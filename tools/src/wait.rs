//! Busy-waiting with a watchdog, for the polling loops of `perf` and `pingpong`.
//!
//! A benchmark polls (a CQ, a byte of a buffer) as fast as it can. [`Waiter::idle`] is called
//! once per unsuccessful poll: it spins (and on machines with fewer than four cores, where the
//! soft device's engine thread and the in-process peer compete with us for the CPU, yields it
//! after a short spin), and fails when nothing has
//! happened for [`STALL_LIMIT`], or with [`CliError::PeerStopped`] once the other side has ended
//! (normally or not). It reads the clock only every thousand calls, so an idle call costs a few
//! nanoseconds.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::CliError;

/// How long a wait may see no progress before the run is declared stuck.
pub(crate) const STALL_LIMIT: Duration = Duration::from_secs(10);

/// Spins before the first yield of the CPU on a machine with fewer cores than a test has busy
/// threads (client, in-process server, the soft device's engine).
const SPINS_BEFORE_YIELD: u32 = 64;

/// Machines with at least this many cores never yield: they spin like perftest does.
const CORES_TO_SPIN: usize = 4;

/// How many idle calls spin before the waiter starts yielding the CPU.
fn spin_limit() -> u32 {
    static LIMIT: OnceLock<u32> = OnceLock::new();
    *LIMIT.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if cores >= CORES_TO_SPIN {
            u32::MAX
        } else {
            SPINS_BEFORE_YIELD
        }
    })
}

/// Calls between two looks at the clock and at the abort flag.
const CHECK_EVERY: u32 = 1024;

/// The state of one waiting loop.
#[derive(Debug)]
pub(crate) struct Waiter<'a> {
    what: &'static str,
    peer_done: Option<&'a AtomicBool>,
    spin_limit: u32,
    spins: u32,
    since: Option<Instant>,
}

impl<'a> Waiter<'a> {
    /// A waiter for `what` (used in the stall message); when `peer_done` becomes true the wait
    /// ends with [`CliError::PeerStopped`].
    pub(crate) fn new(what: &'static str, peer_done: Option<&'a AtomicBool>) -> Self {
        Self {
            what,
            peer_done,
            spin_limit: spin_limit(),
            spins: 0,
            since: None,
        }
    }

    /// Something happened: restart the stall clock.
    #[inline]
    pub(crate) fn progress(&mut self) {
        self.spins = 0;
        self.since = None;
    }

    /// Nothing happened this time.
    ///
    /// # Errors
    /// No progress for [`STALL_LIMIT`], or the peer has ended.
    #[inline]
    pub(crate) fn idle(&mut self) -> Result<(), CliError> {
        self.spins = self.spins.wrapping_add(1);
        if self.spins < self.spin_limit {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
        if self.spins % CHECK_EVERY == 0 {
            self.check()?;
        }
        Ok(())
    }

    /// Runs the stall and peer checks now (for waits that block instead of spinning).
    ///
    /// # Errors
    /// As [`Waiter::idle`].
    pub(crate) fn check_now(&mut self) -> Result<(), CliError> {
        self.check()
    }

    #[cold]
    fn check(&mut self) -> Result<(), CliError> {
        if self.peer_done.is_some_and(|a| a.load(Ordering::Acquire)) {
            return Err(CliError::PeerStopped(self.what));
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if now.duration_since(since) >= STALL_LIMIT {
            return Err(CliError::Failed(format!(
                "nothing happened for {} s while {}: the peer stopped responding",
                STALL_LIMIT.as_secs(),
                self.what
            )));
        }
        Ok(())
    }
}

//! Busy-waiting with a watchdog, for the polling loops of `perf` and `pingpong`, and the
//! deadline every wait on a peer has.
//!
//! A benchmark polls (a CQ, a byte of a buffer) as fast as it can. [`Waiter::idle`] is called
//! once per unsuccessful poll: it spins (and on machines with fewer than four cores, where the
//! soft device's engine thread and the in-process peer compete with us for the CPU, yields it
//! after a short spin), and fails when nothing has happened for its limit (the tool's
//! `--timeout`, [`DEFAULT_TIMEOUT`] unless given), or with [`CliError::PeerStopped`] once the
//! other side has ended (normally or not). It reads the clock only every thousand calls, so an
//! idle call costs a few nanoseconds.
//!
//! A peer in another process can die without a word (its CM has no kernel to send a DREQ for
//! it, and a side that only waits to receive sends nothing that could time out), so every wait
//! on a peer ends after a deadline: [`timeout_arg`] reads the tools' `--timeout SECS` (0: wait
//! for ever, as the C tools do), and [`CliError::with_peer`] names the peer in the message.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use portverbs::AnyDevice;

use crate::error::CliError;

/// How long a wait may see no sign of the peer before the run is declared stuck, unless the
/// tool's `--timeout` says otherwise: ten seconds, as `pingpong`'s TCP exchange has always
/// waited. A peer that runs sends something well within it (an RC QP retries a lost packet
/// after about 67 ms, perftest's and rdma_cm's local ACK timeout 14).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// `--timeout SECS` as a limit: `None` (wait for ever) for 0.
pub(crate) fn timeout_arg(secs: u64) -> Option<Duration> {
    (secs > 0).then(|| Duration::from_secs(secs))
}

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
    limit: Option<Duration>,
    spin_limit: u32,
    spins: u32,
    since: Option<Instant>,
}

impl<'a> Waiter<'a> {
    /// A waiter for `what` (used in the stall message) that gives up after
    /// [`DEFAULT_TIMEOUT`] without progress; when `peer_done` becomes true the wait ends with
    /// [`CliError::PeerStopped`].
    pub(crate) fn new(what: &'static str, peer_done: Option<&'a AtomicBool>) -> Self {
        Self {
            what,
            peer_done,
            limit: Some(DEFAULT_TIMEOUT),
            spin_limit: spin_limit(),
            spins: 0,
            since: None,
        }
    }

    /// Gives up after `limit` without progress instead (`None`: never).
    pub(crate) fn limit(mut self, limit: Option<Duration>) -> Self {
        self.limit = limit;
        self
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
    /// No progress for the limit, or the peer has ended.
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
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        if now.duration_since(since) >= limit {
            return Err(CliError::Failed(format!(
                "nothing happened for {} s while {}: the peer stopped responding (--timeout)",
                limit.as_secs_f64(),
                self.what
            )));
        }
        Ok(())
    }
}

/// How many times `--timeout` a peer gets to run its part of a test (a BW client's whole run,
/// which a server only waits out) when this side's device cannot tell whether packets still
/// arrive: ten minutes with the default.
const RUN_ALLOWANCE: u32 = 60;

/// The deadline of a wait on a peer in another process, which may have died without a word.
///
/// The clock restarts whenever this side's device has received packets since the last look:
/// a peer that runs its part of a test (a BW client, whose server only waits for the result)
/// sends nothing this side could poll for, but its device keeps receiving. The soft device
/// (in-process or UDP-bound) counts what it receives; on a device that cannot tell (an mlx4
/// HCA) a wait through the peer's run gets [`RUN_ALLOWANCE`] times the limit instead.
#[derive(Debug)]
pub(crate) struct PeerWatch {
    limit: Option<Duration>,
    device: AnyDevice,
    packets: Option<u64>,
    since: Instant,
}

impl PeerWatch {
    /// A watch giving up after `limit` (`None`: never) without a sign of the peer, looking
    /// at what `device` receives.
    pub(crate) fn new(limit: Option<Duration>, device: AnyDevice) -> Self {
        let mut w = Self {
            limit,
            device,
            packets: None,
            since: Instant::now(),
        };
        w.restart();
        w
    }

    /// The limit (`None`: none).
    pub(crate) fn limit(&self) -> Option<Duration> {
        self.limit
    }

    fn received(&self) -> Option<u64> {
        self.device.as_soft().map(|d| d.engine_stats().rx_packets)
    }

    /// A new wait starts: the clock starts again.
    pub(crate) fn restart(&mut self) {
        self.packets = self.received();
        self.since = Instant::now();
    }

    /// Fails when the peer showed no sign of life for the limit while `what`; `long` when the
    /// peer is running its part of the test meanwhile.
    ///
    /// # Errors
    /// No sign of the peer for the limit.
    pub(crate) fn check(&mut self, what: &str, long: bool) -> Result<(), CliError> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let now = self.received();
        if now.is_some() && now != self.packets {
            self.packets = now;
            self.since = Instant::now();
        }
        let limit = if long && now.is_none() {
            limit * RUN_ALLOWANCE
        } else {
            limit
        };
        if self.since.elapsed() >= limit {
            return Err(CliError::Failed(format!(
                "no sign of the peer for {} s while {what}: it stopped responding (--timeout)",
                limit.as_secs_f64()
            )));
        }
        Ok(())
    }
}

//! Per-iteration timestamps of a latency run (iterations mode) or the measured window of a
//! duration run.

use std::time::{Duration, Instant};

use super::config::RunMode;
use crate::report::{DurationLatency, duration_latency};

/// What a latency run measured.
#[derive(Debug)]
pub(crate) enum LatOutcome {
    /// One sample per iteration, in microseconds (halved for ping-pong tests).
    Samples(Vec<f64>),
    /// Duration mode.
    Duration(DurationLatency),
}

/// Clock stamps taken by the client.
#[derive(Debug)]
pub(crate) struct Recorder {
    mode: RunMode,
    start: Instant,
    stamps: Vec<Instant>,
    window_start: Option<(Instant, u64)>,
    window: Option<(Duration, u64)>,
}

impl Recorder {
    /// A recorder for `mode`; the stamp vector is reserved up front.
    pub(crate) fn new(mode: RunMode) -> Self {
        let capacity = match mode {
            RunMode::Iters(n) => usize::try_from(n).unwrap_or(0).saturating_add(1),
            RunMode::Duration { .. } => 0,
        };
        Self {
            mode,
            start: Instant::now(),
            stamps: Vec::with_capacity(capacity),
            window_start: None,
            window: None,
        }
    }

    /// Called before iteration `k` (from 0) and once after the last; returns whether
    /// iteration `k` should run.
    #[inline]
    pub(crate) fn tick(&mut self, k: u64) -> bool {
        let now = Instant::now();
        match self.mode {
            RunMode::Iters(n) => {
                if self.stamps.is_empty() {
                    self.start = now;
                }
                self.stamps.push(now);
                k < n
            }
            RunMode::Duration { total, margin } => {
                if k == 0 {
                    self.start = now;
                }
                let elapsed = now - self.start;
                if self.window_start.is_none() && elapsed >= margin {
                    self.window_start = Some((now, k));
                }
                if elapsed >= total - margin {
                    if let Some((t0, k0)) = self.window_start {
                        self.window = Some((now - t0, k - k0));
                    }
                    return false;
                }
                true
            }
        }
    }

    /// Progress units after `k` iterations: `k`, or elapsed milliseconds in duration mode.
    pub(crate) fn units(&self, k: u64) -> u64 {
        match self.mode {
            RunMode::Iters(_) => k,
            RunMode::Duration { .. } => self.start.elapsed().as_millis() as u64,
        }
    }

    /// The result; `half` halves every time (ping-pong tests report half the round trip).
    pub(crate) fn outcome(&self, half: bool) -> LatOutcome {
        match self.mode {
            RunMode::Iters(_) => {
                let factor = if half { 0.5 } else { 1.0 };
                LatOutcome::Samples(
                    self.stamps
                        .windows(2)
                        .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6 * factor)
                        .collect(),
                )
            }
            RunMode::Duration { .. } => {
                let (elapsed, iterations) = self.window.unwrap_or_default();
                LatOutcome::Duration(duration_latency(iterations, elapsed, half))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iteration_samples_are_stamp_differences() {
        let mut r = Recorder::new(RunMode::Iters(3));
        let mut k = 0;
        while r.tick(k) {
            k += 1;
        }
        assert_eq!(k, 3);
        let LatOutcome::Samples(full) = r.outcome(false) else {
            panic!("samples expected");
        };
        let LatOutcome::Samples(half) = r.outcome(true) else {
            panic!("samples expected");
        };
        assert_eq!(full.len(), 3);
        for (f, h) in full.iter().zip(&half) {
            assert!(*f >= 0.0);
            assert!((f / 2.0 - h).abs() < 1e-9);
        }
    }

    #[test]
    fn duration_window_counts_iterations() {
        let mut r = Recorder::new(RunMode::Duration {
            total: Duration::from_millis(20),
            margin: Duration::ZERO,
        });
        let mut k = 0;
        while r.tick(k) {
            k += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        let LatOutcome::Duration(d) = r.outcome(true) else {
            panic!("duration expected");
        };
        assert_eq!(d.iterations, k);
        assert!(d.t_avg > 0.0 && d.tps > 0.0);
    }
}

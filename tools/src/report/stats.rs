//! The statistics behind the perftest-style tables, with perftest's semantics.
//!
//! Latency ([`latency_stats`]) works on per-iteration samples in microseconds; the caller has
//! already converted them to what the tool reports (perftest reports half the round trip for
//! send and write latency, the full operation for read and atomic). Bandwidth ([`bw_result`])
//! works on the message size, the number of messages and the elapsed time, plus optional
//! completion marks for the peak.
//!
//! No function here panics or returns NaN/infinity: empty input, zero elapsed time and
//! non-finite samples all give defined numbers (zeros where nothing was measured), which the
//! formatters print as `0.00` like perftest does.

use std::time::Duration;

use super::numfmt::finite_or_zero;

/// How many of the largest latency samples perftest sets aside before computing statistics.
pub(crate) const LAT_TAIL_DROP: usize = 2;

/// Bytes in one MiB, the unit of perftest's default `[MiB/sec]` columns.
pub(crate) const MIB: f64 = 1_048_576.0;

/// Bytes per second in one Gb/s (10^9 bits), the unit of `--report_gbits`.
pub(crate) const GBIT_BYTES: f64 = 125_000_000.0;

/// Latency statistics in microseconds, as printed in one perftest latency row.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct LatencyStats {
    /// Number of samples the mean, median and deviation were computed over (after the drop).
    pub(crate) kept: usize,
    /// Smallest sample.
    pub(crate) t_min: f64,
    /// `sorted[kept]` (see [`latency_stats`]).
    pub(crate) t_max: f64,
    /// Median of the kept samples.
    pub(crate) t_typical: f64,
    /// Mean of the kept samples.
    pub(crate) t_avg: f64,
    /// Population standard deviation of the kept samples.
    pub(crate) t_stdev: f64,
    /// 99% percentile.
    pub(crate) p99: f64,
    /// 99.9% percentile.
    pub(crate) p99_9: f64,
}

/// Computes perftest's latency statistics from per-iteration samples (microseconds).
///
/// Non-finite samples are ignored. With `N` finite samples sorted ascending into `s`:
///
/// * `kept = N - 2` when `N > 2` (the two largest samples are set aside, as perftest does),
///   otherwise `kept = N`;
/// * `t_min = s[0]`;
/// * `t_max = s[min(kept, N - 1)]`: perftest reads the element just past the kept range, which
///   is the smaller of the two set-aside samples (the second-largest overall);
/// * `t_typical` is the median of `s[..kept]`: `s[kept / 2]` when `kept` is odd, otherwise the
///   mean of `s[kept / 2 - 1]` and `s[kept / 2]`;
/// * `t_avg` and `t_stdev` are the mean and population standard deviation (divide by `kept`) of
///   `s[..kept]`; unlike perftest, deviations are not truncated to whole microseconds;
/// * the percentile `p` (0.99 or 0.999) is `s[min(ceil(kept as f64 * p), N - 1)]`, the same
///   index perftest computes (for `kept = 1000`: `s[990]` and `s[999]`).
///
/// No samples give all zeros.
pub(crate) fn latency_stats(samples_usec: &[f64]) -> LatencyStats {
    let mut s: Vec<f64> = samples_usec
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .collect();
    let n = s.len();
    if n == 0 {
        return LatencyStats::default();
    }
    s.sort_by(f64::total_cmp);
    let kept = if n > LAT_TAIL_DROP {
        n - LAT_TAIL_DROP
    } else {
        n
    };
    let body = &s[..kept];

    let t_typical = if kept % 2 == 1 {
        body[kept / 2]
    } else {
        (body[kept / 2 - 1] + body[kept / 2]) / 2.0
    };
    let t_avg = body.iter().sum::<f64>() / kept as f64;
    let variance = body.iter().map(|x| (x - t_avg).powi(2)).sum::<f64>() / kept as f64;

    LatencyStats {
        kept,
        t_min: s[0],
        t_max: s[kept.min(n - 1)],
        t_typical,
        t_avg: finite_or_zero(t_avg),
        t_stdev: finite_or_zero(variance.sqrt()),
        p99: s[percentile_index(kept, 0.99, n)],
        p99_9: s[percentile_index(kept, 0.999, n)],
    }
}

/// The index perftest reads for percentile `fraction`: `ceil(kept * fraction)`, clamped to the
/// last valid index of an array of `len` samples (0 when `len` is 0).
pub(crate) fn percentile_index(kept: usize, fraction: f64, len: usize) -> usize {
    let raw = (kept as f64 * fraction).ceil();
    let idx = if raw.is_finite() && raw > 0.0 {
        raw as usize
    } else {
        0
    };
    idx.min(len.saturating_sub(1))
}

/// Result of a duration-mode (`-D`) latency run: average latency and transactions per second.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct DurationLatency {
    /// Iterations completed during the measured window.
    pub(crate) iterations: u64,
    /// Average latency in microseconds.
    pub(crate) t_avg: f64,
    /// Iterations per second.
    pub(crate) tps: f64,
}

/// Computes duration-mode latency: `t_avg = elapsed_usec / rtt_factor / iterations` and
/// `tps = iterations / elapsed_s`, where `rtt_factor` is 2 when `half_round_trip` (send and
/// write tests) and 1 otherwise. Zero iterations or zero elapsed time give zeros.
pub(crate) fn duration_latency(
    iterations: u64,
    elapsed: Duration,
    half_round_trip: bool,
) -> DurationLatency {
    let secs = elapsed.as_secs_f64();
    if iterations == 0 || secs <= 0.0 {
        return DurationLatency {
            iterations,
            ..DurationLatency::default()
        };
    }
    let rtt_factor = if half_round_trip { 2.0 } else { 1.0 };
    DurationLatency {
        iterations,
        t_avg: finite_or_zero(secs * 1e6 / rtt_factor / iterations as f64),
        tps: finite_or_zero(iterations as f64 / secs),
    }
}

/// Bandwidth unit of the BW columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum BwUnits {
    /// MiB/s (2^20 bytes per second), perftest's default.
    #[default]
    MiBps,
    /// Gb/s (10^9 bits per second), `--report_gbits`.
    Gbps,
}

impl BwUnits {
    /// Bytes per second in one unit.
    pub(crate) fn bytes_per_unit(self) -> f64 {
        match self {
            Self::MiBps => MIB,
            Self::Gbps => GBIT_BYTES,
        }
    }
}

/// One point of a completion log: by time `at` (since the first post), `messages` messages in
/// total had completed. Marks are taken at CQ-moderation granularity (every `cq_mod` messages,
/// and at the last message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CompletionMark {
    /// Time since the first post.
    pub(crate) at: Duration,
    /// Cumulative number of completed messages at `at`.
    pub(crate) messages: u64,
}

/// The numbers of one BW result row.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub(crate) struct BwResult {
    /// Message size in bytes (`#bytes`).
    pub(crate) msg_size: u64,
    /// Messages counted (`#iterations`: iterations × QPs, as perftest prints it).
    pub(crate) iterations: u64,
    /// Peak bandwidth in `units` (0 when peak was not measured, like `-N`).
    pub(crate) bw_peak: f64,
    /// Average bandwidth in `units`.
    pub(crate) bw_average: f64,
    /// Average message rate in millions of messages per second.
    pub(crate) msg_rate_mpps: f64,
    /// Unit of `bw_peak` and `bw_average`.
    pub(crate) units: BwUnits,
}

/// Average bandwidth: `bytes / elapsed` in `units`; 0 when `elapsed` is zero.
pub(crate) fn bw_average(bytes: f64, elapsed: Duration, units: BwUnits) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    finite_or_zero(bytes / secs / units.bytes_per_unit())
}

/// Message rate in Mpps: `messages / elapsed / 10^6`; 0 when `elapsed` is zero.
pub(crate) fn msg_rate_mpps(messages: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs <= 0.0 {
        return 0.0;
    }
    finite_or_zero(messages as f64 / secs / 1e6)
}

/// Peak bandwidth from completion marks.
///
/// The marks are sorted by time and preceded by an implicit mark `(0 s, 0 messages)` for the
/// first post. Between consecutive marks `a` and `b` the interval rate is
/// `(b.messages - a.messages) × msg_size / (b.at - a.at)`; the peak is the largest such rate, in
/// `units`. A mark at the same time as the previous one is folded into the next interval, a
/// mark whose count goes backwards is ignored, and with no usable interval the peak is 0. Because the overall rate is a weighted mean of the interval rates,
/// the peak is never below the average measured up to the last mark.
///
/// perftest computes the same idea (the smallest per-message time over completion windows at
/// CQ-moderation granularity) on raw cycle counters; this version works on the marks the
/// stack records.
pub(crate) fn bw_peak(msg_size: u64, marks: &[CompletionMark], units: BwUnits) -> f64 {
    let mut sorted = marks.to_vec();
    sorted.sort_by_key(|m| m.at);
    let mut prev = CompletionMark {
        at: Duration::ZERO,
        messages: 0,
    };
    let mut best = 0.0_f64;
    for mark in sorted {
        if mark.messages < prev.messages {
            continue;
        }
        let dt = mark.at.saturating_sub(prev.at).as_secs_f64();
        if dt <= 0.0 {
            continue;
        }
        let dm = mark.messages - prev.messages;
        let rate = dm as f64 * msg_size as f64 / dt / units.bytes_per_unit();
        best = best.max(finite_or_zero(rate));
        prev = mark;
    }
    best
}

/// Computes one BW row the way perftest does for an iterations run.
///
/// `messages = iterations × num_qps`; `bw_average = msg_size × messages / elapsed`;
/// `msg_rate = messages / elapsed / 10^6`; the peak comes from [`bw_peak`] over `marks`, or is 0
/// when `marks` is `None` (perftest's `-N`/`--noPeak`). `elapsed` runs from the first post to the
/// last completion. Zero elapsed time gives zeros.
pub(crate) fn bw_result(
    msg_size: u64,
    iterations: u64,
    num_qps: u32,
    elapsed: Duration,
    marks: Option<&[CompletionMark]>,
    units: BwUnits,
) -> BwResult {
    let messages = iterations.saturating_mul(u64::from(num_qps));
    let bytes = msg_size as f64 * messages as f64;
    BwResult {
        msg_size,
        iterations: messages,
        bw_peak: marks.map_or(0.0, |m| bw_peak(msg_size, m, units)),
        bw_average: bw_average(bytes, elapsed, units),
        msg_rate_mpps: msg_rate_mpps(messages, elapsed),
        units,
    }
}

#[cfg(test)]
#[path = "stats_tests.rs"]
mod tests;

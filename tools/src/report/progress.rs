//! A throttled one-line progress indicator for long runs.
//!
//! Short runs print nothing: the indicator stays silent until the run has lasted more than
//! [`START_DELAY`], then redraws at most every [`REDRAW_INTERVAL`] as
//! `\r<label>: 42% (2100/5000)`, or `\r<label>: 2100 (3s)` (work done and whole seconds
//! elapsed) when the total is unknown. A run measured in time instead of work (perftest's
//! duration mode, [`Progress::timed`]) counts milliseconds and shows seconds:
//! `\r<label>: 42% (2.1/5 s)`. [`Progress::finish`] (or dropping the indicator)
//! erases the line, so the report that follows starts on a clean line.
//!
//! Time and output are injectable: [`Progress::with_sink`] takes any [`std::io::Write`] and a
//! start instant, and [`Progress::update_at`] takes the current instant, so tests drive it with
//! fake time. The default constructor writes to stderr only when stderr is a terminal, so logs
//! and pipes never receive carriage-return noise. Write errors are ignored: progress output is
//! best-effort and must never fail a run.

use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

/// How long a run must last before the first progress line appears.
pub(crate) const START_DELAY: Duration = Duration::from_secs(1);

/// The shortest time between two redraws.
pub(crate) const REDRAW_INTERVAL: Duration = Duration::from_millis(500);

/// A progress indicator writing to `W` (stderr by default).
#[derive(Debug)]
pub(crate) struct Progress<W: Write = io::Stderr> {
    label: String,
    total: Option<u64>,
    /// The work is milliseconds, shown as seconds.
    millis: bool,
    sink: W,
    enabled: bool,
    start: Instant,
    last_draw: Option<Instant>,
    /// Characters of the line currently on screen (0 when none).
    shown_len: usize,
}

impl Progress<io::Stderr> {
    /// An indicator on stderr, started now; enabled only when stderr is a terminal.
    pub(crate) fn new(label: &str, total_work: Option<u64>) -> Self {
        let mut p = Self::with_sink(label, total_work, io::stderr(), Instant::now());
        p.enabled = io::stderr().is_terminal();
        p
    }

    /// An indicator on stderr for a run of `total_ms` milliseconds: the work reported is the
    /// milliseconds elapsed, shown as seconds. Enabled only when stderr is a terminal.
    pub(crate) fn timed(label: &str, total_ms: u64) -> Self {
        Self::new(label, Some(total_ms)).in_millis()
    }

    /// An indicator on stderr, started now, enabled even when stderr is not a terminal.
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "for callers that want progress in logs; tested")
    )]
    pub(crate) fn forced(label: &str, total_work: Option<u64>) -> Self {
        Self::with_sink(label, total_work, io::stderr(), Instant::now())
    }
}

impl<W: Write> Progress<W> {
    /// An enabled indicator writing to `sink`, for a run that started at `start`.
    pub(crate) fn with_sink(label: &str, total_work: Option<u64>, sink: W, start: Instant) -> Self {
        Self {
            label: label.to_owned(),
            total: total_work,
            millis: false,
            sink,
            enabled: true,
            start,
            last_draw: None,
            shown_len: 0,
        }
    }

    /// Turns output on or off (turning it off erases a line already shown).
    #[cfg_attr(
        not(test),
        allow(dead_code, reason = "not needed by the CLI today; tested")
    )]
    pub(crate) fn set_enabled(&mut self, enabled: bool) {
        if !enabled {
            self.finish();
        }
        self.enabled = enabled;
    }

    /// Shows the work as milliseconds, printed in seconds (see [`Progress::timed`]).
    pub(crate) fn in_millis(mut self) -> Self {
        self.millis = true;
        self
    }

    /// Whether the indicator writes anything.
    pub(crate) fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Reports `done` units of work, using the current time.
    pub(crate) fn update(&mut self, done: u64) {
        self.update_at(done, Instant::now());
    }

    /// Reports `done` units of work at time `now`. Redraws the line when the run has lasted
    /// more than [`START_DELAY`] and the last redraw is at least [`REDRAW_INTERVAL`] old;
    /// returns whether it drew.
    pub(crate) fn update_at(&mut self, done: u64, now: Instant) -> bool {
        if !self.enabled {
            return false;
        }
        let elapsed = now.saturating_duration_since(self.start);
        if elapsed <= START_DELAY {
            return false;
        }
        if let Some(last) = self.last_draw {
            if now.saturating_duration_since(last) < REDRAW_INTERVAL {
                return false;
            }
        }
        let line = self.line(done, elapsed);
        let len = line.chars().count();
        let pad = self.shown_len.saturating_sub(len);
        let _ = write!(self.sink, "\r{line}{:pad$}", "");
        let _ = self.sink.flush();
        self.shown_len = len;
        self.last_draw = Some(now);
        true
    }

    /// Erases the line if one is shown. Calling it again does nothing.
    pub(crate) fn finish(&mut self) {
        if self.shown_len > 0 {
            let _ = write!(self.sink, "\r{:width$}\r", "", width = self.shown_len);
            let _ = self.sink.flush();
            self.shown_len = 0;
        }
    }

    /// The sink (tests read what was written).
    #[cfg_attr(not(test), allow(dead_code, reason = "an accessor for tests"))]
    pub(crate) fn sink(&self) -> &W {
        &self.sink
    }

    /// The text of one progress line, without the leading `\r`.
    fn line(&self, done: u64, elapsed: Duration) -> String {
        match self.total {
            Some(total) => {
                let percent = if total == 0 {
                    100
                } else {
                    u128::from(done.min(total)) * 100 / u128::from(total)
                };
                if self.millis {
                    format!(
                        "{}: {percent}% ({}/{} s)",
                        self.label,
                        seconds(done.min(total)),
                        seconds(total)
                    )
                } else {
                    format!("{}: {percent}% ({done}/{total})", self.label)
                }
            }
            None => format!("{}: {done} ({}s)", self.label, elapsed.as_secs()),
        }
    }
}

/// Milliseconds as seconds: whole seconds without decimals, others with one (`5`, `2.1`).
fn seconds(ms: u64) -> String {
    if ms % 1000 == 0 {
        (ms / 1000).to_string()
    } else {
        format!("{}.{}", ms / 1000, ms % 1000 / 100)
    }
}

impl<W: Write> Drop for Progress<W> {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: &Progress<Vec<u8>>) -> String {
        String::from_utf8(p.sink().clone()).unwrap()
    }

    fn at(start: Instant, ms: u64) -> Instant {
        start + Duration::from_millis(ms)
    }

    #[test]
    fn silent_during_first_second() {
        let t0 = Instant::now();
        let mut p = Progress::with_sink("write_bw", Some(5000), Vec::new(), t0);
        assert!(!p.update_at(10, at(t0, 0)));
        assert!(!p.update_at(500, at(t0, 999)));
        assert!(
            !p.update_at(600, at(t0, 1000)),
            "exactly 1 s is not more than 1 s"
        );
        assert_eq!(text(&p), "");
        p.finish();
        assert_eq!(text(&p), "", "nothing shown, nothing to erase");
    }

    #[test]
    fn draws_then_throttles() {
        let t0 = Instant::now();
        let mut p = Progress::with_sink("write_bw", Some(5000), Vec::new(), t0);
        assert!(p.update_at(2100, at(t0, 1001)));
        assert_eq!(text(&p), "\rwrite_bw: 42% (2100/5000)");
        assert!(!p.update_at(2200, at(t0, 1200)));
        assert!(
            !p.update_at(2300, at(t0, 1500)),
            "499 ms after the last draw"
        );
        assert!(p.update_at(2400, at(t0, 1501)));
        assert!(!p.update_at(2500, at(t0, 2000)));
        assert!(p.update_at(5000, at(t0, 2001)));
        assert_eq!(
            text(&p),
            "\rwrite_bw: 42% (2100/5000)\rwrite_bw: 48% (2400/5000)\rwrite_bw: 100% (5000/5000)"
        );
    }

    #[test]
    fn shorter_line_overwrites_leftovers_and_finish_erases() {
        let t0 = Instant::now();
        let mut p = Progress::with_sink("x", Some(1000), Vec::new(), t0);
        p.update_at(999, at(t0, 1100)); // "x: 99% (999/1000)" = 17 chars
        p.update_at(5, at(t0, 1700)); // "x: 0% (5/1000)" = 14 chars, padded by 3
        p.finish();
        p.finish();
        assert_eq!(
            text(&p),
            format!(
                "\rx: 99% (999/1000)\rx: 0% (5/1000)   \r{}\r",
                " ".repeat(14)
            )
        );
    }

    #[test]
    fn unknown_total_shows_elapsed_seconds() {
        let t0 = Instant::now();
        let mut p = Progress::with_sink("lat", None, Vec::new(), t0);
        p.update_at(123, at(t0, 3400));
        assert_eq!(text(&p), "\rlat: 123 (3s)");
    }

    #[test]
    fn timed_runs_show_seconds() {
        let t0 = Instant::now();
        let mut p = Progress::with_sink("write_bw", Some(5000), Vec::new(), t0).in_millis();
        p.update_at(2150, at(t0, 2150));
        p.update_at(5000, at(t0, 5000));
        assert_eq!(
            text(&p),
            // The second line is one character shorter: a space erases the leftover.
            "\rwrite_bw: 43% (2.1/5 s)\rwrite_bw: 100% (5/5 s) "
        );
        assert_eq!(seconds(0), "0");
        assert_eq!(seconds(12_999), "12.9");
        // On stderr (a terminal or not) the constructor sets the unit.
        assert!(Progress::timed("t", 1000).millis);
    }

    #[test]
    fn odd_totals_do_not_panic() {
        let t0 = Instant::now();
        let mut p = Progress::with_sink("z", Some(0), Vec::new(), t0);
        p.update_at(0, at(t0, 2000));
        assert_eq!(text(&p), "\rz: 100% (0/0)");
        let mut q = Progress::with_sink("big", Some(u64::MAX), Vec::new(), t0);
        q.update_at(u64::MAX, at(t0, 2000));
        assert_eq!(text(&q), format!("\rbig: 100% ({0}/{0})", u64::MAX));
        // A clock reading before the start counts as no time elapsed.
        let mut r = Progress::with_sink("r", Some(1), Vec::new(), at(t0, 5000));
        assert!(!r.update_at(1, t0));
    }

    #[test]
    fn disabled_prints_nothing_and_disabling_erases() {
        let t0 = Instant::now();
        let mut p = Progress::with_sink("q", Some(10), Vec::new(), t0);
        p.set_enabled(false);
        assert!(!p.is_enabled());
        assert!(!p.update_at(5, at(t0, 5000)));
        assert_eq!(text(&p), "");
        p.set_enabled(true);
        p.update_at(5, at(t0, 5000));
        p.set_enabled(false);
        assert_eq!(text(&p), format!("\rq: 50% (5/10)\r{}\r", " ".repeat(13)));
    }

    #[test]
    fn stderr_constructors() {
        // `forced` is always on; `new` follows whether stderr is a terminal.
        assert!(Progress::forced("f", None).is_enabled());
        assert_eq!(
            Progress::new("n", None).is_enabled(),
            io::stderr().is_terminal()
        );
    }
}

//! Progress of a whole `perf` command (all sizes), shown on stderr for long runs.

use crate::report::Progress;

/// Counts work across the sizes of one command and feeds the progress line.
#[derive(Debug)]
pub(crate) struct Tracker {
    progress: Progress,
    base: u64,
}

impl Tracker {
    /// A tracker for `total` iterations over all sizes, labelled `label`. The line appears
    /// only on a terminal and only after the first second.
    pub(crate) fn new(label: &str, total: u64) -> Self {
        Self {
            progress: Progress::new(label, Some(total)),
            base: 0,
        }
    }

    /// A tracker for a duration run of `total_ms` milliseconds: the units are milliseconds
    /// elapsed and the line shows seconds (`write_bw: 40% (2/5 s)`).
    pub(crate) fn timed(label: &str, total_ms: u64) -> Self {
        Self {
            progress: Progress::timed(label, total_ms),
            base: 0,
        }
    }

    /// `done` units of the current size are finished.
    #[inline]
    pub(crate) fn update(&mut self, done: u64) {
        if self.progress.is_enabled() {
            self.progress.update(self.base + done);
        }
    }

    /// The current size is finished after `done` units.
    pub(crate) fn next_size(&mut self, done: u64) {
        self.base += done;
        self.update(0);
    }

    /// Erases the progress line (before the result row is printed).
    pub(crate) fn clear(&mut self) {
        self.progress.finish();
    }
}

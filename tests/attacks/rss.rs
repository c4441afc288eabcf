//! The process's resident memory, as the kernel counts it (`/proc/self/status`), so that an
//! attack's cost is a number: the peak growth while it ran and what is still held after.
//! The peak is reset at the start of a measurement (`/proc/self/clear_refs`, value 5, Linux
//! 4.0 and later). The suite's tests run one at a time (see `turn`), so a growth is the
//! attack's own.

#![allow(dead_code)]

use std::sync::{Mutex, MutexGuard};

static SUITE: Mutex<()> = Mutex::new(());

/// The suite's tests take turns: each one's memory figures and its use of both cores are its
/// own.
pub fn turn() -> MutexGuard<'static, ()> {
    SUITE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// One measurement, from [`Rss::start`].
#[derive(Debug)]
pub struct Rss {
    base_kib: u64,
}

impl Rss {
    /// Resets the peak and takes the current resident size as the base.
    pub fn start() -> Self {
        std::fs::write("/proc/self/clear_refs", "5")
            .expect("resetting the peak RSS through /proc/self/clear_refs (Linux 4.0+)");
        Self {
            base_kib: status_kib("VmRSS:"),
        }
    }

    /// Highest resident size since the start, above the base, in MiB.
    pub fn peak_growth_mib(&self) -> f64 {
        status_kib("VmHWM:").saturating_sub(self.base_kib) as f64 / 1024.0
    }

    /// Resident size now, above the base, in MiB.
    pub fn held_growth_mib(&self) -> f64 {
        status_kib("VmRSS:").saturating_sub(self.base_kib) as f64 / 1024.0
    }

    /// Asserts the peak growth stays within `bound_mib` and prints both figures (the suite's
    /// record of what each attack costs).
    pub fn check(&self, attack: &str, bound_mib: f64) {
        let (peak, held) = (self.peak_growth_mib(), self.held_growth_mib());
        println!("{attack}: peak RSS growth {peak:.1} MiB, held after {held:.1} MiB");
        assert!(
            peak <= bound_mib,
            "{attack}: the victim grew by {peak:.1} MiB at its peak (bound {bound_mib} MiB)"
        );
    }
}

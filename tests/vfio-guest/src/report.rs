//! The protocol between the guest and the host: one line per check, then a summary line, on
//! the guest's serial console; and the host's verdict on a captured console log.
//!
//! ```text
//! VFIO-CHECK PASS edu_ident 0x010000ed
//! VFIO-CHECK FAIL nvme_identify no MSI-X within 5s
//! VFIO-SUMMARY passed=19 failed=1
//! ```
//!
//! The host fails the run when a check in [`EXPECTED`] is missing or failed, or when the
//! summary is missing (the guest crashed or QEMU was killed by the timeout). Kernel messages
//! may share the console, so a marker is searched for anywhere in a line.

use std::collections::BTreeMap;
use std::error::Error;

/// Start of a check line.
pub(crate) const CHECK: &str = "VFIO-CHECK ";
/// Start of the summary line.
pub(crate) const SUMMARY: &str = "VFIO-SUMMARY ";

/// Every check the guest must report as passed, in the order it runs them.
pub(crate) const EXPECTED: &[&str] = &[
    "scan",
    "edu_open",
    "edu_config",
    "edu_bar",
    "edu_ident",
    "edu_liveness",
    "edu_factorial",
    "edu_msi_eventfd",
    "edu_dma_to_device",
    "edu_dma_from_device",
    "edu_dma_into_app_memory",
    "edu_dma_after_unmap_blocked",
    "edu_reset",
    "edu_memlock_limit",
    "edu_teardown_reopen",
    "nvme_open",
    "nvme_config",
    "nvme_bar",
    "nvme_msix_route",
    "nvme_enable",
    "nvme_identify_msix_eventfd",
    "nvme_identify_data",
    "nvme_reset",
    "nvme_teardown_reopen",
    "edu_surprise_removal",
];

/// What a check returns: a detail line, or why it failed.
pub(crate) type Outcome<T> = Result<(String, T), Box<dyn Error>>;

/// The guest side: prints check lines and counts them.
#[derive(Debug, Default)]
pub(crate) struct Report {
    passed: u32,
    failed: u32,
}

impl Report {
    /// Runs one check and prints its line; returns its value when it passed.
    pub(crate) fn step<T>(&mut self, name: &str, f: impl FnOnce() -> Outcome<T>) -> Option<T> {
        match f() {
            Ok((detail, value)) => {
                self.passed += 1;
                println!("{CHECK}PASS {name} {detail}");
                Some(value)
            }
            Err(err) => {
                self.failed += 1;
                println!("{CHECK}FAIL {name} {err}");
                None
            }
        }
    }

    /// Reports checks that could not run because an earlier one failed.
    pub(crate) fn skip(&mut self, names: &[&str], why: &str) {
        for name in names {
            self.failed += 1;
            println!("{CHECK}FAIL {name} not run: {why}");
        }
    }

    /// Prints the summary line; true when nothing failed.
    pub(crate) fn finish(&self, elapsed_ms: u128) -> bool {
        println!(
            "{SUMMARY}passed={} failed={} elapsed_ms={elapsed_ms}",
            self.passed, self.failed
        );
        self.failed == 0
    }
}

/// The host's reading of a console log.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Check name → (passed, detail). Of several reports of one check the first counts,
    /// unless a later one is a FAIL: a failure is never overwritten.
    pub(crate) checks: BTreeMap<String, (bool, String)>,
    /// The summary line was seen.
    pub(crate) finished: bool,
    /// What is wrong, one line each; empty when the run passed.
    pub(crate) problems: Vec<String>,
}

/// Reads a console log.
pub(crate) fn verify(log: &str) -> Verdict {
    let mut checks: BTreeMap<String, (bool, String)> = BTreeMap::new();
    let mut finished = false;
    for line in log.lines() {
        let line = line.trim_end_matches('\r');
        if let Some(at) = line.find(CHECK) {
            let rest = &line[at + CHECK.len()..];
            let mut parts = rest.splitn(3, ' ');
            let (status, name, detail) = (
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
                parts.next().unwrap_or(""),
            );
            let passed = match status {
                "PASS" => true,
                "FAIL" => false,
                _ => continue,
            };
            if name.is_empty() {
                continue;
            }
            let entry = checks
                .entry(name.to_string())
                .or_insert((passed, detail.to_string()));
            if !passed {
                *entry = (false, detail.to_string());
            }
        } else if line.contains(SUMMARY) {
            finished = true;
        }
    }
    let mut problems = Vec::new();
    for name in EXPECTED {
        match checks.get(*name) {
            None => problems.push(format!("{name}: missing")),
            Some((false, detail)) => problems.push(format!("{name}: FAIL {detail}")),
            Some((true, _)) => {}
        }
    }
    for (name, (passed, detail)) in &checks {
        if !passed && !EXPECTED.contains(&name.as_str()) {
            problems.push(format!("{name}: FAIL {detail}"));
        }
    }
    if !finished {
        problems
            .push("no summary line: the guest did not finish (crash, hang or timeout)".to_string());
    }
    Verdict {
        checks,
        finished,
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full_pass() -> String {
        let mut log = String::from("[    0.000000] Linux version 6.1.0\n");
        for name in EXPECTED {
            log.push_str(&format!("{CHECK}PASS {name} fine\n"));
        }
        log.push_str(&format!("{SUMMARY}passed={} failed=0\n", EXPECTED.len()));
        log
    }

    #[test]
    fn a_complete_passing_log_passes() {
        let v = verify(&full_pass());
        assert!(v.problems.is_empty(), "{:?}", v.problems);
        assert!(v.finished);
        assert_eq!(v.checks.len(), EXPECTED.len());
    }

    #[test]
    fn a_failed_check_fails_the_run() {
        let log = full_pass().replace(
            "VFIO-CHECK PASS edu_dma_after_unmap_blocked fine",
            "VFIO-CHECK FAIL edu_dma_after_unmap_blocked the write landed",
        );
        let v = verify(&log);
        assert_eq!(
            v.problems,
            ["edu_dma_after_unmap_blocked: FAIL the write landed"]
        );
    }

    #[test]
    fn a_missing_check_or_summary_fails_the_run() {
        let log = full_pass().replace("VFIO-CHECK PASS nvme_bar fine\n", "");
        assert_eq!(verify(&log).problems, ["nvme_bar: missing"]);
        let cut: String = full_pass()
            .lines()
            .take(5)
            .map(|l| format!("{l}\n"))
            .collect();
        let v = verify(&cut);
        assert!(!v.finished);
        assert!(v.problems.iter().any(|p| p.contains("did not finish")));
        assert!(
            v.problems
                .iter()
                .any(|p| p == "nvme_identify_data: missing")
        );
        assert!(!verify("").problems.is_empty());
    }

    #[test]
    fn markers_are_found_behind_kernel_noise_and_a_fail_is_sticky() {
        let log = full_pass()
            .replace(
                "VFIO-CHECK PASS edu_ident fine",
                "[    2.1] DMAR: fault VFIO-CHECK PASS edu_ident fine\r",
            )
            .replace(
                "VFIO-CHECK PASS edu_bar fine",
                "VFIO-CHECK FAIL edu_bar bad\nVFIO-CHECK PASS edu_bar retried",
            );
        let v = verify(&log);
        assert_eq!(v.checks["edu_ident"], (true, "fine".to_string()));
        assert_eq!(v.problems, ["edu_bar: FAIL bad"]);
    }

    #[test]
    fn unknown_failed_checks_count_and_garbage_is_ignored() {
        let log = full_pass()
            + "VFIO-CHECK FAIL extra_check broke\nVFIO-CHECK MAYBE x y\nVFIO-CHECK PASS\n";
        assert_eq!(verify(&log).problems, ["extra_check: FAIL broke"]);
    }
}

//! The QEMU guest test of portverbs-vfio.
//!
//! ```text
//! vfio-guest run [--serial SN]   in the guest: find edu and nvme with portverbs_vfio::scan,
//!                                drive them, print one VFIO-CHECK line per check and a summary
//!                                (the last check removes edu from the guest's PCI bus)
//! vfio-guest verify LOG          on the host: read the guest's console log, print a table,
//!                                exit 1 on any failed or missing check or a missing summary
//! ```
//!
//! `tests/vfio-guest/run.sh` builds this binary statically, boots it in a QEMU guest with both
//! devices bound to vfio-pci, and calls `verify` on the console log. Running `run` anywhere
//! else finds no devices and fails, as it should: this test never passes without a guest.

#[cfg(target_os = "linux")]
mod edu;
#[cfg(target_os = "linux")]
mod memlock;
#[cfg(target_os = "linux")]
mod nvme;
#[cfg(target_os = "linux")]
mod report;
#[cfg(target_os = "linux")]
mod wait;

#[cfg(target_os = "linux")]
fn main() -> std::process::ExitCode {
    use std::process::ExitCode;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let ok = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["run"] => guest::run("vfiotest01"),
        ["run", "--serial", sn] => guest::run(sn),
        ["verify", log] => host::verify(log),
        ["memlock-probe", addr] => memlock::probe(addr),
        _ => {
            eprintln!("usage: vfio-guest run [--serial SN] | vfio-guest verify CONSOLE_LOG");
            false
        }
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(not(target_os = "linux"))]
fn main() -> std::process::ExitCode {
    eprintln!("vfio-guest: VFIO is Linux-only");
    std::process::ExitCode::FAILURE
}

#[cfg(target_os = "linux")]
mod guest {
    use std::time::Instant;

    use portverbs_vfio::PciFunction;

    use crate::report::Report;
    use crate::{edu, nvme};

    const EDU: (u16, u16) = (0x1234, 0x11e8);
    const NVME: (u16, u16) = (0x1b36, 0x0010);

    pub(crate) fn run(serial: &str) -> bool {
        let start = Instant::now();
        let mut r = Report::default();
        println!("VFIO-BEGIN portverbs-vfio guest test");
        let found = r.step("scan", || {
            let bound = portverbs_vfio::scan(None);
            let find = |ids: (u16, u16)| -> Option<PciFunction> {
                bound.iter().find(|f| (f.vendor, f.device) == ids).cloned()
            };
            let (Some(e), Some(n)) = (find(EDU), find(NVME)) else {
                return Err(format!("vfio-pci functions: {bound:?}; want edu and nvme").into());
            };
            let desc = |f: &PciFunction| {
                let group = f.iommu_group.map_or("none".to_string(), |g| g.to_string());
                format!(
                    "{} {:04x}:{:04x} group {group} driver vfio-pci",
                    f.address, f.vendor, f.device
                )
            };
            Ok((format!("{}; {}", desc(&e), desc(&n)), (e, n)))
        });
        match found {
            Some((e, n)) => {
                edu::run(&mut r, &e.address);
                nvme::run(&mut r, &n.address, serial);
                // Last: it removes edu from the guest.
                edu::surprise_removal(&mut r, &e.address);
            }
            None => {
                let rest: Vec<&str> = crate::report::EXPECTED[1..].to_vec();
                r.skip(&rest, "scan found no devices");
            }
        }
        r.finish(start.elapsed().as_millis())
    }
}

#[cfg(target_os = "linux")]
mod host {
    use crate::report::{EXPECTED, verify as read_log};

    pub(crate) fn verify(path: &str) -> bool {
        let log = match std::fs::read(path) {
            Ok(b) => String::from_utf8_lossy(&b).into_owned(),
            Err(e) => {
                eprintln!("vfio-guest verify: cannot read {path}: {e}");
                return false;
            }
        };
        let v = read_log(&log);
        for name in EXPECTED {
            let (status, detail) = match v.checks.get(*name) {
                Some((true, d)) => ("PASS", d.as_str()),
                Some((false, d)) => ("FAIL", d.as_str()),
                None => ("MISSING", ""),
            };
            println!("{status:<7} {name:<30} {detail}");
        }
        if v.problems.is_empty() {
            println!("all {} checks passed", EXPECTED.len());
            true
        } else {
            eprintln!("VFIO guest test FAILED:");
            for p in &v.problems {
                eprintln!("  {p}");
            }
            false
        }
    }
}

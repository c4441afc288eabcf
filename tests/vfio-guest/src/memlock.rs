//! The locked-memory limit, for real: a child process of this binary, running as an
//! unprivileged user (no `CAP_IPC_LOCK`) with `RLIMIT_MEMLOCK` at 64 KiB, opens the device, maps
//! a small DMA region (which must work) and then a 1 MiB one, which must fail with
//! `VfioError::MemlockLimit` and a message that says which limit to raise.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use portverbs_vfio::{VfioDevice, VfioError};
use rustix::process::{Resource, Rlimit, setrlimit};

use crate::report::Outcome;

/// The unprivileged user the probe runs as.
const UID: u32 = 1000;
const LIMIT: u64 = 64 << 10;
const OK: &str = "MEMLOCK-OK ";

/// Parent side: opens the group to the probe user, runs the probe, restores the mode.
pub(crate) fn check(addr: &str, group: u32) -> Outcome<()> {
    let node = format!("/dev/vfio/{group}");
    let old = fs::metadata(&node)?.permissions();
    fs::set_permissions(&node, fs::Permissions::from_mode(0o666))?;
    let out = Command::new(std::env::current_exe()?)
        .args(["memlock-probe", addr])
        .uid(UID)
        .gid(UID)
        .output();
    fs::set_permissions(&node, old)?;
    let out = out?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().find_map(|l| l.strip_prefix(OK)) {
        Some(detail) if out.status.success() => Ok((detail.to_string(), ())),
        _ => Err(format!(
            "probe as uid {UID} ({}): {} {}",
            out.status,
            stdout.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
        .into()),
    }
}

/// Child side (`vfio-guest memlock-probe ADDR`), already running as the probe user.
pub(crate) fn probe(addr: &str) -> bool {
    match run_probe(addr) {
        Ok(detail) => {
            println!("{OK}{detail}");
            true
        }
        Err(e) => {
            println!("MEMLOCK-FAIL {e}");
            false
        }
    }
}

fn run_probe(addr: &str) -> Result<String, Box<dyn std::error::Error>> {
    setrlimit(
        Resource::Memlock,
        Rlimit {
            current: Some(LIMIT),
            maximum: Some(LIMIT),
        },
    )?;
    let dev = VfioDevice::open(addr)?;
    let small = dev.alloc_vfio_dma(4096)?;
    match dev.alloc_vfio_dma(1 << 20) {
        Err(e @ VfioError::MemlockLimit { .. }) => {
            let msg = e.to_string();
            if !msg.contains("raise RLIMIT_MEMLOCK") || !msg.contains(addr) {
                return Err(format!("unhelpful message: {msg}").into());
            }
            drop(small);
            Ok(format!(
                "as uid {UID} with a {LIMIT}-byte limit: 4 KiB mapped, 1 MiB refused: {msg}"
            ))
        }
        Ok(_) => Err("1 MiB was mapped despite the 64 KiB limit".into()),
        Err(e) => Err(format!("1 MiB failed with another error: {e}").into()),
    }
}

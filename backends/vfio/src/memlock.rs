//! The locked-memory limit. `VFIO_IOMMU_MAP_DMA` pins every page it maps and charges it to the
//! process's locked memory (`VmLck` in `/proc/self/status`), which `RLIMIT_MEMLOCK` bounds unless
//! the process has `CAP_IPC_LOCK`. The kernel's answer to a mapping over the limit is a bare
//! `ENOMEM`; this module checks first, so the user reads which limit to raise and to what.

use std::fs;

/// `CAP_IPC_LOCK` (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

/// What limits the pinning of DMA memory for this process right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Memlock {
    /// Soft `RLIMIT_MEMLOCK` in bytes, `None` for unlimited.
    pub(crate) limit: Option<u64>,
    /// Bytes already locked (`VmLck`).
    pub(crate) locked: u64,
    /// The process has `CAP_IPC_LOCK`, which lifts the limit for VFIO.
    pub(crate) cap_ipc_lock: bool,
}

/// A mapping that the limit does not leave room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shortfall {
    pub(crate) limit: u64,
    pub(crate) locked: u64,
}

impl Memlock {
    /// Reads the limit, `VmLck` and the effective capabilities of this process. Anything that
    /// cannot be read counts as "no limit known", so the kernel's own check decides.
    pub(crate) fn current() -> Self {
        let limit = rustix::process::getrlimit(rustix::process::Resource::Memlock).current;
        let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
        Self::from_parts(limit, &status)
    }

    /// Combines a soft limit with the text of `/proc/<pid>/status`.
    pub(crate) fn from_parts(limit: Option<u64>, status: &str) -> Self {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
        };
        let locked = field("VmLck:")
            .and_then(|v| v.strip_suffix("kB"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(0, |kib| kib.saturating_mul(1024));
        let cap_ipc_lock = field("CapEff:")
            .and_then(|v| u64::from_str_radix(v, 16).ok())
            .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0);
        Self {
            limit,
            locked,
            cap_ipc_lock,
        }
    }

    /// Whether `len` more bytes may be pinned.
    pub(crate) fn check(&self, len: u64) -> Result<(), Shortfall> {
        match self.limit {
            Some(limit) if !self.cap_ipc_lock && self.locked.saturating_add(len) > limit => {
                Err(Shortfall {
                    limit,
                    locked: self.locked,
                })
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tdemo\nVmLck:\t      12 kB\nVmPin:\t       0 kB\n\
                          CapInh:\t0000000000000000\nCapEff:\t0000000000000000\n";

    #[test]
    fn parses_locked_memory_and_capabilities() {
        let m = Memlock::from_parts(Some(65536), STATUS);
        assert_eq!(m.locked, 12 * 1024);
        assert!(!m.cap_ipc_lock);
        let root = STATUS.replace("CapEff:\t0000000000000000", "CapEff:\t000001ffffffffff");
        assert!(Memlock::from_parts(Some(65536), &root).cap_ipc_lock);
        let only_ipc_lock =
            STATUS.replace("CapEff:\t0000000000000000", "CapEff:\t0000000000004000");
        assert!(Memlock::from_parts(None, &only_ipc_lock).cap_ipc_lock);
    }

    #[test]
    fn the_limit_counts_what_is_locked_already() {
        let m = Memlock::from_parts(Some(64 * 1024), STATUS);
        assert_eq!(m.check(52 * 1024), Ok(()));
        assert_eq!(
            m.check(52 * 1024 + 1),
            Err(Shortfall {
                limit: 64 * 1024,
                locked: 12 * 1024
            })
        );
    }

    #[test]
    fn unlimited_capable_or_unknown_never_refuses() {
        assert_eq!(Memlock::from_parts(None, STATUS).check(u64::MAX), Ok(()));
        let root = STATUS.replace("CapEff:\t0000000000000000", "CapEff:\t0000000000004000");
        assert_eq!(Memlock::from_parts(Some(0), &root).check(1 << 40), Ok(()));
        // An unreadable status: nothing locked, no capability known; the limit still applies.
        assert!(Memlock::from_parts(Some(4096), "").check(8192).is_err());
    }

    #[test]
    fn reads_this_process() {
        let m = Memlock::current();
        // Whatever the machine, the reading must be self-consistent.
        if let Some(limit) = m.limit {
            assert!(m.check(0).is_ok() || m.locked > limit);
        }
    }
}

//! The path vfio-ioctls gets instead of the function's sysfs entry, so that surprise removal
//! cannot make its `Drop` panic.
//!
//! ## Why
//! vfio-ioctls 0.10 keeps the path given to `VfioDevice::new` and uses it for exactly two
//! things, both when opening and again in its `Drop`:
//! * the path's last component is the device name handed to `VFIO_GROUP_GET_DEVICE_FD`;
//! * the target of the symlink `<path>/iommu_group` is read (not followed) and its last
//!   component parsed as the IOMMU group number.
//!
//! Its `Drop` first closes the device fd and then reads that link again, `unwrap`ping the
//! result. Given the sysfs entry `/sys/bus/pci/devices/<address>`, that read races with
//! surprise removal: the kernel's vfio-pci remove path waits until userspace closes the device
//! fd and then deletes the entry, so the read can find nothing and the process panics.
//!
//! ## What
//! An [`Anchor`] is a directory this process makes for itself (`mkdtemp` under
//! [`std::env::temp_dir`], mode 0700) holding `<address>/iommu_group` →
//! `/sys/kernel/iommu_groups/<N>`: the same name and the same group that vfio-ioctls would have
//! derived from sysfs ([`vfio_ioctls_view`]), in a place nobody else can change and the kernel
//! never removes. vfio-ioctls gets `<anchor>/<address>`; the link target is never followed, so it
//! does not matter that the group's sysfs directory disappears with the function.
//!
//! [`Anchored`] owns the vfio-ioctls device together with its anchor and drops the device
//! first, then the anchor. Before letting the device go it checks that the link still reads back
//! (second line of defence: a user or a cleaner may have deleted the directory; while it lives,
//! a shared BSD lock on it keeps systemd-tmpfiles' ageing away). A damaged anchor is recreated
//! in place if that can be done safely; if not, the device is leaked (with its group and
//! container, and a warning) rather than handed to a `Drop` that would panic.
//!
//! The rest of vfio-ioctls' `Drop` cannot panic here either: the group it looks up by that
//! number is still in its container's table (one device per container, see `device`), so the
//! lookup does not open `/dev/vfio/<N>` again, and detaching a group the kernel already
//! detached only logs.

use std::ffi::OsStr;
use std::fmt;
use std::fs::{self, DirBuilder};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{FlockOperation, Mode, OFlags};
use vmm_sys_util::tempdir::TempDir;

/// How the anchor directories in the temporary directory are named (`mkdtemp` appends six
/// characters).
pub(crate) const PREFIX: &str = "portverbs-vfio-anchor-";

/// Where the anchor's `iommu_group` link points (only the last component matters).
const IOMMU_GROUPS: &str = "/sys/kernel/iommu_groups";

/// What vfio-ioctls 0.10 derives from the path given to `VfioDevice::new`, computed the way it
/// does: the device name is the path's last component, the IOMMU group the last component of
/// the target of `<path>/iommu_group` (read with `read_link`, not followed), parsed as a number.
///
/// # Errors
/// What vfio-ioctls would turn into `InvalidPath` (when opening) or a panic (in its `Drop`).
pub(crate) fn vfio_ioctls_view(path: &Path) -> io::Result<(String, u32)> {
    let name = path
        .file_name()
        .and_then(OsStr::to_str)
        .ok_or_else(|| invalid(format!("{} has no device name", path.display())))?;
    let link = path.join("iommu_group");
    let target = fs::read_link(&link)?;
    let group = target
        .file_name()
        .and_then(OsStr::to_str)
        .and_then(|g| g.parse().ok())
        .ok_or_else(|| {
            invalid(format!(
                "{} points to {}, which names no IOMMU group",
                link.display(),
                target.display()
            ))
        })?;
    Ok((name.to_string(), group))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// A private directory that tells vfio-ioctls a function's name and IOMMU group. Removed with
/// everything in it when dropped.
#[derive(Debug)]
pub(crate) struct Anchor {
    /// `<temp>/portverbs-vfio-anchor-XXXXXX`, made by `mkdtemp` (mode 0700).
    dir: TempDir,
    /// A shared `flock` on `dir` while it lives: systemd-tmpfiles does not age a locked
    /// directory. Best effort (`None` when the lock could not be taken).
    _lock: Option<OwnedFd>,
    /// `dir/<name>`: what vfio-ioctls gets.
    path: PathBuf,
    /// The device name (the PCI address).
    name: String,
    /// The IOMMU group.
    group: u32,
}

/// What must happen before vfio-ioctls' `Drop` may read the anchor ([`Anchor::before_release`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Teardown {
    /// The link reads back as at open: release the device.
    Intact,
    /// The link did not read back (`damage`) and was recreated: release the device.
    Repaired {
        /// What was wrong.
        damage: String,
    },
    /// The link did not read back and could not be recreated: vfio-ioctls' `Drop` would panic,
    /// so the device must be leaked.
    Leak {
        /// What was wrong.
        damage: String,
        /// Why recreating it failed.
        repair: String,
    },
}

impl Anchor {
    /// An anchor in [`std::env::temp_dir`] for the function whose sysfs entry is `sysfs_path`,
    /// in IOMMU group `group`.
    ///
    /// # Errors
    /// The temporary directory is not writable, or `sysfs_path` has no UTF-8 last component.
    pub(crate) fn create(sysfs_path: &Path, group: u32) -> io::Result<Self> {
        // Absolute, so that a change of the working directory cannot break the anchor.
        let parent = std::path::absolute(std::env::temp_dir())?;
        Self::create_in(&parent, sysfs_path, group)
    }

    /// [`Anchor::create`] in another directory (tests).
    pub(crate) fn create_in(parent: &Path, sysfs_path: &Path, group: u32) -> io::Result<Self> {
        let name = sysfs_path
            .file_name()
            .and_then(OsStr::to_str)
            .ok_or_else(|| invalid(format!("{} has no device name", sysfs_path.display())))?
            .to_string();
        // The prefix comes from a path, which cannot hold a NUL byte, so `new_with_prefix`'s
        // CString conversion cannot fail.
        let dir = TempDir::new_with_prefix(parent.join(PREFIX)).map_err(io::Error::from)?;
        let path = dir.as_path().join(&name);
        let anchor = Self {
            _lock: lock_shared(dir.as_path()),
            dir,
            path,
            name,
            group,
        };
        anchor.build()?;
        anchor.check()?;
        Ok(anchor)
    }

    /// The path to give vfio-ioctls: `<anchor>/<address>`.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The anchor directory (removed on drop).
    #[cfg(test)]
    pub(crate) fn dir(&self) -> &Path {
        self.dir.as_path()
    }

    /// Makes what is missing: the anchor directory, `<name>` in it, the `iommu_group` link
    /// (replaced when present). Refuses directories that are not this user's alone, so that a
    /// directory someone else planted at the anchor's path is never used.
    fn build(&self) -> io::Result<()> {
        private_dir(self.dir.as_path())?;
        private_dir(&self.path)?;
        let link = self.path.join("iommu_group");
        match fs::remove_file(&link) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        symlink(Path::new(IOMMU_GROUPS).join(self.group.to_string()), &link)
    }

    /// True (`Ok`) when vfio-ioctls reads the name and group of the open from the anchor.
    fn check(&self) -> io::Result<()> {
        let (name, group) = vfio_ioctls_view(&self.path)?;
        if (name.as_str(), group) == (self.name.as_str(), self.group) {
            Ok(())
        } else {
            Err(invalid(format!(
                "{} now names device {name} in group {group}, not {} in group {}",
                self.path.display(),
                self.name,
                self.group
            )))
        }
    }

    /// Checks the anchor before vfio-ioctls' `Drop` reads it, and repairs it if it can.
    pub(crate) fn before_release(&self) -> Teardown {
        let Err(damage) = self.check() else {
            return Teardown::Intact;
        };
        match self.build().and_then(|()| self.check()) {
            Ok(()) => Teardown::Repaired {
                damage: damage.to_string(),
            },
            Err(e) => Teardown::Leak {
                damage: damage.to_string(),
                repair: e.to_string(),
            },
        }
    }
}

/// Makes `dir` with mode 0700 unless it exists; then it must be a directory (not a symlink)
/// owned by this user and closed to everyone else.
fn private_dir(dir: &Path) -> io::Result<()> {
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = fs::symlink_metadata(dir)?;
    let uid = rustix::process::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a directory private to uid {uid} (type {:?}, owner {}, mode {:o})",
                dir.display(),
                meta.file_type(),
                meta.uid(),
                meta.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

fn lock_shared(dir: &Path) -> Option<OwnedFd> {
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockShared) {
        Ok(()) => Some(fd),
        Err(err) => {
            tracing::debug!(dir = %dir.display(), %err, "cannot lock the VFIO anchor");
            None
        }
    }
}

/// A vfio-ioctls device (`T`) opened through an [`Anchor`], which it outlives only if it must
/// be leaked. Dereferences to the device.
pub(crate) struct Anchored<T> {
    /// Declared before `anchor`: the device goes first. An `Arc` only so that `Drop` can leak
    /// it without `unsafe`, by forgetting a second strong reference.
    dev: Arc<T>,
    anchor: Anchor,
}

impl<T> Anchored<T> {
    /// Ties `dev`, opened with `anchor.path()`, to its anchor.
    pub(crate) fn new(dev: T, anchor: Anchor) -> Self {
        Self {
            dev: Arc::new(dev),
            anchor,
        }
    }

    /// The anchor.
    pub(crate) fn anchor(&self) -> &Anchor {
        &self.anchor
    }
}

impl<T> std::ops::Deref for Anchored<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.dev
    }
}

impl<T> fmt::Debug for Anchored<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Anchored")
            .field("anchor", &self.anchor.path)
            .finish_non_exhaustive()
    }
}

impl<T> Drop for Anchored<T> {
    fn drop(&mut self) {
        let a = &self.anchor;
        match a.before_release() {
            Teardown::Intact => {}
            Teardown::Repaired { damage } => tracing::warn!(
                addr = %a.name, anchor = %a.path.display(), %damage,
                "teardown: the path vfio-ioctls reads at close was damaged; recreated it"
            ),
            Teardown::Leak { damage, repair } => {
                tracing::warn!(
                    addr = %a.name, anchor = %a.path.display(), %damage, %repair,
                    "teardown: the path vfio-ioctls reads at close is gone and cannot be \
                     recreated, and vfio-ioctls would panic without it; leaking the device fd, \
                     its group and container instead (they stay open until the process exits, and \
                     a pending removal of the function waits until then)"
                );
                std::mem::forget(Arc::clone(&self.dev));
            }
        }
        // Now the fields: `dev` (vfio-ioctls' `Drop`, unless leaked), then `anchor`.
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Mutex;

    use super::*;
    use crate::scan::tests::FakeSysfs;

    const ADDR: &str = "0000:3b:00.0";

    /// A fake sysfs tree with one vfio-pci function in group 12, and a parent for anchors.
    fn setup() -> (FakeSysfs, PathBuf, TempDir) {
        let s = FakeSysfs::new();
        s.add(ADDR, (0x15b3, 0x1003, 0x028000), Some(12), Some("vfio-pci"));
        let sysfs_path = s.devices().join(ADDR);
        let parent = TempDir::new_with_prefix("/tmp/portverbs-vfio-anchors-").unwrap();
        (s, sysfs_path, parent)
    }

    fn entries(dir: &Path) -> usize {
        fs::read_dir(dir).unwrap().count()
    }

    #[test]
    fn the_anchor_tells_vfio_ioctls_what_sysfs_told_it_also_after_removal() {
        let (s, sysfs_path, parent) = setup();
        let from_sysfs = vfio_ioctls_view(&sysfs_path).unwrap();
        assert_eq!(from_sysfs, (ADDR.to_string(), 12));

        let a = Anchor::create_in(parent.as_path(), &sysfs_path, 12).unwrap();
        assert_eq!(vfio_ioctls_view(a.path()).unwrap(), from_sysfs);
        assert_eq!(a.path().parent(), Some(a.dir()));
        assert!(
            a.dir()
                .file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(PREFIX)
        );
        assert_eq!(
            fs::read_link(a.path().join("iommu_group")).unwrap(),
            Path::new("/sys/kernel/iommu_groups/12")
        );
        for dir in [a.dir(), a.path()] {
            let mode = fs::symlink_metadata(dir).unwrap().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
        }

        // Surprise removal: the kernel deletes the sysfs entry. Reading it now is what made
        // vfio-ioctls' Drop panic; the anchor still answers the same.
        fs::remove_dir_all(s.devices().join(ADDR)).unwrap();
        assert!(vfio_ioctls_view(&sysfs_path).is_err());
        assert_eq!(vfio_ioctls_view(a.path()).unwrap(), from_sysfs);
        assert_eq!(a.before_release(), Teardown::Intact);
    }

    #[test]
    fn the_anchor_directory_is_removed_on_drop() {
        let (_s, sysfs_path, parent) = setup();
        let a = Anchor::create_in(parent.as_path(), &sysfs_path, 12).unwrap();
        let dir = a.dir().to_path_buf();
        assert!(dir.is_dir());
        assert_eq!(entries(parent.as_path()), 1);
        drop(a);
        assert!(!dir.exists());
        assert_eq!(entries(parent.as_path()), 0);
    }

    #[test]
    fn creation_fails_cleanly() {
        let (_s, sysfs_path, parent) = setup();
        let missing = parent.as_path().join("missing");
        let e = Anchor::create_in(&missing, &sysfs_path, 12).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let e = Anchor::create_in(parent.as_path(), Path::new("/"), 12).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert_eq!(entries(parent.as_path()), 0, "nothing left behind");
    }

    #[test]
    fn a_damaged_anchor_is_repaired_before_release() {
        let (_s, sysfs_path, parent) = setup();
        let a = Anchor::create_in(parent.as_path(), &sysfs_path, 12).unwrap();
        let want = (ADDR.to_string(), 12);

        // Deleted whole (a cleaner of /tmp, a user).
        fs::remove_dir_all(a.dir()).unwrap();
        assert!(vfio_ioctls_view(a.path()).is_err());
        assert!(matches!(a.before_release(), Teardown::Repaired { .. }));
        assert_eq!(vfio_ioctls_view(a.path()).unwrap(), want);

        // The link pointing elsewhere.
        let link = a.path().join("iommu_group");
        fs::remove_file(&link).unwrap();
        symlink("/sys/kernel/iommu_groups/13", &link).unwrap();
        match a.before_release() {
            Teardown::Repaired { damage } => assert!(damage.contains("group 13"), "{damage}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(vfio_ioctls_view(a.path()).unwrap(), want);
        assert_eq!(a.before_release(), Teardown::Intact);
    }

    #[test]
    fn an_anchor_that_cannot_be_recreated_means_leak() {
        let (_s, sysfs_path, parent) = setup();

        // Something else now sits at the anchor's path: a file.
        let a = Anchor::create_in(parent.as_path(), &sysfs_path, 12).unwrap();
        fs::remove_dir_all(a.dir()).unwrap();
        fs::write(a.dir(), "not a directory").unwrap();
        match a.before_release() {
            Teardown::Leak { damage, repair } => {
                assert!(damage.contains("Not a directory"), "{damage}");
                assert!(repair.contains("not a directory private"), "{repair}");
            }
            other => panic!("{other:?}"),
        }
        fs::remove_file(a.dir()).unwrap();

        // A directory others may write to is not used either (this holds for root too).
        let b = Anchor::create_in(parent.as_path(), &sysfs_path, 12).unwrap();
        fs::remove_dir_all(b.dir()).unwrap();
        fs::create_dir(b.dir()).unwrap();
        fs::set_permissions(b.dir(), fs::Permissions::from_mode(0o777)).unwrap();
        assert!(matches!(b.before_release(), Teardown::Leak { .. }));
        assert!(vfio_ioctls_view(b.path()).is_err(), "nothing made in it");
    }

    /// Stands in for vfio-ioctls' device: at drop it reads the anchor as vfio-ioctls' `Drop`
    /// does, and records what it read.
    struct FakeDevice {
        path: PathBuf,
        seen: Seen,
    }

    /// What each drop of a [`FakeDevice`] read.
    type Seen = Arc<Mutex<Vec<io::Result<(String, u32)>>>>;

    impl Drop for FakeDevice {
        fn drop(&mut self) {
            self.seen.lock().unwrap().push(vfio_ioctls_view(&self.path));
        }
    }

    fn anchored(parent: &Path, sysfs_path: &Path) -> (Anchored<FakeDevice>, Seen) {
        let anchor = Anchor::create_in(parent, sysfs_path, 12).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let dev = FakeDevice {
            path: anchor.path().to_path_buf(),
            seen: seen.clone(),
        };
        (Anchored::new(dev, anchor), seen)
    }

    #[test]
    fn the_device_is_dropped_before_its_anchor_and_reads_it_intact() {
        let (s, sysfs_path, parent) = setup();
        let (dev, seen) = anchored(parent.as_path(), &sysfs_path);
        assert_eq!(dev.path, dev.anchor().path(), "derefs to the device");
        fs::remove_dir_all(s.devices().join(ADDR)).unwrap();
        drop(dev);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1, "dropped once");
        assert_eq!(seen[0].as_ref().unwrap(), &(ADDR.to_string(), 12));
        assert_eq!(entries(parent.as_path()), 0, "then the anchor went");
    }

    #[test]
    fn a_deleted_anchor_is_recreated_for_the_device_drop() {
        let (_s, sysfs_path, parent) = setup();
        let (dev, seen) = anchored(parent.as_path(), &sysfs_path);
        fs::remove_dir_all(dev.anchor().dir()).unwrap();
        drop(dev);
        let seen = seen.lock().unwrap();
        assert_eq!(seen[0].as_ref().unwrap(), &(ADDR.to_string(), 12));
        assert_eq!(entries(parent.as_path()), 0);
    }

    #[test]
    fn an_unrecoverable_anchor_leaks_the_device_instead_of_dropping_it() {
        let (_s, sysfs_path, parent) = setup();
        let (dev, seen) = anchored(parent.as_path(), &sysfs_path);
        let dir = dev.anchor().dir().to_path_buf();
        fs::remove_dir_all(&dir).unwrap();
        fs::write(&dir, "in the way").unwrap();
        drop(dev);
        assert!(
            seen.lock().unwrap().is_empty(),
            "the device's Drop never ran, so it could not panic"
        );
    }
}

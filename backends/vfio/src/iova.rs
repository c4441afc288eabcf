//! The IOVA allocator: which device addresses a new DMA region gets.
//!
//! The IOMMU translates only inside the windows the kernel reports with `VFIO_IOMMU_GET_INFO`
//! (capability `VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE`); on x86 the MSI doorbell window
//! 0xfee00000..0xfeefffff is cut out of them, and the IOMMU's address width bounds the last one.
//! This allocator hands out page-aligned ranges inside those windows, first fit from the lowest
//! address, so small devices with narrow DMA masks (QEMU's `edu` decodes 28 bits) get low
//! addresses as long as the process keeps its DMA footprint small.
//!
//! Addresses below [`DEFAULT_FLOOR`] are never handed out: address 0 in particular reads as
//! "not set" to many devices and drivers, and a stray zero pointer must not hit a live mapping.

use std::collections::BTreeMap;
use std::fmt;

/// Lowest IOVA the device layer hands out (1 MiB).
pub const DEFAULT_FLOOR: u64 = 0x10_0000;

/// One window of valid IOVAs, both ends inclusive (the kernel's `vfio_iova_range`), so that a
/// window ending at `u64::MAX` can be written down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IovaRange {
    /// First valid address.
    pub start: u64,
    /// Last valid address.
    pub last: u64,
}

impl fmt::Display for IovaRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}..={:#x}", self.start, self.last)
    }
}

/// Why a free was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IovaFreeError {
    /// The address was not returned by [`IovaAllocator::alloc`], or was already freed.
    #[error("IOVA {0:#x} is not an allocated range")]
    NotAllocated(u64),
}

/// First-fit allocator of page-aligned IOVA ranges. Not synchronised: the device keeps it under
/// a lock.
#[derive(Debug, Clone)]
pub struct IovaAllocator {
    /// Free ranges by start, inclusive last address as value; disjoint and never adjacent
    /// (adjacent ranges are merged).
    free: BTreeMap<u64, u64>,
    /// Allocated ranges by start, length in bytes as value.
    used: BTreeMap<u64, u64>,
    page: u64,
}

impl IovaAllocator {
    /// An allocator over `windows`, handing out multiples of `page` (a power of two; the
    /// IOMMU's smallest page size) at addresses not below `floor`. Parts of windows that are
    /// not page-aligned are dropped.
    ///
    /// # Panics
    /// Never; a `page` that is not a power of two is rounded up to one (minimum 4 KiB).
    pub fn new(windows: &[IovaRange], page: u64, floor: u64) -> Self {
        let page = page
            .max(4096)
            .checked_next_power_of_two()
            .unwrap_or(1 << 63);
        let mut alloc = Self {
            free: BTreeMap::new(),
            used: BTreeMap::new(),
            page,
        };
        for w in windows {
            if w.last < w.start {
                continue;
            }
            let Some(start) = w.start.max(floor).checked_next_multiple_of(page) else {
                continue;
            };
            // Last address of the last whole page inside the window.
            let end_excl = (u128::from(w.last) + 1) / u128::from(page) * u128::from(page);
            if u128::from(start) >= end_excl {
                continue;
            }
            // end_excl > start >= 0, so end_excl - 1 fits in u64.
            let last = (end_excl - 1) as u64;
            alloc.insert_free(start, last);
        }
        alloc
    }

    /// The allocation unit in bytes.
    pub fn page(&self) -> u64 {
        self.page
    }

    /// Total free bytes (saturating).
    pub fn available(&self) -> u64 {
        self.free.iter().fold(0u64, |acc, (s, l)| {
            acc.saturating_add(l - s).saturating_add(1)
        })
    }

    /// `len` rounded up to whole pages; `None` on overflow. Zero-length requests take a page.
    pub fn round(&self, len: u64) -> Option<u64> {
        len.max(1).checked_next_multiple_of(self.page)
    }

    /// Allocates `len` bytes (rounded up to whole pages) and returns the first IOVA, or `None`
    /// when no free range is large enough.
    pub fn alloc(&mut self, len: u64) -> Option<u64> {
        let size = self.round(len)?;
        let (&start, &last) = self
            .free
            .iter()
            .find(|&(&s, &l)| u128::from(l) - u128::from(s) + 1 >= u128::from(size))?;
        self.free.remove(&start);
        if u128::from(start) + u128::from(size) <= u128::from(last) {
            self.free.insert(start + size, last);
        }
        self.used.insert(start, size);
        Some(start)
    }

    /// Returns the range that starts at `iova` to the free pool and gives its length.
    ///
    /// # Errors
    /// [`IovaFreeError::NotAllocated`] for an address `alloc` did not return (or a double free).
    pub fn free(&mut self, iova: u64) -> Result<u64, IovaFreeError> {
        let size = self
            .used
            .remove(&iova)
            .ok_or(IovaFreeError::NotAllocated(iova))?;
        self.insert_free(iova, iova + (size - 1));
        Ok(size)
    }

    /// Inserts a free range, merging it with its neighbours.
    fn insert_free(&mut self, mut start: u64, mut last: u64) {
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            if pl.checked_add(1) == Some(start) {
                self.free.remove(&ps);
                start = ps;
            }
        }
        if let Some(next) = last.checked_add(1) {
            if let Some(nl) = self.free.remove(&next) {
                last = nl;
            }
        }
        self.free.insert(start, last);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The windows the 6.1 kernel reports for an intel-iommu group in QEMU: everything up to
    /// the MSI window, and everything above it up to the 48-bit address width.
    fn q35_windows() -> Vec<IovaRange> {
        vec![
            IovaRange {
                start: 0,
                last: 0xfedf_ffff,
            },
            IovaRange {
                start: 0xfef0_0000,
                last: 0xffff_ffff_ffff,
            },
        ]
    }

    #[test]
    fn first_fit_from_the_floor_page_aligned() {
        let mut a = IovaAllocator::new(&q35_windows(), 4096, DEFAULT_FLOOR);
        assert_eq!(a.alloc(1), Some(0x10_0000));
        assert_eq!(a.alloc(4096), Some(0x10_1000));
        assert_eq!(a.alloc(4097), Some(0x10_2000), "rounded up to two pages");
        assert_eq!(
            a.alloc(0),
            Some(0x10_4000),
            "zero length still takes a page"
        );
    }

    #[test]
    fn never_crosses_the_msi_window() {
        let windows = q35_windows();
        let mut a = IovaAllocator::new(&windows, 4096, 0xfed0_0000);
        // 1 MiB fits below the MSI window exactly; the next MiB must come from above it.
        assert_eq!(a.alloc(0x10_0000), Some(0xfed0_0000));
        assert_eq!(a.alloc(0x10_0000), Some(0xfef0_0000));
        for iova in [0xfed0_0000u64, 0xfef0_0000] {
            assert!(windows.iter().any(|w| w.start <= iova && iova < w.last));
        }
    }

    #[test]
    fn a_request_larger_than_any_window_fails() {
        let w = [IovaRange {
            start: 0,
            last: 0xf_ffff,
        }];
        let mut a = IovaAllocator::new(&w, 4096, 0x1000);
        assert_eq!(a.available(), 0xff000);
        assert_eq!(a.alloc(0x10_0000), None);
        assert_eq!(
            a.alloc(u64::MAX),
            None,
            "rounding overflow is a failure, not a panic"
        );
        assert_eq!(a.alloc(0xff000), Some(0x1000));
        assert_eq!(a.alloc(1), None);
    }

    #[test]
    fn free_merges_neighbours_and_rejects_unknown_addresses() {
        let mut a = IovaAllocator::new(&q35_windows(), 4096, DEFAULT_FLOOR);
        let before = a.available();
        let x = a.alloc(4096).unwrap();
        let y = a.alloc(8192).unwrap();
        let z = a.alloc(4096).unwrap();
        assert_eq!(a.free(y), Ok(8192));
        assert_eq!(
            a.free(y),
            Err(IovaFreeError::NotAllocated(y)),
            "double free"
        );
        assert_eq!(a.free(y + 4096), Err(IovaFreeError::NotAllocated(y + 4096)));
        // The hole left by y is reused first (first fit).
        assert_eq!(a.alloc(4096), Some(y));
        a.free(y).unwrap();
        a.free(x).unwrap();
        a.free(z).unwrap();
        assert_eq!(a.available(), before, "everything merged back");
        assert_eq!(a.free.len(), 2, "one free range per window again");
    }

    #[test]
    fn larger_iommu_pages_and_unaligned_windows() {
        let w = [IovaRange {
            start: 0x1234,
            last: 0x40_1233,
        }];
        let mut a = IovaAllocator::new(&w, 0x20_0000, 0);
        assert_eq!(a.page(), 0x20_0000);
        // Only the 2 MiB page at 0x200000 lies wholly inside the window.
        assert_eq!(a.alloc(1), Some(0x20_0000));
        assert_eq!(a.alloc(1), None);
        // A page size that is not a power of two is rounded up.
        assert_eq!(IovaAllocator::new(&w, 5000, 0).page(), 8192);
    }

    #[test]
    fn a_window_ending_at_the_top_of_the_address_space() {
        let w = [IovaRange {
            start: u64::MAX - 0x3fff,
            last: u64::MAX,
        }];
        let mut a = IovaAllocator::new(&w, 4096, 0);
        assert_eq!(a.available(), 0x4000);
        let x = a.alloc(0x4000).unwrap();
        assert_eq!(x, u64::MAX - 0x3fff);
        assert_eq!(a.free(x), Ok(0x4000));
        assert_eq!(a.available(), 0x4000);
    }

    #[test]
    fn empty_and_inverted_windows_give_nothing() {
        let w = [IovaRange {
            start: 0x2000,
            last: 0x1000,
        }];
        let mut a = IovaAllocator::new(&w, 4096, 0);
        assert_eq!(a.available(), 0);
        assert_eq!(a.alloc(1), None);
        assert_eq!(IovaAllocator::new(&[], 4096, 0).alloc(1), None);
    }
}

//! The mlx4 formats' own raw writes into ring slots: inline-data segments and WQE stamps, the
//! one module of this crate with `unsafe` code (the workspace keeps `unsafe` in modules named
//! `mmio`/`dma`/`sys`, where a reviewer looks for it).
//!
//! Rings themselves are the workspace's one ring/slot abstraction, [`portverbs_dma::ring`]:
//! `Ring` (a [`HostMapped`] region and its raw base), `Slots<MIN>` (geometry checked once, so
//! that accesses at constant offsets need no run-time bounds check) and `Slot`, plus the
//! direction-typed counters `Producer<HostToDevice>`/`Consumer<DeviceToHost>`. Every queue of
//! the driver (EQ, CQ, SQ, RQ, SRQ) keeps its entries in a `Slots` made once when the queue is
//! created; every other part of the driver reaches DMA memory through the HAL's
//! [`DmaMemory`](portverbs_hal::DmaMemory) copies. What is here knows the mlx4 WQE layout
//! (rdma-core `providers/mlx4/qp.c`), so it stays in the driver and builds on [`Slot`]'s guarantee
//! (its bytes lie in a live region, 8-byte aligned, `len()` a power of two at least `MIN`).
//!
//! Raw access needs a promise the safe `DmaMemory` trait cannot carry, so the PCI seam hands
//! out [`HostMapped`] regions: an `unsafe` trait whose implementors (the VFIO function's
//! IOMMU-mapped memory, the emulated HCA's memory) vouch for the host mapping.
#![allow(unsafe_code)]

pub(crate) use portverbs_dma::queue::{EventRing, WorkRing};
pub(crate) use portverbs_dma::ring::{HostToDevice, Producer, Ring, Slot, Slots};

pub use portverbs_dma::HostMapped;

/// The mlx4 send-WQE writes that need raw access: inline-data segments and stamps.
pub(crate) trait WqeSlot: Copy {
    /// Writes `data` from offset `AT` as inline-data segments (see the implementation).
    fn inline_segments<const AT: usize>(self, flag: u32, data: &[u8]) -> Option<usize>;

    /// One inline segment of at most 60 bytes at `at`.
    fn segment(self, at: usize, flag: u32, piece: &[u8]) -> Option<usize>;

    /// Stores `word` at the start of every 64-byte block after the first below `size`.
    fn stamp_blocks(self, size: usize, word: [u8; 4]);
}

impl<const MIN: usize> WqeSlot for Slot<'_, MIN> {
    /// Writes `data` from offset `AT` as inline-data segments (rdma-core `providers/mlx4/qp.c`):
    /// each a big-endian header `flag | bytes` and then its bytes, none crossing a 64-byte boundary
    /// (the first fills the rest of `AT`'s block, each further one starts a block). The first
    /// segment is written even for empty data. Returns the end; `None` when the segments would
    /// leave the slot (those that fit may have been written).
    #[inline(always)]
    fn inline_segments<const AT: usize>(self, flag: u32, data: &[u8]) -> Option<usize> {
        const BLOCK: usize = 64;
        let first_room = const { BLOCK - 4 - AT % BLOCK };
        let (first, rest) = data.split_at(data.len().min(first_room));
        let mut at = self.segment(AT, flag, first)?;
        // Data that ends in the next block (a 64-byte payload after a remote-address segment)
        // needs one more segment and no loop.
        if rest.len() <= BLOCK - 4 {
            if !rest.is_empty() {
                at = self.segment(at, flag, rest)?;
            }
            return Some(at);
        }
        for piece in rest.chunks(BLOCK - 4) {
            at = self.segment(at, flag, piece)?;
        }
        Some(at)
    }

    /// One inline segment of at most 60 bytes at `at`; its end, or `None` (nothing written)
    /// past the slot's end.
    #[inline(always)]
    fn segment(self, at: usize, flag: u32, piece: &[u8]) -> Option<usize> {
        if piece.len() > 60 || at > self.len() || 4 + piece.len() > self.len() - at {
            return None;
        }
        // SAFETY: `at + 4 + piece.len() <= len`: inside the slot of a live region (the slot's guarantee); `piece` is at most 60 bytes.
        unsafe {
            let header = (flag | piece.len() as u32).to_be_bytes();
            let d = (self.addr() + at) as *mut u8;
            std::ptr::write_unaligned(d.cast::<[u8; 4]>(), header);
            copy_small(d.add(4), piece);
        }
        Some(at + 4 + piece.len())
    }

    /// Stores `word` at the start of every 64-byte block after the first below `size` (a
    /// WQE's stamp, as rdma-core writes it); blocks past the slot's end are left alone.
    #[inline(always)]
    fn stamp_blocks(self, size: usize, word: [u8; 4]) {
        const { assert!(MIN >= 64 && MIN % 64 == 0) };
        let end = size.min(self.len());
        let word = u32::from_ne_bytes(word);
        let mut b = 64;
        // A WQE of up to 128 bytes (the commonest) has one block to stamp: it is the first
        // test, before any loop set-up.
        while b < end {
            // SAFETY: `b < end <= len`, and `len` (the stride) is a multiple of 64 (a power of
            // two at least `MIN`), so `b + 4 <= len`: inside the slot of a live region, 4-byte
            // aligned. Volatile: one plain store per block, never merged or vectorised.
            unsafe { std::ptr::write_volatile((self.addr() + b) as *mut u32, word) };
            if b + 64 >= end {
                break;
            }
            b += 64;
        }
    }
}

/// Copies at most 64 bytes to `d` with overlapping fixed-size moves (no call to `memcpy`).
///
/// # Safety
/// `d..d + src.len()` is valid for writes and does not overlap `src`; `src.len() <= 64`.
#[inline(always)]
unsafe fn copy_small(d: *mut u8, src: &[u8]) {
    /// # Safety
    /// `from..from + W` is inside both buffers.
    #[inline(always)]
    unsafe fn mv<const W: usize>(s: *const u8, d: *mut u8, from: usize) {
        // SAFETY: as the caller promises.
        unsafe {
            let v = std::ptr::read_unaligned(s.add(from).cast::<[u8; W]>());
            std::ptr::write_unaligned(d.add(from).cast::<[u8; W]>(), v);
        }
    }
    let n = src.len();
    let s = src.as_ptr();
    debug_assert!(n <= 64);
    // SAFETY: every move reads inside `src` and writes inside `d..d + n` (as the caller
    // promises for `d`).
    unsafe {
        if n >= 16 {
            // Head and tail 16 bytes (and for more than 32 the two in between) cover every
            // byte, overlapping where n is not a multiple of 16.
            mv::<16>(s, d, 0);
            mv::<16>(s, d, n - 16);
            if n > 32 {
                mv::<16>(s, d, 16);
                mv::<16>(s, d, n - 32);
            }
        } else if n >= 8 {
            mv::<8>(s, d, 0);
            mv::<8>(s, d, n - 8);
        } else if n >= 4 {
            mv::<4>(s, d, 0);
            mv::<4>(s, d, n - 4);
        } else {
            for i in 0..n {
                mv::<1>(s, d, i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Arc;

    use portverbs_dma::SoftDma;
    use portverbs_dma::ring::Geometry;

    fn ring(words: usize) -> Ring {
        Ring::new(SoftDma::alloc(words * 8).unwrap() as Arc<dyn HostMapped>)
    }

    #[test]
    fn a_segment_stays_inside_its_slot() {
        let s = Slots::<32>::new(
            ring(8),
            Geometry {
                base: 32,
                shift: 5,
                cnt: 1,
            },
        )
        .unwrap();
        let slot = s.at(0);
        slot.put_at(24, [3; 8]);
        assert_eq!(slot.segment(24, 0x8000_0000, &[4, 5]), Some(30));
        assert_eq!(slot.read::<24, 8>(), [0x80, 0, 0, 2, 4, 5, 3, 3]);
        assert_eq!(slot.segment(27, 0, &[4, 5]), None, "past the slot");
        assert_eq!(
            slot.segment(28, 0, &[]),
            Some(32),
            "an empty segment's header at the slot's end fits"
        );
    }

    /// A one-slot ring of 256-byte slots filled with 0xee.
    fn slot256() -> Slots<64> {
        let s = Slots::<64>::new(
            ring(32),
            Geometry {
                base: 0,
                shift: 8,
                cnt: 1,
            },
        )
        .unwrap();
        assert!(s.write(0, 0, &[0xee; 256]));
        s
    }

    fn bytes(s: &Slots<64>) -> [u8; 256] {
        let mut out = [0u8; 256];
        assert!(s.ring().read_into(0, &mut out));
        out
    }

    #[test]
    fn segments_write_exactly_their_header_and_bytes() {
        let src: Vec<u8> = (1..=60).collect();
        for n in 0..=60 {
            for at in [0, 4, 36, 252 - n] {
                let s = slot256();
                assert_eq!(
                    s.at(0).segment(at, 0x8000_0000, &src[..n]),
                    Some(at + 4 + n),
                    "n {n} at {at}"
                );
                let out = bytes(&s);
                assert!(
                    out[..at].iter().all(|&b| b == 0xee),
                    "before, n {n} at {at}"
                );
                assert_eq!(out[at..at + 4], (0x8000_0000 | n as u32).to_be_bytes());
                assert_eq!(out[at + 4..at + 4 + n], src[..n], "n {n} at {at}");
                assert!(
                    out[at + 4 + n..].iter().all(|&b| b == 0xee),
                    "after, n {n} at {at}"
                );
            }
        }
        let s = slot256();
        let slot = s.at(0);
        assert_eq!(slot.segment(0, 0, &[0; 61]), None, "more than 60 bytes");
        assert_eq!(slot.segment(248, 0, &[0; 5]), None, "past the slot");
        assert_eq!(slot.segment(usize::MAX, 0, &[]), None, "overflowing offset");
    }

    /// Parses the inline segments from `at` to `end` back into their bytes, checking that
    /// none crosses a 64-byte boundary and each carries the flag.
    fn parse_segments(out: &[u8], mut at: usize, end: usize) -> Vec<u8> {
        let mut data = Vec::new();
        while at < end {
            let h = u32::from_be_bytes(out[at..at + 4].try_into().unwrap());
            assert_eq!(h & 0x8000_0000, 0x8000_0000, "flag at {at}");
            let n = (h & 0x7fff_ffff) as usize;
            assert!(
                at / 64 == (at + 3 + n) / 64,
                "segment at {at} of {n} crosses a block"
            );
            data.extend_from_slice(&out[at + 4..at + 4 + n]);
            at += 4 + n;
        }
        assert_eq!(at, end);
        data
    }

    #[test]
    fn inline_segments_split_at_64_byte_blocks_and_stop_at_the_slot_end() {
        let src: Vec<u8> = (0..=255).map(|i: u32| (i * 7 + 1) as u8).collect();
        for n in 0..=220 {
            let s = slot256();
            let end = s.at(0).inline_segments::<32>(0x8000_0000, &src[..n]);
            // 28 bytes fit in the first block after offset 32, then 60 per block.
            let rest = n.saturating_sub(28);
            let want = 32 + 4 + n + 4 * rest.div_ceil(60);
            if want > 256 {
                assert_eq!(end, None, "n {n}");
                continue;
            }
            assert_eq!(end, Some(want), "n {n}");
            let out = bytes(&s);
            assert_eq!(parse_segments(&out, 32, want), src[..n], "n {n}");
            assert!(out[want..].iter().all(|&b| b == 0xee), "after, n {n}");
        }
        // From a block boundary (a UD WQE's payload) the first segment takes 60 bytes.
        let s = slot256();
        assert_eq!(
            s.at(0).inline_segments::<64>(0x8000_0000, &src[..61]),
            Some(64 + 4 + 60 + 4 + 1)
        );
        assert_eq!(parse_segments(&bytes(&s), 64, 133), src[..61]);
    }

    #[test]
    fn stamps_go_to_every_block_after_the_first_inside_the_slot() {
        for size in [0, 64, 65, 128, 200, 1008] {
            let s = slot256();
            s.at(0).stamp_blocks(size, [0xff; 4]);
            let out = bytes(&s);
            for b in (0..256).step_by(64) {
                let stamped = b > 0 && b < size;
                let want = if stamped { [0xff; 4] } else { [0xee; 4] };
                assert_eq!(out[b..b + 4], want, "size {size} block {b}");
                assert!(out[b + 4..b + 64].iter().all(|&x| x == 0xee));
            }
        }
    }
}

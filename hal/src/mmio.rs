//! Access to device registers in a PCI BAR: explicit big-endian 32/64-bit accesses and
//! write-combining block copies.
//!
//! A backend implements [`Mmio`] in its own `mmio` module over a raw-pointer mapping of the BAR,
//! never a Rust reference to it: a reference is `dereferenceable`, so the compiler may load
//! through it unasked, and a load from a register is a device access. Register values are
//! passed as the value of the big-endian word, so callers never byte-swap by hand. Ordering against DMA
//! memory is the caller's job, with the helpers in [`crate::barrier`].
//!
//! [`MemRegisters`] is a plain-memory implementation for tests and for device models that want
//! to observe what a driver wrote.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU32, Ordering};

use thiserror::Error;

/// Failures of register access.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum MmioError {
    /// Outside the mapped BAR.
    #[error("register access of {width} bytes at {offset:#x} is outside a BAR of {len:#x} bytes")]
    OutOfBounds {
        /// Offset.
        offset: usize,
        /// Access width.
        width: usize,
        /// BAR length.
        len: usize,
    },
    /// Not naturally aligned.
    #[error("register access of {width} bytes at {offset:#x} is misaligned")]
    Misaligned {
        /// Offset.
        offset: usize,
        /// Access width.
        width: usize,
    },
    /// The device is gone (reads return all-ones after a surprise removal).
    #[error("device removed")]
    Removed,
}

/// A mapped register block.
pub trait Mmio: Send + Sync + Debug {
    /// Length of the mapping in bytes.
    fn len(&self) -> usize;

    /// True for an empty mapping.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads the big-endian 32-bit register at `offset` and returns its value.
    ///
    /// # Errors
    /// Out of bounds, misaligned, or the device is gone.
    fn read32(&self, offset: usize) -> Result<u32, MmioError>;

    /// Writes `value` as a big-endian 32-bit register at `offset`.
    ///
    /// # Errors
    /// Out of bounds, misaligned, or the device is gone.
    fn write32(&self, offset: usize, value: u32) -> Result<(), MmioError>;

    /// Writes `value` as one big-endian 64-bit store at `offset` (the high dword lands at
    /// `offset`, the low dword at `offset + 4`).
    ///
    /// # Errors
    /// Out of bounds, misaligned, or the device is gone.
    fn write64(&self, offset: usize, value: u64) -> Result<(), MmioError>;

    /// Copies `block` (a multiple of 8 bytes, already in device byte order) to `offset` with
    /// write-combining stores, then flushes them (BlueFlame).
    ///
    /// # Errors
    /// Out of bounds, misaligned, or the device is gone.
    fn write_wc(&self, offset: usize, block: &[u8]) -> Result<(), MmioError>;
}

/// Checks an access of `width` bytes at `offset` in a mapping of `len` bytes.
///
/// # Errors
/// [`MmioError::OutOfBounds`] or [`MmioError::Misaligned`] (alignment is checked against
/// `min(width, 8)`).
pub fn check_access(offset: usize, width: usize, len: usize) -> Result<(), MmioError> {
    if offset % width.min(8) != 0 {
        return Err(MmioError::Misaligned { offset, width });
    }
    match offset.checked_add(width) {
        Some(end) if end <= len => Ok(()),
        _ => Err(MmioError::OutOfBounds { offset, width, len }),
    }
}

/// Registers backed by ordinary memory, stored in device (big-endian) byte order. Every access is
/// an atomic operation on 32-bit words, so a model thread and a driver thread can share it.
#[derive(Debug)]
pub struct MemRegisters {
    words: Box<[AtomicU32]>,
}

impl MemRegisters {
    /// `len` bytes of zeroed registers (rounded up to whole dwords).
    pub fn new(len: usize) -> Self {
        Self {
            words: (0..len.div_ceil(4)).map(|_| AtomicU32::new(0)).collect(),
        }
    }

    /// The raw bytes at `offset` in device byte order, for tests and models.
    ///
    /// # Errors
    /// Out of bounds or not dword aligned.
    pub fn bytes(&self, offset: usize, out: &mut [u8]) -> Result<(), MmioError> {
        check_access(offset, out.len().max(4), self.len())?;
        for (i, chunk) in out.chunks_mut(4).enumerate() {
            let be = self.words[offset / 4 + i]
                .load(Ordering::Acquire)
                .to_ne_bytes();
            chunk.copy_from_slice(&be[..chunk.len()]);
        }
        Ok(())
    }
}

impl Mmio for MemRegisters {
    fn len(&self) -> usize {
        self.words.len() * 4
    }

    fn read32(&self, offset: usize) -> Result<u32, MmioError> {
        check_access(offset, 4, self.len())?;
        Ok(u32::from_be(self.words[offset / 4].load(Ordering::Acquire)))
    }

    fn write32(&self, offset: usize, value: u32) -> Result<(), MmioError> {
        check_access(offset, 4, self.len())?;
        self.words[offset / 4].store(value.to_be(), Ordering::Release);
        Ok(())
    }

    fn write64(&self, offset: usize, value: u64) -> Result<(), MmioError> {
        check_access(offset, 8, self.len())?;
        self.words[offset / 4].store(((value >> 32) as u32).to_be(), Ordering::Release);
        self.words[offset / 4 + 1].store((value as u32).to_be(), Ordering::Release);
        Ok(())
    }

    fn write_wc(&self, offset: usize, block: &[u8]) -> Result<(), MmioError> {
        check_access(offset, block.len().max(8), self.len())?;
        if block.len() % 8 != 0 {
            return Err(MmioError::Misaligned {
                offset: offset + block.len(),
                width: 8,
            });
        }
        for (i, chunk) in block.chunks_exact(4).enumerate() {
            let word = u32::from_ne_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            self.words[offset / 4 + i].store(word, Ordering::Release);
        }
        crate::barrier::wc_flush();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_are_big_endian_in_memory() {
        let regs = MemRegisters::new(64);
        regs.write32(0x14, 0x0000_4800).unwrap();
        let mut raw = [0u8; 4];
        regs.bytes(0x14, &mut raw).unwrap();
        assert_eq!(raw, [0x00, 0x00, 0x48, 0x00]);
        assert_eq!(regs.read32(0x14).unwrap(), 0x4800);
    }

    #[test]
    fn write64_puts_high_dword_first() {
        let regs = MemRegisters::new(64);
        regs.write64(0x20, 0x1200_0085_0000_0010).unwrap();
        assert_eq!(regs.read32(0x20).unwrap(), 0x1200_0085);
        assert_eq!(regs.read32(0x24).unwrap(), 0x10);
    }

    #[test]
    fn bad_accesses_are_errors() {
        let regs = MemRegisters::new(16);
        assert!(matches!(regs.read32(2), Err(MmioError::Misaligned { .. })));
        assert!(matches!(
            regs.read32(16),
            Err(MmioError::OutOfBounds { .. })
        ));
        assert!(matches!(
            regs.write64(12, 0),
            Err(MmioError::Misaligned { .. })
        ));
        assert!(regs.write_wc(0, &[0u8; 12]).is_err());
    }

    #[test]
    fn wc_block_copies_bytes_verbatim() {
        let regs = MemRegisters::new(128);
        let block: Vec<u8> = (0..64).collect();
        regs.write_wc(64, &block).unwrap();
        let mut back = [0u8; 64];
        regs.bytes(64, &mut back).unwrap();
        assert_eq!(&back[..], &block[..]);
    }
}

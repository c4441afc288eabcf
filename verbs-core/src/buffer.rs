//! Memory the device can reach. The device may write it at any moment (receives, RDMA writes,
//! READ responses), so safe code only ever copies in and out; no reference into it exists.

use std::fmt;
use std::sync::Arc;

use portverbs_hal::dma::{DmaError, DmaMemory};

/// A region of DMA-visible memory allocated by a device (see
/// [`crate::Context::alloc_buffer`]). Cheap to clone; memory regions keep it alive.
#[derive(Clone)]
pub struct Buffer {
    pub(crate) mem: Arc<dyn DmaMemory>,
    /// Identity of the context that allocated it.
    pub(crate) owner: usize,
    /// Shared by the clones of this buffer only (devices hold `mem`, never this): its count
    /// is the number of buffer handles, so an MR knows when it alone holds its memory.
    pub(crate) handles: Arc<()>,
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .finish()
    }
}

impl Buffer {
    pub(crate) fn new(mem: Arc<dyn DmaMemory>, owner: usize) -> Self {
        Self {
            mem,
            owner,
            handles: Arc::new(()),
        }
    }

    /// The device memory behind the buffer (for backends and benchmarks; it offers only
    /// copy-in/out and atomic access, never a reference).
    pub fn dma(&self) -> &Arc<dyn DmaMemory> {
        &self.mem
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len()
    }

    /// True for an empty buffer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Virtual address of byte 0 (what SGEs and remote addresses use).
    pub fn addr(&self) -> u64 {
        self.mem.host_addr()
    }

    /// Copies bytes out of the buffer.
    ///
    /// # Errors
    /// The range is outside the buffer.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), DmaError> {
        self.mem.read(offset, dst)
    }

    /// Copies bytes into the buffer.
    ///
    /// # Errors
    /// The range is outside the buffer.
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<(), DmaError> {
        self.mem.write(offset, src)
    }

    /// Fills a range with one byte value.
    ///
    /// # Errors
    /// The range is outside the buffer.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> Result<(), DmaError> {
        self.mem.fill(offset, len, byte)
    }

    /// Copies a range out into a new vector.
    ///
    /// # Errors
    /// The range is outside the buffer.
    pub fn to_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>, DmaError> {
        let mut v = vec![0; len];
        self.read(offset, &mut v)?;
        Ok(v)
    }

    /// Atomically reads the 8-byte aligned native-endian word at `offset` (the target or the
    /// result of an atomic operation).
    ///
    /// # Errors
    /// Out of range or misaligned.
    pub fn load_u64(&self, offset: usize) -> Result<u64, DmaError> {
        self.mem.load_u64(offset)
    }

    /// Atomically writes the 8-byte aligned native-endian word at `offset`.
    ///
    /// # Errors
    /// Out of range or misaligned.
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<(), DmaError> {
        self.mem.store_u64(offset, value)
    }
}

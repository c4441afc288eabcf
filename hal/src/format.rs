//! Device formats as pure functions over local byte buffers.
//!
//! A backend describes its WQE, CQE and EQE layouts by implementing these traits. They never see
//! DMA memory: an encoder fills a local buffer that the queue object then copies into the ring
//! (ownership word last), and a decoder reads a local copy of an entry that the queue object took
//! after checking the owner bit. That keeps the formats testable against byte arrays and
//! fuzzable, and keeps every raw memory access inside the backend's `dma` module.
//!
//! Decoders must treat their input as hostile: any byte pattern yields either a value or an
//! error, never a panic.

use crate::error::{CqeError, EqeError, WqeError};
use crate::event::DeviceEvent;
use crate::types::QpType;
use crate::wc::Cqe;
use crate::wr::{SendWr, Sge};

/// Per-WQE facts an encoder needs besides the work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeContext {
    /// Transport of the queue pair.
    pub qp_type: QpType,
    /// QP number.
    pub qpn: u32,
    /// Producer counter of this WQE.
    pub counter: u32,
    /// Owner bit to write (wrap parity of `counter`).
    pub owner: bool,
    /// Whether the WQE must generate a completion on success.
    pub signaled: bool,
}

/// A send-queue WQE layout.
pub trait SendWqeFormat {
    /// Encodes `wr` into `out` (one ring slot) and returns the number of bytes used. The entry
    /// is complete, including its ownership word.
    ///
    /// # Errors
    /// The request does not fit the slot or has no encoding on this queue.
    fn encode_send(
        &self,
        wr: &SendWr<'_>,
        ctx: &EncodeContext,
        out: &mut [u8],
    ) -> Result<usize, WqeError>;
}

/// A receive-queue WQE layout.
pub trait RecvWqeFormat {
    /// Encodes a receive scatter list into `out` and returns the number of bytes used.
    ///
    /// # Errors
    /// Too many entries for the slot.
    fn encode_recv(&self, sges: &[Sge], out: &mut [u8]) -> Result<usize, WqeError>;
}

/// A CQE layout.
pub trait CqeFormat {
    /// Size of one entry in bytes.
    const ENTRY_SIZE: usize;

    /// The owner bit of a raw entry (`entry.len() == ENTRY_SIZE`).
    fn owner_bit(entry: &[u8]) -> bool;

    /// Decodes a raw entry whose ownership was already checked. `cqn` and `index` only label
    /// errors.
    ///
    /// # Errors
    /// Contents that make no sense ([`CqeError`]).
    fn decode(entry: &[u8], cqn: u32, index: u32) -> Result<Cqe, CqeError>;
}

/// An EQE layout.
pub trait EqeFormat {
    /// Size of one entry in bytes.
    const ENTRY_SIZE: usize;

    /// The owner bit of a raw entry.
    fn owner_bit(entry: &[u8]) -> bool;

    /// Decodes a raw entry whose ownership was already checked.
    ///
    /// # Errors
    /// Contents that make no sense ([`EqeError`]).
    fn decode(entry: &[u8], eqn: u32, index: u32) -> Result<DeviceEvent, EqeError>;
}

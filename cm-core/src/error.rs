//! Typed errors: [`MadError`] for bytes from the wire, [`CmError`] for illegal API calls.

use crate::agent::{CmId, CmState};

/// Why a received MAD is not a CM message this layer accepts. The agent drops such a MAD
/// (as Linux's MAD layer does) and reports the reason to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MadError {
    /// A MAD is exactly 256 bytes.
    #[error("a MAD is 256 bytes, got {len}")]
    Length {
        /// Bytes received.
        len: usize,
    },
    /// BaseVersion is not 1.
    #[error("MAD base version {0}, only 1 is accepted")]
    BaseVersion(u8),
    /// The management class is not Communication Management (0x07).
    #[error("management class 0x{0:02x} is not CM (0x07)")]
    NotCm(u8),
    /// The CM class version is not 2 (Linux registers only version 2).
    #[error("CM class version {0}, only 2 is accepted")]
    ClassVersion(u8),
    /// The method byte (response bit included) is not Send (0x03).
    #[error("CM method byte 0x{0:02x}, only Send (0x03) is accepted")]
    Method(u8),
    /// An attribute ID this CM does not handle (ClassPortInfo or an unassigned one).
    #[error("CM attribute 0x{0:04x} is not handled")]
    Attribute(u16),
    /// A REJ's Reject Info Length exceeds the 72-byte ARI field.
    #[error("REJ ARI length {0} exceeds 72")]
    AriLength(u8),
    /// A SIDR_REP's Additional Information Length exceeds its 72-byte field.
    #[error("SIDR_REP additional information length {0} exceeds 72")]
    InfoLength(u8),
}

/// Why an API call on a [`crate::CmAgent`] was refused. A refused call changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// The handle was destroyed (or never came from this agent).
    #[error("{0:?} is not a live CM id")]
    UnknownId(CmId),
    /// The call is not legal in the id's current state.
    #[error("{op} is not allowed on {id:?} in state {state}")]
    State {
        /// The refused operation.
        op: &'static str,
        /// The id it was called on.
        id: CmId,
        /// The id's state at the time.
        state: CmState,
    },
    /// Private data longer than the message carries.
    #[error("{len} bytes of private data, the {msg} carries at most {max}")]
    PrivateData {
        /// The message that would carry it.
        msg: &'static str,
        /// Bytes given.
        len: usize,
        /// Bytes the message holds.
        max: usize,
    },
    /// Another id already listens on this service ID.
    #[error("service ID 0x{0:016x} already has a listener")]
    ServiceInUse(u64),
    /// Every local communication ID is in use (the slab is full).
    #[error("no free communication ID")]
    NoFreeId,
    /// A parameter does not fit its wire field.
    #[error("parameter {name} = {value} does not fit its wire field")]
    Param {
        /// The parameter.
        name: &'static str,
        /// The value given.
        value: u64,
    },
}

/// Why a CMA private-data header (rdma_cm's `struct cma_hdr`, Linux `core/cma.c`) was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmaError {
    /// Fewer than 36 bytes (to parse, or room to emit).
    #[error("a CMA header is 36 bytes, have {0}")]
    Truncated(usize),
    /// The CMA version byte is not 0.
    #[error("CMA version 0x{0:02x}, only 0 is accepted")]
    Version(u8),
    /// The IP version is neither 4 nor 6.
    #[error("CMA header IP version {0}, only 4 and 6 are accepted")]
    IpVersion(u8),
    /// Source and destination are of different address families.
    #[error("CMA header addresses mix IPv4 and IPv6")]
    MixedFamilies,
}

//! [`HeaderSet`]: which extension headers follow the BTH for an opcode, and their sizes
//! (IBA chapter 9). The opcode table in `opcode.rs` assigns one set to every known opcode.

use bitflags::bitflags;

use super::{Aeth, AtomicAckEth, AtomicEth, Deth, IMM_LEN, Reth};

bitflags! {
    /// Which extension headers (and whether a payload) follow the BTH for an opcode.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct HeaderSet: u16 {
        /// RDMA extended transport header (16 bytes).
        const RETH = 1 << 0;
        /// ACK extended transport header (4 bytes).
        const AETH = 1 << 1;
        /// Datagram extended transport header (8 bytes).
        const DETH = 1 << 2;
        /// Atomic extended transport header (28 bytes).
        const ATOMIC_ETH = 1 << 3;
        /// Atomic acknowledge extended transport header (8 bytes).
        const ATOMIC_ACK_ETH = 1 << 4;
        /// Immediate data (4 bytes).
        const IMM = 1 << 5;
        /// Invalidate extended transport header (4 bytes).
        const IETH = 1 << 6;
        /// The packet may carry a payload.
        const PAYLOAD = 1 << 7;
        /// The 16 reserved zero bytes that follow the BTH of a RoCEv2 CNP.
        const CNP_RESERVED = 1 << 8;
    }
}

impl HeaderSet {
    /// Size in bytes of the extension headers in this set (BTH, payload and pad excluded).
    pub const fn ext_len(self) -> usize {
        let mut n = 0;
        if self.contains(Self::DETH) {
            n += Deth::LEN;
        }
        if self.contains(Self::RETH) {
            n += Reth::LEN;
        }
        if self.contains(Self::ATOMIC_ETH) {
            n += AtomicEth::LEN;
        }
        if self.contains(Self::AETH) {
            n += Aeth::LEN;
        }
        if self.contains(Self::ATOMIC_ACK_ETH) {
            n += AtomicAckEth::LEN;
        }
        if self.contains(Self::IMM) {
            n += IMM_LEN;
        }
        if self.contains(Self::IETH) {
            n += IMM_LEN;
        }
        if self.contains(Self::CNP_RESERVED) {
            n += CNP_RESERVED_LEN;
        }
        n
    }
}

/// Length of the reserved block after the BTH of a CNP.
pub(crate) const CNP_RESERVED_LEN: usize = 16;

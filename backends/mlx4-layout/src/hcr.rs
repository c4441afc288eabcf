//! The host command register (Linux `mlx4/cmd.c`, `mlx4/reset.c`): seven big-endian dwords in BAR0
//! through which firmware commands are posted, plus the reset and ownership registers next to it.

use zerocopy::byteorder::big_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::layout;

/// BAR0 offset of the HCR (Linux `MLX4_HCR_BASE`).
pub const HCR_BASE: usize = 0x80680;
/// BAR0 offset of the ownership semaphore (reads 0 = acquired).
pub const OWNER_SEMAPHORE: usize = 0x8069c;
/// BAR0 offset of the reset register: write big-endian 1 to reset (Linux `mlx4/reset.c`).
pub const RESET_REG: usize = 0xf0010;
/// BAR0 offset of the reset semaphore: poll until it reads 0.
pub const RESET_SEMAPHORE: usize = 0xf03fc;
/// Smallest BAR0 that holds every register above.
pub const BAR0_MIN_LEN: usize = 0x10_0000;

/// The HCR's dwords as laid out in BAR0 (Linux `mlx4_cmd_post`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct Hcr {
    /// Input parameter (immediate or inbox bus address).
    pub in_param: U64,
    /// Input modifier.
    pub in_modifier: U32,
    /// Output parameter (immediate output or outbox bus address).
    pub out_param: U64,
    /// Token in bits 31:16.
    pub token: U32,
    /// Status / go / event / toggle / opcode modifier / opcode.
    pub status: U32,
}
layout!(Hcr, 0x1c, { in_param: 0x00, in_modifier: 0x08, out_param: 0x0c, token: 0x14, status: 0x18 });

/// Offsets of the HCR dwords from [`HCR_BASE`].
pub mod dword {
    /// in_param\[63:32\].
    pub const IN_PARAM_HI: usize = 0x00;
    /// in_param\[31:0\].
    pub const IN_PARAM_LO: usize = 0x04;
    /// in_modifier.
    pub const IN_MODIFIER: usize = 0x08;
    /// out_param\[63:32\].
    pub const OUT_PARAM_HI: usize = 0x0c;
    /// out_param\[31:0\].
    pub const OUT_PARAM_LO: usize = 0x10;
    /// token << 16.
    pub const TOKEN: usize = 0x14;
    /// status/go/e/t/opmod/opcode.
    pub const STATUS: usize = 0x18;
}

/// Go bit: set by software to post, cleared by the HCA on completion.
pub const GO: u32 = 1 << 23;
/// Event bit: report completion with a command-completion EQE.
pub const EVENT: u32 = 1 << 22;
/// Toggle bit.
pub const TOGGLE: u32 = 1 << 21;
/// Token of polling-mode commands.
pub const POLL_TOKEN: u16 = 0xffff;

/// The status dword (HCR dword 6) as a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusWord(pub u32);

impl StatusWord {
    /// The word software writes to post a command.
    pub fn post(opcode: u16, opmod: u8, toggle: bool, event: bool) -> Self {
        Self(
            GO | if event { EVENT } else { 0 }
                | if toggle { TOGGLE } else { 0 }
                | (u32::from(opmod & 0xf) << 12)
                | u32::from(opcode & 0xfff),
        )
    }

    /// Completion status (bits 31:24).
    pub fn status(self) -> u8 {
        (self.0 >> 24) as u8
    }

    /// Go bit.
    pub fn go(self) -> bool {
        self.0 & GO != 0
    }

    /// Event bit.
    pub fn event(self) -> bool {
        self.0 & EVENT != 0
    }

    /// Toggle bit.
    pub fn toggle(self) -> bool {
        self.0 & TOGGLE != 0
    }

    /// Opcode modifier.
    pub fn opmod(self) -> u8 {
        ((self.0 >> 12) & 0xf) as u8
    }

    /// Opcode.
    pub fn opcode(self) -> u16 {
        (self.0 & 0xfff) as u16
    }

    /// The word the HCA leaves after completing: status in 31:24, go clear, t as written.
    pub fn completed(self, status: u8) -> Self {
        Self((u32::from(status) << 24) | (self.0 & !(GO | 0xff00_0000)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worked_encodings_of_facts_10_1() {
        // First command after reset, polling: QUERY_FW with t = 1.
        assert_eq!(StatusWord::post(0x004, 0, true, false).0, 0x00a0_0004);
        // The next one with t = 0: QUERY_DEV_CAP.
        assert_eq!(StatusWord::post(0x003, 0, false, false).0, 0x0080_0003);
        // 2RST_QP, opmod 2, t = 1.
        assert_eq!(StatusWord::post(0x021, 2, true, false).0, 0x00a0_2021);
    }

    #[test]
    fn completion_keeps_toggle_and_clears_go() {
        let posted = StatusWord::post(0x021, 2, true, true);
        let done = posted.completed(0x10);
        assert!(!done.go());
        assert!(done.toggle());
        assert_eq!(done.status(), 0x10);
        assert_eq!(done.opcode(), 0x021);
        assert_eq!(done.opmod(), 2);
    }
}

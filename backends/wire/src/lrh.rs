//! Local Route Header (LRH, 8 bytes; IBA 7.7), the link header of a native InfiniBand packet.
//!
//! ```text
//! byte 0      VL(0xF0) LVer(0x0F)
//! byte 1      SL(0xF0) reserved(0x0C) LNH(0x03)
//! bytes 2-3   DLID
//! bytes 4-5   reserved(0xF800) PktLen(0x07FF, in 4-byte words)
//! bytes 6-7   SLID
//! ```
//!
//! RoCEv2 packets carry no LRH; it is what software builds for the MLX-transport WQEs of an
//! HCA's special QPs. Reserved bits are written as zero and ignored when parsing; fields
//! narrower than their Rust type are masked on emit, never rejected.

use super::WireError;
use super::bytes::{check_len, check_room, read_u8, read_u16, write_u8, write_u16};

/// Byte offsets of the LRH fields.
mod field {
    use core::ops::Range;

    pub(super) const VL_LVER: usize = 0;
    pub(super) const SL_LNH: usize = 1;
    pub(super) const DLID: Range<usize> = 2..4;
    pub(super) const PKT_LEN: Range<usize> = 4..6;
    pub(super) const SLID: Range<usize> = 6..8;
}

const NIBBLE: u8 = 0x0F;
const LNH_MASK: u8 = 0x03;
const PKT_LEN_MASK: u16 = 0x07FF;

/// Link next header: what follows the LRH (IBA 7.7.5).
pub mod lnh {
    /// Raw packet.
    pub const RAW: u8 = 0;
    /// An IPv6 packet that is not an IBA transport packet.
    pub const IP_NON_IBA: u8 = 1;
    /// IBA local: the BTH follows.
    pub const IBA_LOCAL: u8 = 2;
    /// IBA global: a GRH follows.
    pub const IBA_GLOBAL: u8 = 3;
}

/// Local Route Header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Lrh {
    /// Virtual lane (4 bits, masked on emit).
    pub vl: u8,
    /// Link version, 0 (4 bits, masked on emit).
    pub lver: u8,
    /// Service level (4 bits, masked on emit).
    pub sl: u8,
    /// Link next header, one of [`lnh`] (2 bits, masked on emit).
    pub lnh: u8,
    /// Destination LID.
    pub dlid: u16,
    /// Packet length in 4-byte words, from the LRH to the ICRC inclusive (VCRC excluded;
    /// 11 bits, masked on emit).
    pub pkt_len: u16,
    /// Source LID.
    pub slid: u16,
}

impl Lrh {
    /// Encoded size in bytes.
    pub const LEN: usize = 8;

    /// The largest packet length the 11-bit field holds, in 4-byte words.
    pub const MAX_PKT_WORDS: u16 = PKT_LEN_MASK;

    /// Parses the first [`Lrh::LEN`] bytes of `buf` (extra bytes are ignored).
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        check_len(buf, Self::LEN)?;
        let vl_lver = read_u8(buf, field::VL_LVER)?;
        let sl_lnh = read_u8(buf, field::SL_LNH)?;
        Ok(Self {
            vl: vl_lver >> 4,
            lver: vl_lver & NIBBLE,
            sl: sl_lnh >> 4,
            lnh: sl_lnh & LNH_MASK,
            dlid: read_u16(buf, field::DLID)?,
            pkt_len: read_u16(buf, field::PKT_LEN)? & PKT_LEN_MASK,
            slid: read_u16(buf, field::SLID)?,
        })
    }

    /// Writes the header into the first [`Lrh::LEN`] bytes of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), WireError> {
        check_room(out, Self::LEN)?;
        write_u8(
            out,
            field::VL_LVER,
            ((self.vl & NIBBLE) << 4) | (self.lver & NIBBLE),
        )?;
        write_u8(
            out,
            field::SL_LNH,
            ((self.sl & NIBBLE) << 4) | (self.lnh & LNH_MASK),
        )?;
        write_u16(out, field::DLID, self.dlid)?;
        write_u16(out, field::PKT_LEN, self.pkt_len & PKT_LEN_MASK)?;
        write_u16(out, field::SLID, self.slid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Lrh {
        Lrh {
            vl: 15,
            lver: 0,
            sl: 3,
            lnh: lnh::IBA_LOCAL,
            dlid: 0x1234,
            pkt_len: 0x7ff,
            slid: 0xabcd,
        }
    }

    /// IBA 7.7: VL and LVer share byte 0, SL and LNH byte 1, then DLID, the 11-bit packet
    /// length under 5 reserved bits, and SLID, all big-endian.
    #[test]
    fn fields_sit_where_iba_7_7_puts_them() {
        let mut b = [0u8; Lrh::LEN];
        sample().emit(&mut b).unwrap();
        assert_eq!(b, [0xf0, 0x32, 0x12, 0x34, 0x07, 0xff, 0xab, 0xcd]);
    }

    #[test]
    fn round_trips_and_masks_narrow_fields() {
        let mut b = [0u8; Lrh::LEN];
        let h = sample();
        h.emit(&mut b).unwrap();
        assert_eq!(Lrh::parse(&b), Ok(h));
        let wide = Lrh {
            vl: 0x1f,
            lver: 0x12,
            sl: 0x25,
            lnh: 0x07,
            pkt_len: 0xf801,
            ..h
        };
        wide.emit(&mut b).unwrap();
        assert_eq!(b[..2], [0xf2, 0x53]);
        assert_eq!(b[4..6], [0x00, 0x01], "reserved bits stay zero");
        let back = Lrh::parse(&b).unwrap();
        assert_eq!((back.vl, back.lver, back.sl, back.lnh), (15, 2, 5, 3));
        assert_eq!(back.pkt_len, 1);
    }

    #[test]
    fn parsing_ignores_reserved_bits_and_refuses_short_input() {
        let mut b = [0xffu8; Lrh::LEN];
        let h = Lrh::parse(&b).unwrap();
        assert_eq!((h.lnh, h.pkt_len), (3, 0x7ff));
        assert!(matches!(
            Lrh::parse(&b[..7]),
            Err(WireError::Truncated { need: 8, have: 7 })
        ));
        assert!(matches!(
            sample().emit(&mut b[..4]),
            Err(WireError::BufferTooSmall { need: 8, have: 4 })
        ));
    }
}

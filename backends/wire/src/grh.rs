//! Global Route Header (GRH, 40 bytes; IBA 8.3), laid out as an IPv6 header: it follows the LRH
//! when the LRH's link next header is IBA global.
//!
//! ```text
//! bytes 0-3   IPVer(0xF000_0000) TClass(0x0FF0_0000) FlowLabel(0x000F_FFFF)
//! bytes 4-5   PayLen (bytes after the GRH up to and including the ICRC)
//! byte 6      NxtHdr (0x1B: an IBA transport header follows)
//! byte 7      HopLmt
//! bytes 8-23  SGID
//! bytes 24-39 DGID
//! ```
//!
//! Fields narrower than their Rust type are masked on emit, never rejected; parsing keeps the
//! version and next header as they are, for the caller to check.

use super::WireError;
use super::bytes::{
    check_len, check_room, read_16, read_u8, read_u16, read_u32, write_bytes, write_u8, write_u16,
    write_u32,
};
use super::icrc::FLOW_LABEL_MASK;

/// Byte offsets of the GRH fields.
mod field {
    use core::ops::Range;

    pub(super) const VER_TCLASS_FLOW: Range<usize> = 0..4;
    pub(super) const PAY_LEN: Range<usize> = 4..6;
    pub(super) const NEXT_HEADER: usize = 6;
    pub(super) const HOP_LIMIT: usize = 7;
    pub(super) const SGID: Range<usize> = 8..24;
    pub(super) const DGID: Range<usize> = 24..40;
}

/// Global Route Header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Grh {
    /// IP version, [`Grh::IP_VERSION`] (4 bits, masked on emit).
    pub ip_version: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (20 bits, masked on emit).
    pub flow_label: u32,
    /// Payload length: the bytes after the GRH up to and including the ICRC.
    pub pay_len: u16,
    /// Next header, [`Grh::NEXT_HEADER_IBA`] before a BTH.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source GID.
    pub sgid: [u8; 16],
    /// Destination GID.
    pub dgid: [u8; 16],
}

impl Grh {
    /// Encoded size in bytes.
    pub const LEN: usize = 40;

    /// The IP version a GRH carries.
    pub const IP_VERSION: u8 = 6;

    /// The next-header value of an IBA transport header (IBA 8.3.1).
    pub const NEXT_HEADER_IBA: u8 = 0x1B;

    /// Parses the first [`Grh::LEN`] bytes of `buf` (extra bytes are ignored).
    pub fn parse(buf: &[u8]) -> Result<Self, WireError> {
        check_len(buf, Self::LEN)?;
        let w0 = read_u32(buf, field::VER_TCLASS_FLOW)?;
        Ok(Self {
            ip_version: (w0 >> 28) as u8,
            traffic_class: (w0 >> 20) as u8,
            flow_label: w0 & FLOW_LABEL_MASK,
            pay_len: read_u16(buf, field::PAY_LEN)?,
            next_header: read_u8(buf, field::NEXT_HEADER)?,
            hop_limit: read_u8(buf, field::HOP_LIMIT)?,
            sgid: read_16(buf, field::SGID)?,
            dgid: read_16(buf, field::DGID)?,
        })
    }

    /// Writes the header into the first [`Grh::LEN`] bytes of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), WireError> {
        check_room(out, Self::LEN)?;
        let w0 = (u32::from(self.ip_version & 0x0F) << 28)
            | (u32::from(self.traffic_class) << 20)
            | (self.flow_label & FLOW_LABEL_MASK);
        write_u32(out, field::VER_TCLASS_FLOW, w0)?;
        write_u16(out, field::PAY_LEN, self.pay_len)?;
        write_u8(out, field::NEXT_HEADER, self.next_header)?;
        write_u8(out, field::HOP_LIMIT, self.hop_limit)?;
        write_bytes(out, field::SGID.start, &self.sgid)?;
        write_bytes(out, field::DGID.start, &self.dgid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Grh {
        let mut sgid = [0u8; 16];
        let mut dgid = [0u8; 16];
        for (i, (s, d)) in sgid.iter_mut().zip(dgid.iter_mut()).enumerate() {
            *s = i as u8;
            *d = 0xf0 | i as u8;
        }
        Grh {
            ip_version: Grh::IP_VERSION,
            traffic_class: 0xa5,
            flow_label: 0x1_2345,
            pay_len: 0x0118,
            next_header: Grh::NEXT_HEADER_IBA,
            hop_limit: 64,
            sgid,
            dgid,
        }
    }

    /// IBA 8.3: version, traffic class and flow label in the first word, then payload length,
    /// next header, hop limit and the two GIDs, all big-endian.
    #[test]
    fn fields_sit_where_iba_8_3_puts_them() {
        let mut b = [0u8; Grh::LEN];
        sample().emit(&mut b).unwrap();
        assert_eq!(b[..8], [0x6a, 0x51, 0x23, 0x45, 0x01, 0x18, 0x1b, 0x40]);
        assert_eq!(b[8..24], sample().sgid);
        assert_eq!(b[24..40], sample().dgid);
    }

    #[test]
    fn round_trips_and_masks_narrow_fields() {
        let mut b = [0u8; Grh::LEN];
        let g = sample();
        g.emit(&mut b).unwrap();
        assert_eq!(Grh::parse(&b), Ok(g));
        let wide = Grh {
            ip_version: 0x16,
            flow_label: 0xfff0_0001,
            ..g
        };
        wide.emit(&mut b).unwrap();
        assert_eq!(b[..4], [0x6a, 0x50, 0x00, 0x01]);
        let back = Grh::parse(&b).unwrap();
        assert_eq!((back.ip_version, back.flow_label), (6, 1));
    }

    #[test]
    fn short_input_is_an_error() {
        let mut b = [0u8; Grh::LEN];
        assert!(matches!(
            Grh::parse(&b[..39]),
            Err(WireError::Truncated { need: 40, have: 39 })
        ));
        assert!(matches!(
            sample().emit(&mut b[..20]),
            Err(WireError::BufferTooSmall { need: 40, have: 20 })
        ));
    }
}

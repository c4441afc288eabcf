//! Big-endian field accessors over the 232-byte CM payload.
//!
//! Every offset passed here is a constant from a message's `field` module, always inside the
//! fixed-size array; the unit tests touch every field, so an offset mistake shows up there.

use super::PAYLOAD_LEN;

/// The CM class data of a MAD (after the 24-byte common header).
pub(crate) type Payload = [u8; PAYLOAD_LEN];

pub(crate) fn u16_at(p: &Payload, at: usize) -> u16 {
    u16::from_be_bytes([p[at], p[at + 1]])
}

pub(crate) fn u24_at(p: &Payload, at: usize) -> u32 {
    u32::from_be_bytes([0, p[at], p[at + 1], p[at + 2]])
}

pub(crate) fn u32_at(p: &Payload, at: usize) -> u32 {
    u32::from_be_bytes([p[at], p[at + 1], p[at + 2], p[at + 3]])
}

pub(crate) fn u64_at(p: &Payload, at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&p[at..at + 8]);
    u64::from_be_bytes(b)
}

pub(crate) fn array_at<const N: usize>(p: &Payload, at: usize) -> [u8; N] {
    let mut b = [0u8; N];
    b.copy_from_slice(&p[at..at + N]);
    b
}

pub(crate) fn put_u16(p: &mut Payload, at: usize, v: u16) {
    p[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Writes the low 24 bits of `v` (masked, never an error).
pub(crate) fn put_u24(p: &mut Payload, at: usize, v: u32) {
    p[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

pub(crate) fn put_u32(p: &mut Payload, at: usize, v: u32) {
    p[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn put_u64(p: &mut Payload, at: usize, v: u64) {
    p[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

pub(crate) fn put_bytes(p: &mut Payload, at: usize, v: &[u8]) {
    p[at..at + v.len()].copy_from_slice(v);
}

/// Reads the `width`-bit field whose most significant bit is bit `msb` (7 = MSB) of byte `at`.
pub(crate) fn bits_at(p: &Payload, at: usize, msb: u8, width: u8) -> u8 {
    let shift = msb + 1 - width;
    (p[at] >> shift) & mask(width)
}

/// ORs `v` (masked to `width` bits) into the field of [`bits_at`]; the byte starts zeroed.
pub(crate) fn put_bits(p: &mut Payload, at: usize, msb: u8, width: u8, v: u8) {
    let shift = msb + 1 - width;
    p[at] |= (v & mask(width)) << shift;
}

fn mask(width: u8) -> u8 {
    ((1u16 << width) - 1) as u8
}

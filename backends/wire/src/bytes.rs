//! Checked big-endian field accessors used by the header representations.
//!
//! Every accessor takes a byte range (from a header's private `field` module) and returns an
//! error instead of panicking when the range is not inside the buffer, so a header's code stays
//! panic-free even if a length check were ever wrong.

use core::ops::Range;

use super::WireError;

/// Fails with [`WireError::Truncated`] unless `buf` holds at least `need` bytes.
pub(crate) fn check_len(buf: &[u8], need: usize) -> Result<(), WireError> {
    if buf.len() < need {
        Err(WireError::Truncated {
            need,
            have: buf.len(),
        })
    } else {
        Ok(())
    }
}

/// Fails with [`WireError::BufferTooSmall`] unless `out` holds at least `need` bytes.
pub(crate) fn check_room(out: &[u8], need: usize) -> Result<(), WireError> {
    if out.len() < need {
        Err(WireError::BufferTooSmall {
            need,
            have: out.len(),
        })
    } else {
        Ok(())
    }
}

/// Reads the bytes of `range` as a fixed-size array.
fn array<const N: usize>(buf: &[u8], range: Range<usize>) -> Result<[u8; N], WireError> {
    let need = range.end;
    buf.get(range)
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(WireError::Truncated {
            need,
            have: buf.len(),
        })
}

/// Returns a mutable fixed-size view of `range` in `out`.
fn array_mut<const N: usize>(
    out: &mut [u8],
    range: Range<usize>,
) -> Result<&mut [u8; N], WireError> {
    let need = range.end;
    let have = out.len();
    out.get_mut(range)
        .and_then(|s| <&mut [u8; N]>::try_from(s).ok())
        .ok_or(WireError::BufferTooSmall { need, have })
}

/// Reads one byte at `at`.
pub(crate) fn read_u8(buf: &[u8], at: usize) -> Result<u8, WireError> {
    buf.get(at).copied().ok_or(WireError::Truncated {
        need: at.saturating_add(1),
        have: buf.len(),
    })
}

/// Writes one byte at `at`.
pub(crate) fn write_u8(out: &mut [u8], at: usize, v: u8) -> Result<(), WireError> {
    let have = out.len();
    let slot = out.get_mut(at).ok_or(WireError::BufferTooSmall {
        need: at.saturating_add(1),
        have,
    })?;
    *slot = v;
    Ok(())
}

/// Reads a big-endian `u16` from a 2-byte range.
pub(crate) fn read_u16(buf: &[u8], range: Range<usize>) -> Result<u16, WireError> {
    array(buf, range).map(u16::from_be_bytes)
}

/// Writes a big-endian `u16` into a 2-byte range.
pub(crate) fn write_u16(out: &mut [u8], range: Range<usize>, v: u16) -> Result<(), WireError> {
    *array_mut(out, range)? = v.to_be_bytes();
    Ok(())
}

/// Reads a big-endian 24-bit value from a 3-byte range.
pub(crate) fn read_u24(buf: &[u8], range: Range<usize>) -> Result<u32, WireError> {
    let [a, b, c] = array(buf, range)?;
    Ok(u32::from_be_bytes([0, a, b, c]))
}

/// Writes the low 24 bits of `v` big-endian into a 3-byte range (upper bits are dropped).
pub(crate) fn write_u24(out: &mut [u8], range: Range<usize>, v: u32) -> Result<(), WireError> {
    let [_, a, b, c] = v.to_be_bytes();
    *array_mut(out, range)? = [a, b, c];
    Ok(())
}

/// Reads a big-endian `u32` from a 4-byte range.
pub(crate) fn read_u32(buf: &[u8], range: Range<usize>) -> Result<u32, WireError> {
    array(buf, range).map(u32::from_be_bytes)
}

/// Writes a big-endian `u32` into a 4-byte range.
pub(crate) fn write_u32(out: &mut [u8], range: Range<usize>, v: u32) -> Result<(), WireError> {
    *array_mut(out, range)? = v.to_be_bytes();
    Ok(())
}

/// Reads a big-endian `u64` from an 8-byte range.
pub(crate) fn read_u64(buf: &[u8], range: Range<usize>) -> Result<u64, WireError> {
    array(buf, range).map(u64::from_be_bytes)
}

/// Writes a big-endian `u64` into an 8-byte range.
pub(crate) fn write_u64(out: &mut [u8], range: Range<usize>, v: u64) -> Result<(), WireError> {
    *array_mut(out, range)? = v.to_be_bytes();
    Ok(())
}

/// Reads a 16-byte range (an IPv6 address).
pub(crate) fn read_16(buf: &[u8], range: Range<usize>) -> Result<[u8; 16], WireError> {
    array(buf, range)
}

/// Reads a 4-byte range as raw bytes (an IPv4 address).
pub(crate) fn read_4(buf: &[u8], range: Range<usize>) -> Result<[u8; 4], WireError> {
    array(buf, range)
}

/// Copies `src` into `out` at offset `at`.
pub(crate) fn write_bytes(out: &mut [u8], at: usize, src: &[u8]) -> Result<(), WireError> {
    let end = at.saturating_add(src.len());
    let have = out.len();
    let dst = out
        .get_mut(at..end)
        .ok_or(WireError::BufferTooSmall { need: end, have })?;
    dst.copy_from_slice(src);
    Ok(())
}

/// The part of `buf` from `at` on (empty if `at` is past the end).
pub(crate) fn tail(buf: &[u8], at: usize) -> &[u8] {
    buf.get(at..).unwrap_or(&[])
}

/// The part of `out` from `at` on (empty if `at` is past the end).
pub(crate) fn tail_mut(out: &mut [u8], at: usize) -> &mut [u8] {
    match out.get_mut(at..) {
        Some(rest) => rest,
        None => &mut [],
    }
}

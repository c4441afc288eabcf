//! What rping (librdmacm's example) puts in its buffers, as facts of its protocol: the
//! 16-byte advertisement of a buffer and the ping text.

use crate::error::CliError;

/// rping's default ping size (`-S`).
pub(crate) const DEFAULT_SIZE: usize = 64;
/// rping's default port (`-p`).
pub(crate) const DEFAULT_PORT: u16 = 7174;
/// The largest ping: rping's 64 KiB buffer less one byte.
pub(crate) const MAX_SIZE: usize = 64 * 1024 - 1;
/// The smallest ping: room for the longest `rdma-ping-<n>: ` prefix rping allows (the size of
/// the C strings `"2147483647"` and `"rdma-ping-%d: "`, NULs included).
pub(crate) const MIN_SIZE: usize = 11 + 15;

/// The bytes of an advertisement (`struct rping_rdma_info`).
pub(crate) const INFO_LEN: usize = 16;

/// A buffer one side may read or write: its address, rkey and length, big-endian on the wire
/// (u64 address, u32 rkey, u32 size).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RdmaInfo {
    pub(crate) addr: u64,
    pub(crate) rkey: u32,
    pub(crate) size: u32,
}

impl RdmaInfo {
    pub(crate) fn to_bytes(self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    /// Reads an advertisement of exactly [`INFO_LEN`] bytes (rping's "Received bogus data"
    /// check).
    pub(crate) fn from_bytes(b: &[u8]) -> Result<Self, CliError> {
        let b: &[u8; INFO_LEN] = b
            .try_into()
            .map_err(|_| CliError::Failed(format!("Received bogus data, size {}", b.len())))?;
        let [
            a0,
            a1,
            a2,
            a3,
            a4,
            a5,
            a6,
            a7,
            k0,
            k1,
            k2,
            k3,
            s0,
            s1,
            s2,
            s3,
        ] = *b;
        Ok(Self {
            addr: u64::from_be_bytes([a0, a1, a2, a3, a4, a5, a6, a7]),
            rkey: u32::from_be_bytes([k0, k1, k2, k3]),
            size: u32::from_be_bytes([s0, s1, s2, s3]),
        })
    }
}

/// Checks `-S` as rping does.
pub(crate) fn check_size(size: usize) -> Result<(), CliError> {
    if (MIN_SIZE..=MAX_SIZE).contains(&size) {
        Ok(())
    } else {
        Err(CliError::usage(format_args!(
            "Invalid size {size} (valid range is {MIN_SIZE} to {})",
            MAX_SIZE + 1
        )))
    }
}

/// The first character of the pattern of ping `n` (rping starts at 'A' and moves one on per
/// ping, wrapping after 'z').
pub(crate) fn start_char(n: u64) -> u8 {
    b'A' + (n % u64::from(b'z' - b'A' + 1)) as u8
}

/// Fills `buf` with ping `n`: `rdma-ping-<n>: `, then characters from [`start_char`] on,
/// each one more than the last, wrapping from 'z' to 'A', and a NUL in the last byte.
pub(crate) fn fill_ping(buf: &mut [u8], n: u64) {
    let prefix = format!("rdma-ping-{n}: ");
    let cc = prefix.len().min(buf.len());
    buf[..cc].copy_from_slice(&prefix.as_bytes()[..cc]);
    let mut c = start_char(n);
    for b in &mut buf[cc..] {
        *b = c;
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    if let Some(last) = buf.last_mut() {
        *last = 0;
    }
}

/// The C string at the start of `buf`: the bytes before the first NUL (all of them if none).
pub(crate) fn c_str(buf: &[u8]) -> &[u8] {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    &buf[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advertisement_is_big_endian_and_exactly_16_bytes() {
        let info = RdmaInfo {
            addr: 0x0102_0304_0506_0708,
            rkey: 0x0a0b_0c0d,
            size: 64,
        };
        let b = info.to_bytes();
        assert_eq!(b[..8], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(b[8..12], [0x0a, 0x0b, 0x0c, 0x0d]);
        assert_eq!(b[12..], [0, 0, 0, 64]);
        assert_eq!(RdmaInfo::from_bytes(&b).unwrap(), info);
        let e = RdmaInfo::from_bytes(&b[..15]).unwrap_err();
        assert_eq!(e.to_string(), "Received bogus data, size 15");
    }

    #[test]
    fn pings_follow_rpings_pattern() {
        let mut buf = [0xffu8; 32];
        fill_ping(&mut buf, 0);
        assert_eq!(&buf[..], b"rdma-ping-0: ABCDEFGHIJKLMNOPQR\0");
        fill_ping(&mut buf, 1);
        assert_eq!(c_str(&buf), b"rdma-ping-1: BCDEFGHIJKLMNOPQRS");
        // After 'z' comes 'A'; ping 57 starts at 'z'.
        fill_ping(&mut buf, 57);
        assert_eq!(c_str(&buf), b"rdma-ping-57: zABCDEFGHIJKLMNOP");
        fill_ping(&mut buf, 58);
        assert_eq!(&buf[14..16], b"AB", "58 wraps to 'A'");
    }

    #[test]
    fn sizes_outside_rpings_range_are_refused() {
        assert!(check_size(MIN_SIZE).is_ok());
        assert!(check_size(MAX_SIZE).is_ok());
        let e = check_size(MIN_SIZE - 1).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Invalid size 25 (valid range is 26 to 65536)"
        );
        assert!(check_size(MAX_SIZE + 1).is_err());
    }
}

//! What librdmacm's `rping` (`librdmacm/examples/rping.c`) puts in its buffers once the CM has
//! connected its QP: the 16-byte advertisement of a buffer the peer may read or write
//! (`struct rping_rdma_info`), SENT each way, and the text of each ping.
//!
//! The conversation: the client advertises its source buffer, the server RDMA READs the ping
//! from it and advertises nothing (an all-zero "go ahead"), the client advertises its sink
//! buffer, the server RDMA WRITEs the ping back and says "go ahead" again.

/// rping's default ping size (`-S`).
pub const DEFAULT_SIZE: usize = 64;

/// rping's default port (`-p`).
pub const DEFAULT_PORT: u16 = 7174;

/// The largest ping: rping's 64 KiB buffer less one byte.
pub const MAX_SIZE: usize = 64 * 1024 - 1;

/// The smallest ping: room for the longest `rdma-ping-<n>: ` prefix rping allows (the sizes
/// of the C strings `"2147483647"` and `"rdma-ping-%d: "`, NULs included).
pub const MIN_SIZE: usize = 11 + 15;

/// Bytes of an advertisement.
pub const INFO_LEN: usize = 16;

/// A buffer one side may read or write: its address, rkey and length, on the wire a
/// big-endian u64, u32 and u32.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RdmaInfo {
    /// The buffer's address.
    pub addr: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Its length.
    pub size: u32,
}

/// An advertisement of a length other than [`INFO_LEN`] (rping's "Received bogus data"
/// check); holds the length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("Received bogus data, size {0}")]
pub struct BogusInfo(pub usize);

impl RdmaInfo {
    /// The advertisement's bytes.
    pub fn to_bytes(self) -> [u8; INFO_LEN] {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&self.addr.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    /// Reads an advertisement: exactly [`INFO_LEN`] bytes, as received.
    ///
    /// # Errors
    /// [`BogusInfo`] for any other length.
    pub fn from_bytes(b: &[u8]) -> Result<Self, BogusInfo> {
        let b: &[u8; INFO_LEN] = b.try_into().map_err(|_| BogusInfo(b.len()))?;
        Ok(Self {
            addr: u64::from_be_bytes(std::array::from_fn(|i| b[i])),
            rkey: u32::from_be_bytes(std::array::from_fn(|i| b[8 + i])),
            size: u32::from_be_bytes(std::array::from_fn(|i| b[12 + i])),
        })
    }
}

/// The first character of the pattern of ping `n`: rping starts at `A` and moves one on per
/// ping, wrapping after `z`.
pub fn start_char(n: u64) -> u8 {
    b'A' + (n % u64::from(b'z' - b'A' + 1)) as u8
}

/// Fills `buf` with ping `n` as rping does: `rdma-ping-<n>: `, then characters from
/// [`start_char`] on, each one more than the last, wrapping from `z` to `A`, and a NUL in the
/// last byte. A buffer shorter than the prefix holds what fits of it.
pub fn fill_ping(buf: &mut [u8], n: u64) {
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

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
        assert_eq!(RdmaInfo::from_bytes(&b), Ok(info));
        assert_eq!(RdmaInfo::from_bytes(&b[..15]), Err(BogusInfo(15)));
        assert_eq!(RdmaInfo::from_bytes(&[0; 17]), Err(BogusInfo(17)));
        assert_eq!(RdmaInfo::from_bytes(&[]), Err(BogusInfo(0)));
        assert_eq!(BogusInfo(15).to_string(), "Received bogus data, size 15");
    }

    #[test]
    fn pings_follow_rpings_pattern() {
        let mut buf = [0xffu8; 32];
        fill_ping(&mut buf, 0);
        assert_eq!(&buf[..], b"rdma-ping-0: ABCDEFGHIJKLMNOPQR\0");
        fill_ping(&mut buf, 1);
        assert_eq!(&buf[..], b"rdma-ping-1: BCDEFGHIJKLMNOPQRS\0");
        // After 'z' comes 'A'; ping 57 starts at 'z'.
        fill_ping(&mut buf, 57);
        assert_eq!(&buf[..], b"rdma-ping-57: zABCDEFGHIJKLMNOP\0");
        fill_ping(&mut buf, 58);
        assert_eq!(&buf[14..16], b"AB", "58 wraps to 'A'");
        let mut tiny = [0xffu8; 4];
        fill_ping(&mut tiny, 3);
        assert_eq!(&tiny, b"rdm\0");
        fill_ping(&mut [], 3);
    }

    proptest! {
        #[test]
        fn advertisements_round_trip(addr: u64, rkey: u32, size: u32) {
            let info = RdmaInfo { addr, rkey, size };
            prop_assert_eq!(RdmaInfo::from_bytes(&info.to_bytes()), Ok(info));
        }

        #[test]
        fn other_lengths_are_bogus(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let r = RdmaInfo::from_bytes(&b);
            prop_assert_eq!(r.is_ok(), b.len() == INFO_LEN);
            if let Ok(info) = r {
                prop_assert_eq!(&info.to_bytes()[..], &b[..]);
            }
        }
    }
}

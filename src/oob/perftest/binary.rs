//! The binary destination of perftest's rdma_cm mode (`-R`): `struct pingpong_dest` as it
//! lies in memory on a 64-bit host, every integer big-endian.
//!
//! | bytes | field |
//! |---|---|
//! | 0, 4, 8, 12, 16 | `lid`, `out_reads`, `qpn`, `psn`, `rkey` (4 bytes each) |
//! | 20 | padding (4 bytes) |
//! | 24 | `vaddr` (8 bytes) |
//! | 32 | from 6.28: `tail_markers_vaddr` (8 bytes), moving the rest by 8 |
//! | 32 (40) | the GID (16 bytes) |
//! | 48 (56) | `srqn`, `gid_index` (4 bytes each) |

use portverbs_hal::Gid;

use super::{DecodeError, Dest};

/// Which layout of the binary destination; the peer's version decides
/// ([`BinaryForm::for_version`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BinaryForm {
    /// Before perftest 6.28: 56 bytes.
    #[default]
    Plain,
    /// From 6.28 on, with `tail_markers_vaddr` after `vaddr`: 64 bytes.
    TailMarkers,
}

/// The first perftest version whose destination has `tail_markers_vaddr`.
#[allow(clippy::approx_constant, reason = "a version number, not 2π")]
const TAIL_MARKERS_VERSION: f64 = 6.28;

impl BinaryForm {
    /// The form a peer of perftest version `version` reads.
    pub fn for_version(version: f64) -> Self {
        if version >= TAIL_MARKERS_VERSION {
            Self::TailMarkers
        } else {
            Self::Plain
        }
    }

    /// Bytes of a destination of this form.
    pub const fn size(self) -> usize {
        match self {
            Self::Plain => 56,
            Self::TailMarkers => 64,
        }
    }

    /// The form of a message of `len` bytes.
    pub fn of_size(len: usize) -> Option<Self> {
        [Self::Plain, Self::TailMarkers]
            .into_iter()
            .find(|f| f.size() == len)
    }

    /// Where the GID starts.
    fn gid_at(self) -> usize {
        match self {
            Self::Plain => 32,
            Self::TailMarkers => 40,
        }
    }
}

impl Dest {
    /// The binary destination of `form`, announcing `gid_index`; no GID is sent as zeros,
    /// `tail_markers_vaddr` as 0.
    pub fn encode_binary(&self, gid_index: u32, form: BinaryForm) -> Vec<u8> {
        let mut m = vec![0u8; form.size()];
        let mut put = |at: usize, v: &[u8]| m[at..at + v.len()].copy_from_slice(v);
        put(0, &u32::from(self.lid).to_be_bytes());
        put(4, &u32::from(self.out_reads).to_be_bytes());
        put(8, &self.qpn.to_be_bytes());
        put(12, &self.psn.to_be_bytes());
        put(16, &self.rkey.to_be_bytes());
        put(24, &self.vaddr.to_be_bytes());
        let at = form.gid_at();
        put(at, &self.gid.unwrap_or_default().0);
        put(at + 16, &self.srqn.to_be_bytes());
        put(at + 20, &gid_index.to_be_bytes());
        m
    }

    /// Reads a binary destination; its length says its form. QPN and PSN are taken modulo
    /// 2^24; the GID index is not kept.
    ///
    /// # Errors
    /// [`DecodeError::BinaryLength`] for a length of neither form, [`DecodeError::Wide`] for
    /// a LID or outstanding-reads count above 16 bits.
    pub fn decode_binary(msg: &[u8]) -> Result<Self, DecodeError> {
        let form = BinaryForm::of_size(msg.len()).ok_or(DecodeError::BinaryLength(msg.len()))?;
        // The form fixes the length: every field lies inside the message.
        let word = |at: usize| u32::from_be_bytes(std::array::from_fn(|i| msg[at + i]));
        let narrow = |at: usize, field: &'static str| {
            let value = word(at);
            u16::try_from(value).map_err(|_| DecodeError::Wide { field, value })
        };
        let at = form.gid_at();
        Ok(Self {
            lid: narrow(0, "LID")?,
            out_reads: narrow(4, "outstanding reads")?,
            qpn: word(8) & 0xff_ffff,
            psn: word(12) & 0xff_ffff,
            rkey: word(16),
            vaddr: u64::from_be_bytes(std::array::from_fn(|i| msg[24 + i])),
            gid: Some(Gid(std::array::from_fn(|i| msg[at + i]))),
            srqn: word(at + 16),
        })
    }
}

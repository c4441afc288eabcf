//! Packets as the engine produces and consumes them.
//!
//! A [`Packet`] carries the parsed IB transport headers plus routing metadata (source and
//! destination GID, the GRH/IP fields) and its payload. The payload is either owned bytes (inline
//! sends, atomics, anything a corrupting link materialised) or references into registered memory
//! ([`MemSeg`]) that the receiving side copies from directly, so a large RDMA WRITE costs one copy
//! from source to destination memory, as on an HCA. The fabric turns a packet into real RoCEv2
//! bytes (IP/UDP/BTH…/ICRC) whenever a link can corrupt or a capture is running
//! ([`Packet::to_frame`]), and parses such bytes back ([`Packet::from_frame`]).

use std::net::IpAddr;
use std::sync::Arc;

use portverbs_hal::types::Gid;
use smallvec::SmallVec;

use crate::dma::SoftDma;
use crate::wire::{self, TransportHdr, WireError};

/// A piece of payload that lives in registered memory.
#[derive(Debug, Clone)]
pub struct MemSeg {
    /// Memory.
    pub mem: Arc<SoftDma>,
    /// Offset of the first byte.
    pub offset: usize,
    /// Length.
    pub len: u32,
}

/// Payload of a packet.
#[derive(Debug, Clone, Default)]
pub enum PayloadData {
    /// No payload.
    #[default]
    Empty,
    /// Owned bytes.
    Bytes(Vec<u8>),
    /// References into registered memory, in order.
    Mem(SmallVec<[MemSeg; 2]>),
}

impl PayloadData {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Empty => 0,
            Self::Bytes(b) => b.len(),
            Self::Mem(segs) => segs.iter().map(|s| s.len as usize).sum(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the payload into `dst` at `dst_off`.
    ///
    /// # Errors
    /// A range outside `dst` (the caller checked it, so this means a bug, reported not panicked).
    pub fn copy_to(&self, dst: &SoftDma, dst_off: usize) -> Result<(), portverbs_hal::DmaError> {
        use portverbs_hal::DmaMemory;
        match self {
            Self::Empty => Ok(()),
            Self::Bytes(b) => dst.write(dst_off, b),
            Self::Mem(segs) => {
                let mut at = dst_off;
                for s in segs {
                    SoftDma::copy(&s.mem, s.offset, dst, at, s.len as usize)?;
                    at += s.len as usize;
                }
                Ok(())
            }
        }
    }

    /// Copies payload bytes `[from, from + len)` into `dst` at `dst_off`, straight from the
    /// sender's memory when the payload is a reference (one copy, as an HCA's DMA does).
    ///
    /// # Errors
    /// A range outside the payload or `dst`.
    pub fn copy_range_to(
        &self,
        from: usize,
        len: usize,
        dst: &SoftDma,
        dst_off: usize,
    ) -> Result<(), portverbs_hal::DmaError> {
        use portverbs_hal::DmaMemory;
        portverbs_hal::dma::check_range(from, len, self.len())?;
        match self {
            Self::Empty => Ok(()),
            Self::Bytes(b) => dst.write(dst_off, &b[from..from + len]),
            Self::Mem(segs) => {
                let mut pos = 0usize;
                let mut done = 0usize;
                for s in segs {
                    let seg_len = s.len as usize;
                    let start = from + done;
                    if done < len && start < pos + seg_len {
                        let within = start - pos;
                        let n = (seg_len - within).min(len - done);
                        SoftDma::copy(&s.mem, s.offset + within, dst, dst_off + done, n)?;
                        done += n;
                    }
                    pos += seg_len;
                }
                Ok(())
            }
        }
    }

    /// Copies `out.len()` bytes starting at payload offset `from` into `out`.
    ///
    /// # Errors
    /// The range is outside the payload or memory.
    pub fn read(&self, from: usize, out: &mut [u8]) -> Result<(), portverbs_hal::DmaError> {
        use portverbs_hal::DmaMemory;
        let total = self.len();
        portverbs_hal::dma::check_range(from, out.len(), total)?;
        match self {
            Self::Empty => Ok(()),
            Self::Bytes(b) => {
                out.copy_from_slice(&b[from..from + out.len()]);
                Ok(())
            }
            Self::Mem(segs) => {
                let mut pos = 0usize;
                let mut done = 0usize;
                for s in segs {
                    let seg_len = s.len as usize;
                    let start = from + done;
                    if done < out.len() && start < pos + seg_len {
                        let within = start - pos;
                        let n = (seg_len - within).min(out.len() - done);
                        s.mem.read(s.offset + within, &mut out[done..done + n])?;
                        done += n;
                    }
                    pos += seg_len;
                }
                Ok(())
            }
        }
    }

    /// The payload as owned bytes.
    ///
    /// # Errors
    /// Memory no longer readable.
    pub fn to_vec(&self) -> Result<Vec<u8>, portverbs_hal::DmaError> {
        let mut v = vec![0u8; self.len()];
        self.read(0, &mut v)?;
        Ok(v)
    }
}

/// One IB transport packet in flight.
#[derive(Debug, Clone)]
pub struct Packet {
    /// Source GID (the sender's port address).
    pub src_gid: Gid,
    /// Destination GID (routing key of the fabric).
    pub dst_gid: Gid,
    /// IPv6 flow label / entropy.
    pub flow_label: u32,
    /// Traffic class.
    pub traffic_class: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// UDP source port.
    pub udp_sport: u16,
    /// Transport headers (BTH and extensions).
    pub hdr: TransportHdr,
    /// Payload (without pad).
    pub payload: PayloadData,
}

impl Packet {
    /// Serialises the packet as a RoCEv2 frame (IP, UDP, transport headers, payload, pad, ICRC).
    ///
    /// # Errors
    /// Mixed IP families, or payload memory that can no longer be read.
    pub fn to_frame(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let mut hdr = [0u8; 64];
        let n = self.hdr.emit(&mut hdr)?;
        let payload = self
            .payload
            .to_vec()
            .map_err(|_| WireError::BadIpHeader("payload memory unreadable"))?;
        wire::build_frame(
            self.src_gid.to_ip(),
            self.dst_gid.to_ip(),
            self.udp_sport,
            &hdr[..n],
            &payload,
            out,
        )
    }

    /// Parses a RoCEv2 frame back into a packet. Returns `Ok(None)` when the ICRC does not match
    /// (the receiver silently drops such packets, as rxe does).
    ///
    /// # Errors
    /// A frame that is not valid RoCEv2.
    pub fn from_frame(frame: &[u8]) -> Result<Option<Self>, WireError> {
        let view = wire::parse_frame(frame)?;
        if !view.icrc_ok {
            return Ok(None);
        }
        let parsed = TransportHdr::parse(view.ib)?;
        let gid = |ip: IpAddr| Gid::from_ip(ip);
        Ok(Some(Self {
            src_gid: gid(view.src),
            dst_gid: gid(view.dst),
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 64,
            udp_sport: view.udp_sport,
            hdr: parsed.hdr,
            payload: if parsed.payload.is_empty() {
                PayloadData::Empty
            } else {
                PayloadData::Bytes(parsed.payload.to_vec())
            },
        }))
    }
}

/// PSN arithmetic modulo 2^24 (facts/ib-cm-and-rocev2.md §6.1).
pub mod psn {
    /// PSN mask.
    pub const MASK: u32 = 0x00ff_ffff;

    /// `a + n` modulo 2^24.
    pub fn add(a: u32, n: u32) -> u32 {
        a.wrapping_add(n) & MASK
    }

    /// Signed distance `a - b` in the 24-bit circle (positive: `a` is newer).
    pub fn diff(a: u32, b: u32) -> i32 {
        ((a.wrapping_sub(b)) << 8) as i32 >> 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_arithmetic_wraps_at_24_bits() {
        assert_eq!(psn::add(0xff_ffff, 1), 0);
        assert_eq!(psn::diff(0, 0xff_ffff), 1);
        assert_eq!(psn::diff(0xff_ffff, 0), -1);
        assert_eq!(psn::diff(5, 5), 0);
        assert_eq!(psn::diff(0x40_0000, 0), 0x40_0000);
        assert!(psn::diff(0x80_0000, 0) < 0, "2^23 ahead compares as older");
    }

    #[test]
    fn payload_reads_across_segments() {
        let a = SoftDma::alloc(16).unwrap();
        let b = SoftDma::alloc(16).unwrap();
        use portverbs_hal::DmaMemory;
        a.write(0, b"abcdefgh").unwrap();
        b.write(4, b"ijklmnop").unwrap();
        let p = PayloadData::Mem(SmallVec::from_vec(vec![
            MemSeg {
                mem: a,
                offset: 2,
                len: 6,
            },
            MemSeg {
                mem: b,
                offset: 4,
                len: 8,
            },
        ]));
        assert_eq!(p.len(), 14);
        assert_eq!(p.to_vec().unwrap(), b"cdefghijklmnop");
        let mut mid = [0u8; 5];
        p.read(4, &mut mid).unwrap();
        assert_eq!(&mid, b"ghijk");
        assert!(p.read(10, &mut mid).is_err());
    }
}

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
use crate::wire::{self, Opcode, Position, TransportHdr, WireError};

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

/// Largest payload kept inside the packet instead of on the heap.
pub const INLINE_PAYLOAD: usize = 32;

/// Payload of a packet.
#[derive(Debug, Clone, Default)]
pub enum PayloadData {
    /// No payload.
    #[default]
    Empty,
    /// Up to [`INLINE_PAYLOAD`] bytes carried in the packet itself (inline sends, small
    /// messages): no allocation.
    Inline {
        /// Bytes used.
        len: u8,
        /// Storage.
        bytes: [u8; INLINE_PAYLOAD],
    },
    /// Owned bytes.
    Bytes(Vec<u8>),
    /// References into registered memory, in order.
    Mem(SmallVec<[MemSeg; 2]>),
}

impl PayloadData {
    /// Owned bytes, inline when small.
    #[inline]
    pub fn from_slice(b: &[u8]) -> Self {
        if b.is_empty() {
            Self::Empty
        } else if b.len() <= INLINE_PAYLOAD {
            let mut bytes = [0u8; INLINE_PAYLOAD];
            bytes[..b.len()].copy_from_slice(b);
            Self::Inline {
                len: b.len() as u8,
                bytes,
            }
        } else {
            Self::Bytes(b.to_vec())
        }
    }

    /// The same bytes, no longer referring to registered memory: a [`PayloadData::Mem`]
    /// payload is read now (what an HCA's DMA read does when the packet leaves), so that the
    /// sender may reuse its buffer before the packet is delivered. Memory that can no longer
    /// be read gives an empty payload, as a registration removed before the packet was built
    /// does.
    pub fn into_owned(self) -> Self {
        match self {
            Self::Mem(_) => {
                let mut bytes = vec![0u8; self.len()];
                match self.read(0, &mut bytes) {
                    Ok(()) => Self::from_slice(&bytes),
                    Err(_) => Self::Empty,
                }
            }
            other => other,
        }
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        match self {
            Self::Empty => 0,
            Self::Inline { len, .. } => usize::from(*len),
            Self::Bytes(b) => b.len(),
            Self::Mem(segs) => segs.iter().map(|s| s.len as usize).sum(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the payload into `dst` at `dst_off`: what [`PayloadData::copy_range_to`] does
    /// for the whole payload, without its range check.
    ///
    /// # Errors
    /// A range outside `dst` (the caller checked it, so this means a bug, reported not panicked).
    #[inline]
    pub fn copy_to(&self, dst: &SoftDma, dst_off: usize) -> Result<(), portverbs_hal::DmaError> {
        use portverbs_hal::DmaMemory;
        match self {
            Self::Empty => Ok(()),
            Self::Inline { len, bytes } => dst.write(dst_off, &bytes[..usize::from(*len)]),
            Self::Bytes(b) => dst.write(dst_off, b),
            Self::Mem(segs) => {
                let mut at = dst_off;
                for s in segs.iter().filter(|s| s.len > 0) {
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
    #[inline]
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
            Self::Inline { bytes, .. } => dst.write(dst_off, &bytes[from..from + len]),
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
            Self::Inline { bytes, .. } => {
                out.copy_from_slice(&bytes[from..from + out.len()]);
                Ok(())
            }
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
    /// Transport headers (BTH and extensions). For a train: the BTH opcode and PSN of its
    /// first packet and the RETH/AETH that packet carries; immediate data, IETH, SE, AckReq and
    /// PadCnt belong to its last packet.
    pub hdr: TransportHdr,
    /// Payload (without pad); for a train, all its packets' payloads in order.
    pub payload: PayloadData,
    /// Number of consecutive packets of one message this value stands for (1 = a plain packet).
    /// Trains exist only between engines on a fault-free link (segmentation offload); the
    /// fabric splits them ([`Packet::split`]) before faults, captures or serialisation.
    pub train: u16,
    /// Opcode of the train's last packet (equal to `hdr.bth.opcode` when `train == 1`).
    pub train_last: Opcode,
    /// Payload bytes of every packet of a train but the last (the path MTU).
    pub train_mtu: u16,
}

impl Packet {
    /// A plain (non-train) packet.
    pub fn new(src_gid: Gid, dst_gid: Gid, hdr: TransportHdr, payload: PayloadData) -> Self {
        let op = hdr.bth.opcode;
        Self {
            src_gid,
            dst_gid,
            flow_label: 0,
            traffic_class: 0,
            hop_limit: 64,
            udp_sport: 0,
            hdr,
            payload,
            train: 1,
            train_last: op,
            train_mtu: 0,
        }
    }

    /// Number of PSNs the packet covers.
    #[inline]
    pub fn psn_count(&self) -> u32 {
        u32::from(self.train.max(1))
    }

    /// The individual packets of a train (a plain packet is returned as is).
    pub fn split(self) -> Vec<Self> {
        let mtu = usize::from(self.train_mtu);
        let k = usize::from(self.train.max(1));
        if k == 1 {
            return vec![self];
        }
        let first = self.hdr.bth.opcode;
        let last = self.train_last;
        let total = self.payload.len();
        let middle = |pos| match first.service() {
            wire::Service::Uc if first.is_write() => Opcode::write(wire::Service::Uc, pos, false),
            wire::Service::Uc => Opcode::send(wire::Service::Uc, pos, false, false),
            _ if first.is_write() => Opcode::write(wire::Service::Rc, pos, false),
            _ if first.is_read_response() => Opcode::read_response(pos),
            _ => Opcode::send(wire::Service::Rc, pos, false, false),
        };
        let mut out = Vec::with_capacity(k);
        for i in 0..k {
            let from = (i * mtu).min(total);
            let n = if i + 1 == k {
                total - from
            } else {
                mtu.min(total - from)
            };
            let mut hdr = TransportHdr::new(self.hdr.bth);
            hdr.bth.psn = psn::add(self.hdr.bth.psn, i as u32);
            hdr.bth.opcode = if i == 0 {
                first
            } else if i + 1 == k {
                last
            } else {
                middle(Position::Middle).unwrap_or(last)
            };
            let is_last = i + 1 == k;
            hdr.bth.solicited = is_last && self.hdr.bth.solicited;
            hdr.bth.ack_req = is_last && self.hdr.bth.ack_req;
            hdr.bth.pad_count = if is_last { self.hdr.bth.pad_count } else { 0 };
            if i == 0 {
                hdr.reth = self.hdr.reth;
            }
            if is_last {
                hdr.imm = self.hdr.imm;
                hdr.ieth = self.hdr.ieth;
            }
            if hdr.bth.opcode.headers().contains(wire::HeaderSet::AETH) {
                hdr.aeth = self.hdr.aeth;
            }
            let mut bytes = vec![0u8; n];
            let payload = match self.payload.read(from, &mut bytes) {
                Ok(()) => PayloadData::from_slice(&bytes),
                Err(_) => PayloadData::Empty,
            };
            out.push(Self {
                hdr,
                payload,
                train: 1,
                train_last: hdr.bth.opcode,
                ..self.clone()
            });
        }
        out
    }

    /// Serialises the packet as a RoCEv2 frame (IP, UDP, transport headers, payload, pad, ICRC),
    /// with the packet's own traffic class, hop limit and (IPv6) flow label in the IP header.
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
        let opts = wire::FrameOptions {
            traffic_class: self.traffic_class,
            hop_limit: self.hop_limit,
            flow_label: self.flow_label & 0xF_FFFF,
            ..wire::FrameOptions::default()
        };
        wire::build_frame_with(
            &opts,
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
            flow_label: view.flow_label,
            traffic_class: view.traffic_class,
            hop_limit: view.hop_limit,
            udp_sport: view.udp_sport,
            hdr: parsed.hdr,
            payload: PayloadData::from_slice(parsed.payload),
            train: 1,
            train_last: parsed.hdr.bth.opcode,
            train_mtu: 0,
        }))
    }
}

impl Packet {
    /// The packet a RoCEv2 datagram received from a UDP socket carries (its ICRC already
    /// checked by [`wire::open_datagram`]); `src_gid`/`dst_gid` are the datagram's addresses.
    ///
    /// # Errors
    /// Transport headers that do not parse.
    pub fn from_datagram(d: &wire::Datagram<'_>) -> Result<Self, WireError> {
        Self::from_datagram_with(d, PayloadData::from_slice)
    }

    /// [`Packet::from_datagram`], with the payload bytes placed by `place` (a receiver that
    /// keeps payloads in pooled memory instead of one allocation each).
    ///
    /// # Errors
    /// Transport headers that do not parse.
    pub fn from_datagram_with(
        d: &wire::Datagram<'_>,
        place: impl FnOnce(&[u8]) -> PayloadData,
    ) -> Result<Self, WireError> {
        let parsed = TransportHdr::parse(d.ib)?;
        let mut pkt = Self::new(
            Gid::from_ip(d.src),
            Gid::from_ip(d.dst),
            parsed.hdr,
            place(parsed.payload),
        );
        pkt.udp_sport = d.udp_sport;
        Ok(pkt)
    }

    /// Appends the packet's transport headers, payload and pad to `out` (a RoCEv2 datagram
    /// without its ICRC: [`wire::datagram_icrc`] computes that). A train must be split first.
    ///
    /// # Errors
    /// Headers that cannot be emitted, a pad count that does not fit the payload, or payload
    /// memory that cannot be read; `out` is then left as it was.
    pub fn write_datagram(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let start = out.len();
        let result = self.append_datagram(out);
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    fn append_datagram(&self, out: &mut Vec<u8>) -> Result<(), WireError> {
        let mut hdr = [0u8; 64];
        let n = self.hdr.emit(&mut hdr)?;
        let len = self.payload.len();
        let pad = wire::pad_len(len);
        if self.train > 1 || self.hdr.bth.pad_count != pad {
            return Err(WireError::BadPad {
                pad: self.hdr.bth.pad_count,
                payload: len,
            });
        }
        out.extend_from_slice(hdr.get(..n).unwrap_or(&[]));
        let at = out.len();
        out.resize(at + len + usize::from(pad), 0);
        let body = out.get_mut(at..at + len).unwrap_or(&mut []);
        self.payload
            .read(0, body)
            .map_err(|_| WireError::BadIpHeader("payload memory unreadable"))
    }
}

/// PSN arithmetic modulo 2^24 (as Linux rxe's `psn_compare`).
pub mod psn {
    /// PSN mask.
    pub const MASK: u32 = 0x00ff_ffff;

    /// `a + n` modulo 2^24.
    #[inline]
    pub fn add(a: u32, n: u32) -> u32 {
        a.wrapping_add(n) & MASK
    }

    /// Signed distance `a - b` in the 24-bit circle (positive: `a` is newer).
    #[inline]
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

#[cfg(test)]
mod train_tests {
    use super::*;
    use crate::wire::{Bth, Reth};

    #[test]
    fn a_write_train_splits_into_the_packets_it_stands_for() {
        let mut hdr = TransportHdr::new(Bth::new(Opcode::WriteFirst, 0x11, 100));
        hdr.reth = Some(Reth {
            va: 0x1000,
            rkey: 7,
            dma_len: 2600,
        });
        hdr.bth.ack_req = true;
        hdr.bth.pad_count = 0;
        let data: Vec<u8> = (0..2600u32).map(|i| i as u8).collect();
        let pkt = Packet {
            train: 3,
            train_last: Opcode::WriteLast,
            train_mtu: 1024,
            ..Packet::new(Gid::ZERO, Gid::ZERO, hdr, PayloadData::Bytes(data.clone()))
        };
        let parts = pkt.split();
        assert_eq!(parts.len(), 3);
        let ops: Vec<_> = parts.iter().map(|p| p.hdr.bth.opcode).collect();
        assert_eq!(
            ops,
            [Opcode::WriteFirst, Opcode::WriteMiddle, Opcode::WriteLast]
        );
        let psns: Vec<_> = parts.iter().map(|p| p.hdr.bth.psn).collect();
        assert_eq!(psns, [100, 101, 102]);
        assert!(parts[0].hdr.reth.is_some() && parts[1].hdr.reth.is_none());
        assert!(!parts[0].hdr.bth.ack_req && parts[2].hdr.bth.ack_req);
        let lens: Vec<_> = parts.iter().map(|p| p.payload.len()).collect();
        assert_eq!(lens, [1024, 1024, 552]);
        let mut joined = Vec::new();
        for p in &parts {
            joined.extend(p.payload.to_vec().unwrap());
            p.hdr.validate().unwrap();
        }
        assert_eq!(joined, data);
    }
}

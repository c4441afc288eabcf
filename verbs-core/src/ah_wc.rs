//! Address handles that answer a received datagram: libibverbs' `ibv_init_ah_from_wc` and
//! `ibv_create_ah_from_wc` (rdma-core `libibverbs/verbs.c`). A UD receive starts with the
//! 40-byte GRH area ([`GRH_LEN`]): an IPv6 header, or on RoCEv2 over IPv4 20 unused bytes
//! and then the IPv4 header. The sender is that header's source; the local GID it was sent
//! to names the source GID index of the answer.
//!
//! Read as libibverbs reads it: the IP version from the header (an area that looks like
//! both is IPv4 when its IPv4 header has 5 words and a valid checksum), source and
//! destination GIDs swapped, the flow label (IPv6) and traffic class copied, the remote LID,
//! SL and path bits taken from the completion. A multicast destination names no GID of this
//! port, so it is refused, as libibverbs refuses it.
//!
//! The hop limit is [`REPLY_HOP_LIMIT`] (255), what the Linux kernel's
//! `ib_init_ah_attr_from_wc` (`drivers/infiniband/core/verbs.c`) starts from and older
//! libibverbs set. Current rdma-core copies the received hop limit (IPv4: the TTL the
//! datagram arrived with) instead; that value has already been lowered by every router on
//! the way, so an answer sent with it may run out before it gets back. 255 always reaches.

use portverbs_hal::attr::AddressVector;
use portverbs_hal::block_on;
use portverbs_hal::device::Device;
use portverbs_hal::types::{Gid, LinkLayer};
use portverbs_hal::wc::{WcFlags, WorkCompletion};
use thiserror::Error;

use crate::ah::AddressHandle;
use crate::context::Context;
use crate::error::{AhError, QueryError};
use crate::pd::Pd;

/// Bytes of the GRH area at the start of every UD receive (IBA 11.4.1.2).
pub const GRH_LEN: usize = 40;

/// The hop limit of an address vector made from a completion (see the module docs).
pub const REPLY_HOP_LIMIT: u8 = 0xFF;

/// IPv6 next header of RoCEv2 (UDP) and of RoCEv1 (the IBA BTH).
const NEXT_HDR_UDP: u8 = 17;
const NEXT_HDR_IB: u8 = 0x1B;

/// Why a GRH area could not be read. The area comes from the wire: every defect is one of
/// these, never a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum GrhError {
    /// Fewer than [`GRH_LEN`] bytes.
    #[error("the GRH area is {0} bytes; it takes {GRH_LEN}")]
    Truncated(usize),
    /// Neither an IPv6 header (version 6 at byte 0) nor an IPv4 header (version 4 at byte 20).
    #[error("no IP header in the GRH area (version nibbles {ipv6} at byte 0, {ipv4} at byte 20)")]
    NoIpHeader {
        /// The version nibble at byte 0.
        ipv6: u8,
        /// The version nibble at byte 20.
        ipv4: u8,
    },
    /// An IPv6 header whose next header is neither UDP (RoCEv2) nor 0x1B (RoCEv1).
    #[error("the GRH's next header is {0}, neither UDP nor 0x1B")]
    NextHeader(u8),
}

/// The GRH area of a received datagram, read ([`ReceivedGrh::parse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceivedGrh {
    /// The sender's GID (an IPv4 source as `::ffff:a.b.c.d`).
    pub sgid: Gid,
    /// The GID the datagram was sent to: one of this port's, or a multicast group.
    pub dgid: Gid,
    /// Traffic class (IPv4: the TOS byte).
    pub traffic_class: u8,
    /// Flow label (20 bits; 0 for IPv4).
    pub flow_label: u32,
    /// The hop limit (IPv4: TTL) the datagram arrived with.
    pub hop_limit: u8,
    /// The area holds an IPv4 header (RoCEv2 over IPv4).
    pub ipv4: bool,
}

/// Whether the 20 bytes are an IPv4 header with 5 words and a valid checksum.
fn valid_ipv4_header(h: &[u8]) -> bool {
    if h.len() != 20 || h[0] & 0x0F != 5 {
        return false;
    }
    let mut sum: u32 = h
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum == 0xFFFF
}

fn gid_at(area: &[u8], at: usize) -> Gid {
    let mut g = [0u8; 16];
    g.copy_from_slice(&area[at..at + 16]);
    Gid(g)
}

impl ReceivedGrh {
    /// Reads the first [`GRH_LEN`] bytes of a UD receive buffer.
    ///
    /// # Errors
    /// [`GrhError`]: too short, no IP header, or an IPv6 next header that is not RoCE.
    pub fn parse(area: &[u8]) -> Result<Self, GrhError> {
        let area = area.get(..GRH_LEN).ok_or(GrhError::Truncated(area.len()))?;
        let (ipv6, ipv4) = (area[0] >> 4, area[20] >> 4);
        let is_v4 = match ipv6 {
            6 => valid_ipv4_header(&area[20..]),
            _ if ipv4 == 4 => true,
            _ => return Err(GrhError::NoIpHeader { ipv6, ipv4 }),
        };
        if is_v4 {
            let h = &area[20..];
            let ip = |at: usize| Gid::from_ipv4([h[at], h[at + 1], h[at + 2], h[at + 3]].into());
            return Ok(Self {
                sgid: ip(12),
                dgid: ip(16),
                traffic_class: h[1],
                flow_label: 0,
                hop_limit: h[8],
                ipv4: true,
            });
        }
        if area[6] != NEXT_HDR_UDP && area[6] != NEXT_HDR_IB {
            return Err(GrhError::NextHeader(area[6]));
        }
        let vtf = u32::from_be_bytes([area[0], area[1], area[2], area[3]]);
        Ok(Self {
            sgid: gid_at(area, 8),
            dgid: gid_at(area, 24),
            traffic_class: (vtf >> 20) as u8,
            flow_label: vtf & 0xF_FFFF,
            hop_limit: area[7],
            ipv4: false,
        })
    }

    /// Whether the datagram was sent to a multicast group (IPv4 class D, or an IPv6 GID
    /// starting with 0xFF).
    pub fn to_multicast(&self) -> bool {
        self.dgid.0[0] == 0xFF || (self.ipv4 && self.dgid.to_ip().is_multicast())
    }

    /// The address vector that answers the sender of `wc` from port `port` and the local GID
    /// at `sgid_index`: GRH toward [`ReceivedGrh::sgid`], this flow label and traffic class,
    /// hop limit [`REPLY_HOP_LIMIT`], and the completion's source LID, SL and path bits.
    pub fn reply_av(&self, wc: &WorkCompletion, port: u8, sgid_index: u8) -> AddressVector {
        AddressVector {
            dgid: self.sgid,
            sgid_index,
            flow_label: self.flow_label,
            hop_limit: REPLY_HOP_LIMIT,
            traffic_class: self.traffic_class,
            is_global: true,
            dlid: wc.slid,
            sl: wc.sl,
            src_path_bits: wc.dlid_path_bits,
            static_rate: 0,
            port_num: port,
        }
    }
}

impl<D: Device> Context<D> {
    /// The address vector that answers the sender of a received datagram
    /// (`ibv_init_ah_from_wc`): `wc` is its completion, `grh` the start of its receive buffer
    /// (at least [`GRH_LEN`] bytes), `port` the port it came in on. The source GID index is
    /// that of the local GID the datagram was sent to. A completion without
    /// [`WcFlags::GRH`] gives, on an InfiniBand port, an address by LID alone.
    ///
    /// # Errors
    /// [`AhError::NoSuchPort`]; [`AhError::NoGrh`] (a RoCE port, and the completion says no
    /// GRH came); [`AhError::BadGrh`]; [`AhError::MulticastDestination`];
    /// [`AhError::NotLocalGid`] (no entry of the port's GID table holds the GRH's
    /// destination); [`AhError::Device`].
    pub async fn init_ah_from_wc(
        &self,
        port: u8,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<AddressVector, AhError> {
        let pattr = port
            .checked_sub(1)
            .and_then(|i| self.inner.port_attrs.get(usize::from(i)))
            .ok_or(AhError::NoSuchPort { port })?;
        if !wc.wc_flags.contains(WcFlags::GRH) {
            if pattr.link_layer == LinkLayer::Ethernet {
                return Err(AhError::NoGrh { port });
            }
            return Ok(AddressVector {
                dlid: wc.slid,
                sl: wc.sl,
                src_path_bits: wc.dlid_path_bits,
                port_num: port,
                ..AddressVector::default()
            });
        }
        let g = ReceivedGrh::parse(grh)?;
        if g.to_multicast() {
            return Err(AhError::MulticastDestination { gid: g.dgid });
        }
        let index = self
            .local_gid_index(port, pattr.gid_tbl_len, g.dgid)
            .await?;
        Ok(g.reply_av(wc, port, index))
    }

    /// Blocking form of [`Context::init_ah_from_wc`].
    ///
    /// # Errors
    /// As [`Context::init_ah_from_wc`].
    pub fn init_ah_from_wc_blocking(
        &self,
        port: u8,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<AddressVector, AhError> {
        block_on(self.init_ah_from_wc(port, wc, grh))
    }

    /// The index of `gid` in `port`'s GID table (of `len` entries; an address vector names
    /// one of the first 256).
    async fn local_gid_index(&self, port: u8, len: u32, gid: Gid) -> Result<u8, AhError> {
        for i in (0..=u8::MAX).take_while(|&i| u32::from(i) < len) {
            match self.query_gid(port, u32::from(i)).await {
                Ok(e) if e.gid == gid => return Ok(i),
                Ok(_) | Err(QueryError::EmptyGid { .. }) => {}
                Err(QueryError::Device(e)) => return Err(AhError::Device(e)),
                Err(_) => break,
            }
        }
        Err(AhError::NotLocalGid { port, gid })
    }
}

impl<D: Device> Pd<D> {
    /// An address handle that answers the sender of a received datagram
    /// (`ibv_create_ah_from_wc`): [`Context::init_ah_from_wc`], then [`Pd::create_ah`].
    ///
    /// # Errors
    /// As [`Context::init_ah_from_wc`] and [`Pd::create_ah`].
    pub async fn create_ah_from_wc(
        &self,
        wc: &WorkCompletion,
        grh: &[u8],
        port: u8,
    ) -> Result<AddressHandle<D>, AhError> {
        let av = self.context().init_ah_from_wc(port, wc, grh).await?;
        self.create_ah(av).await
    }

    /// Blocking form of [`Pd::create_ah_from_wc`].
    ///
    /// # Errors
    /// As [`Pd::create_ah_from_wc`].
    pub fn create_ah_from_wc_blocking(
        &self,
        wc: &WorkCompletion,
        grh: &[u8],
        port: u8,
    ) -> Result<AddressHandle<D>, AhError> {
        block_on(self.create_ah_from_wc(wc, grh, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An IPv4 RoCEv2 GRH area as the transport writes it: 20 zero bytes, then the header.
    fn ipv4_area(src: [u8; 4], dst: [u8; 4], tos: u8, ttl: u8) -> [u8; GRH_LEN] {
        let mut g = [0u8; GRH_LEN];
        let h = &mut g[20..];
        h[0] = 0x45;
        h[1] = tos;
        h[2..4].copy_from_slice(&60u16.to_be_bytes());
        h[6] = 0x40;
        h[8] = ttl;
        h[9] = 17;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let mut sum: u32 = h
            .chunks_exact(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xFFFF {
            sum = (sum & 0xFFFF) + (sum >> 16);
        }
        h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        g
    }

    fn ipv6_area(src: Gid, dst: Gid, tclass: u8, flow: u32, hops: u8) -> [u8; GRH_LEN] {
        let mut g = [0u8; GRH_LEN];
        let vtf = (6u32 << 28) | (u32::from(tclass) << 20) | flow;
        g[0..4].copy_from_slice(&vtf.to_be_bytes());
        g[6] = NEXT_HDR_UDP;
        g[7] = hops;
        g[8..24].copy_from_slice(&src.0);
        g[24..40].copy_from_slice(&dst.0);
        g
    }

    #[test]
    fn an_ipv4_area_gives_the_sender_as_destination() {
        let g = ReceivedGrh::parse(&ipv4_area([10, 0, 0, 2], [10, 0, 0, 1], 0x68, 61)).unwrap();
        assert!(g.ipv4);
        assert_eq!(g.sgid, Gid::from_ipv4([10, 0, 0, 2].into()));
        assert_eq!(g.dgid, Gid::from_ipv4([10, 0, 0, 1].into()));
        assert_eq!((g.traffic_class, g.flow_label, g.hop_limit), (0x68, 0, 61));
        let wc = WorkCompletion {
            slid: 7,
            sl: 3,
            dlid_path_bits: 1,
            ..WorkCompletion::default()
        };
        let av = g.reply_av(&wc, 1, 4);
        assert_eq!(av.dgid, g.sgid, "the answer goes to the sender");
        assert_eq!((av.sgid_index, av.port_num), (4, 1));
        assert_eq!(av.hop_limit, REPLY_HOP_LIMIT, "not the TTL it arrived with");
        assert_eq!((av.traffic_class, av.flow_label), (0x68, 0));
        assert!(av.is_global);
        assert_eq!((av.dlid, av.sl, av.src_path_bits), (7, 3, 1));
    }

    #[test]
    fn an_ipv6_area_keeps_flow_label_and_traffic_class() {
        let src = Gid::from_ip("fe80::2".parse().unwrap());
        let dst = Gid::from_ip("fe80::1".parse().unwrap());
        let g = ReceivedGrh::parse(&ipv6_area(src, dst, 0xb8, 0x12345, 9)).unwrap();
        assert!(!g.ipv4);
        assert_eq!((g.sgid, g.dgid), (src, dst));
        assert_eq!(
            (g.traffic_class, g.flow_label, g.hop_limit),
            (0xb8, 0x12345, 9)
        );
        assert!(!g.to_multicast());
    }

    #[test]
    fn an_ipv6_header_whose_second_half_looks_like_ipv4_stays_ipv6() {
        let src = Gid::from_ip("2001:db8::2".parse().unwrap());
        let mut dst = [0u8; 16];
        dst[0] = 0x20;
        dst[12] = 0x45; // byte 20 of the area: an IPv4 version nibble, but no valid header
        let g = ReceivedGrh::parse(&ipv6_area(src, Gid(dst), 0, 0, 64)).unwrap();
        assert!(!g.ipv4);
        assert_eq!(g.dgid, Gid(dst));
    }

    #[test]
    fn malformed_areas_are_typed_errors() {
        assert_eq!(ReceivedGrh::parse(&[]), Err(GrhError::Truncated(0)));
        assert_eq!(
            ReceivedGrh::parse(&[0x60; 39]),
            Err(GrhError::Truncated(39))
        );
        assert_eq!(
            ReceivedGrh::parse(&[0u8; 40]),
            Err(GrhError::NoIpHeader { ipv6: 0, ipv4: 0 })
        );
        let mut g = ipv6_area(Gid::ZERO, Gid::ZERO, 0, 0, 1);
        g[6] = 6; // TCP
        assert_eq!(ReceivedGrh::parse(&g), Err(GrhError::NextHeader(6)));
        // Every byte pattern of the version bytes parses or errs; none panics.
        for b in 0..=255u8 {
            let mut g = [b; GRH_LEN];
            g[20] = b.rotate_left(4);
            let _ = ReceivedGrh::parse(&g);
        }
    }

    #[test]
    fn multicast_destinations_are_recognised() {
        let g = ReceivedGrh::parse(&ipv4_area([10, 0, 0, 2], [239, 1, 2, 3], 0, 1)).unwrap();
        assert!(g.to_multicast());
        let mc = Gid::from_ip("ff0e::1".parse().unwrap());
        let g = ReceivedGrh::parse(&ipv6_area(Gid::ZERO, mc, 0, 0, 1)).unwrap();
        assert!(g.to_multicast());
    }
}

//! rdma_cm's conventions carried in CM messages (Linux `core/cma.c`): service IDs built from a
//! port space and a port, and the 36-byte CMA header at the start of REQ and SIDR_REQ private
//! data. Codec only; address resolution is the rdma_cm layer's job (`portverbs-cm-service`).
//!
//! ```text
//! 0      CMA version (0)
//! 1      IP version in bits 7..4 (4 or 6), bits 3..0 reserved
//! 2..4   source port (big-endian)
//! 4..20  source IP: IPv6 in full; IPv4 as 12 zero bytes then the address
//! 20..36 destination IP, same encoding
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::CmaError;

/// Bytes of the CMA header.
pub const CMA_HEADER_LEN: usize = 36;
/// The IP-CM service ID prefix (IBTA annex A11) and the mask that selects it.
pub const IP_CM_SERVICE_ID: u64 = 0x0000_0000_0100_0000;
/// Mask of [`IP_CM_SERVICE_ID`].
pub const IP_CM_SERVICE_MASK: u64 = 0xFFFF_FFFF_FF00_0000;

/// An rdma_cm port space; unknown values preserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpace {
    /// RDMA_PS_TCP (0x0106): RC connections.
    Tcp,
    /// RDMA_PS_UDP (0x0111): UD, resolved with SIDR.
    Udp,
    /// RDMA_PS_IB (0x013F).
    Ib,
    /// Any other value.
    Other(u16),
}

impl PortSpace {
    /// The wire value.
    pub const fn to_u16(self) -> u16 {
        match self {
            Self::Tcp => 0x0106,
            Self::Udp => 0x0111,
            Self::Ib => 0x013F,
            Self::Other(v) => v,
        }
    }

    /// The port space for a wire value.
    pub const fn from_u16(v: u16) -> Self {
        match v {
            0x0106 => Self::Tcp,
            0x0111 => Self::Udp,
            0x013F => Self::Ib,
            other => Self::Other(other),
        }
    }
}

/// The service ID rdma_cm listens on and connects to: `(port_space << 16) | port`.
pub const fn service_id(ps: PortSpace, port: u16) -> u64 {
    ((ps.to_u16() as u64) << 16) | port as u64
}

/// The port space and port of an IP-CM service ID; `None` outside the IP-CM prefix.
pub const fn split_service_id(sid: u64) -> Option<(PortSpace, u16)> {
    if sid & IP_CM_SERVICE_MASK != IP_CM_SERVICE_ID {
        return None;
    }
    Some((PortSpace::from_u16((sid >> 16) as u16), sid as u16))
}

/// The CMA header of a REQ or SIDR_REQ from an IP-addressed rdma_cm id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmaHeader {
    /// The active side's rdma_cm port.
    pub src_port: u16,
    /// The active side's IP.
    pub src: IpAddr,
    /// The passive side's IP (its port is in the service ID).
    pub dst: IpAddr,
}

impl CmaHeader {
    /// Parses the first [`CMA_HEADER_LEN`] bytes of private data. Linux accepts only version
    /// 0 and IP version 4 or 6; so does this.
    pub fn parse(pd: &[u8]) -> Result<Self, CmaError> {
        let h = pd
            .get(..CMA_HEADER_LEN)
            .ok_or(CmaError::Truncated(pd.len()))?;
        if h[0] != 0 {
            return Err(CmaError::Version(h[0]));
        }
        let ipv = h[1] >> 4;
        let addr = |at: usize| -> IpAddr {
            let mut b = [0u8; 16];
            b.copy_from_slice(&h[at..at + 16]);
            if ipv == 4 {
                IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15]))
            } else {
                IpAddr::V6(Ipv6Addr::from(b))
            }
        };
        if ipv != 4 && ipv != 6 {
            return Err(CmaError::IpVersion(ipv));
        }
        Ok(Self {
            src_port: u16::from_be_bytes([h[2], h[3]]),
            src: addr(4),
            dst: addr(20),
        })
    }

    /// Writes the header into the first [`CMA_HEADER_LEN`] bytes of `out`.
    pub fn emit(&self, out: &mut [u8]) -> Result<(), CmaError> {
        let have = out.len();
        let h = out
            .get_mut(..CMA_HEADER_LEN)
            .ok_or(CmaError::Truncated(have))?;
        h.fill(0);
        let ipv = match (self.src, self.dst) {
            (IpAddr::V4(_), IpAddr::V4(_)) => 4,
            (IpAddr::V6(_), IpAddr::V6(_)) => 6,
            _ => return Err(CmaError::MixedFamilies),
        };
        h[1] = ipv << 4;
        h[2..4].copy_from_slice(&self.src_port.to_be_bytes());
        for (at, ip) in [(4, self.src), (20, self.dst)] {
            match ip {
                IpAddr::V4(v4) => h[at + 12..at + 16].copy_from_slice(&v4.octets()),
                IpAddr::V6(v6) => h[at..at + 16].copy_from_slice(&v6.octets()),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ids_split_as_wireshark_shows_them() {
        let sid = service_id(PortSpace::Tcp, 7471);
        assert_eq!(sid.to_be_bytes(), [0, 0, 0, 0, 0x01, 0x06, 0x1d, 0x2f]);
        assert_eq!(split_service_id(sid), Some((PortSpace::Tcp, 7471)));
        assert_eq!(service_id(PortSpace::Udp, 1), 0x0111_0001);
        assert_eq!(
            split_service_id(0x0000_0000_0001_0000),
            None,
            "SDP is not IP-CM"
        );
        assert_eq!(
            split_service_id(0x0000_0000_01ab_0001),
            Some((PortSpace::Other(0x01ab), 1))
        );
    }

    #[test]
    fn ipv4_header_bytes() {
        let h = CmaHeader {
            src_port: 0xc123,
            src: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            dst: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        };
        let mut pd = [0xaa; 56];
        h.emit(&mut pd).expect("room");
        let mut want = [0u8; 36];
        want[1] = 0x40;
        want[2..4].copy_from_slice(&[0xc1, 0x23]);
        want[16..20].copy_from_slice(&[10, 0, 0, 1]);
        want[32..36].copy_from_slice(&[10, 0, 0, 2]);
        assert_eq!(pd[..36], want);
        assert_eq!(pd[36], 0xaa, "consumer data untouched");
        assert_eq!(CmaHeader::parse(&pd), Ok(h));
    }

    #[test]
    fn ipv6_round_trips() {
        let h = CmaHeader {
            src_port: 1,
            src: IpAddr::V6("fe80::1".parse().expect("ip")),
            dst: IpAddr::V6("2001:db8::2".parse().expect("ip")),
        };
        let mut pd = [0u8; 36];
        h.emit(&mut pd).expect("room");
        assert_eq!(pd[1], 0x60);
        assert_eq!(CmaHeader::parse(&pd), Ok(h));
    }

    #[test]
    fn bad_headers_are_typed_errors() {
        let mut pd = [0u8; 36];
        pd[1] = 0x40;
        assert_eq!(CmaHeader::parse(&pd[..35]), Err(CmaError::Truncated(35)));
        pd[0] = 0x10;
        assert_eq!(CmaHeader::parse(&pd), Err(CmaError::Version(0x10)));
        pd[0] = 0;
        pd[1] = 0x50;
        assert_eq!(CmaHeader::parse(&pd), Err(CmaError::IpVersion(5)));
        let mixed = CmaHeader {
            src_port: 0,
            src: IpAddr::V4(Ipv4Addr::LOCALHOST),
            dst: IpAddr::V6(Ipv6Addr::LOCALHOST),
        };
        assert_eq!(mixed.emit(&mut pd), Err(CmaError::MixedFamilies));
        assert_eq!(mixed.emit(&mut pd[..10]), Err(CmaError::Truncated(10)));
    }
}

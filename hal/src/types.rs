//! Basic InfiniBand vocabulary shared by every layer: GIDs, MTUs, QP types and states, access
//! flags. Numeric values follow libibverbs (`verbs.h`) so that tools and logs read the same.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

mod gid_text;

pub use gid_text::{GidParseError, GidText};

bitflags::bitflags! {
    /// Memory access rights of an MR or MW (`enum ibv_access_flags`).
    ///
    /// IBTA rule enforced by `verbs-core`: `REMOTE_WRITE` and `REMOTE_ATOMIC` require
    /// `LOCAL_WRITE`. Local read is always granted.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AccessFlags: u32 {
        /// The device may write the memory locally (receives, RDMA-read responses, atomics results).
        const LOCAL_WRITE = 1;
        /// Remote peers may RDMA-write the memory.
        const REMOTE_WRITE = 1 << 1;
        /// Remote peers may RDMA-read the memory.
        const REMOTE_READ = 1 << 2;
        /// Remote peers may run atomics on the memory.
        const REMOTE_ATOMIC = 1 << 3;
        /// Memory windows may be bound to this MR.
        const MW_BIND = 1 << 4;
        /// Zero-based addressing (offsets instead of virtual addresses); windows only.
        const ZERO_BASED = 1 << 5;
    }
}

impl AccessFlags {
    /// Every remote right.
    pub const REMOTE: Self = Self::REMOTE_WRITE
        .union(Self::REMOTE_READ)
        .union(Self::REMOTE_ATOMIC);

    /// True when some remote access is granted (the MR then has an rkey worth publishing).
    pub fn has_remote(self) -> bool {
        self.intersects(Self::REMOTE)
    }
}

/// Transport service of a queue pair (`enum ibv_qp_type` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpType {
    /// Reliable connected.
    Rc = 2,
    /// Unreliable connected.
    Uc = 3,
    /// Unreliable datagram.
    Ud = 4,
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Rc => "RC",
            Self::Uc => "UC",
            Self::Ud => "UD",
        })
    }
}

/// A queue pair with a number and a role fixed by IBA, created on purpose rather than drawn
/// from the device's pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpecialQp {
    /// The General Services Interface QP (IBA 13.5.1): QP number 1, unreliable datagram,
    /// Q_Key [`SpecialQp::GSI_QKEY`]; the connection manager's MADs travel on it. One per
    /// device port; on RoCE it is reached like any UD QP, at QP number 1 of the peer's GID.
    Gsi,
}

impl SpecialQp {
    /// The GSI QP's number.
    pub const GSI_QPN: u32 = 1;
    /// The well-known Q_Key of QP1 (IBA 13.5.1.1): its receives accept only this one, and a
    /// sender's work request names it (its high bit set means "the QP's own Q_Key", which
    /// for QP1 is this value as well).
    pub const GSI_QKEY: u32 = 0x8001_0000;

    /// The QP number this special QP has.
    pub const fn qpn(self) -> u32 {
        match self {
            Self::Gsi => Self::GSI_QPN,
        }
    }

    /// The transport it runs (GSI: UD).
    pub const fn qp_type(self) -> QpType {
        match self {
            Self::Gsi => QpType::Ud,
        }
    }
}

/// Queue-pair state (IBA 10.3.1; `enum ibv_qp_state` values). `Display` prints the IBA name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum QpState {
    /// Reset: no work requests accepted.
    Reset = 0,
    /// Initialized: receives may be posted.
    Init = 1,
    /// Ready to receive.
    Rtr = 2,
    /// Ready to send.
    Rts = 3,
    /// Send queue drained.
    Sqd = 4,
    /// Send queue error (UC/UD).
    Sqe = 5,
    /// Error: everything posted completes with `WR_FLUSH_ERR`.
    Err = 6,
}

impl QpState {
    /// All states, in numeric order.
    pub const ALL: [Self; 7] = [
        Self::Reset,
        Self::Init,
        Self::Rtr,
        Self::Rts,
        Self::Sqd,
        Self::Sqe,
        Self::Err,
    ];

    /// Decodes the libibverbs numeric value.
    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.get(usize::from(v)).copied()
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Reset => "RESET",
            Self::Init => "INIT",
            Self::Rtr => "RTR",
            Self::Rts => "RTS",
            Self::Sqd => "SQD",
            Self::Sqe => "SQE",
            Self::Err => "ERR",
        })
    }
}

/// IB path MTU (`enum ibv_mtu`: the code is 1..=5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Mtu {
    /// 256 bytes.
    Mtu256 = 1,
    /// 512 bytes.
    Mtu512 = 2,
    /// 1024 bytes.
    Mtu1024 = 3,
    /// 2048 bytes.
    Mtu2048 = 4,
    /// 4096 bytes.
    Mtu4096 = 5,
}

impl Mtu {
    /// Payload bytes per packet.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// Decodes the IB encoding (1..=5).
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::Mtu256,
            2 => Self::Mtu512,
            3 => Self::Mtu1024,
            4 => Self::Mtu2048,
            5 => Self::Mtu4096,
            _ => return None,
        })
    }

    /// The MTU whose payload is exactly `bytes`.
    pub fn from_bytes(bytes: u32) -> Option<Self> {
        Some(match bytes {
            256 => Self::Mtu256,
            512 => Self::Mtu512,
            1024 => Self::Mtu1024,
            2048 => Self::Mtu2048,
            4096 => Self::Mtu4096,
            _ => return None,
        })
    }
}

impl fmt::Display for Mtu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

/// Logical port state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PortState {
    /// No link.
    Down = 1,
    /// Link up, not yet configured by a subnet manager.
    Init = 2,
    /// Configured, not yet active.
    Armed = 3,
    /// Active: data can flow.
    Active = 4,
    /// Active, deferring.
    ActiveDefer = 5,
}

impl fmt::Display for PortState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Down => "PORT_DOWN",
            Self::Init => "PORT_INIT",
            Self::Armed => "PORT_ARMED",
            Self::Active => "PORT_ACTIVE",
            Self::ActiveDefer => "PORT_ACTIVE_DEFER",
        })
    }
}

/// Link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// Native InfiniBand (LIDs, subnet manager).
    InfiniBand,
    /// Ethernet: RoCE, addressed by GIDs derived from IP addresses.
    Ethernet,
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::InfiniBand => "InfiniBand",
            Self::Ethernet => "Ethernet",
        })
    }
}

/// Node transport (`enum ibv_transport_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Transport {
    /// InfiniBand transport (also RoCE).
    InfiniBand = 0,
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("InfiniBand")
    }
}

/// Memory-window type (IBA 10.6.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MwType {
    /// Type 1: bound with a bind operation, invalidated by rebinding with length 0.
    Type1 = 1,
    /// Type 2: bound to a QP through a bind work request, invalidated by LOCAL_INV or SEND_WITH_INV.
    Type2 = 2,
}

impl MwType {
    /// Decodes the numeric type; `None` for anything but 1 and 2 (IBA knows no type 3).
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Type1),
            2 => Some(Self::Type2),
            _ => None,
        }
    }
}

/// A 128-bit global identifier. On RoCEv2 ports it is an IPv6 address, IPv4 addresses being
/// mapped as `::ffff:a.b.c.d` (as Linux's RoCE GID tables hold them).
///
/// `Display` writes the IPv6 text of glibc's `inet_ntop` and `FromStr` reads IPv6 or IPv4 text
/// and the 32-hex-digit wire form; [`GidText`] has every form the RDMA tools use.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID (an empty table entry).
    pub const ZERO: Self = Self([0; 16]);

    /// The RoCEv2 GID of an IPv4 address (IPv4-mapped IPv6).
    pub fn from_ipv4(ip: Ipv4Addr) -> Self {
        Self(ip.to_ipv6_mapped().octets())
    }

    /// The RoCEv2 GID of an IPv6 address (used verbatim).
    pub fn from_ipv6(ip: Ipv6Addr) -> Self {
        Self(ip.octets())
    }

    /// The RoCEv2 GID of any IP address.
    pub fn from_ip(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => Self::from_ipv4(v4),
            IpAddr::V6(v6) => Self::from_ipv6(v6),
        }
    }

    /// The IP address this GID stands for on a RoCEv2 port (IPv4-mapped GIDs give IPv4).
    pub fn to_ip(self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// True for the IPv4-mapped form.
    pub fn is_ipv4_mapped(self) -> bool {
        Ipv6Addr::from(self.0).to_ipv4_mapped().is_some()
    }

    /// True for the all-zero GID.
    pub fn is_zero(self) -> bool {
        self == Self::ZERO
    }

    /// True for a multicast GID (MGID): first byte 0xFF (IBA 4.1.1; on RoCEv2 the IPv6
    /// multicast prefix ff00::/8). An IPv4 group's MGID is the IPv4-mapped form
    /// `::ffff:a.b.c.d` (what Linux's rdma_cm makes, `drivers/infiniband/core/cma.c`), so
    /// [`Gid::mcast_ip`] is what names a group on a RoCEv2 wire.
    pub fn is_multicast(self) -> bool {
        self.0[0] == 0xff || self.mcast_ip().is_some()
    }

    /// The IP multicast group this GID stands for on a RoCEv2 port: an IPv6 multicast
    /// address (ff00::/8) as is, or the IPv4 group (224.0.0.0/4) of an IPv4-mapped GID.
    /// `None` for a unicast GID.
    pub fn mcast_ip(self) -> Option<IpAddr> {
        match self.to_ip() {
            ip if ip.is_multicast() => Some(ip),
            _ => None,
        }
    }

    /// Parses the `ibv_devinfo` form (`0000:0000:…` eight groups) or any IPv4/IPv6 text.
    pub fn parse(text: &str) -> Option<Self> {
        if let Ok(ip) = text.parse::<IpAddr>() {
            return Some(Self::from_ip(ip));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multicast_gids_follow_rdma_cm_on_rocev2() {
        // An IPv4 group as rdma_cm names it on RoCEv2: ::ffff:239.1.2.3.
        let v4 = Gid::from_ipv4(Ipv4Addr::new(239, 1, 2, 3));
        assert!(v4.is_multicast());
        assert_eq!(v4.mcast_ip(), Some(IpAddr::V4(Ipv4Addr::new(239, 1, 2, 3))));
        // The RoCEv1 form ff0e::ffff:a.b.c.d and any ff00::/8 address are groups too.
        let mut v1 = v4;
        v1.0[0] = 0xff;
        v1.0[1] = 0x0e;
        assert!(v1.is_multicast());
        let v6 = Gid::from_ipv6("ff12::1:2".parse().unwrap());
        assert!(v6.is_multicast());
        assert_eq!(v6.mcast_ip(), Some(v6.to_ip()));
        for unicast in [
            Gid::ZERO,
            Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 1)),
            Gid::from_ipv4(Ipv4Addr::new(240, 0, 0, 1)),
            Gid::from_ipv6("fe80::1".parse().unwrap()),
        ] {
            assert!(!unicast.is_multicast(), "{unicast}");
            assert_eq!(unicast.mcast_ip(), None);
        }
    }

    #[test]
    fn ipv4_gid_is_v4_mapped_and_round_trips() {
        let gid = Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(gid.to_string(), "::ffff:10.0.0.1");
        assert_eq!(
            gid.hex_groups().to_string(),
            "0000:0000:0000:0000:0000:ffff:0a00:0001"
        );
        assert!(gid.is_ipv4_mapped());
        assert_eq!(gid.to_ip(), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        assert_eq!(Gid::parse("10.0.0.1"), Some(gid));
    }

    #[test]
    fn ipv6_gid_is_verbatim() {
        let ip: Ipv6Addr = "fe80::1".parse().unwrap();
        let gid = Gid::from_ipv6(ip);
        assert_eq!(gid.to_ip(), IpAddr::V6(ip));
        assert!(!gid.is_ipv4_mapped());
        assert_eq!(gid.to_string(), "fe80::1");
        assert_eq!(
            gid.hex_groups().to_string(),
            "fe80:0000:0000:0000:0000:0000:0000:0001"
        );
    }

    #[test]
    fn mtu_codes_and_bytes_agree() {
        for code in 1..=5 {
            let mtu = Mtu::from_code(code).unwrap();
            assert_eq!(mtu as u8, code);
            assert_eq!(Mtu::from_bytes(mtu.bytes()), Some(mtu));
        }
        assert_eq!(Mtu::Mtu1024.bytes(), 1024);
        assert_eq!(Mtu::from_code(0), None);
        assert_eq!(Mtu::from_code(6), None);
    }

    #[test]
    fn qp_state_round_trips_and_prints_iba_names() {
        for s in QpState::ALL {
            assert_eq!(QpState::from_u8(s as u8), Some(s));
        }
        assert_eq!(QpState::from_u8(7), None);
        assert_eq!(QpState::Rts.to_string(), "RTS");
        assert_eq!(QpState::Err.to_string(), "ERR");
    }

    #[test]
    fn access_flags_match_libibverbs_values() {
        assert_eq!(AccessFlags::LOCAL_WRITE.bits(), 1);
        assert_eq!(AccessFlags::REMOTE_WRITE.bits(), 2);
        assert_eq!(AccessFlags::REMOTE_READ.bits(), 4);
        assert_eq!(AccessFlags::REMOTE_ATOMIC.bits(), 8);
        assert_eq!(AccessFlags::MW_BIND.bits(), 16);
        assert!(AccessFlags::REMOTE_READ.has_remote());
        assert!(!AccessFlags::LOCAL_WRITE.has_remote());
    }

    #[test]
    fn mw_type_three_does_not_exist() {
        assert_eq!(MwType::from_u8(1), Some(MwType::Type1));
        assert_eq!(MwType::from_u8(2), Some(MwType::Type2));
        assert_eq!(MwType::from_u8(3), None);
    }
}

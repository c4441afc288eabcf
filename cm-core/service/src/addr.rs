//! IP addressing for RoCE (Linux `rdma_ip2gid`, `include/rdma/ib_addr.h`): an IP address is its
//! GID (IPv4 as `::ffff:a.b.c.d`),
//! so the remote GID needs no ARP, and the local side is the GID table entry holding it.

use std::net::IpAddr;

use portverbs_hal::Device;
use portverbs_hal::Gid;
use portverbs_verbs::Context;

use crate::ServiceError;

/// The GID an IP address has on a RoCEv2 port.
pub fn ip_to_gid(ip: IpAddr) -> Gid {
    Gid::from_ip(ip)
}

/// The index of `ip`'s GID in port `port`'s GID table.
///
/// # Errors
/// [`ServiceError::AddressNotLocal`] when no entry holds it; a verbs error when the table
/// cannot be read.
pub fn local_gid_index<D: Device>(
    ctx: &Context<D>,
    port: u8,
    ip: IpAddr,
) -> Result<u8, ServiceError> {
    let want = ip_to_gid(ip);
    let table = ctx
        .gid_table_blocking(port)
        .map_err(|e| ServiceError::verbs("reading the GID table", e))?;
    table
        .iter()
        .find(|(_, e)| e.gid == want)
        .and_then(|(i, _)| u8::try_from(*i).ok())
        .ok_or(ServiceError::AddressNotLocal(ip))
}

/// The port of `ctx` whose GID table holds `ip`, and the entry's index: the first port, in
/// port order, that has it (what Linux's `rdma_resolve_addr` binds an ID to: the port whose
/// GID cache holds the address).
///
/// # Errors
/// [`ServiceError::AddressNotLocal`] when no port holds it; a verbs error when a table cannot
/// be read.
pub fn local_port_gid_index<D: Device>(
    ctx: &Context<D>,
    ip: IpAddr,
) -> Result<(u8, u8), ServiceError> {
    for port in 1..=ctx.attr().phys_port_cnt {
        match local_gid_index(ctx, port, ip) {
            Ok(index) => return Ok((port, index)),
            Err(ServiceError::AddressNotLocal(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Err(ServiceError::AddressNotLocal(ip))
}

/// The IP address a GID stands for (an IPv4-mapped GID gives the IPv4 address).
pub fn gid_to_ip(gid: Gid) -> IpAddr {
    gid.to_ip()
}

/// The sender's GID from the 40-byte area in front of a UD receive: an IPv6 header (source
/// at bytes 8..24), or for RoCEv2 over IPv4 20 reserved bytes and then the IPv4 header
/// (source at bytes 32..36), told apart by the IPv4 header's version nibble.
pub fn source_gid(grh: &[u8; 40]) -> Gid {
    if grh[20] >> 4 == 4 && grh[0] >> 4 != 6 {
        let ip = std::net::Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]);
        return Gid::from_ipv4(ip);
    }
    let mut src = [0u8; 16];
    src.copy_from_slice(&grh[8..24]);
    Gid(src)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_of_an_ipv4_header_area() {
        let mut g = [0u8; 40];
        g[20] = 0x45;
        g[32..36].copy_from_slice(&[10, 1, 2, 3]);
        assert_eq!(
            source_gid(&g).to_ip(),
            "10.1.2.3".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn source_of_an_ipv6_header() {
        let mut g = [0u8; 40];
        g[0] = 0x60;
        let ip: std::net::Ipv6Addr = "fe80::1234".parse().unwrap();
        g[8..24].copy_from_slice(&ip.octets());
        // A byte of the source address that looks like an IPv4 version nibble changes nothing.
        g[20] = 0x45;
        let want = Gid(g[8..24].try_into().unwrap());
        assert_eq!(source_gid(&g), want);
    }
}

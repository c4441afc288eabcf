//! IP addressing for RoCE (facts §4.5): an IP address is its GID (IPv4 as `::ffff:a.b.c.d`),
//! so the remote GID needs no ARP, and the local side is the GID table entry holding it.

use std::net::IpAddr;

use portverbs_hal::Device;
use portverbs_hal::Gid;
use portverbs_verbs::Context;

use super::ServiceError;

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

/// The IP address a GID stands for (an IPv4-mapped GID gives the IPv4 address).
pub fn gid_to_ip(gid: Gid) -> IpAddr {
    gid.to_ip()
}

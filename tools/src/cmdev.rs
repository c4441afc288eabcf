//! Which device a CM-connected tool runs on, and its CM: shared by `rping`, `cmtime` and the
//! librdmacm example counterparts (`ucmatose`, `udaddy`, `rdma_server`, `rdma_client`).
//!
//! rdma_cm picks the device by address: a server's bind address, a client's source address
//! or, without one, the route to the destination. Here every device has one address (the IP
//! of port 1's first GID), so the same rules become: the device named with `--ib-dev`, else
//! the one holding the address, else the first device other processes can reach.

use std::net::IpAddr;

use portverbs::AnyDevice;
use portverbs::cm::service::CmDevice;
use portverbs::prelude::*;

use crate::error::{CliError, Context as _};
use crate::verbs;

/// The device's RoCEv2 address: the IP of its port 1's first GID.
pub(crate) fn device_ip(ctx: &Context) -> Result<IpAddr, CliError> {
    let table = ctx
        .gid_table_blocking(1)
        .ctx(format_args!("reading the GID table of {}", ctx.name()))?;
    table
        .first()
        .map(|(_, e)| e.gid.to_ip())
        .ok_or_else(|| CliError::Failed(format!("{} has no GID on port 1", ctx.name())))
}

/// The device whose port 1 has `ip`'s GID ([`portverbs::device_by_addr`]); the error says
/// why none (no device has it, or the one that would have it did not come up).
pub(crate) fn device_of(ip: IpAddr) -> Result<AnyDevice, portverbs::DeviceError> {
    portverbs::device_by_addr(ip)
}

/// `e` as the failure of librdmacm's `call`.
fn in_call(call: &str, e: portverbs::DeviceError) -> CliError {
    match CliError::from(e) {
        CliError::Usage(m) => CliError::Usage(format!("{call}: {m}")),
        CliError::Failed(m) => CliError::Failed(format!("{call}: {m}")),
        other => other,
    }
}

/// The first device other processes can reach (UDP-bound, VFIO), else the first device.
pub(crate) fn reachable_device() -> Result<AnyDevice, CliError> {
    let all = portverbs::devices();
    all.iter()
        .find(|d| !verbs::in_process(d))
        .or_else(|| all.first())
        .cloned()
        .ok_or_else(|| CliError::Failed("No IB devices found".into()))
}

/// Refuses a server (`rping -s`, `cmtime -L`, the librdmacm examples' servers) on a device of
/// this process's embedded fabric: no other process can reach it, so it would wait for ever
/// for a client that cannot come. `alone` says how the tool runs both ends in this process
/// instead, where it can.
pub(crate) fn reachable_server(dev: &AnyDevice, alone: &str) -> Result<(), CliError> {
    if !verbs::in_process(dev) {
        return Ok(());
    }
    Err(CliError::usage(format_args!(
        "{} is a device of this process's embedded fabric, which no other process can reach: \
         a server on it would wait for ever. Bind a device to an address of this host for \
         other processes to connect to (PORTVERBS_UDP=<ip>, e.g. PORTVERBS_UDP=127.0.0.1){alone}",
        dev.info().name
    )))
}

/// Opens the CM on `dev`.
pub(crate) fn cm_device(dev: AnyDevice) -> Result<CmDevice<AnyDevice>, CliError> {
    let ctx = verbs::open(dev)?;
    let ip = device_ip(&ctx)?;
    CmDevice::open_blocking(&ctx, ip).ctx(format_args!("opening the CM on {}", ctx.name()))
}

/// A server's device: `explicit` (`--ib-dev`), else the one holding `bind` (an unspecified
/// address binds to none in particular), else the first reachable one.
pub(crate) fn server_device(
    explicit: Option<&str>,
    bind: Option<IpAddr>,
) -> Result<AnyDevice, CliError> {
    match (explicit, bind.filter(|a| !a.is_unspecified())) {
        (Some(name), _) => verbs::pick_device(Some(name)),
        (None, Some(a)) => device_of(a).map_err(|e| in_call("rdma_bind_addr", e)),
        (None, None) => reachable_device(),
    }
}

/// A client's device: `explicit`, else the one holding `source`, else — for a destination
/// that is a device of this process (the embedded fabric) — another device of it, else the
/// first reachable one.
pub(crate) fn client_device(
    explicit: Option<&str>,
    source: Option<IpAddr>,
    dst: Option<IpAddr>,
) -> Result<AnyDevice, CliError> {
    match (explicit, source) {
        (Some(name), _) => verbs::pick_device(Some(name)),
        (None, Some(src)) => device_of(src).map_err(|e| in_call("rdma_resolve_addr", e)),
        (None, None) => match dst.and_then(|d| device_of(d).ok()) {
            Some(theirs) => portverbs::devices()
                .into_iter()
                .find(|d| d.info().name != theirs.info().name)
                .ok_or_else(|| CliError::Failed("No IB devices found".into())),
            None => reachable_device(),
        },
    }
}

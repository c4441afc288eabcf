//! `ibv_rc_pingpong`'s output for `portverbs pingpong`, which `uc_pingpong`, `ud_pingpong` and
//! `srq_pingpong` share (their TCP exchange is `portverbs::oob::pingpong`).
//!
//! * The address lines: `  local address:  LID 0x0000, QPN 0x000011, PSN 0x123456, GID ::`
//!   (note the two spaces after `local address:`, which line it up with `remote address:`);
//!   the GID is printed as IPv6 text the way `inet_ntop` writes it.
//! * The result lines: `<bytes> bytes in <s> seconds = <x> Mbit/sec` and
//!   `<n> iters in <s> seconds = <y> usec/iter`, with two decimals, where `bytes` counts both
//!   directions (size × iterations × 2).

use std::time::Duration;

use portverbs::prelude::QpEndpoint;

use super::numfmt::finite_or_zero;

/// Which end an address line describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PingpongSide {
    /// `  local address:  …`.
    Local,
    /// `  remote address: …`.
    Remote,
}

/// Formats an address line (ends with `\n`):
/// `  local address:  LID 0x0001, QPN 0x000011, PSN 0x123456, GID fe80::1`.
pub(crate) fn format_address(side: PingpongSide, dest: &QpEndpoint) -> String {
    let label = match side {
        PingpongSide::Local => "local address: ",
        PingpongSide::Remote => "remote address:",
    };
    format!(
        "  {label} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}\n",
        dest.lid,
        dest.qpn,
        dest.psn,
        dest.gid.inet6()
    )
}

/// Formats `ibv_ud_pingpong`'s local address line, which has a colon where the others have a
/// comma before the GID (ends with `\n`):
/// `  local address:  LID 0x0001, QPN 0x000011, PSN 0x123456: GID fe80::1`.
pub(crate) fn format_ud_local_address(dest: &QpEndpoint) -> String {
    format_address(PingpongSide::Local, dest).replacen(", GID ", ": GID ", 1)
}

/// Formats the two result lines printed at the end of a run (each ends with `\n`):
///
/// `<bytes> bytes in <s> seconds = <mbit> Mbit/sec` with `bytes = size × iters × 2` and
/// `mbit = bytes × 8 / elapsed_usec`, then `<iters> iters in <s> seconds = <usec> usec/iter` with
/// `usec = elapsed_usec / iters`. Zero elapsed time or zero iterations print `0.00`.
pub(crate) fn format_results(size: u64, iters: u64, elapsed: Duration) -> String {
    let usec = elapsed.as_secs_f64() * 1e6;
    let secs = elapsed.as_secs_f64();
    let bytes = size.saturating_mul(iters).saturating_mul(2);
    let mbit = if usec > 0.0 {
        bytes as f64 * 8.0 / usec
    } else {
        0.0
    };
    let per_iter = if iters > 0 { usec / iters as f64 } else { 0.0 };
    format!(
        "{bytes} bytes in {secs:.2} seconds = {:.2} Mbit/sec\n\
         {iters} iters in {secs:.2} seconds = {:.2} usec/iter\n",
        finite_or_zero(mbit),
        finite_or_zero(per_iter)
    )
}

#[cfg(test)]
#[path = "pingpong_tests.rs"]
mod tests;

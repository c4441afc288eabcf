//! The connection manager's behaviour on every backend: each case is a function
//! `fn name(backend: Backend)` in one of the area modules, and the `cm_cases!` macro at the
//! bottom of each module turns it into one `#[test]` per backend, as the conformance suite's
//! `cases!` does: `cm_matrix::<area>::soft::<name>` (two software devices on a fabric of the
//! test's own), `…::mlx4::<name>` (two emulated ConnectX-3s under the mlx4 driver) and
//! `…::udp::<name>` (two UDP-bound devices in auto progress, their packets crossing the
//! kernel between two loopback addresses of the test's own, see [`cm_util::pair`]).
//!
//! Every case makes its own pair of devices ([`cm_util::pair::Pair`]), so the cases run in
//! parallel. What is about one backend alone stays in the files of that backend: `cm.rs`
//! (UDP devices in manual progress, a silent UDP socket as the peer, loss on a fabric),
//! `cm_semantics.rs` (port MTUs chosen per soft device, the REQ read off a UDP socket),
//! `cm_sidr.rs` (IP TTLs on the UDP port), `cm_mlx4.rs` (mlx4 and soft devices on one fabric),
//! `cm_slow_commands.rs` (the mlx4 firmware's late command events).
#![cfg(target_os = "linux")]
#![allow(unreachable_pub)]

/// Declares each listed case as a test on every backend.
macro_rules! cm_cases {
    ($($name:ident),* $(,)?) => {
        mod soft {
            $(
                #[test]
                fn $name() {
                    super::$name(super::Backend::Soft);
                }
            )*
        }
        mod mlx4 {
            $(
                #[test]
                fn $name() {
                    super::$name(super::Backend::Mlx4);
                }
            )*
        }
        mod udp {
            $(
                #[test]
                fn $name() {
                    super::$name(super::Backend::Udp);
                }
            )*
        }
    };
}

#[path = "util/cm/mod.rs"]
mod cm_util;
#[path = "util/mcast/mod.rs"]
mod mcast_util;
#[path = "util/cm/sidr.rs"]
mod sidr_util;

mod cm_matrix {
    mod connect;
    mod lifecycle;
    mod mcast;
    mod params;
    mod scale;
    mod sidr;
}

//! The conformance suite: the behaviours of rdma-core's pyverbs tests and google/rdma-unit-test
//! (rdma-core `tests/`, google/rdma-unit-test `cases/`), each test named after what it checks, run
//! on every backend. Differences between backends are entries in each backend's quirks table, never
//! skipped tests.
//!
//! Every case is a function `fn name(backend: Backend)` in one of the area modules; the
//! `cases!` macro at the bottom of each module turns them into one `#[test]` per backend
//! (`conformance::<area>::soft::<name>`, `…::mlx4::<name>` on the emulated ConnectX-3,
//! `…::udp::<name>` on two software devices whose packets cross the kernel's UDP sockets
//! between two loopback addresses (Linux), `…::udp_manual::<name>` on two such devices as
//! applications make them in manual progress — no thread, real time, the case's own calls
//! driving them — in every area but `qp_post` (whose SQD case holds a write in flight with a
//! link delay a real-time run cannot promise), and
//! `…::mlx4_hw::<name>`, ignored unless a real ConnectX-3 bound to vfio-pci is named:
//! `PORTVERBS_MLX4_PCI=0000:01:00.0 PORTVERBS_MLX4_IP=192.0.2.1 cargo test --test conformance
//! mlx4_hw -- --ignored --test-threads=1`; cases that need fault injection fail there by design).

#![allow(unreachable_pub)]

/// Declares each listed case as a test on every backend; with `manual;` first, also on two
/// UDP-bound devices in manual progress (`…::udp_manual::<name>`: no thread, real time, the
/// test's own calls and settling drive them).
macro_rules! cases {
    (manual; $($name:ident),* $(,)?) => {
        cases!($($name),*);
        #[cfg(target_os = "linux")]
        mod udp_manual {
            $(
                #[test]
                fn $name() {
                    super::$name(super::Backend::UdpManual);
                }
            )*
        }
    };
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
        #[cfg(target_os = "linux")]
        mod udp {
            $(
                #[test]
                fn $name() {
                    super::$name(super::Backend::Udp);
                }
            )*
        }
        mod mlx4_hw {
            $(
                #[test]
                #[ignore = "needs a ConnectX-3 bound to vfio-pci: PORTVERBS_MLX4_PCI=<addr> \
                            PORTVERBS_MLX4_IP=<ip> cargo test --test conformance mlx4_hw -- \
                            --ignored --test-threads=1"]
                fn $name() {
                    super::$name(super::Backend::Mlx4Hw);
                }
            )*
        }
    };
}

mod conformance {
    pub mod env;
    pub mod util;

    mod ah;
    mod app_memory;
    mod atomics;
    mod connect;
    mod cq;
    mod device;
    mod error_classes;
    mod errors_rc;
    mod events;
    mod gsi;
    mod gsi_mixed;
    mod mcast;
    mod mr;
    mod mw;
    mod mw_access;
    mod mw_rules;
    mod mw_util;
    mod notify;
    mod obj_util;
    mod pd;
    mod pd_walk;
    mod pd_walk_mw;
    mod qp;
    mod qp_misc;
    mod qp_post;
    mod reliability_rc;
    mod srq;
    mod traffic_rc;
    mod traffic_rc_flow;
    mod traffic_uc;
    mod traffic_ud;
    mod tx_util;
}

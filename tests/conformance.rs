//! The conformance suite: the behaviours of rdma-core's pyverbs tests and google/rdma-unit-test
//! (facts/ecosystem-and-conformance.md §3), each test named after what it checks, run on every
//! backend. Differences between backends are entries in each backend's quirks table, never
//! skipped tests.
//!
//! Every case is a function `fn name(backend: Backend)` in one of the area modules; the
//! `cases!` macro at the bottom of each module turns them into one `#[test]` per backend
//! (`conformance::<area>::soft::<name>`).

#![allow(unreachable_pub)]

/// Declares each listed case as a test on every backend.
macro_rules! cases {
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
    };
}

mod conformance {
    pub mod env;
    pub mod util;

    mod ah;
    mod cq;
    mod device;
    mod errors_rc;
    mod events;
    mod mr;
    mod mw;
    mod notify;
    mod obj_util;
    mod pd;
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

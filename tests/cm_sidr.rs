//! UD services through the CM (SIDR, `RDMA_PS_UDP`) on the UDP port alone: the hop limit
//! an address handle puts on the wire, read back from the IP header the receiver gets
//! (loopback lowers no TTL), where a socket cannot send the TTL 0 it was given. The exchange
//! itself (udaddy's), private data to rdma_cm's limits and the refusals of a handle made from
//! a completion run on every backend in `cm_matrix.rs`'s `sidr` module.
#![cfg(target_os = "linux")]

use portverbs::cm::service::RDMA_UDP_QKEY;
use portverbs::hal::Progress;
use portverbs::prelude::*;
use portverbs::verbs::ReceivedGrh;

#[path = "util/cm/mod.rs"]
mod cm_util;
#[path = "util/mcast/mod.rs"]
mod mcast_util;
#[path = "util/cm/sidr.rs"]
mod sidr_util;

use cm_util::udp::udp_cm;
use sidr_util::{recv, send, ud};

/// What a hop limit of 0 means on the UDP port: the hop limit travels as given, as Linux's
/// rxe writes it into the IP header (0 there, which no router forwards); a socket cannot send
/// TTL 0, so it leaves as 1, which no router forwards either. The CM's address vector and
/// one made from a completion carry a routable hop limit instead.
#[test]
fn a_hop_limit_of_zero_leaves_as_ttl_one() {
    let (_da, a) = udp_cm("cm_sidr_f", [127, 0, 95, 6].into(), Progress::Auto);
    let (_db, b) = udp_cm("cm_sidr_g", [127, 0, 95, 7].into(), Progress::Auto);
    let (from, to) = (ud(&a), ud(&b));
    let ah = from
        .pd
        .create_ah_blocking(AddressVector {
            dgid: Gid::from_ip(b.local_ip()),
            sgid_index: a.gid_index(),
            is_global: true,
            port_num: 1,
            ..AddressVector::default()
        })
        .unwrap();
    assert_eq!(ah.av().hop_limit, 0);
    send(&from, &ah, to.qp.qp_num(), RDMA_UDP_QKEY, b"short-lived");
    let (_, grh, payload) = recv(&to);
    assert_eq!(payload, b"short-lived");
    assert_eq!(ReceivedGrh::parse(&grh).unwrap().hop_limit, 1);
}

//! The CM service's multicast join (`CmDevice::join_multicast`, rdma_cm's
//! `rdma_join_multicast` on RoCEv2): a QP of one device and two of the other join an IPv4
//! group; a datagram sent with what the sender's join returned (address handle attributes,
//! QPN 0xFFFFFF, rdma_cm's Q_Key) reaches both joined QPs of the other device; after a leave
//! it no longer does. And the join's refusals, each typed.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use portverbs::cm::service::{MCAST_HOP_LIMIT, MCAST_QPN, RDMA_UDP_QKEY, ServiceError};
use portverbs::prelude::*;
use portverbs::verbs::McastError;

use crate::cm_util::Dev;
use crate::cm_util::pair::{Backend, Pair};
use crate::mcast_util::{self, Ud, completions};

/// A UD QP brought up as rdma_cm brings up a `RDMA_PS_UDP` id's QP (Q_Key 0x01234567).
fn ud(cm: &Dev) -> Ud {
    mcast_util::ud(cm.context(), RDMA_UDP_QKEY)
}

/// The group `239.(a+up).b.n`, where `a.b` are the second and third octets of `dev`'s own
/// address: the UDP pairs' groups (real IP multicast on loopback) differ as their addresses
/// do, so that tests running at the same time never share one.
fn group_of(dev: &Dev, up: u8, n: u8) -> Ipv4Addr {
    let IpAddr::V4(ip) = dev.local_ip() else {
        panic!("the pairs' devices have IPv4 addresses")
    };
    let o = ip.octets();
    Ipv4Addr::new(239, o[1] + up, o[2], n)
}

fn a_joined_group_reaches_every_joined_qp_until_they_leave(backend: Backend) {
    let p = Pair::new(backend);
    let (a, b) = (&p.a, &p.b);
    let group = IpAddr::V4(group_of(a, 0, 1));
    let sender = ud(a);
    let (r1, r2) = (ud(b), ud(b));

    let join = a.join_multicast_blocking(&sender.qp, group).unwrap();
    // What rdma_cm's join event carries on RoCEv2 for an IPv4 group in RDMA_PS_UDP.
    assert_eq!(join.group, group);
    assert_eq!(join.mgid, Gid::from_ip(group));
    assert_eq!(join.av.dgid, join.mgid);
    assert!(join.av.is_global);
    assert_eq!(join.av.hop_limit, MCAST_HOP_LIMIT);
    assert_eq!(join.av.sgid_index, a.gid_index());
    assert_eq!((join.av.dlid, join.av.sl), (0, 0));
    assert_eq!(join.remote_qpn, MCAST_QPN);
    assert_eq!(join.qkey, 0x0123_4567);
    assert_eq!(sender.qp.mcast_groups(), [join.mgid]);
    // Joining again attaches nothing more.
    assert_eq!(a.join_multicast_blocking(&sender.qp, group).unwrap(), join);
    assert_eq!(sender.qp.mcast_groups(), [join.mgid]);

    // The async form joins the same way.
    let j1 = portverbs::hal::block_on(b.join_multicast(&r1.qp, group)).unwrap();
    let j2 = b.join_multicast_blocking(&r2.qp, group).unwrap();
    assert_eq!((j1.mgid, j2.mgid), (join.mgid, join.mgid));
    r1.post_recv(1);
    r2.post_recv(2);

    let ah = sender.pd.create_ah_blocking(join.av).unwrap();
    let send = |payload: &[u8], wr_id: u64| {
        sender.mr.write(0, payload).unwrap();
        let sge = [sender.mr.sge(0, payload.len()).unwrap()];
        let dest = UdDest {
            ah_pd: None,
            av: ah.av(),
            remote_qpn: join.remote_qpn,
            remote_qkey: join.qkey,
        };
        let wr = SendWr::new(wr_id, SendOp::Send)
            .sges(&sge)
            .ud(dest)
            .signaled();
        sender.qp.post_send(&[wr]).unwrap();
        let wc = completions(&sender.cq, 1, Duration::from_secs(10));
        assert_eq!(wc.len(), 1);
        assert_eq!(wc[0].status, WcStatus::Success);
    };
    let payload = b"to the group joined through the CM";
    send(payload, 7);
    for (r, wr_id) in [(&r1, 1), (&r2, 2)] {
        let wc = completions(&r.cq, 1, Duration::from_secs(10));
        assert_eq!(wc.len(), 1, "one copy for each joined QP");
        assert_eq!(wc[0].wr_id, wr_id);
        assert_eq!(wc[0].status, WcStatus::Success);
        assert_eq!(wc[0].src_qp, sender.qp.qp_num());
        let mut got = vec![0u8; 40 + payload.len()];
        r.mr.read(0, &mut got).unwrap();
        assert_eq!(
            IpAddr::from(<[u8; 4]>::try_from(&got[36..40]).unwrap()),
            group,
            "GRH destination: the group"
        );
        assert_eq!(&got[40..], payload);
    }

    // r1 leaves: the next datagram reaches r2 only.
    b.leave_multicast_blocking(&r1.qp, group).unwrap();
    assert_eq!(r1.qp.mcast_groups(), []);
    r1.post_recv(3);
    r2.post_recv(4);
    send(b"after r1 left", 8);
    let wc = completions(&r2.cq, 1, Duration::from_secs(10));
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].wr_id, 4);
    // r2's copy arrived, and the one datagram was delivered to the port once for all of its
    // QPs: r1, no longer attached, got nothing.
    assert_eq!(completions(&r1.cq, 1, Duration::ZERO), []);

    // Leaving twice is refused, typed.
    let err = b.leave_multicast_blocking(&r1.qp, group).unwrap_err();
    assert!(
        matches!(err, ServiceError::Multicast(McastError::NotAttached { .. })),
        "{err:?}"
    );
    portverbs::hal::block_on(b.leave_multicast(&r2.qp, group)).unwrap();
    a.leave_multicast_blocking(&sender.qp, group).unwrap();
}

fn joins_that_cannot_be_made_are_refused_typed(backend: Backend) {
    let p = Pair::new(backend);
    let a = &p.a;
    let group = IpAddr::V4(group_of(a, 0, 2));
    let u = ud(a);

    // Not a UD QP.
    let pd = a.context().alloc_pd_blocking().unwrap();
    let rc = pd
        .create_qp_blocking(QpInit::new(QpType::Rc, &u.cq))
        .unwrap();
    let err = a.join_multicast_blocking(&rc, group).unwrap_err();
    assert!(
        matches!(err, ServiceError::NotUd(q) if q == rc.qp_num()),
        "{err:?}"
    );

    // Not a multicast address.
    for not in ["10.1.2.3", "0.0.0.0", "255.255.255.255"] {
        let ip: IpAddr = not.parse().unwrap();
        let err = a.join_multicast_blocking(&u.qp, ip).unwrap_err();
        assert!(
            matches!(err, ServiceError::NotMulticast(x) if x == ip),
            "{err:?}"
        );
    }

    // An IPv6 group on an IPv4 address's device.
    let v6: IpAddr = "ff0e::51:1".parse().unwrap();
    let err = a.join_multicast_blocking(&u.qp, v6).unwrap_err();
    assert!(matches!(err, ServiceError::FamilyMismatch(..)), "{err:?}");

    // A device limit: one group more than `max_mcast_grp` on one QP.
    let max = a.context().attr().max_mcast_grp;
    assert!(max > 0 && max < 256, "{max}");
    for i in 0..max {
        let g = IpAddr::V4(group_of(a, 100, u8::try_from(i).unwrap()));
        a.join_multicast_blocking(&u.qp, g).unwrap();
    }
    let err = a.join_multicast_blocking(&u.qp, group).unwrap_err();
    assert!(
        matches!(
            err,
            ServiceError::Multicast(McastError::LimitReached {
                limit: "max_mcast_grp",
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(u.qp.mcast_groups().len(), max as usize);
    // Nothing was attached by the refusals.
    assert!(!u.qp.mcast_groups().contains(&Gid::from_ip(group)));
}

cm_cases!(
    a_joined_group_reaches_every_joined_qp_until_they_leave,
    joins_that_cannot_be_made_are_refused_typed,
);

//! UD multicast (IBA 10.5.2.4, 11.3.1.1; `ibv_attach_mcast`/`ibv_detach_mcast`): delivery
//! to every attached QP on every device, the sender's own copy only when it is attached (as
//! Linux rxe does), detach, the Q_Key check, the attach rules and the device limits.
//!
//! A backend without multicast reports `max_mcast_grp == 0`; on it each case checks that an
//! attach is refused with `McastError::Unsupported` and stops there ([`supported`]), so
//! nothing is skipped silently.
//!
//! Groups are IPv4 groups named as rdma_cm names them on RoCEv2 (the IPv4-mapped MGID,
//! `::ffff:239.a.b.n`), with `a.b` taken from the environment's own addresses so that cases
//! running at once on the UDP backends (whose groups are real IP groups of the host) never
//! hear each other.

use portverbs::prelude::*;
use portverbs::verbs::McastError;

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

const GRH: u32 = 40;
/// The destination QP of a datagram to a multicast group.
const MCAST_QPN: u32 = 0x00ff_ffff;

/// Group `n` of this environment.
fn group(env: &Env, n: u8) -> Gid {
    let a = match env.ips[0] {
        std::net::IpAddr::V4(v4) => v4.octets(),
        std::net::IpAddr::V6(_) => [0, 0, 0, 0],
    };
    Gid::from_ipv4(std::net::Ipv4Addr::new(239, a[1], a[2], n))
}

/// Whether the backend has multicast; when it has none, checks that it says so (an attach
/// fails with `Unsupported`) so the caller can stop.
fn supported(env: &Env) -> bool {
    let attr = env.a().attr();
    if attr.max_mcast_grp > 0 {
        assert!(attr.max_mcast_qp_attach > 0, "{attr:?}");
        assert!(attr.max_total_mcast_qp_attach > 0, "{attr:?}");
        return true;
    }
    let s = ud_side(env.a(), QKEY);
    let err = s.qp.attach_mcast_blocking(group(env, 1), 0).unwrap_err();
    assert!(matches!(err, McastError::Unsupported), "{err:?}");
    eprintln!(
        "{:?}: max_mcast_grp is 0, multicast is not supported: only the refusal is checked",
        env.backend
    );
    false
}

/// A UD QP in RTS with Q_Key `qkey`, 8 KiB registered.
fn ud_side(ctx: &Context, qkey: u32) -> Side {
    let s = Side::new(ctx, QpType::Ud, CAPS, 8192, FULL_ACCESS);
    let opts = ConnectOptions {
        qkey,
        ..Params::default().options()
    };
    s.qp.ready_ud_blocking(&opts).unwrap();
    s
}

/// An address handle on `ctx` to the group.
fn group_ah(side: &Side, gid: Gid) -> AddressHandle {
    side.pd
        .create_ah_blocking(AddressVector {
            dgid: gid,
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AddressVector::default()
        })
        .unwrap()
}

/// Sends `len` bytes of `from`'s buffer to the group with Q_Key `qkey`; checks the send's
/// completion.
fn send_to_group(env: &Env, from: &Side, ah: &AddressHandle, wr_id: u64, len: u32, qkey: u32) {
    let sge = [from.sge(0, len)];
    let dest = UdDest {
        ah_pd: None,
        av: ah.av(),
        remote_qpn: MCAST_QPN,
        remote_qkey: qkey,
    };
    let wr = SendWr::new(wr_id, SendOp::Send)
        .sges(&sge)
        .ud(dest)
        .signaled();
    from.qp.post_send(&[wr]).unwrap();
    let wc = poll_one(env, &from.cq);
    check_wc(&wc, wr_id, WcStatus::Success, WcOpcode::Send);
}

/// Checks one multicast receive: from `src_qpn`, with the GRH area naming the group as its
/// destination and the sender's address as its source, and the data.
fn check_mcast_recv(wc: &WorkCompletion, side: &Side, wr_id: u64, src: (u32, Gid), gid: Gid) {
    check_wc(wc, wr_id, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.qp_num, side.qp.qp_num(), "{wc:?}");
    assert_eq!(wc.src_qp, src.0, "{wc:?}");
    assert!(wc.wc_flags.contains(WcFlags::GRH), "{wc:?}");
    assert_eq!(wc.byte_len, 100 + GRH);
    let grh = side.buf.to_vec(0, GRH as usize).unwrap();
    assert_eq!(grh[20] >> 4, 4, "an IPv4 header after 20 reserved bytes");
    assert_eq!(grh[32..36], src.1.0[12..16], "source: the sender's address");
    assert_eq!(
        grh[36..40],
        gid.0[12..16],
        "destination: the group's address"
    );
    assert_eq!(side.buf.to_vec(40, 100).unwrap(), pattern(7, 100));
}

fn mcast_send_reaches_attached_qps_on_both_devices(backend: Backend) {
    let env = Env::new(backend);
    if !supported(&env) {
        return;
    }
    let gid = group(&env, 1);
    let sender = ud_side(env.a(), QKEY);
    let near = ud_side(env.a(), QKEY); // another QP of the sender's device
    let far = ud_side(env.b(), QKEY);
    let bystander = ud_side(env.b(), QKEY); // not attached
    near.qp.attach_mcast_blocking(gid, 0).unwrap();
    far.qp.attach_mcast_blocking(gid, 0).unwrap();
    for s in [&sender, &near, &far, &bystander] {
        s.post_recv(1, 0, 4096);
    }
    sender.buf.write(0, &pattern(7, 100)).unwrap();
    let ah = group_ah(&sender, gid);
    send_to_group(&env, &sender, &ah, 9, 100, QKEY);
    let src = (sender.qp.qp_num(), Env::gid(env.a()));
    let wc = env.poll(&far.cq, 1);
    assert_eq!(wc.len(), 1, "one copy on the other device: {wc:?}");
    check_mcast_recv(&wc[0], &far, 1, src, gid);
    let wc = env.poll(&near.cq, 1);
    assert_eq!(wc.len(), 1, "one copy on the sender's device: {wc:?}");
    check_mcast_recv(&wc[0], &near, 1, src, gid);
    assert_eq!(
        env.poll(&sender.cq, 0),
        [],
        "the sending QP is not attached: no copy for it"
    );
    assert_eq!(env.poll(&bystander.cq, 0), [], "not attached, nothing");
    drop(ah);
}

fn mcast_sender_gets_its_own_copy_only_when_attached(backend: Backend) {
    let env = Env::new(backend);
    if !supported(&env) {
        return;
    }
    let gid = group(&env, 2);
    let sender = ud_side(env.a(), QKEY);
    let far = ud_side(env.b(), QKEY);
    sender.qp.attach_mcast_blocking(gid, 0).unwrap();
    far.qp.attach_mcast_blocking(gid, 0).unwrap();
    // The payload comes from the second half of the buffer; the copy lands in the first.
    sender.buf.write(0, &pattern(7, 100)).unwrap();
    sender.post_recv(1, 4096, 4096);
    far.post_recv(2, 0, 4096);
    let ah = group_ah(&sender, gid);
    let sge = [sender.sge(0, 100)];
    let dest = UdDest {
        ah_pd: None,
        av: ah.av(),
        remote_qpn: MCAST_QPN,
        remote_qkey: QKEY,
    };
    let wr = SendWr::new(9, SendOp::Send).sges(&sge).ud(dest).signaled();
    sender.qp.post_send(&[wr]).unwrap();
    let src = (sender.qp.qp_num(), Env::gid(env.a()));
    let wc = env.poll(&far.cq, 1);
    assert_eq!(wc.len(), 1, "{wc:?}");
    check_mcast_recv(&wc[0], &far, 2, src, gid);
    // The sending QP is attached: like rxe, it receives its own datagram. Its CQ holds the
    // send's completion and the receive's.
    let mut wc = env.poll(&sender.cq, 2);
    assert_eq!(
        wc.len(),
        2,
        "the send and the attached sender's own copy: {wc:?}"
    );
    wc.sort_by_key(|w| w.wr_id);
    check_wc(&wc[0], 1, WcStatus::Success, WcOpcode::Recv);
    check_wc(&wc[1], 9, WcStatus::Success, WcOpcode::Send);
    assert_eq!(wc[0].src_qp, sender.qp.qp_num());
    assert_eq!(wc[0].byte_len, 100 + GRH);
    assert_eq!(sender.buf.to_vec(4096 + 40, 100).unwrap(), pattern(7, 100));
}

fn mcast_detach_stops_delivery(backend: Backend) {
    let env = Env::new(backend);
    if !supported(&env) {
        return;
    }
    let gid = group(&env, 3);
    let sender = ud_side(env.a(), QKEY);
    let r1 = ud_side(env.b(), QKEY);
    let r2 = ud_side(env.b(), QKEY);
    r1.qp.attach_mcast_blocking(gid, 0).unwrap();
    r2.qp.attach_mcast_blocking(gid, 0).unwrap();
    r1.post_recv(1, 0, 4096);
    r2.post_recv(1, 0, 4096);
    sender.buf.write(0, &pattern(7, 100)).unwrap();
    let ah = group_ah(&sender, gid);
    send_to_group(&env, &sender, &ah, 9, 100, QKEY);
    assert_eq!(env.poll(&r1.cq, 1).len(), 1);
    assert_eq!(env.poll(&r2.cq, 1).len(), 1);
    // r1 leaves; r2, still attached, keeps the device in the group.
    r1.qp.detach_mcast_blocking(gid, 0).unwrap();
    assert_eq!(r1.qp.mcast_groups(), []);
    r1.post_recv(2, 0, 4096);
    r2.post_recv(2, 0, 4096);
    send_to_group(&env, &sender, &ah, 10, 100, QKEY);
    assert_eq!(env.poll(&r2.cq, 1).len(), 1, "r2 still receives");
    assert_eq!(env.poll(&r1.cq, 0), [], "r1 detached: nothing");
    // r2 leaves too: the device is out of the group.
    r2.qp.detach_mcast_blocking(gid, 0).unwrap();
    r2.post_recv(3, 0, 4096);
    send_to_group(&env, &sender, &ah, 11, 100, QKEY);
    assert_eq!(env.poll(&r2.cq, 0), [], "r2 detached: nothing");
    assert_eq!(env.poll(&r1.cq, 0), []);
    // Detaching again is an error: the QP is not attached.
    let err = r2.qp.detach_mcast_blocking(gid, 0).unwrap_err();
    assert!(
        matches!(err, McastError::NotAttached { qpn, gid: g } if qpn == r2.qp.qp_num() && g == gid),
        "{err:?}"
    );
    // Attached again, r1's receive (still posted) takes the next datagram.
    r1.qp.attach_mcast_blocking(gid, 0).unwrap();
    send_to_group(&env, &sender, &ah, 12, 100, QKEY);
    let wc = env.poll(&r1.cq, 1);
    assert_eq!(wc.len(), 1, "{wc:?}");
    check_wc(&wc[0], 2, WcStatus::Success, WcOpcode::Recv);
}

fn mcast_wrong_qkey_is_dropped_per_receiver(backend: Backend) {
    let env = Env::new(backend);
    if !supported(&env) {
        return;
    }
    let gid = group(&env, 4);
    let sender = ud_side(env.a(), QKEY);
    let matching = ud_side(env.b(), QKEY);
    let other = ud_side(env.b(), QKEY ^ 0x10);
    matching.qp.attach_mcast_blocking(gid, 0).unwrap();
    other.qp.attach_mcast_blocking(gid, 0).unwrap();
    matching.post_recv(1, 0, 4096);
    other.post_recv(1, 0, 4096);
    sender.buf.write(0, &pattern(7, 100)).unwrap();
    let ah = group_ah(&sender, gid);
    // A Q_Key neither receiver has: both drop it, their receives stay posted.
    send_to_group(&env, &sender, &ah, 9, 100, QKEY ^ 1);
    assert_eq!(env.poll(&matching.cq, 0), []);
    assert_eq!(env.poll(&other.cq, 0), []);
    // The group's Q_Key: only the QP whose Q_Key matches takes it.
    send_to_group(&env, &sender, &ah, 10, 100, QKEY);
    let src = (sender.qp.qp_num(), Env::gid(env.a()));
    let wc = env.poll(&matching.cq, 1);
    assert_eq!(wc.len(), 1, "{wc:?}");
    check_mcast_recv(&wc[0], &matching, 1, src, gid);
    assert_eq!(env.poll(&other.cq, 0), [], "Q_Key mismatch: dropped");
    // The privileged-Q_Key rule is the unicast one: bit 31 set in the request sends the
    // sending QP's own Q_Key (QKEY).
    matching.post_recv(2, 0, 4096);
    send_to_group(&env, &sender, &ah, 11, 100, 0x8000_0000);
    let wc = env.poll(&matching.cq, 1);
    assert_eq!(wc.len(), 1, "{wc:?}");
    check_wc(&wc[0], 2, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(env.poll(&other.cq, 0), []);
    if !matches!(env.backend, Backend::Mlx4 | Backend::Mlx4Hw) {
        // mlx4 reads its counters through MAD_IFC, which the driver does not issue. Each
        // receiver whose Q_Key did not match counted a violation: 2 + 1 + 1.
        let a = env.a().query_port_blocking(1).unwrap();
        let b = env.b().query_port_blocking(1).unwrap();
        assert_eq!(a.qkey_viol_cntr, 0);
        assert_eq!(b.qkey_viol_cntr, 4, "{b:?}");
    }
}

fn mcast_without_a_posted_receive_is_dropped(backend: Backend) {
    let env = Env::new(backend);
    if !supported(&env) {
        return;
    }
    let gid = group(&env, 5);
    let sender = ud_side(env.a(), QKEY);
    let r = ud_side(env.b(), QKEY);
    r.qp.attach_mcast_blocking(gid, 0).unwrap();
    sender.buf.write(0, &pattern(7, 100)).unwrap();
    let ah = group_ah(&sender, gid);
    send_to_group(&env, &sender, &ah, 9, 100, QKEY);
    assert_eq!(env.poll(&r.cq, 0), []);
    assert_eq!(queried_state(&r.qp), QpState::Rts);
    r.post_recv(1, 0, 4096);
    send_to_group(&env, &sender, &ah, 10, 100, QKEY);
    let src = (sender.qp.qp_num(), Env::gid(env.a()));
    let wc = env.poll(&r.cq, 1);
    assert_eq!(wc.len(), 1, "the second datagram only: {wc:?}");
    check_mcast_recv(&wc[0], &r, 1, src, gid);
}

fn mcast_attach_rules(backend: Backend) {
    let env = Env::new(backend);
    if !supported(&env) {
        return;
    }
    let gid = group(&env, 6);
    // Only UD QPs attach (libibverbs: EINVAL).
    for t in [QpType::Rc, QpType::Uc] {
        let s = Side::new(env.a(), t, CAPS, 4096, FULL_ACCESS);
        let err = s.qp.attach_mcast_blocking(gid, 0).unwrap_err();
        assert!(
            matches!(err, McastError::NotUd { qp_type, special: false, .. } if qp_type == t),
            "{err:?}"
        );
    }
    let s = ud_side(env.a(), QKEY);
    // A unicast GID is no group: the device's own address, and the all-zero GID.
    for g in [Env::gid(env.a()), Gid::ZERO] {
        let err = s.qp.attach_mcast_blocking(g, 0).unwrap_err();
        assert!(
            matches!(err, McastError::NotMulticast { gid } if gid == g),
            "{err:?}"
        );
    }
    // Detaching what was never attached.
    let err = s.qp.detach_mcast_blocking(gid, 0).unwrap_err();
    assert!(matches!(err, McastError::NotAttached { .. }), "{err:?}");
    // Attaching twice changes nothing; a QP is in several groups; a QP in RESET attaches
    // as well.
    let other = group(&env, 7);
    s.qp.attach_mcast_blocking(gid, 0).unwrap();
    s.qp.attach_mcast_blocking(gid, 0).unwrap();
    s.qp.attach_mcast_blocking(other, 0).unwrap();
    let mut groups = s.qp.mcast_groups();
    groups.sort();
    let mut want = vec![gid, other];
    want.sort();
    assert_eq!(groups, want);
    let fresh = Side::new(env.a(), QpType::Ud, CAPS, 4096, FULL_ACCESS);
    fresh.qp.attach_mcast_blocking(gid, 0).unwrap();
    // One detach undoes the double attach.
    s.qp.detach_mcast_blocking(gid, 0).unwrap();
    assert!(matches!(
        s.qp.detach_mcast_blocking(gid, 0),
        Err(McastError::NotAttached { .. })
    ));
    s.qp.detach_mcast_blocking(other, 0).unwrap();
    assert_eq!(s.qp.mcast_groups(), []);
    // Destroying an attached QP detaches it.
    drop(fresh);
}

fn mcast_device_limits_are_enforced(backend: Backend) {
    let env = Env::new(backend);
    if !supported(&env) {
        return;
    }
    let attr = env.a().attr().clone();
    let (groups, per_group, total) = (
        attr.max_mcast_grp,
        attr.max_mcast_qp_attach,
        attr.max_total_mcast_qp_attach,
    );
    // The limits must be small enough to reach here (the software device's are).
    assert!(groups <= 64 && per_group <= 64 && total <= 256, "{attr:?}");
    assert!(groups < total && per_group < total, "{attr:?}");
    let gids: Vec<Gid> = (0..=groups as u8).map(|n| group(&env, 100 + n)).collect();
    let qps: Vec<Side> = (0..=per_group)
        .map(|_| Side::new(env.a(), QpType::Ud, CAPS, 64, FULL_ACCESS))
        .collect();
    // max_mcast_qp_attach: QPs in one group.
    for s in &qps[..per_group as usize] {
        s.qp.attach_mcast_blocking(gids[0], 0).unwrap();
    }
    let err = qps[per_group as usize]
        .qp
        .attach_mcast_blocking(gids[0], 0)
        .unwrap_err();
    assert!(
        matches!(err, McastError::LimitReached { limit: "max_mcast_qp_attach", max, .. } if max == per_group),
        "{err:?}"
    );
    // An attachment already there is no new one.
    qps[0].qp.attach_mcast_blocking(gids[0], 0).unwrap();
    // max_mcast_grp: groups on the device.
    for g in &gids[1..groups as usize] {
        qps[0].qp.attach_mcast_blocking(*g, 0).unwrap();
    }
    let err = qps[1]
        .qp
        .attach_mcast_blocking(gids[groups as usize], 0)
        .unwrap_err();
    assert!(
        matches!(err, McastError::LimitReached { limit: "max_mcast_grp", max, .. } if max == groups),
        "{err:?}"
    );
    // max_total_mcast_qp_attach: attachments in all, spread over the existing groups. A
    // device whose total is the product of the other two (Linux's mlx4 computes it so) has
    // no total limit of its own to reach.
    if total >= groups * per_group {
        assert_eq!(total, groups * per_group, "{attr:?}");
        qps[0].qp.detach_mcast_blocking(gids[1], 0).unwrap();
        qps[per_group as usize]
            .qp
            .attach_mcast_blocking(gids[1], 0)
            .unwrap();
        return;
    }
    let mut made = per_group + (groups - 1);
    let mut refused = None;
    'fill: for s in &qps[1..] {
        for g in &gids[1..groups as usize] {
            match s.qp.attach_mcast_blocking(*g, 0) {
                Ok(()) => made += 1,
                Err(e) => {
                    refused = Some(e);
                    break 'fill;
                }
            }
        }
    }
    let err = refused.expect("the total limit is reached");
    assert_eq!(made, total, "attachments made before the refusal");
    assert!(
        matches!(err, McastError::LimitReached { limit: "max_total_mcast_qp_attach", max, .. } if max == total),
        "{err:?}"
    );
    // A detach makes room again.
    qps[0].qp.detach_mcast_blocking(gids[1], 0).unwrap();
    qps[per_group as usize]
        .qp
        .attach_mcast_blocking(gids[1], 0)
        .unwrap();
}

/// Sends one datagram to each of `gids` (payload: the group's index) and returns the indices
/// that reached `r`, which has a receive posted for each.
fn indices_heard(env: &Env, sender: &Side, r: &Side, gids: &[Gid], wr_base: u64) -> Vec<u8> {
    for (k, _) in gids.iter().enumerate() {
        let sge = [r.sge(k as u64 * 256, 256)];
        r.qp.post_recv(&[RecvWr {
            wr_id: wr_base + k as u64,
            sges: &sge,
        }])
        .unwrap();
    }
    for (k, gid) in gids.iter().enumerate() {
        sender.buf.write(0, &[k as u8; 16]).unwrap();
        let ah = group_ah(sender, *gid);
        send_to_group(env, sender, &ah, 100 + k as u64, 16, QKEY);
    }
    let wc = env.poll(&r.cq, gids.len());
    let mut heard: Vec<u8> = wc
        .iter()
        .map(|w| {
            check_wc(w, w.wr_id, WcStatus::Success, WcOpcode::Recv);
            let slot = w.wr_id - wr_base;
            r.buf.to_vec(slot as usize * 256 + 40, 1).unwrap()[0]
        })
        .collect();
    heard.sort_unstable();
    // Receives left over (groups not heard) are flushed by the caller's QP teardown.
    heard
}

fn mcast_many_groups_deliver_and_detach_in_any_order(backend: Backend) {
    let env = Env::new(backend);
    if !supported(&env) {
        return;
    }
    // As many groups as the device promises, up to 8: on a device that hashes groups into a
    // table (mlx4) several share a bucket and chain, and detaching every other one removes
    // chain heads, middles and ends.
    let n = env.a().attr().max_mcast_grp.min(8) as u8;
    let gids: Vec<Gid> = (0..n).map(|k| group(&env, 20 + k)).collect();
    let sender = ud_side(env.a(), QKEY);
    let r = ud_side(env.b(), QKEY);
    for g in &gids {
        r.qp.attach_mcast_blocking(*g, 0).unwrap();
    }
    assert_eq!(
        indices_heard(&env, &sender, &r, &gids, 1000),
        (0..n).collect::<Vec<_>>()
    );
    // Every other group loses its only QP: its entry goes.
    for g in gids.iter().step_by(2) {
        r.qp.detach_mcast_blocking(*g, 0).unwrap();
    }
    let odd: Vec<u8> = (0..n).filter(|k| k % 2 == 1).collect();
    assert_eq!(indices_heard(&env, &sender, &r, &gids, 2000), odd);
    // Another QP joins them all (new entries for the even ones, a second member for the
    // odd ones); then r leaves the odd ones, whose entries stay for the other QP.
    let r2 = ud_side(env.b(), QKEY);
    for g in &gids {
        r2.qp.attach_mcast_blocking(*g, 0).unwrap();
    }
    for g in gids.iter().skip(1).step_by(2) {
        r.qp.detach_mcast_blocking(*g, 0).unwrap();
    }
    assert_eq!(r.qp.mcast_groups(), []);
    assert_eq!(indices_heard(&env, &sender, &r, &gids, 3000), []);
    assert_eq!(
        indices_heard(&env, &sender, &r2, &gids, 4000),
        (0..n).collect::<Vec<_>>()
    );
}

cases!(
    manual;
    mcast_send_reaches_attached_qps_on_both_devices,
    mcast_sender_gets_its_own_copy_only_when_attached,
    mcast_detach_stops_delivery,
    mcast_wrong_qkey_is_dropped_per_receiver,
    mcast_without_a_posted_receive_is_dropped,
    mcast_attach_rules,
    mcast_device_limits_are_enforced,
    mcast_many_groups_deliver_and_detach_in_any_order,
);

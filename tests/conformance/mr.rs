//! Memory regions (pyverbs `test_mr`, rdma-unit-test `mr_test`): registration rules, keys,
//! re-registration of rights, PD and address with traffic, and deregistration.

use portverbs::prelude::*;
use portverbs::verbs::{MrError, PdError, Rereg};

use super::env::{Backend, Env};
use super::obj_util::*;
use super::util::*;

fn reg_mr_and_dereg_mr(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let buf = env.a().alloc_buffer(8192).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ;
    let mr = pd.reg_mr_blocking(&buf, 4096..8192, access).unwrap();
    assert_ne!(mr.lkey(), 0);
    assert_eq!(mr.addr(), buf.addr() + 4096);
    assert_eq!(mr.len(), 4096);
    assert!(!mr.is_empty());
    assert_eq!(mr.access(), access);
    assert_eq!(mr.pd().pdn(), pd.pdn());
    assert_eq!(mr.buffer().1, 4096..8192);
    let sge = mr.sge_at(16, 100);
    assert_eq!(
        (sge.addr, sge.length, sge.lkey),
        (mr.addr() + 16, 100, mr.lkey())
    );
    assert_eq!(env.a().object_counts().mrs, 1);
    assert_eq!(env.devs[0].resources().mrs, 1);
    mr.dereg().unwrap();
    assert_eq!(env.a().object_counts().mrs, 0);
    assert_eq!(env.devs[0].resources().mrs, 0);
}

fn mr_has_an_lkey_always_and_an_rkey_only_with_remote_access(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let buf = env.a().alloc_buffer(4096).unwrap();
    let local_only = [AccessFlags::empty(), AccessFlags::LOCAL_WRITE];
    for access in local_only {
        let mr = pd.reg_mr_blocking(&buf, 0..4096, access).unwrap();
        assert_ne!(mr.lkey(), 0, "{access:?}");
        assert_eq!(mr.rkey(), None, "{access:?}: no rkey without remote access");
    }
    let remote = [
        AccessFlags::REMOTE_READ,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE,
        AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC,
    ];
    for access in remote {
        let mr = pd.reg_mr_blocking(&buf, 0..4096, access).unwrap();
        assert_ne!(mr.lkey(), 0, "{access:?}");
        assert!(
            mr.rkey().is_some_and(|k| k != 0),
            "{access:?}: remote access gives an rkey"
        );
    }
}

fn remote_write_or_atomic_without_local_write_is_rejected(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let buf = env.a().alloc_buffer(4096).unwrap();
    for access in [
        AccessFlags::REMOTE_WRITE,
        AccessFlags::REMOTE_ATOMIC,
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ,
        AccessFlags::REMOTE_ATOMIC | AccessFlags::MW_BIND,
    ] {
        match pd.reg_mr_blocking(&buf, 0..4096, access) {
            Err(MrError::RemoteWithoutLocalWrite { access: a }) => assert_eq!(a, access),
            other => panic!("{access:?}: expected RemoteWithoutLocalWrite, got {other:?}"),
        }
    }
    // The same rule holds for re-registration, and the MR keeps its rights.
    let mr = pd
        .reg_mr_blocking(&buf, 0..4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let r = mr.rereg_blocking(Rereg {
        access: Some(AccessFlags::REMOTE_WRITE),
        ..Rereg::default()
    });
    assert!(
        matches!(r, Err(MrError::RemoteWithoutLocalWrite { .. })),
        "{r:?}"
    );
    assert_eq!(mr.access(), AccessFlags::LOCAL_WRITE);
    assert_eq!(env.devs[0].resources().mrs, 1);
}

fn reg_mr_with_zero_based_access_is_invalid(backend: Backend) {
    // ZERO_BASED is a property of windows, not of regions.
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let buf = env.a().alloc_buffer(4096).unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::ZERO_BASED;
    match pd.reg_mr_blocking(&buf, 0..4096, access) {
        Err(MrError::InvalidAccess { access: a }) => assert_eq!(a, access),
        other => panic!("expected InvalidAccess, got {other:?}"),
    }
    assert_eq!(env.devs[0].resources().mrs, 0);
}

fn reg_mr_outside_the_buffer_fails_with_out_of_range(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let buf = env.a().alloc_buffer(4096).unwrap();
    match pd.reg_mr_blocking(&buf, 4000..4200, AccessFlags::LOCAL_WRITE) {
        Err(MrError::OutOfRange {
            offset,
            len,
            buffer_len,
        }) => assert_eq!((offset, len, buffer_len), (4000, 200, 4096)),
        other => panic!("expected OutOfRange, got {other:?}"),
    }
    let r = pd.reg_mr_blocking(&buf, 5000..5000, AccessFlags::empty());
    assert!(matches!(r, Err(MrError::OutOfRange { .. })), "{r:?}");
    assert_eq!(env.devs[0].resources().mrs, 0);
    // Re-registration checks the new range the same way and leaves the MR as it was.
    let mr = pd
        .reg_mr_blocking(&buf, 0..4096, AccessFlags::empty())
        .unwrap();
    let r = mr.rereg_blocking(Rereg {
        memory: Some((&buf, 0..8192)),
        ..Rereg::default()
    });
    assert!(
        matches!(
            r,
            Err(MrError::OutOfRange {
                offset: 0,
                len: 8192,
                buffer_len: 4096
            })
        ),
        "{r:?}"
    );
    assert_eq!((mr.addr(), mr.len()), (buf.addr(), 4096));
}

fn zero_length_mr_registers(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let buf = env.a().alloc_buffer(4096).unwrap();
    let mr = pd
        .reg_mr_blocking(&buf, 100..100, AccessFlags::LOCAL_WRITE)
        .unwrap();
    assert_eq!(mr.len(), 0);
    assert!(mr.is_empty());
    assert_eq!(mr.addr(), buf.addr() + 100);
    mr.dereg().unwrap();
}

fn dereg_mr_with_other_handles_is_busy(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let buf = env.a().alloc_buffer(4096).unwrap();
    let mr = pd
        .reg_mr_blocking(&buf, 0..4096, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let lkey = mr.lkey();
    let other = mr.clone();
    let mr = match mr.dereg().map_err(|r| r.into_parts()) {
        Err((MrError::Busy { lkey: k, .. }, mr)) => {
            assert_eq!(k, lkey);
            mr
        }
        other => panic!("expected Busy, got {:?}", other.err().map(|e| e.0)),
    };
    assert_eq!(env.devs[0].resources().mrs, 1, "still registered");
    drop(other);
    mr.dereg().unwrap();
    assert_eq!(env.devs[0].resources().mrs, 0);
}

fn rdma_write_to_a_deregistered_mr_fails_with_remote_access_error(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let mr =
        p.b.pd
            .reg_mr_blocking(&p.b.buf, 0..4096, FULL_ACCESS)
            .unwrap();
    let target = RemoteAddr {
        addr: mr.addr(),
        rkey: mr.rkey().unwrap(),
    };
    mr.dereg().unwrap();
    let wc = write(&env, &p.a, 1, &pattern(1, 64), target);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(p.b.buf.to_vec(0, 64).unwrap(), vec![0; 64]);
}

fn send_from_a_deregistered_mr_fails_with_local_protection_error(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let mr =
        p.a.pd
            .reg_mr_blocking(&p.a.buf, 0..4096, AccessFlags::LOCAL_WRITE)
            .unwrap();
    let sge = [mr.sge_at(0, 64)];
    mr.dereg().unwrap();
    p.b.post_recv(1, 0, 4096);
    let wc = run(&env, &p.a, SendWr::new(2, SendOp::Send).sges(&sge));
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::LocProtErr));
}

fn rereg_dropping_remote_write_makes_rdma_write_fail_until_restored(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let remote = p.b.remote(0);
    let reduced = FULL_ACCESS - AccessFlags::REMOTE_WRITE;
    p.b.mr
        .rereg_blocking(Rereg {
            access: Some(reduced),
            ..Rereg::default()
        })
        .unwrap();
    assert_eq!(p.b.mr.access(), reduced);
    let wc = write(&env, &p.a, 1, &pattern(1, 256), remote);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(
        p.b.buf.to_vec(0, 256).unwrap(),
        vec![0; 256],
        "nothing written"
    );
    restate_pair(&env, &p, &Params::default());
    p.b.mr
        .rereg_blocking(Rereg {
            access: Some(FULL_ACCESS),
            ..Rereg::default()
        })
        .unwrap();
    let data = pattern(2, 256);
    let wc = write(&env, &p.a, 2, &data, p.b.remote(0));
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    assert_eq!(wc.opcode, WcOpcode::RdmaWrite);
    assert_eq!(p.b.buf.to_vec(0, 256).unwrap(), data);
}

fn rereg_adding_remote_write_enables_rdma_write(backend: Backend) {
    let env = Env::new(backend);
    let start = AccessFlags::LOCAL_WRITE;
    let p = Pair::with(&env, QpType::Rc, &Params::default(), start);
    assert_eq!(p.b.mr.rkey(), None);
    p.b.mr
        .rereg_blocking(Rereg {
            access: Some(start | AccessFlags::REMOTE_WRITE),
            ..Rereg::default()
        })
        .unwrap();
    let data = pattern(3, 512);
    let wc = write(&env, &p.a, 7, &data, p.b.remote(64));
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(p.b.buf.to_vec(64, 512).unwrap(), data);
}

fn rereg_to_local_only_access_hides_the_rkey(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let buf = env.a().alloc_buffer(4096).unwrap();
    let mr = pd.reg_mr_blocking(&buf, 0..4096, FULL_ACCESS).unwrap();
    let lkey = mr.lkey();
    assert!(mr.rkey().is_some());
    mr.rereg_blocking(Rereg {
        access: Some(AccessFlags::LOCAL_WRITE),
        ..Rereg::default()
    })
    .unwrap();
    assert_eq!(mr.rkey(), None);
    assert_eq!(mr.lkey(), lkey, "a rights change keeps the lkey usable");
}

fn rereg_dropping_remote_atomic_makes_atomics_fail_until_restored(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.buf.store_u64(64, 100).unwrap();
    let faa = |wr_id| {
        let sge = [p.a.sge(0, 8)];
        let op = SendOp::AtomicFetchAdd {
            remote: p.b.remote(64),
            add: 5,
        };
        run(&env, &p.a, SendWr::new(wr_id, op).sges(&sge))
    };
    p.b.mr
        .rereg_blocking(Rereg {
            access: Some(FULL_ACCESS - AccessFlags::REMOTE_ATOMIC),
            ..Rereg::default()
        })
        .unwrap();
    assert_eq!(faa(1).status, WcStatus::RemAccessErr);
    assert_eq!(p.b.buf.load_u64(64).unwrap(), 100, "untouched");
    restate_pair(&env, &p, &Params::default());
    p.b.mr
        .rereg_blocking(Rereg {
            access: Some(FULL_ACCESS),
            ..Rereg::default()
        })
        .unwrap();
    let wc = faa(2);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    assert_eq!(
        p.a.buf.load_u64(0).unwrap(),
        100,
        "the original value comes back"
    );
    assert_eq!(p.b.buf.load_u64(64).unwrap(), 105);
}

fn rereg_to_another_pd_fails_traffic_and_back_restores_it(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.post_recv(1, 0, 4096);
    assert_eq!(
        send(&env, &p.a, 10, &pattern(1, 100)).status,
        WcStatus::Success
    );
    assert_eq!(one(&env, &p.b.cq).status, WcStatus::Success);

    let new_pd = env.b().alloc_pd_blocking().unwrap();
    p.b.mr
        .rereg_blocking(Rereg {
            pd: Some(&new_pd),
            ..Rereg::default()
        })
        .unwrap();
    assert_eq!(p.b.mr.pd().pdn(), new_pd.pdn());
    p.b.post_recv(2, 0, 4096);
    let wc = send(&env, &p.a, 11, &pattern(2, 100));
    assert_eq!(
        wc.status,
        WcStatus::RemOpErr,
        "pyverbs: remote operation error"
    );
    let rwc = one(&env, &p.b.cq);
    assert_eq!((rwc.wr_id, rwc.status), (2, WcStatus::LocProtErr));
    // The MR holds its new PD.
    let Err((PdError::Busy { .. }, new_pd)) = new_pd.dealloc().map_err(|r| r.into_parts()) else {
        panic!("a PD with a re-registered MR was freed");
    };

    restate_pair(&env, &p, &Params::default());
    p.b.mr
        .rereg_blocking(Rereg {
            pd: Some(&p.b.pd),
            ..Rereg::default()
        })
        .unwrap();
    p.b.post_recv(3, 0, 4096);
    let data = pattern(3, 100);
    assert_eq!(send(&env, &p.a, 12, &data).status, WcStatus::Success);
    let rwc = one(&env, &p.b.cq);
    assert_eq!(
        (rwc.wr_id, rwc.status, rwc.byte_len),
        (3, WcStatus::Success, 100)
    );
    assert_eq!(p.b.buf.to_vec(0, 100).unwrap(), data);
    new_pd.dealloc().unwrap();
}

fn rereg_to_a_new_address_with_a_receive_outstanding_fails_traffic(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.post_recv(1, 0, 4096);
    let new_buf = env.b().alloc_buffer(1 << 16).unwrap();
    p.b.mr
        .rereg_blocking(Rereg {
            memory: Some((&new_buf, 0..1 << 16)),
            ..Rereg::default()
        })
        .unwrap();
    assert_eq!(p.b.mr.addr(), new_buf.addr());
    assert_eq!(p.b.mr.len(), 1 << 16);
    let wc = send(&env, &p.a, 10, &pattern(1, 100));
    assert_eq!(
        wc.status,
        WcStatus::RemOpErr,
        "pyverbs: remote operation error"
    );
    let rwc = one(&env, &p.b.cq);
    assert_eq!((rwc.wr_id, rwc.status), (1, WcStatus::LocProtErr));
    assert_eq!(p.b.buf.to_vec(0, 100).unwrap(), vec![0; 100]);

    restate_pair(&env, &p, &Params::default());
    p.b.post_recv(2, 0, 4096);
    let data = pattern(4, 100);
    assert_eq!(send(&env, &p.a, 11, &data).status, WcStatus::Success);
    let rwc = one(&env, &p.b.cq);
    assert_eq!((rwc.wr_id, rwc.status), (2, WcStatus::Success));
    assert_eq!(
        new_buf.to_vec(0, 100).unwrap(),
        data,
        "lands in the new memory"
    );
    assert_eq!(p.b.buf.to_vec(0, 100).unwrap(), vec![0; 100]);
}

fn rereg_onto_an_empty_range_is_refused_and_the_mr_is_unchanged(backend: Backend) {
    // rdma-unit-test ReregMrInvalidBuffer: IBV_REREG_MR_ERR_INPUT, the MR as it was.
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let (lkey, rkey, addr, len) = (p.b.mr.lkey(), p.b.mr.rkey(), p.b.mr.addr(), p.b.mr.len());
    let other = env.b().alloc_buffer(4096).unwrap();
    for range in [0..0, 4096..4096, 100..100] {
        let start = range.start;
        match p.b.mr.rereg_blocking(Rereg {
            memory: Some((&other, range)),
            ..Rereg::default()
        }) {
            Err(MrError::EmptyRange { offset }) => assert_eq!(offset, start),
            other => panic!("expected EmptyRange, got {other:?}"),
        }
    }
    assert_eq!(
        (p.b.mr.lkey(), p.b.mr.rkey(), p.b.mr.addr(), p.b.mr.len()),
        (lkey, rkey, addr, len)
    );
    let data = pattern(4, 128);
    let wc = write(&env, &p.a, 1, &data, p.b.remote(256));
    assert_eq!(
        wc.status,
        WcStatus::Success,
        "the old registration still works"
    );
    assert_eq!(p.b.buf.to_vec(256, 128).unwrap(), data);
}

cases!(
    manual;
    reg_mr_and_dereg_mr,
    mr_has_an_lkey_always_and_an_rkey_only_with_remote_access,
    remote_write_or_atomic_without_local_write_is_rejected,
    reg_mr_with_zero_based_access_is_invalid,
    reg_mr_outside_the_buffer_fails_with_out_of_range,
    zero_length_mr_registers,
    dereg_mr_with_other_handles_is_busy,
    rdma_write_to_a_deregistered_mr_fails_with_remote_access_error,
    send_from_a_deregistered_mr_fails_with_local_protection_error,
    rereg_dropping_remote_write_makes_rdma_write_fail_until_restored,
    rereg_adding_remote_write_enables_rdma_write,
    rereg_to_local_only_access_hides_the_rkey,
    rereg_dropping_remote_atomic_makes_atomics_fail_until_restored,
    rereg_to_another_pd_fails_traffic_and_back_restores_it,
    rereg_to_a_new_address_with_a_receive_outstanding_fails_traffic,
    rereg_onto_an_empty_range_is_refused_and_the_mr_is_unchanged,
);

//! Atomics (IBA 9.4.5, 10.8.3.4; pyverbs `test_atomic`; rdma-unit-test `rc_test`): the local
//! buffer is exactly 8 bytes, and the checks run in one documented order — at the requester
//! the length (`LOC_LEN_ERR`) before the local key (`LOC_PROT_ERR`); at the responder the
//! rights, key and range (`REM_ACCESS_ERR`) before the alignment (`REM_INV_REQ_ERR`), as rxe
//! does. Equal-value compare-and-swap and fetch-and-add wrap-around complete normally.

use portverbs::prelude::*;

use super::env::{Backend, Env};
use super::tx_util::*;
use super::util::*;

fn faa(id: u64, sge: &[Sge], remote: RemoteAddr) -> SendWr<'_> {
    SendWr::new(id, SendOp::AtomicFetchAdd { remote, add: 1 }).sges(sge)
}

fn cas(id: u64, sge: &[Sge], remote: RemoteAddr, compare: u64, swap: u64) -> SendWr<'_> {
    SendWr::new(
        id,
        SendOp::AtomicCmpSwp {
            remote,
            compare,
            swap,
        },
    )
    .sges(sge)
}

/// Posts `wr` signaled and returns its completion; the QP is then in ERR unless it succeeded.
fn one_atomic(env: &Env, side: &Side, wr: SendWr<'_>) -> WorkCompletion {
    side.qp.post_send(&[wr.signaled()]).unwrap();
    poll_one(env, &side.cq)
}

fn atomic_with_a_local_buffer_other_than_8_bytes_is_loc_len(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.buf.store_u64(0, 5).unwrap();
    let lens: [&[u32]; 4] = [&[4], &[16], &[], &[4, 8]];
    for (i, lens) in lens.into_iter().enumerate() {
        let sges: Vec<Sge> = lens
            .iter()
            .scan(0u64, |at, &l| {
                let s = p.a.sge(*at, l);
                *at += u64::from(l);
                Some(s)
            })
            .collect();
        let wc = one_atomic(&env, &p.a, faa(i as u64, &sges, p.b.remote(0)));
        assert_eq!(
            (wc.wr_id, wc.status),
            (i as u64, WcStatus::LocLenErr),
            "local buffer of {lens:?} bytes"
        );
        assert_eq!(queried_state(&p.a.qp), QpState::Err);
        restate_pair_rc(&env, &p);
    }
    assert_eq!(
        p.b.buf.load_u64(0).unwrap(),
        5,
        "the remote word is untouched"
    );
    // Eight bytes in two entries are eight bytes.
    let sges = [p.a.sge(0, 4), p.a.sge(4, 4)];
    let wc = one_atomic(&env, &p.a, faa(9, &sges, p.b.remote(0)));
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 6);
    assert_eq!(
        p.a.buf.load_u64(0).unwrap(),
        5,
        "the original value came back"
    );
}

fn atomic_length_is_checked_before_the_local_key(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let bad_key = Sge {
        lkey: p.a.mr.lkey() ^ 0x80,
        ..p.a.sge(0, 16)
    };
    let wc = one_atomic(&env, &p.a, faa(1, &[bad_key], p.b.remote(0)));
    assert_eq!(wc.status, WcStatus::LocLenErr);
    restate_pair_rc(&env, &p);
    let bad_key = Sge {
        lkey: p.a.mr.lkey() ^ 0x80,
        ..p.a.sge(0, 8)
    };
    let wc = one_atomic(&env, &p.a, faa(2, &[bad_key], p.b.remote(0)));
    assert_eq!(
        wc.status,
        WcStatus::LocProtErr,
        "an 8-byte buffer with a bad key"
    );
}

fn atomic_key_is_checked_before_the_alignment(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let sge = [p.a.sge(0, 8)];
    let misaligned_bad_key = RemoteAddr {
        addr: p.b.mr.addr() + 4,
        rkey: p.b.mr.rkey().unwrap() ^ 0x80,
    };
    let wc = one_atomic(&env, &p.a, faa(1, &sge, misaligned_bad_key));
    assert_eq!(wc.status, WcStatus::RemAccessErr, "key before alignment");
    restate_pair_rc(&env, &p);
    let misaligned_outside = RemoteAddr {
        addr: p.b.mr.addr() + p.b.mr.len() as u64 - 4,
        rkey: p.b.mr.rkey().unwrap(),
    };
    let wc = one_atomic(&env, &p.a, faa(2, &sge, misaligned_outside));
    assert_eq!(wc.status, WcStatus::RemAccessErr, "range before alignment");
    restate_pair_rc(&env, &p);
    let wc = one_atomic(&env, &p.a, faa(3, &sge, p.b.remote(4)));
    assert_eq!(wc.status, WcStatus::RemInvReqErr, "a valid key, misaligned");
}

fn compare_and_swap_with_equal_and_unequal_values(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.buf.store_u64(64, 7).unwrap();
    let sge = [p.a.sge(0, 8)];
    let wc = one_atomic(&env, &p.a, cas(1, &sge, p.b.remote(64), 7, 7));
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::CompSwap)
    );
    assert_eq!(wc.byte_len, 8);
    assert_eq!(p.a.buf.load_u64(0).unwrap(), 7);
    assert_eq!(
        p.b.buf.load_u64(64).unwrap(),
        7,
        "equal: swapped with the same value"
    );
    let wc = one_atomic(&env, &p.a, cas(2, &sge, p.b.remote(64), 8, 99));
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(
        p.a.buf.load_u64(0).unwrap(),
        7,
        "the original value comes back"
    );
    assert_eq!(p.b.buf.load_u64(64).unwrap(), 7, "unequal: not swapped");
    let wc = one_atomic(&env, &p.a, cas(3, &sge, p.b.remote(64), 7, 99));
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(p.b.buf.load_u64(64).unwrap(), 99);
}

fn fetch_and_add_wraps_around(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.buf.store_u64(8, u64::MAX).unwrap();
    let sge = [p.a.sge(0, 8)];
    let wr = SendWr::new(
        1,
        SendOp::AtomicFetchAdd {
            remote: p.b.remote(8),
            add: 2,
        },
    )
    .sges(&sge);
    let wc = one_atomic(&env, &p.a, wr);
    assert_eq!(
        (wc.status, wc.opcode),
        (WcStatus::Success, WcOpcode::FetchAdd)
    );
    assert_eq!(p.a.buf.load_u64(0).unwrap(), u64::MAX);
    assert_eq!(p.b.buf.load_u64(8).unwrap(), 1);
}

/// RESET → RTS again for both sides of an RC pair with the default parameters.
fn restate_pair_rc(env: &Env, p: &Pair) {
    super::obj_util::restate_pair(env, p, &Params::default());
}

fn atomic_misaligned_with_a_bad_lkey_is_rem_inv_req(backend: Backend) {
    // The responder's error comes first: the local key is only met by the response.
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.buf.store_u64(0, 1).unwrap();
    let bad = Sge {
        lkey: p.a.mr.lkey() ^ 0x80,
        ..p.a.sge(0, 8)
    };
    let wc = one_atomic(&env, &p.a, faa(1, &[bad], p.b.remote(4)));
    assert_eq!(wc.status, WcStatus::RemInvReqErr);
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 1);
}

fn atomic_with_a_bad_lkey_executes_remotely_and_fails_locally(backend: Backend) {
    // As on rxe and HCAs (rdma-unit-test FetchAddInvalidLKey/CompareSwapInvalidLKey): the
    // responder executes the atomic; the original value cannot land, LOC_PROT_ERR.
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    p.b.buf.store_u64(0, 2).unwrap();
    p.a.buf.store_u64(0, 0xaa).unwrap();
    let bad = Sge {
        lkey: p.a.mr.lkey() ^ 0x80,
        ..p.a.sge(0, 8)
    };
    let wc = one_atomic(&env, &p.a, faa(1, &[bad], p.b.remote(0)));
    assert_eq!(wc.status, WcStatus::LocProtErr);
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 3, "the responder added 1");
    assert_eq!(
        p.a.buf.load_u64(0).unwrap(),
        0xaa,
        "the local word is untouched"
    );
    restate_pair_rc(&env, &p);
    let wc = one_atomic(&env, &p.a, cas(2, &[bad], p.b.remote(0), 3, 4));
    assert_eq!(wc.status, WcStatus::LocProtErr);
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 4, "the responder swapped");
}

fn atomic_result_buffer_without_local_write_is_loc_prot(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let ro =
        p.a.pd
            .reg_mr_blocking(&p.a.buf, 0..4096, AccessFlags::empty())
            .unwrap();
    p.a.buf.store_u64(0, 0xbb).unwrap();
    let wc = one_atomic(&env, &p.a, faa(1, &[ro.sge_at(0, 8)], p.b.remote(0)));
    assert_eq!(wc.status, WcStatus::LocProtErr);
    assert_eq!(p.a.buf.load_u64(0).unwrap(), 0xbb);
}

fn atomics_need_only_remote_atomic_on_the_target(backend: Backend) {
    let env = Env::new(backend);
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_ATOMIC;
    let p = Pair::with(&env, QpType::Rc, &Params::default(), access);
    let sge = [p.a.sge(0, 8)];
    assert_eq!(
        one_atomic(&env, &p.a, faa(1, &sge, p.b.remote(0))).status,
        WcStatus::Success
    );
    assert_eq!(
        one_atomic(&env, &p.a, cas(2, &sge, p.b.remote(0), 1, 9)).status,
        WcStatus::Success
    );
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 9);
}

fn atomic_to_a_responder_without_rd_atomic_resources_fails(backend: Backend) {
    let env = Env::new(backend);
    let a = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let b = Side::new(env.b(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
    let p = Params::default();
    to_init(&a.qp, &p);
    to_init(&b.qp, &p);
    to_rts(&a.qp, b.qp.qp_num(), Env::gid(env.b()), &p);
    to_rts(
        &b.qp,
        a.qp.qp_num(),
        Env::gid(env.a()),
        &Params { rd_atomic: 0, ..p },
    );
    let expected = if has_quirk(env.b(), portverbs::hal::QuirkId::ZeroRdAtomicIsAccessError) {
        WcStatus::RemAccessErr
    } else {
        WcStatus::RemInvReqErr
    };
    let wc = one_atomic(&env, &a, faa(1, &[a.sge(0, 8)], b.remote(0)));
    assert_eq!(wc.status, expected);
    assert_eq!(b.buf.load_u64(0).unwrap(), 0);
}

fn unsignaled_atomics_complete_silently_and_take_effect(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let s1 = [p.a.sge(0, 8)];
    let s2 = [p.a.sge(8, 8)];
    let first = SendWr::new(
        1,
        SendOp::AtomicFetchAdd {
            remote: p.b.remote(0),
            add: 10,
        },
    )
    .sges(&s1);
    let second = SendWr::new(
        2,
        SendOp::AtomicFetchAdd {
            remote: p.b.remote(0),
            add: 1,
        },
    )
    .sges(&s2)
    .signaled();
    p.a.qp.post_send(&[first, second]).unwrap();
    let wc = poll_one(&env, &p.a.cq);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::Success));
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 11);
    assert_eq!(
        p.a.buf.load_u64(8).unwrap(),
        10,
        "the second saw the first's result"
    );
}

cases!(
    manual;
    atomic_with_a_local_buffer_other_than_8_bytes_is_loc_len,
    atomic_length_is_checked_before_the_local_key,
    atomic_key_is_checked_before_the_alignment,
    compare_and_swap_with_equal_and_unequal_values,
    fetch_and_add_wraps_around,
    atomic_misaligned_with_a_bad_lkey_is_rem_inv_req,
    atomic_with_a_bad_lkey_executes_remotely_and_fails_locally,
    atomic_result_buffer_without_local_write_is_loc_prot,
    atomics_need_only_remote_atomic_on_the_target,
    atomic_to_a_responder_without_rd_atomic_resources_fails,
    unsignaled_atomics_complete_silently_and_take_effect,
);

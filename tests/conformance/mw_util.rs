//! Set-up shared by the memory-window cases (`mw`, `mw_rules`, `mw_access`): a pair whose QPs
//! may bind windows (windows live on side b, a reaches them), binds of both kinds, and a
//! second QP in b's PD.

use portverbs::prelude::*;

use super::env::Env;
use super::obj_util::*;
use super::tx_util::{connect, make_qp};
use super::util::*;

/// Remote read and write.
pub const RW: AccessFlags = AccessFlags::REMOTE_WRITE.union(AccessFlags::REMOTE_READ);

/// A pair whose QPs may bind windows; windows live on side b.
pub fn mw_pair(env: &Env) -> Pair {
    Pair::with(env, QpType::Rc, &mw_params(), FULL_ACCESS)
}

/// Binds a type-1 window of b over `len` bytes at `offset` of b's MR (`bind_mw`, wr_id 900,
/// checked to succeed); returns the new rkey.
pub fn bind_type1(env: &Env, p: &Pair, mw: &Mw, offset: u64, len: u64, access: AccessFlags) -> u32 {
    let addr = p.b.mr.addr() + offset;
    let rkey =
        p.b.qp
            .bind_mw(mw, &p.b.mr, addr, len, access, 900, true)
            .unwrap();
    let wc = one(env, &p.b.cq);
    assert_eq!((wc.wr_id, wc.status), (900, WcStatus::Success));
    assert_eq!(wc.opcode, WcOpcode::BindMw);
    assert_eq!(
        mw.rkey(),
        rkey,
        "the window answers to the key bind_mw returned"
    );
    rkey
}

/// Binds `mw` over `len` bytes at `offset` of `mr` with `access` by a BIND_MW work request
/// (wr_id 901) posted on `side` (how type 2 binds), checking that the request carries the
/// key the window now answers to; returns its completion.
pub fn bind_wr(
    env: &Env,
    side: &Side,
    mw: &Mw,
    mr: &Mr,
    offset: u64,
    len: u64,
    access: AccessFlags,
) -> WorkCompletion {
    let bind = mw.bind(mr, mr.addr() + offset, len, access);
    assert_eq!(bind.new_rkey, mw.rkey());
    run(env, side, SendWr::new(901, SendOp::BindMw { bind }))
}

/// `offset` into b's MR, reached through `rkey`.
pub fn remote(p: &Pair, offset: u64, rkey: u32) -> RemoteAddr {
    RemoteAddr {
        addr: p.b.mr.addr() + offset,
        rkey,
    }
}

/// A second RC QP in b's PD (on b's CQ), connected to a fresh side on device a.
pub fn second_qp(env: &Env, p: &Pair) -> (Qp, Side) {
    let qp2 = make_qp(&p.b.pd, &p.b.cq, QpType::Rc, None, false);
    let a2 = side_on(env.a(), cq(env.a(), 16), FULL_ACCESS);
    connect(&qp2, &a2.qp, &mw_params());
    (qp2, a2)
}

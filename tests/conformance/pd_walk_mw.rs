//! The protection-domain walk, continued: the rows of memory windows (binding them, reaching
//! memory through them, invalidating them), one case per row of
//! `backends/transport/src/memory/pd.rs`, with the helpers of `pd_walk`.

use portverbs::prelude::*;
use portverbs::verbs::{MwBind, inc_rkey};

use super::env::{Backend, Env};
use super::mw_util::{RW, bind_wr, mw_pair};
use super::obj_util::*;
use super::pd_walk::{ALL, foreign_mr, remote_ops_refused, requester, with_receive};
use super::tx_util::*;
use super::util::*;

/// A QP of another PD on device b, connected to a side of its own on a, with an MR of its PD
/// over the first 4 KiB of b's buffer: the owner of the foreign windows.
struct OtherDomain {
    cq: Cq,
    qp: Qp,
    mr: Mr,
    a: Side,
    pd: Pd,
}

impl OtherDomain {
    fn new(env: &Env, p: &Pair) -> Self {
        let pd = env.b().alloc_pd_blocking().unwrap();
        let cq = cq(env.b(), 16);
        let qp = make_qp(&pd, &cq, QpType::Rc, None, false);
        let a = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
        connect(&a.qp, &qp, &mw_params());
        let mr = pd.reg_mr_blocking(&p.b.buf, 0..4096, FULL_ACCESS).unwrap();
        Self { cq, qp, mr, a, pd }
    }

    /// Binds `mw` (of this PD) over the MR through this QP; returns its key.
    fn bind(&self, env: &Env, mw: &Mw) -> u32 {
        let addr = self.mr.addr();
        if mw.mw_type() == MwType::Type1 {
            self.qp
                .bind_mw(mw, &self.mr, addr, 4096, ALL, 1, true)
                .unwrap();
        } else {
            let bind = mw.bind(&self.mr, addr, 4096, ALL);
            let wr = SendWr::new(1, SendOp::BindMw { bind }).signaled();
            self.qp.post_send(&[wr]).unwrap();
        }
        assert_eq!(one(env, &self.cq).status, WcStatus::Success);
        mw.rkey()
    }

    /// Writes `data` through `rkey` from this domain's own QP (the key's rightful user).
    fn write(&self, env: &Env, rkey: u32, data: &[u8]) -> WorkCompletion {
        let addr = self.mr.addr();
        write(env, &self.a, 70, data, RemoteAddr { addr, rkey })
    }
}
fn rkey_of_a_type1_window(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let other = OtherDomain::new(&env, &p);
    let mw = other.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let rkey = other.bind(&env, &mw);
    let remote = RemoteAddr {
        addr: other.mr.addr(),
        rkey,
    };
    let expect = requester("rkey_of_a_type1_window");
    remote_ops_refused(&env, &p, &mw_params(), remote, expect);
    // The key is good in its own domain.
    assert!(other.write(&env, rkey, &pattern(6, 8)).is_ok());
    assert_eq!(p.b.buf.to_vec(0, 8).unwrap(), pattern(6, 8));
}

fn rkey_of_a_type2_window(backend: Backend) {
    let env = Env::new(backend);
    let expect = requester("rkey_of_a_type2_window");
    let p = mw_pair(&env);
    // Bound in another domain.
    let other = OtherDomain::new(&env, &p);
    let mw = other.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let rkey = other.bind(&env, &mw);
    let remote = RemoteAddr {
        addr: other.mr.addr(),
        rkey,
    };
    remote_ops_refused(&env, &p, &mw_params(), remote, expect);
    // Bound in the responder's domain, but to another of its QPs.
    let (qp2, a2) = super::mw_util::second_qp(&env, &p);
    let mw2 = p.b.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let bind = mw2.bind(&p.b.mr, p.b.mr.addr(), 4096, ALL);
    qp2.post_send(&[SendWr::new(1, SendOp::BindMw { bind }).signaled()])
        .unwrap();
    assert!(one(&env, &p.b.cq).is_ok());
    let remote2 = RemoteAddr {
        addr: p.b.mr.addr(),
        rkey: mw2.rkey(),
    };
    remote_ops_refused(&env, &p, &mw_params(), remote2, expect);
    // Each key is good through the QP its window is bound to.
    assert!(other.write(&env, rkey, &pattern(7, 8)).is_ok());
    assert!(write(&env, &a2, 8, &pattern(8, 8), remote2).is_ok());
    assert_eq!(p.b.buf.to_vec(0, 8).unwrap(), pattern(8, 8));
}

/// b's QP is in ERR after a failed bind; restated, a WRITE through `rkey` fails and b's first
/// 4 KiB are still zero: the window did not bind.
fn bind_left_nothing(env: &Env, p: &Pair, rkey: u32) {
    assert_eq!(queried_state(&p.b.qp), QpState::Err);
    restate_pair(env, p, &mw_params());
    let target = RemoteAddr {
        addr: p.b.mr.addr(),
        rkey,
    };
    let wc = write(env, &p.a, 60, &pattern(9, 8), target);
    assert_eq!(wc.status, WcStatus::RemAccessErr);
    assert_eq!(p.b.buf.to_vec(0, 4096).unwrap(), vec![0; 4096]);
    restate_pair(env, p, &mw_params());
}

fn window_of_a_bind(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let other_pd = env.b().alloc_pd_blocking().unwrap();
    let mw = other_pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let wc = bind_wr(&env, &p.b, &mw, &p.b.mr, 0, 4096, RW);
    assert_eq!(wc.status, requester("window_of_a_bind"));
    bind_left_nothing(&env, &p, mw.rkey());
}

fn mr_of_a_bind(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let foreign = foreign_mr(env.b(), &p.b.buf, FULL_ACCESS);
    for t in [MwType::Type1, MwType::Type2] {
        let mw = p.b.pd.alloc_mw_blocking(t).unwrap();
        let wc = bind_wr(&env, &p.b, &mw, &foreign, 0, 4096, RW);
        assert_eq!(wc.status, requester("mr_of_a_bind"), "{t:?}");
        bind_left_nothing(&env, &p, mw.rkey());
    }
}

fn bind_right_of_a_bind_mr(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let no_bind =
        p.b.pd
            .reg_mr_blocking(&p.b.buf, 0..4096, AccessFlags::LOCAL_WRITE | RW)
            .unwrap();
    for t in [MwType::Type1, MwType::Type2] {
        let mw = p.b.pd.alloc_mw_blocking(t).unwrap();
        let wc = bind_wr(&env, &p.b, &mw, &no_bind, 0, 4096, RW);
        assert_eq!(wc.status, requester("bind_right_of_a_bind_mr"), "{t:?}");
        bind_left_nothing(&env, &p, mw.rkey());
    }
}

fn key_of_a_type2_bind(backend: Backend) {
    let env = Env::new(backend);
    let expect = requester("key_of_a_type2_bind");
    let p = mw_pair(&env);
    let other_pd = env.b().alloc_pd_blocking().unwrap();
    let foreign_mw = other_pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let mr_key = p.b.mr.rkey().unwrap();
    // The new key's index names a window of another PD, then an MR: neither is this
    // domain's window, whatever tag byte the consumer picks.
    for named in [foreign_mw.rkey(), mr_key] {
        let bind = MwBind {
            new_rkey: inc_rkey(named),
            mw_type: MwType::Type2,
            mr_lkey: p.b.mr.lkey(),
            addr: p.b.mr.addr(),
            length: 4096,
            access: RW,
        };
        let wc = run(&env, &p.b, SendWr::new(3, SendOp::BindMw { bind }));
        assert_eq!((wc.wr_id, wc.status), (3, expect), "{named:#x}");
        bind_left_nothing(&env, &p, bind.new_rkey);
    }
    // The MR still answers to its own key.
    assert!(write(&env, &p.a, 4, &pattern(10, 8), p.b.remote(0)).is_ok());
}

fn type1_bind_through_the_verb(backend: Backend) {
    let env = Env::new(backend);
    let expect = requester("type1_bind_through_the_verb");
    let p = mw_pair(&env);
    let other_pd = env.b().alloc_pd_blocking().unwrap();
    let foreign_mr = other_pd
        .reg_mr_blocking(&p.b.buf, 0..4096, FULL_ACCESS)
        .unwrap();
    let foreign_mw = other_pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let own_mw = p.b.pd.alloc_mw_blocking(MwType::Type1).unwrap();
    // The window of another PD, then the MR of another PD.
    for (mw, mr) in [(&foreign_mw, &p.b.mr), (&own_mw, &foreign_mr)] {
        let rkey =
            p.b.qp
                .bind_mw(mw, mr, mr.addr(), 4096, RW, 5, true)
                .unwrap();
        let wc = one(&env, &p.b.cq);
        assert_eq!((wc.wr_id, wc.status), (5, expect));
        bind_left_nothing(&env, &p, rkey);
    }
}

fn key_of_a_local_invalidate(backend: Backend) {
    let env = Env::new(backend);
    let p = mw_pair(&env);
    let other = OtherDomain::new(&env, &p);
    let mw = other.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let rkey = other.bind(&env, &mw);
    let wc = run(&env, &p.b, SendWr::new(4, SendOp::LocalInv { rkey }));
    assert_eq!(
        (wc.wr_id, wc.status),
        (4, requester("key_of_a_local_invalidate"))
    );
    // The window is still bound.
    assert!(other.write(&env, rkey, &pattern(11, 8)).is_ok());
    assert_eq!(p.b.buf.to_vec(0, 8).unwrap(), pattern(11, 8));
}

fn key_of_a_send_with_invalidate(backend: Backend) {
    let env = Env::new(backend);
    let (send_status, recv_status) = with_receive("key_of_a_send_with_invalidate");
    let p = mw_pair(&env);
    let other = OtherDomain::new(&env, &p);
    let mw = other.pd.alloc_mw_blocking(MwType::Type2).unwrap();
    let rkey = other.bind(&env, &mw);
    p.b.post_recv(3, 8192, 4096);
    p.a.buf.write(0, &pattern(12, 32)).unwrap();
    let op = SendOp::SendWithInv { rkey };
    let wc = run(&env, &p.a, SendWr::new(4, op).sges(&[p.a.sge(0, 32)]));
    assert_eq!((wc.wr_id, wc.status), (4, send_status));
    let rwc = one(&env, &p.b.cq);
    assert_eq!((rwc.wr_id, rwc.status), (3, recv_status));
    // The window is still bound.
    assert!(other.write(&env, rkey, &pattern(13, 8)).is_ok());
    assert_eq!(p.b.buf.to_vec(0, 8).unwrap(), pattern(13, 8));
}
/// Declares the walk's cases on every backend and records their names.
macro_rules! walk {
    ($($name:ident),* $(,)?) => {
        pub(super) const WALKED: &[&str] = &[$(stringify!($name)),*];
        cases!($($name),*);
    };
}

walk!(
    rkey_of_a_type1_window,
    rkey_of_a_type2_window,
    window_of_a_bind,
    mr_of_a_bind,
    bind_right_of_a_bind_mr,
    key_of_a_type2_bind,
    type1_bind_through_the_verb,
    key_of_a_local_invalidate,
    key_of_a_send_with_invalidate,
);

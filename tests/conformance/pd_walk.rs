//! The protection-domain walk (IBA 10.2.3, chapters 10 and 11): one case per row of the
//! transport's table (`backends/transport/src/memory/pd.rs`), each naming an object of another
//! domain in a work request and asserting the outcome the table gives, and that no memory
//! changed. `every_row_of_the_table_has_a_case` keeps the table and the cases in step.

use portverbs::prelude::*;
use portverbs::verbs::{MwBind, PostError, PostErrorKind, inc_rkey};
use portverbs_transport::memory::pd::{Outcome, PD_RULES, rule};

use super::env::{Backend, Env};
use super::mw_util::{RW, bind_wr, mw_pair};
use super::obj_util::*;
use super::tx_util::*;
use super::util::*;

/// Remote read, write and atomics.
const ALL: AccessFlags = RW.union(AccessFlags::REMOTE_ATOMIC);

/// The status the table gives a row whose violation completes only the send request.
fn requester(name: &str) -> WcStatus {
    match rule(name).outcome {
        Outcome::Requester(status) => status,
        other => panic!("{name}: {other:?}"),
    }
}

/// The (send request, receive) statuses of a row whose violation completes a receive.
fn with_receive(name: &str) -> (WcStatus, WcStatus) {
    match rule(name).outcome {
        Outcome::Receive { requester, receive } => (requester, receive),
        other => panic!("{name}: {other:?}"),
    }
}

/// An MR over the first 4 KiB of `buf` in a fresh PD of `ctx`.
fn foreign_mr(ctx: &Context, buf: &Buffer, access: AccessFlags) -> Mr {
    let pd = ctx.alloc_pd_blocking().unwrap();
    pd.reg_mr_blocking(buf, 0..4096, access).unwrap()
}

/// Nothing completed on `side` and its first `len` bytes are still zero.
fn untouched(env: &Env, side: &Side, len: usize) {
    assert!(env.try_poll(&side.cq).unwrap().is_empty(), "no completion");
    assert_eq!(side.buf.to_vec(0, len).unwrap(), vec![0; len], "no byte");
}

/// WRITE, READ and both atomics toward `remote`, with an 8-byte local buffer.
fn remote_ops(remote: RemoteAddr) -> [SendOp; 4] {
    [
        SendOp::RdmaWrite { remote },
        SendOp::RdmaRead { remote },
        SendOp::AtomicFetchAdd { remote, add: 1 },
        SendOp::AtomicCmpSwp {
            remote,
            compare: 3,
            swap: 4,
        },
    ]
}

/// Runs each of [`remote_ops`] from a toward `remote` (offset 0 of b's buffer), expecting
/// `expect`; b's word and a's local buffer stay as they were. The pair is restated after each.
fn remote_ops_refused(env: &Env, p: &Pair, params: &Params, remote: RemoteAddr, expect: WcStatus) {
    p.b.buf.store_u64(0, 3).unwrap();
    for (i, op) in remote_ops(remote).into_iter().enumerate() {
        p.a.buf.store_u64(0, 0xaa).unwrap();
        let wc = run(env, &p.a, SendWr::new(i as u64, op).sges(&[p.a.sge(0, 8)]));
        assert_eq!((wc.wr_id, wc.status), (i as u64, expect), "{op:?}");
        assert_eq!(
            p.b.buf.load_u64(0).unwrap(),
            3,
            "{op:?} left the target alone"
        );
        assert_eq!(
            p.a.buf.load_u64(0).unwrap(),
            0xaa,
            "{op:?} brought nothing back"
        );
        restate_pair(env, p, params);
    }
}

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

fn gather_lkey_of_a_send(backend: Backend) {
    let env = Env::new(backend);
    let expect = requester("gather_lkey_of_a_send");
    let ops = [
        SendOp::Send,
        SendOp::SendWithImm { imm: 5 },
        SendOp::SendWithInv { rkey: 0x1234 },
    ];
    for op in ops {
        let p = Pair::new(&env, QpType::Rc);
        let foreign = foreign_mr(env.a(), &p.a.buf, AccessFlags::LOCAL_WRITE);
        p.a.buf.write(0, &pattern(1, 64)).unwrap();
        p.b.post_recv(1, 0, 4096);
        let wc = run(
            &env,
            &p.a,
            SendWr::new(2, op).sges(&[foreign.sge_at(0, 64)]),
        );
        assert_eq!((wc.wr_id, wc.status), (2, expect), "{op:?}");
        untouched(&env, &p.b, 4096);
    }
}

fn gather_lkey_of_a_write(backend: Backend) {
    let env = Env::new(backend);
    let expect = requester("gather_lkey_of_a_write");
    for with_imm in [false, true] {
        let p = Pair::new(&env, QpType::Rc);
        let foreign = foreign_mr(env.a(), &p.a.buf, AccessFlags::LOCAL_WRITE);
        p.a.buf.write(0, &pattern(2, 64)).unwrap();
        let remote = p.b.remote(0);
        let op = if with_imm {
            p.b.post_recv(1, 1024, 64);
            SendOp::RdmaWriteWithImm { remote, imm: 9 }
        } else {
            SendOp::RdmaWrite { remote }
        };
        let wc = run(
            &env,
            &p.a,
            SendWr::new(2, op).sges(&[foreign.sge_at(0, 64)]),
        );
        assert_eq!((wc.wr_id, wc.status), (2, expect), "{op:?}");
        untouched(&env, &p.b, 4096);
    }
}

fn scatter_lkey_of_a_read(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let foreign = foreign_mr(env.a(), &p.a.buf, AccessFlags::LOCAL_WRITE);
    p.b.buf.write(0, &pattern(3, 64)).unwrap();
    let op = SendOp::RdmaRead {
        remote: p.b.remote(0),
    };
    let wc = run(
        &env,
        &p.a,
        SendWr::new(2, op).sges(&[foreign.sge_at(0, 64)]),
    );
    assert_eq!(wc.status, requester("scatter_lkey_of_a_read"));
    untouched(&env, &p.a, 4096);
}

fn result_lkey_of_an_atomic(backend: Backend) {
    let env = Env::new(backend);
    let expect = requester("result_lkey_of_an_atomic");
    for cmp_swp in [false, true] {
        let p = Pair::new(&env, QpType::Rc);
        let foreign = foreign_mr(env.a(), &p.a.buf, AccessFlags::LOCAL_WRITE);
        p.a.buf.store_u64(0, 0xaa).unwrap();
        p.b.buf.store_u64(0, 3).unwrap();
        let remote = p.b.remote(0);
        let op = if cmp_swp {
            SendOp::AtomicCmpSwp {
                remote,
                compare: 3,
                swap: 4,
            }
        } else {
            SendOp::AtomicFetchAdd { remote, add: 1 }
        };
        let wc = run(&env, &p.a, SendWr::new(2, op).sges(&[foreign.sge_at(0, 8)]));
        assert_eq!(wc.status, expect, "{op:?}");
        // The responder executed it (README, "Deviations"); its result never landed.
        assert_eq!(p.a.buf.load_u64(0).unwrap(), 0xaa, "{op:?}");
    }
}

fn receive_lkey_on_the_rq(backend: Backend) {
    let env = Env::new(backend);
    let (send_status, recv_status) = with_receive("receive_lkey_on_the_rq");
    let p = Pair::new(&env, QpType::Rc);
    let foreign = foreign_mr(env.b(), &p.b.buf, AccessFlags::LOCAL_WRITE);
    p.b.qp
        .post_recv(&[RecvWr {
            wr_id: 1,
            sges: &[foreign.sge_at(0, 256)],
        }])
        .unwrap();
    let wc = send(&env, &p.a, 2, &pattern(4, 64));
    assert_eq!((wc.wr_id, wc.status), (2, send_status));
    let rwc = one(&env, &p.b.cq);
    assert_eq!((rwc.wr_id, rwc.status), (1, recv_status));
    assert_eq!(
        p.b.buf.to_vec(0, 256).unwrap(),
        vec![0; 256],
        "nothing landed"
    );
}

/// A QP of one PD receiving through an SRQ of another, on device b, connected to a side on a.
struct SrqAcross {
    srq_pd: Pd,
    qp_pd: Pd,
    srq: Srq,
    cq: Cq,
    qp: Qp,
    buf: Buffer,
    a: Side,
}

impl SrqAcross {
    fn new(env: &Env) -> Self {
        let ctx = env.b();
        let srq_pd = ctx.alloc_pd_blocking().unwrap();
        let qp_pd = ctx.alloc_pd_blocking().unwrap();
        let srq = srq_pd
            .create_srq_blocking(SrqInit {
                max_wr: 4,
                max_sge: 1,
                limit: 0,
            })
            .unwrap();
        let cq = cq(ctx, 16);
        let qp = make_qp(&qp_pd, &cq, QpType::Rc, Some(&srq), false);
        let buf = ctx.alloc_buffer(4096).unwrap();
        let a = Side::new(env.a(), QpType::Rc, CAPS, 4096, FULL_ACCESS);
        connect(&a.qp, &qp, &Params::default());
        Self {
            srq_pd,
            qp_pd,
            srq,
            cq,
            qp,
            buf,
            a,
        }
    }

    /// Posts a 256-byte receive through an MR of `pd` on the SRQ, sends 64 bytes from a;
    /// returns the sender's and the receiver's completions.
    fn exchange(&self, env: &Env, pd: &Pd) -> (WorkCompletion, WorkCompletion) {
        let mr = pd
            .reg_mr_blocking(&self.buf, 0..4096, AccessFlags::LOCAL_WRITE)
            .unwrap();
        let wr = RecvWr {
            wr_id: 1,
            sges: &[mr.sge_at(0, 256)],
        };
        self.srq.post_recv(&[wr]).unwrap();
        let wc = send(env, &self.a, 2, &pattern(5, 64));
        (wc, one(env, &self.cq))
    }
}

fn receive_lkey_on_an_srq(backend: Backend) {
    let env = Env::new(backend);
    let (send_status, recv_status) = with_receive("receive_lkey_on_an_srq");
    // An MR of the QP's PD is of the wrong domain for the SRQ's receive.
    let x = SrqAcross::new(&env);
    assert_ne!(x.qp_pd.pdn(), x.srq_pd.pdn());
    let (wc, rwc) = x.exchange(&env, &x.qp_pd);
    assert_eq!((wc.wr_id, wc.status), (2, send_status));
    assert_eq!(
        (rwc.wr_id, rwc.status, rwc.qp_num),
        (1, recv_status, x.qp.qp_num())
    );
    assert_eq!(
        x.buf.to_vec(0, 256).unwrap(),
        vec![0; 256],
        "nothing landed"
    );
    // The SRQ's own PD is the right one.
    let x = SrqAcross::new(&env);
    let (wc, rwc) = x.exchange(&env, &x.srq_pd);
    assert_eq!(
        (wc.status, rwc.status),
        (WcStatus::Success, WcStatus::Success)
    );
    assert_eq!(x.buf.to_vec(0, 64).unwrap(), pattern(5, 64));
}

fn rkey_of_an_mr(backend: Backend) {
    let env = Env::new(backend);
    let expect = requester("rkey_of_an_mr");
    let p = Pair::new(&env, QpType::Rc);
    let foreign = foreign_mr(env.b(), &p.b.buf, FULL_ACCESS);
    let remote = RemoteAddr {
        addr: foreign.addr(),
        rkey: foreign.rkey().unwrap(),
    };
    remote_ops_refused(&env, &p, &Params::default(), remote, expect);
    // A WRITE with immediate fails the same way; the receive it took reports the protection
    // error (README, "Deviations").
    p.b.post_recv(5, 1024, 64);
    let op = SendOp::RdmaWriteWithImm { remote, imm: 1 };
    let wc = run(&env, &p.a, SendWr::new(6, op).sges(&[p.a.sge(0, 8)]));
    assert_eq!((wc.wr_id, wc.status), (6, expect));
    let rwc = one(&env, &p.b.cq);
    assert_eq!((rwc.wr_id, rwc.status), (5, WcStatus::LocAccessErr));
    assert_eq!(p.b.buf.load_u64(0).unwrap(), 3);
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

fn address_handle_of_a_ud_send(backend: Backend) {
    let env = Env::new(backend);
    assert_eq!(
        rule("address_handle_of_a_ud_send").outcome,
        Outcome::Refused
    );
    let p = Pair::new(&env, QpType::Ud);
    let av = AddressVector {
        dgid: Env::gid(env.b()),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..AddressVector::default()
    };
    let other_pd = env.a().alloc_pd_blocking().unwrap();
    let foreign_ah = other_pd.create_ah_blocking(av).unwrap();
    let own_ah = p.a.pd.create_ah_blocking(av).unwrap();
    p.a.buf.write(0, &pattern(14, 64)).unwrap();
    p.b.post_recv(1, 0, 2048);
    let sge = [p.a.sge(0, 64)];
    for op in [SendOp::Send, SendOp::SendWithImm { imm: 2 }] {
        let dest = foreign_ah.dest(p.b.qp.qp_num(), QKEY);
        let wr = SendWr::new(2, op).sges(&sge).ud(dest).signaled();
        match p.a.qp.post_send(&[wr]) {
            Err(PostError {
                kind: PostErrorKind::AhOfAnotherPd { ah_pd, qp_pd },
                wr_id: 2,
                ..
            }) => assert_eq!((ah_pd, qp_pd), (other_pd.pdn(), p.a.pd.pdn())),
            other => panic!("{op:?}: expected AhOfAnotherPd, got {other:?}"),
        }
    }
    env.settle();
    untouched(&env, &p.a, 0);
    untouched(&env, &p.b, 2048);
    // The QP's own domain's handle reaches b.
    let wr = SendWr::new(3, SendOp::Send)
        .sges(&sge)
        .ud(own_ah.dest(p.b.qp.qp_num(), QKEY));
    let wc = run(&env, &p.a, wr);
    assert_eq!((wc.wr_id, wc.status), (3, WcStatus::Success));
    let rwc = one(&env, &p.b.cq);
    assert_eq!((rwc.wr_id, rwc.status), (1, WcStatus::Success));
}

/// Declares the walk's cases on every backend and records their names.
macro_rules! walk {
    ($($name:ident),* $(,)?) => {
        const WALKED: &[&str] = &[$(stringify!($name)),*];
        cases!($($name),*);
    };
}

walk!(
    gather_lkey_of_a_send,
    gather_lkey_of_a_write,
    scatter_lkey_of_a_read,
    result_lkey_of_an_atomic,
    receive_lkey_on_the_rq,
    receive_lkey_on_an_srq,
    rkey_of_an_mr,
    rkey_of_a_type1_window,
    rkey_of_a_type2_window,
    window_of_a_bind,
    mr_of_a_bind,
    bind_right_of_a_bind_mr,
    key_of_a_type2_bind,
    type1_bind_through_the_verb,
    key_of_a_local_invalidate,
    key_of_a_send_with_invalidate,
    address_handle_of_a_ud_send,
);

#[test]
fn every_row_of_the_table_has_a_case() {
    let rows: Vec<&str> = PD_RULES.iter().map(|r| r.name).collect();
    for row in &rows {
        assert!(WALKED.contains(row), "no case walks the row {row}");
    }
    for case in WALKED {
        assert!(rows.contains(case), "the table has no row {case}");
    }
}

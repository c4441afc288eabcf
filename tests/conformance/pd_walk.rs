//! The protection-domain walk (IBA 10.2.3, chapters 10 and 11): one case per row of the
//! transport's table (`backends/transport/src/memory/pd.rs`), each naming an object of another
//! domain in a work request and asserting the outcome the table gives, and that no memory
//! changed. The rows of memory windows are in `pd_walk_mw`; `every_row_of_the_table_has_a_case`
//! keeps the table and the cases of both in step.

use portverbs::prelude::*;
use portverbs::verbs::{PostError, PostErrorKind};
use portverbs_transport::memory::pd::{Outcome, PD_RULES, rule};

use super::env::{Backend, Env};
use super::obj_util::*;
use super::tx_util::*;
use super::util::*;

/// Remote read, write and atomics.
pub(super) const ALL: AccessFlags = AccessFlags::REMOTE_WRITE
    .union(AccessFlags::REMOTE_READ)
    .union(AccessFlags::REMOTE_ATOMIC);

/// The status the table gives a row whose violation completes only the send request.
pub(super) fn requester(name: &str) -> WcStatus {
    match rule(name).outcome {
        Outcome::Requester(status) => status,
        other => panic!("{name}: {other:?}"),
    }
}

/// The (send request, receive) statuses of a row whose violation completes a receive.
pub(super) fn with_receive(name: &str) -> (WcStatus, WcStatus) {
    match rule(name).outcome {
        Outcome::Receive { requester, receive } => (requester, receive),
        other => panic!("{name}: {other:?}"),
    }
}

/// An MR over the first 4 KiB of `buf` in a fresh PD of `ctx`.
pub(super) fn foreign_mr(ctx: &Context, buf: &Buffer, access: AccessFlags) -> Mr {
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
pub(super) fn remote_ops_refused(
    env: &Env,
    p: &Pair,
    params: &Params,
    remote: RemoteAddr,
    expect: WcStatus,
) {
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
        pub(super) const WALKED: &[&str] = &[$(stringify!($name)),*];
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
    address_handle_of_a_ud_send,
);

#[test]
fn every_row_of_the_table_has_a_case() {
    let walked: Vec<&str> = [WALKED, super::pd_walk_mw::WALKED].concat();
    let rows: Vec<&str> = PD_RULES.iter().map(|r| r.name).collect();
    for row in &rows {
        assert!(walked.contains(row), "no case walks the row {row}");
    }
    for case in &walked {
        assert!(rows.contains(case), "the table has no row {case}");
    }
    assert_eq!(walked.len(), rows.len(), "a row walked twice");
}

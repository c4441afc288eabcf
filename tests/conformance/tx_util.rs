//! Helpers of the QP, SRQ, event and traffic cases: QP bring-up one step at a time, sides
//! built with options `util::Side` does not offer, and completion/event checks.

#![allow(dead_code)]

use portverbs::prelude::*;
use portverbs::verbs::{AsyncEvent, AsyncEventKind, EventElement};

use super::env::Env;
use super::util::*;

/// Polls `cq` (settling first) and asserts that exactly `n` completions arrived.
pub fn poll_exact(env: &Env, cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let got = env.poll(cq, n);
    // A second look: nothing more may be pending.
    let more = env.poll(cq, 0);
    assert_eq!(
        got.len() + more.len(),
        n,
        "expected {n} completions, got {got:?} then {more:?}"
    );
    got
}

/// Polls exactly one completion.
pub fn poll_one(env: &Env, cq: &Cq) -> WorkCompletion {
    poll_exact(env, cq, 1)[0]
}

/// Asserts a completion's wr_id, status and (for successes) opcode.
pub fn check_wc(wc: &WorkCompletion, wr_id: u64, status: WcStatus, opcode: WcOpcode) {
    assert_eq!(wc.wr_id, wr_id, "wr_id of {wc:?}");
    assert_eq!(wc.status, status, "status of {wc:?}");
    if status == WcStatus::Success {
        assert_eq!(wc.opcode, opcode, "opcode of {wc:?}");
    }
}

/// Every asynchronous event queued on `ctx` now.
pub fn drain_events(ctx: &Context) -> Vec<AsyncEvent> {
    let mut out = Vec::new();
    while let Some(ev) = ctx.get_async_event().expect("event queue") {
        out.push(ev);
    }
    out
}

/// Counts the events of `kind` on `element` in `evs`.
pub fn count_events(evs: &[AsyncEvent], kind: AsyncEventKind, element: EventElement) -> usize {
    evs.iter()
        .filter(|e| e.kind == kind && e.element == element)
        .count()
}

/// The state the device reports for `qp`.
pub fn queried_state(qp: &Qp) -> QpState {
    qp.query_blocking().expect("query QP").qp_state
}

/// The RTR attributes the library's ladder sets under `util::to_rts`, toward `remote_qpn` at
/// `remote_gid`: for the cases that take one transition at a time.
pub fn rtr_attr(remote_qpn: u32, remote_gid: Gid, p: &Params) -> QpAttr {
    QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: p.mtu,
        dest_qp_num: remote_qpn,
        rq_psn: p.psn,
        max_dest_rd_atomic: p.rd_atomic,
        min_rnr_timer: p.min_rnr_timer,
        ah_attr: AddressVector {
            dgid: remote_gid,
            is_global: true,
            hop_limit: 1,
            port_num: 1,
            ..AddressVector::default()
        },
        ..QpAttr::default()
    }
}

/// The RTS attributes the library's ladder sets under `util::to_rts`.
pub fn rts_attr(p: &Params) -> QpAttr {
    QpAttr {
        qp_state: QpState::Rts,
        sq_psn: p.psn,
        timeout: p.timeout,
        retry_cnt: p.retry_cnt,
        rnr_retry: p.rnr_retry,
        max_rd_atomic: p.rd_atomic,
        ..QpAttr::default()
    }
}

/// INIT → RTR only.
pub fn to_rtr(qp: &Qp, remote_qpn: u32, remote_gid: Gid, p: &Params) {
    qp.modify_blocking(&rtr_attr(remote_qpn, remote_gid, p), rtr_mask(qp.qp_type()))
        .unwrap();
}

/// RTR → RTS only.
pub fn rtr_to_rts(qp: &Qp, p: &Params) {
    qp.modify_blocking(&rts_attr(p), rts_mask(qp.qp_type()))
        .unwrap();
}

/// A QP on `pd` with the given CQ (send and receive), SRQ and signalling.
pub fn make_qp(pd: &Pd, cq: &Cq, t: QpType, srq: Option<&Srq>, sq_sig_all: bool) -> Qp {
    pd.create_qp_blocking(QpInit {
        qp_type: t,
        send_cq: cq,
        recv_cq: cq,
        srq,
        caps: CAPS,
        sq_sig_all,
        special: None,
    })
    .unwrap()
}

/// Brings `a` and `b` from RESET to RTS toward each other.
pub fn connect(a: &Qp, b: &Qp, p: &Params) {
    let (ea, eb) = (endpoint(a, p), endpoint(b, p));
    connect_qp(a, &eb, p);
    connect_qp(b, &ea, p);
}

/// A connected pair whose sides have `len`-byte buffers (`Pair` has 64 KiB).
pub fn pair_with_len(env: &Env, t: QpType, len: usize) -> Pair {
    let a = Side::new(env.a(), t, CAPS, len, FULL_ACCESS);
    let b = Side::new(env.b(), t, CAPS, len, FULL_ACCESS);
    connect(&a.qp, &b.qp, &Params::default());
    Pair { a, b }
}

/// A signaled RDMA WRITE to offset `to` of `dst`, with no data until `.sges(..)` adds some.
pub fn write_wr(wr_id: u64, dst: &Side, to: u64) -> SendWr<'static> {
    SendWr::new(
        wr_id,
        SendOp::RdmaWrite {
            remote: dst.remote(to),
        },
    )
    .signaled()
}

/// Asserts the QP is in ERR by query and that a send posted now is flushed.
pub fn assert_err_and_flushes(env: &Env, side: &Side) {
    assert_eq!(queried_state(&side.qp), QpState::Err);
    side.qp
        .post_send(&[SendWr::new(0xdead, SendOp::Send).signaled()])
        .expect("posting in ERR is allowed");
    let wc = poll_one(env, &side.cq);
    check_wc(&wc, 0xdead, WcStatus::WrFlushErr, WcOpcode::Send);
    assert_eq!(wc.qp_num, side.qp.qp_num());
}

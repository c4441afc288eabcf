//! Helpers of the object-level cases (device, PD, MR, MW, AH, CQ, notification): connected
//! pairs on caller-chosen CQs, restating QPs after an error, and one-shot operations that
//! return their completion.

#![allow(dead_code)]

use portverbs::prelude::*;

use super::env::Env;
use super::util::*;

/// Parameters whose QP access also allows memory-window binds (pyverbs' MW resources).
pub fn mw_params() -> Params {
    Params {
        access: Params::default().access | AccessFlags::MW_BIND,
        ..Params::default()
    }
}

/// One RC side on `cq` (send and receive), with 64 KiB registered with `access`.
pub fn side_on(ctx: &Context, cq: Cq, access: AccessFlags) -> Side {
    let pd = ctx.alloc_pd_blocking().unwrap();
    let qp = pd
        .create_qp_blocking(QpInit {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            caps: CAPS,
            sq_sig_all: false,
            special: None,
        })
        .unwrap();
    let buf = ctx.alloc_buffer(1 << 16).unwrap();
    let mr = pd.reg_mr_blocking(&buf, 0..1 << 16, access).unwrap();
    Side {
        pd,
        cq,
        qp,
        buf,
        mr,
    }
}

/// A connected RC pair whose sides use the given CQs.
pub fn pair_on(env: &Env, a_cq: Cq, b_cq: Cq) -> Pair {
    let p = Params::default();
    let a = side_on(env.a(), a_cq, FULL_ACCESS);
    let b = side_on(env.b(), b_cq, FULL_ACCESS);
    to_init(&a.qp, &p);
    to_init(&b.qp, &p);
    to_rts(&a.qp, b.qp.qp_num(), Env::gid(env.b()), &p);
    to_rts(&b.qp, a.qp.qp_num(), Env::gid(env.a()), &p);
    Pair { a, b }
}

/// RESET → INIT → RTR → RTS again (how pyverbs' `restate_qps` recovers a QP in ERR).
pub fn restate(qp: &Qp, remote_qpn: u32, remote_gid: Gid, p: &Params) {
    let reset = QpAttr {
        qp_state: QpState::Reset,
        ..QpAttr::default()
    };
    qp.modify_blocking(&reset, QpAttrMask::STATE).unwrap();
    to_init(qp, p);
    to_rts(qp, remote_qpn, remote_gid, p);
}

/// Restates both QPs of a pair.
pub fn restate_pair(env: &Env, pair: &Pair, p: &Params) {
    restate(&pair.a.qp, pair.b.qp.qp_num(), Env::gid(env.b()), p);
    restate(&pair.b.qp, pair.a.qp.qp_num(), Env::gid(env.a()), p);
}

/// Settles and polls `cq`, expecting exactly one completion.
pub fn one(env: &Env, cq: &Cq) -> WorkCompletion {
    let wcs = env.poll(cq, 1);
    assert_eq!(wcs.len(), 1, "expected exactly one completion, got {wcs:?}");
    wcs[0]
}

/// Posts a signaled work request on `side` and returns its completion.
pub fn run(env: &Env, side: &Side, wr: SendWr<'_>) -> WorkCompletion {
    side.qp.post_send(&[wr.signaled()]).unwrap();
    one(env, &side.cq)
}

/// RDMA-writes `data` from offset 0 of `from`'s buffer to `remote`; returns the completion.
pub fn write(
    env: &Env,
    from: &Side,
    wr_id: u64,
    data: &[u8],
    remote: RemoteAddr,
) -> WorkCompletion {
    from.buf.write(0, data).unwrap();
    let sge = [from.sge(0, data.len() as u32)];
    run(
        env,
        from,
        SendWr::new(wr_id, SendOp::RdmaWrite { remote }).sges(&sge),
    )
}

/// SENDs `data` from offset 0 of `from` (the receiver must have posted a receive); returns the
/// sender's completion.
pub fn send(env: &Env, from: &Side, wr_id: u64, data: &[u8]) -> WorkCompletion {
    from.buf.write(0, data).unwrap();
    let sge = [from.sge(0, data.len() as u32)];
    run(env, from, SendWr::new(wr_id, SendOp::Send).sges(&sge))
}

/// Posts `n` signaled zero-risk RDMA writes (8 bytes each) from `a` to `b` with wr_ids
/// `first..first + n`, without polling.
pub fn post_writes(pair: &Pair, first: u64, n: u64) {
    let sge = [pair.a.sge(0, 8)];
    let wrs: Vec<_> = (first..first + n)
        .map(|id| {
            SendWr::new(
                id,
                SendOp::RdmaWrite {
                    remote: pair.b.remote(1024),
                },
            )
            .sges(&sge)
            .signaled()
        })
        .collect();
    pair.a.qp.post_send(&wrs).unwrap();
}

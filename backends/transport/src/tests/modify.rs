//! QP state changes through the one funnel: modify commands checked against the state the QP
//! is really in, flushing on ERR (once), the SQ drain and its event, SQE on a UC send error,
//! and RESET forgetting the QP's transport state.

use portverbs_hal::attr::{QpAttr, QpAttrMask, ack_timeout_ns};
use portverbs_hal::error::CommandError;
use portverbs_hal::event::QpEventKind;
use portverbs_hal::types::{QpState, QpType};
use portverbs_hal::wc::{WcOpcode, WcStatus};
use portverbs_hal::wr::SendOp;

use super::harness::{QPN, RQ_PSN, SQ_PSN, Setup, Side, TIMEOUT, ack, request, summary};
use crate::wire::Opcode;

#[test]
fn a_transition_the_diagram_forbids_is_refused_and_changes_nothing() {
    let mut s = Side::rc();
    let attr = s.attr;
    assert!(matches!(
        s.modify(QpState::Init, &attr, QpAttrMask::empty()),
        Err(CommandError::BadState { .. })
    ));
    assert_eq!(s.state(), QpState::Rts);
    // The caller believes the QP is in RTR: refused, the QP is in RTS.
    let stale = QpAttr {
        cur_qp_state: QpState::Rtr,
        ..attr
    };
    assert!(matches!(
        s.modify(QpState::Rts, &stale, QpAttrMask::CUR_STATE),
        Err(CommandError::BadState { .. })
    ));
    // A transition the diagram allows is applied.
    assert!(s.modify(QpState::Sqd, &attr, QpAttrMask::empty()).is_ok());
    assert_eq!(s.state(), QpState::Sqd);
}

#[test]
fn err_flushes_both_queues_once() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::Send, 0, 16));
    s.post(s.wqe(SendOp::Send, 0, 16));
    s.post_recv(0, 64);
    s.post_recv(64, 64);
    let attr = s.attr;
    s.modify(QpState::Err, &attr, QpAttrMask::empty()).unwrap();
    let got: Vec<_> = s
        .take_cqes()
        .iter()
        .map(|c| (c.wqe.is_send, c.wqe.index, c.wc.status))
        .collect();
    assert_eq!(
        got,
        [
            (true, 0, WcStatus::WrFlushErr),
            (true, 1, WcStatus::WrFlushErr),
            (false, 0, WcStatus::WrFlushErr),
            (false, 1, WcStatus::WrFlushErr)
        ]
    );
    assert_eq!(s.hca.errors, [QPN]);
    // Timers stopped: nothing is retransmitted.
    let at = s.now + ack_timeout_ns(TIMEOUT).unwrap();
    assert!(s.advance_to(at).is_empty());
    // ERR again is no new transition.
    s.modify(QpState::Err, &attr, QpAttrMask::empty()).unwrap();
    assert!(s.take_cqes().is_empty());
    assert_eq!(s.hca.errors, [QPN]);
}

#[test]
fn sqd_drains_reports_it_and_rts_resumes() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::Send, 0, 16));
    let attr = QpAttr {
        en_sqd_async_notify: true,
        ..s.attr
    };
    s.modify(QpState::Sqd, &attr, QpAttrMask::EN_SQD_ASYNC_NOTIFY)
        .unwrap();
    assert!(s.engine.query_qp(QPN).unwrap().sq_draining);
    // Posted while draining: held back.
    assert!(s.post(s.wqe(SendOp::Send, 0, 16)).is_empty());
    assert!(!s.has_event(QpEventKind::SqDrained));
    s.feed(ack(SQ_PSN));
    assert!(s.has_event(QpEventKind::SqDrained));
    assert!(!s.engine.query_qp(QPN).unwrap().sq_draining);
    let out = s.modify(QpState::Rts, &attr, QpAttrMask::empty()).unwrap();
    assert_eq!(summary(&out), [(Opcode::SendOnly, SQ_PSN + 1)]);
}

#[test]
fn reset_forgets_the_transport_state() {
    let mut s = Side::rc();
    s.post(s.wqe(SendOp::Send, 0, 16));
    let (attr, mask) = (s.attr, s.mask);
    s.modify(QpState::Reset, &attr, QpAttrMask::empty())
        .unwrap();
    assert!(s.take_cqes().is_empty(), "RESET completes nothing");
    let at = s.now + ack_timeout_ns(TIMEOUT).unwrap();
    assert!(s.advance_to(at).is_empty(), "the old timer is stale");
    let attr = QpAttr { sq_psn: 7, ..attr };
    for st in [QpState::Init, QpState::Rtr, QpState::Rts] {
        s.modify(st, &attr, mask).unwrap();
    }
    let out = s.post(s.wqe(SendOp::Send, 0, 16));
    assert_eq!(summary(&out), [(Opcode::SendOnly, 7)]);
}

#[test]
fn a_uc_send_error_enters_sqe_and_receives_keep_working() {
    let mut s = Side::with(Setup::of(QpType::Uc));
    let mut bad = s.wqe(SendOp::Send, 0, 16);
    bad.sges[0].lkey ^= 0xff00;
    s.post(bad);
    assert_eq!(s.state(), QpState::Sqe);
    assert_eq!(s.take_cqes()[0].wc.status, WcStatus::LocProtErr);
    // Sends posted now are flushed; the receive side still works.
    assert!(s.post(s.wqe(SendOp::Send, 0, 16)).is_empty());
    assert_eq!(s.take_cqes()[0].wc.status, WcStatus::WrFlushErr);
    s.post_recv(0, 64);
    s.feed(request(Opcode::UcSendOnly, RQ_PSN, false, &[4; 4]));
    let cqes = s.take_cqes();
    assert_eq!(
        (cqes[0].wc.opcode, cqes[0].wc.status),
        (WcOpcode::Recv, WcStatus::Success)
    );
    // UC may leave SQE for RTS and send again.
    let attr = s.attr;
    s.modify(QpState::Rts, &attr, QpAttrMask::empty()).unwrap();
    let out = s.post(s.wqe(SendOp::Send, 0, 16));
    assert_eq!(summary(&out), [(Opcode::UcSendOnly, SQ_PSN)]);
}

//! QP transitions the CM applies for a connection (see the crate docs): each is started as
//! verbs-core's async `modify` and polled once. A device whose command completes at once (the
//! soft device) is done there; one whose command is still in flight (mlx4 in event mode) has
//! the transition parked in the device state and polled again on every progress, so the CM's
//! message processing never waits for a device command.
//!
//! A transition the agent asked for gates the agent's later outputs: the REP does not leave
//! before the QP is in RTR, nor the RTU before RTS, nor ESTABLISHED reach the application. A
//! released QP's move to ERR gates nothing.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use portverbs_hal::Device;
use portverbs_hal::types::Mtu;
use portverbs_verbs::{AccessFlags, AddressVector, ModifyQpError, Qp, QpAttr, QpAttrMask, QpState};

use portverbs_cm::{CmId, RtrAttrs, RtsAttrs};

type ModifyFuture = Pin<Box<dyn Future<Output = Result<(), ModifyQpError>> + Send>>;

/// A started QP transition.
pub(crate) struct Transition {
    /// The connection it is for.
    pub(crate) id: CmId,
    qpn: u32,
    target: QpState,
    fut: ModifyFuture,
}

impl fmt::Debug for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transition")
            .field("id", &self.id)
            .field("qpn", &self.qpn)
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

impl Transition {
    /// Starts modifying `qp` with `attr`/`mask` for connection `id` (nothing runs until the
    /// first [`Transition::poll`]).
    pub(crate) fn start<D: Device>(id: CmId, qp: Qp<D>, attr: QpAttr, mask: QpAttrMask) -> Self {
        Self {
            id,
            qpn: qp.qp_num(),
            target: attr.qp_state,
            fut: Box::pin(async move { qp.modify(&attr, mask).await }),
        }
    }

    /// Drives the device command; `waker` is woken when it can make progress.
    pub(crate) fn poll(&mut self, waker: &Waker) -> Poll<Result<(), ModifyQpError>> {
        self.fut.as_mut().poll(&mut Context::from_waker(waker))
    }

    /// The QP it moves.
    pub(crate) fn qpn(&self) -> u32 {
        self.qpn
    }
}

/// The remote access an RC QP of the CM gets, as Linux `cm.c` grants it: remote WRITE always,
/// remote READ and atomics only when the QP has responder resources.
fn access(read_atomic: bool) -> AccessFlags {
    if read_atomic {
        AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
    } else {
        AccessFlags::REMOTE_WRITE
    }
}

/// RESET → INIT on port 1 with remote WRITE allowed: what Linux's CM gives a QP whose
/// responder resources are not known yet (librdmacm's `rdma_create_qp` before a connect).
/// The RTR transition sets the connection's access ([`rtr`]).
pub(crate) fn init() -> (QpAttr, QpAttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Init,
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: access(false),
        ..QpAttr::default()
    };
    let mask =
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
    (attr, mask)
}

/// INIT → RTR as the agent's attributes say, on the local GID at `sgid_index`, with the
/// connection's remote access (remote READ and atomics only with responder resources: what
/// librdmacm's INIT → INIT before RTR sets).
pub(crate) fn rtr(r: &RtrAttrs, sgid_index: u8) -> (QpAttr, QpAttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Rtr,
        qp_access_flags: access(r.remote_read_atomic),
        path_mtu: Mtu::from_code(r.path_mtu).unwrap_or(Mtu::Mtu1024),
        dest_qp_num: r.dest_qpn,
        rq_psn: r.rq_psn,
        max_dest_rd_atomic: r.max_dest_rd_atomic,
        min_rnr_timer: r.min_rnr_timer,
        ah_attr: AddressVector {
            dgid: r.dgid,
            is_global: true,
            sgid_index,
            flow_label: r.flow_label,
            hop_limit: r.hop_limit,
            traffic_class: r.traffic_class,
            sl: r.sl,
            port_num: 1,
            ..AddressVector::default()
        },
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER
        | QpAttrMask::ACCESS_FLAGS;
    (attr, mask)
}

/// RTR → RTS as the agent's attributes say.
pub(crate) fn rts(r: &RtsAttrs) -> (QpAttr, QpAttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: r.sq_psn,
        retry_cnt: r.retry_cnt,
        rnr_retry: r.rnr_retry,
        max_rd_atomic: r.max_rd_atomic,
        timeout: r.timeout,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC
        | QpAttrMask::TIMEOUT;
    (attr, mask)
}

/// Any state → ERR (every posted request flushed); `None` when `qp` is already in ERR or in
/// RESET, where there is nothing to flush.
pub(crate) fn error<D: Device>(qp: &Qp<D>) -> Option<(QpAttr, QpAttrMask)> {
    if matches!(qp.state(), QpState::Err | QpState::Reset) {
        return None;
    }
    let attr = QpAttr {
        qp_state: QpState::Err,
        ..QpAttr::default()
    };
    Some((attr, QpAttrMask::STATE))
}

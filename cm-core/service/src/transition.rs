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
use portverbs_hal::types::{Mtu, QpType};
use portverbs_verbs::bringup::{self, InitStep, RtrStep, RtsStep};
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

/// RESET → INIT on the CM's port (`port`, [`crate::CmDevice::port`]) with remote WRITE allowed: what Linux's CM gives a QP
/// whose responder resources are not known yet (librdmacm's `rdma_create_qp` before a
/// connect). The RTR transition sets the connection's access ([`rtr`]).
pub(crate) fn init(port: u8) -> (QpAttr, QpAttrMask) {
    bringup::init(&InitStep {
        qp_type: QpType::Rc,
        port,
        pkey_index: 0,
        access: access(false),
        qkey: 0,
    })
}

/// INIT → RTR as the agent's attributes say, from the local GID at `sgid_index` of `port`, with the
/// connection's remote access (remote READ and atomics only with responder resources: what
/// librdmacm's INIT → INIT before RTR sets).
pub(crate) fn rtr(r: &RtrAttrs, port: u8, sgid_index: u8) -> (QpAttr, QpAttrMask) {
    bringup::rtr(&RtrStep {
        qp_type: QpType::Rc,
        av: AddressVector {
            dgid: r.dgid,
            is_global: true,
            sgid_index,
            flow_label: r.flow_label,
            hop_limit: r.hop_limit,
            traffic_class: r.traffic_class,
            sl: r.sl,
            port_num: port,
            ..AddressVector::default()
        },
        path_mtu: Mtu::from_code(r.path_mtu).unwrap_or(Mtu::Mtu1024),
        dest_qpn: r.dest_qpn,
        rq_psn: r.rq_psn,
        max_dest_rd_atomic: r.max_dest_rd_atomic,
        min_rnr_timer: r.min_rnr_timer,
        access: Some(access(r.remote_read_atomic)),
    })
}

/// RTR → RTS as the agent's attributes say.
pub(crate) fn rts(r: &RtsAttrs) -> (QpAttr, QpAttrMask) {
    bringup::rts(&RtsStep {
        qp_type: QpType::Rc,
        sq_psn: r.sq_psn,
        timeout: r.timeout,
        retry_cnt: r.retry_cnt,
        rnr_retry: r.rnr_retry,
        max_rd_atomic: r.max_rd_atomic,
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use QpAttrMask as M;
    use portverbs_hal::Gid;

    fn rtr_attrs(remote_read_atomic: bool) -> RtrAttrs {
        RtrAttrs {
            dest_qpn: 0x44,
            rq_psn: 0x1234,
            path_mtu: Mtu::Mtu4096 as u8,
            max_dest_rd_atomic: 2,
            min_rnr_timer: 0,
            remote_read_atomic,
            sgid: Gid([1; 16]),
            dgid: Gid([2; 16]),
            flow_label: 7,
            traffic_class: 3,
            hop_limit: 64,
            sl: 1,
        }
    }

    /// The CM's RC transitions: the required attributes of each step, the access flags at
    /// RTR as well, and the CM's port wherever a port is named.
    #[test]
    fn the_cm_brings_an_rc_qp_up_on_its_port() {
        let (a, m) = init(2);
        assert_eq!(m, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS);
        assert_eq!((a.qp_state, a.port_num), (QpState::Init, 2));
        assert_eq!(a.qp_access_flags, AccessFlags::REMOTE_WRITE);

        let (a, m) = rtr(&rtr_attrs(true), 2, 5);
        assert_eq!(
            m,
            M::STATE
                | M::AV
                | M::PATH_MTU
                | M::DEST_QPN
                | M::RQ_PSN
                | M::MAX_DEST_RD_ATOMIC
                | M::MIN_RNR_TIMER
                | M::ACCESS_FLAGS
        );
        assert_eq!((a.ah_attr.port_num, a.ah_attr.sgid_index), (2, 5));
        assert_eq!(
            (a.path_mtu, a.dest_qp_num, a.rq_psn),
            (Mtu::Mtu4096, 0x44, 0x1234)
        );
        assert!(a.qp_access_flags.contains(AccessFlags::REMOTE_READ));
        let (a, _) = rtr(&rtr_attrs(false), 2, 5);
        assert_eq!(a.qp_access_flags, AccessFlags::REMOTE_WRITE);

        let (a, m) = rts(&RtsAttrs {
            sq_psn: 0x99,
            retry_cnt: 7,
            rnr_retry: 6,
            max_rd_atomic: 2,
            timeout: 18,
        });
        assert_eq!(
            m,
            M::STATE | M::SQ_PSN | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC | M::TIMEOUT
        );
        assert_eq!((a.sq_psn, a.timeout, a.rnr_retry), (0x99, 18, 6));
    }
}

//! The attributes and masks of each step that brings a QP from RESET to RTS, decided in one
//! place: [`init`] (RESET → INIT), [`rtr`] (INIT → RTR) and [`rts`] (RTR → RTS). Each takes
//! the values its caller has (port, path, PSNs, depths, timeouts, access) and returns the
//! [`QpAttr`] and [`QpAttrMask`] to modify the QP with. The mask is `STATE` and exactly the
//! attributes the QP state table requires of that transition on that transport (IBA 11.2.4.2
//! and 10.3.1; the table is `portverbs_hal::qp_state`), plus the access flags at RTR when the
//! caller asks for them (an optional attribute of that transition on RC and UC).
//!
//! [`crate::Qp::connect_rc`] and its siblings, the connection manager's transitions and the
//! tests' bring-up helper all build their modifies here.

use portverbs_hal::attr::{AddressVector, QpAttr, QpAttrMask};
use portverbs_hal::qp_state;
use portverbs_hal::types::{AccessFlags, Mtu, QpState, QpType};

/// `STATE` and the attributes the QP state table requires for `from → to` on `t` (only
/// `STATE` for a transition the table does not have).
pub fn required(t: QpType, from: QpState, to: QpState) -> QpAttrMask {
    let rule = qp_state::rule_for(t, from, to);
    QpAttrMask::STATE | rule.map_or(QpAttrMask::empty(), |r| r.required)
}

/// The remote access a QP of type `t` can grant, out of `wanted`: all of it on RC, only
/// remote WRITE on UC (UC has no READ or atomics), none on UD.
pub fn access_of(t: QpType, wanted: AccessFlags) -> AccessFlags {
    match t {
        QpType::Rc => wanted,
        QpType::Uc => wanted & AccessFlags::REMOTE_WRITE,
        QpType::Ud => AccessFlags::empty(),
    }
}

/// The values of RESET → INIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitStep {
    /// The QP's transport.
    pub qp_type: QpType,
    /// Local port (from 1).
    pub port: u8,
    /// P_Key index.
    pub pkey_index: u16,
    /// Remote access wanted (RC, UC; narrowed by [`access_of`]).
    pub access: AccessFlags,
    /// Q_Key (UD).
    pub qkey: u32,
}

/// RESET → INIT: port, P_Key index, and the access flags (RC, UC) or the Q_Key (UD).
pub fn init(s: &InitStep) -> (QpAttr, QpAttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: s.port,
        pkey_index: s.pkey_index,
        qkey: s.qkey,
        qp_access_flags: access_of(s.qp_type, s.access),
        ..QpAttr::default()
    };
    (attr, required(s.qp_type, QpState::Reset, QpState::Init))
}

/// The values of INIT → RTR.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RtrStep {
    /// The QP's transport.
    pub qp_type: QpType,
    /// The path to the remote QP (RC, UC).
    pub av: AddressVector,
    /// Path MTU (RC, UC).
    pub path_mtu: Mtu,
    /// The remote QP number (RC, UC).
    pub dest_qpn: u32,
    /// The first PSN expected from the remote QP (RC, UC).
    pub rq_psn: u32,
    /// Outstanding READs/atomics as responder (RC).
    pub max_dest_rd_atomic: u8,
    /// RNR NAK timer code (RC).
    pub min_rnr_timer: u8,
    /// Remote access to set with this step (RC, UC; narrowed by [`access_of`]); `None`
    /// keeps what INIT set.
    pub access: Option<AccessFlags>,
}

/// INIT → RTR: the path, MTU, remote QPN and receive PSN (RC, UC), the responder depth and
/// RNR timer (RC); nothing on UD.
pub fn rtr(s: &RtrStep) -> (QpAttr, QpAttrMask) {
    let mut mask = required(s.qp_type, QpState::Init, QpState::Rtr);
    let access = match (s.access, s.qp_type) {
        (Some(a), QpType::Rc | QpType::Uc) => {
            mask |= QpAttrMask::ACCESS_FLAGS;
            access_of(s.qp_type, a)
        }
        _ => AccessFlags::empty(),
    };
    let attr = QpAttr {
        qp_state: QpState::Rtr,
        qp_access_flags: access,
        path_mtu: s.path_mtu,
        dest_qp_num: s.dest_qpn,
        rq_psn: s.rq_psn,
        max_dest_rd_atomic: s.max_dest_rd_atomic,
        min_rnr_timer: s.min_rnr_timer,
        ah_attr: s.av,
        ..QpAttr::default()
    };
    (attr, mask)
}

/// The values of RTR → RTS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsStep {
    /// The QP's transport.
    pub qp_type: QpType,
    /// The first PSN this QP sends with.
    pub sq_psn: u32,
    /// Local ACK timeout code (RC).
    pub timeout: u8,
    /// Transport retries (RC).
    pub retry_cnt: u8,
    /// RNR retries, 7 = infinite (RC).
    pub rnr_retry: u8,
    /// Outstanding READs/atomics as initiator (RC).
    pub max_rd_atomic: u8,
}

/// RTR → RTS: the send PSN on every transport, the timeout, retries and initiator depth (RC).
pub fn rts(s: &RtsStep) -> (QpAttr, QpAttrMask) {
    let attr = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: s.sq_psn,
        timeout: s.timeout,
        retry_cnt: s.retry_cnt,
        rnr_retry: s.rnr_retry,
        max_rd_atomic: s.max_rd_atomic,
        ..QpAttr::default()
    };
    (attr, required(s.qp_type, QpState::Rtr, QpState::Rts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpAttrMask as M;

    fn steps(t: QpType, rtr_access: Option<AccessFlags>) -> [(QpAttr, QpAttrMask); 3] {
        let all = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC;
        [
            init(&InitStep {
                qp_type: t,
                port: 2,
                pkey_index: 3,
                access: all,
                qkey: 0x1111,
            }),
            rtr(&RtrStep {
                qp_type: t,
                av: AddressVector {
                    dlid: 9,
                    port_num: 2,
                    ..AddressVector::default()
                },
                path_mtu: Mtu::Mtu2048,
                dest_qpn: 0x12,
                rq_psn: 0x345,
                max_dest_rd_atomic: 4,
                min_rnr_timer: 12,
                access: rtr_access,
            }),
            rts(&RtsStep {
                qp_type: t,
                sq_psn: 0x678,
                timeout: 14,
                retry_cnt: 7,
                rnr_retry: 6,
                max_rd_atomic: 4,
            }),
        ]
    }

    /// Each step's mask is `STATE` and exactly what IBA 11.2.4.2's table requires of the
    /// transition on the transport, written out here from the spec, not from hal's table.
    #[test]
    fn each_step_masks_exactly_the_required_attributes() {
        let init_connected = M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
        let path = M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN;
        let table = [
            (
                QpType::Rc,
                [
                    init_connected,
                    path | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
                    M::SQ_PSN | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC,
                ],
            ),
            (QpType::Uc, [init_connected, path, M::SQ_PSN]),
            (
                QpType::Ud,
                [M::PKEY_INDEX | M::PORT | M::QKEY, M::empty(), M::SQ_PSN],
            ),
        ];
        let states = [QpState::Init, QpState::Rtr, QpState::Rts];
        for (t, masks) in table {
            for (i, (attr, mask)) in steps(t, None).into_iter().enumerate() {
                assert_eq!(mask, M::STATE | masks[i], "{t:?} step {i}");
                assert_eq!(attr.qp_state, states[i], "{t:?} step {i}");
                let from = if i == 0 {
                    QpState::Reset
                } else {
                    states[i - 1]
                };
                assert_eq!(
                    qp_state::check(t, from, attr.qp_state, mask),
                    Ok(states[i]),
                    "{t:?} step {i}"
                );
            }
        }
    }

    #[test]
    fn access_at_rtr_is_added_only_where_the_transport_allows_it() {
        let rw = AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
        let [_, (rc, rc_mask), _] = steps(QpType::Rc, Some(rw));
        assert_eq!(rc.qp_access_flags, rw);
        assert!(rc_mask.contains(M::ACCESS_FLAGS));
        assert_eq!(
            qp_state::check(QpType::Rc, QpState::Init, QpState::Rtr, rc_mask),
            Ok(QpState::Rtr)
        );
        let [_, (uc, uc_mask), _] = steps(QpType::Uc, Some(rw));
        assert_eq!(uc.qp_access_flags, AccessFlags::REMOTE_WRITE);
        assert!(uc_mask.contains(M::ACCESS_FLAGS));
        let [_, (_, ud_mask), _] = steps(QpType::Ud, Some(rw));
        assert_eq!(ud_mask, M::STATE);
    }

    #[test]
    fn init_carries_the_port_and_the_access_the_transport_can_grant() {
        let [(rc, _), ..] = steps(QpType::Rc, None);
        assert_eq!((rc.port_num, rc.pkey_index), (2, 3));
        assert!(rc.qp_access_flags.contains(AccessFlags::REMOTE_ATOMIC));
        let [(uc, _), ..] = steps(QpType::Uc, None);
        assert_eq!(uc.qp_access_flags, AccessFlags::REMOTE_WRITE);
        let [(ud, _), ..] = steps(QpType::Ud, None);
        assert_eq!(
            (ud.qkey, ud.qp_access_flags),
            (0x1111, AccessFlags::empty())
        );
    }
}

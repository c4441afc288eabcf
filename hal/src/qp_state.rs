//! The QP state machine, the one table every layer uses: which transitions exist for each
//! transport, which attributes each requires and allows (IBA 10.3.1 / 11.2.5.2, as Linux's
//! `ib_modify_qp_is_ok` and rdma-core's pyverbs tests apply it), and a name for each
//! transition ([`Transition`]) that a device maps to its own command (mlx4: `RST2INIT_QP` …).
//!
//! verbs-core checks every modify with [`check`] before it reaches a device; the transport
//! engine and the emulated HCA refuse what [`transition`] does not name; the mlx4 driver picks
//! its firmware command from the [`Transition`].

use crate::attr::QpAttrMask as M;
use crate::types::{QpState, QpType};

/// Required and optional attributes of one transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Must be in the mask.
    pub required: M,
    /// May be in the mask.
    pub optional: M,
}

const fn rule(required: M, optional: M) -> Rule {
    Rule { required, optional }
}

const NONE: M = M::empty();

/// A transition of the QP state machine, named as the IBTA (and mlx4's command set) names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transition {
    /// Any state → RESET.
    ToReset,
    /// Any state but RESET → ERR.
    ToErr,
    /// RESET → INIT.
    ResetToInit,
    /// INIT → INIT.
    InitToInit,
    /// INIT → RTR.
    InitToRtr,
    /// RTR → RTS.
    RtrToRts,
    /// RTS → RTS.
    RtsToRts,
    /// SQE → RTS (UD and UC only: an RC send-side error goes to ERR).
    SqeToRts,
    /// RTS → SQD.
    RtsToSqd,
    /// SQD → RTS.
    SqdToRts,
    /// SQD → SQD.
    SqdToSqd,
}

/// The transition `from → to` on transport `t`, or `None` when it does not exist.
pub fn transition(t: QpType, from: QpState, to: QpState) -> Option<Transition> {
    use QpState::*;
    use Transition::*;
    Some(match (from, to) {
        (_, Reset) => ToReset,
        // A QP that was never initialised has nothing to flush: Linux's table
        // (`ib_modify_qp_is_ok`) has no RESET → ERR, so neither does ours.
        (Reset, Err) => return None,
        (_, Err) => ToErr,
        (Reset, Init) => ResetToInit,
        (Init, Init) => InitToInit,
        (Init, Rtr) => InitToRtr,
        (Rtr, Rts) => RtrToRts,
        (Rts, Rts) => RtsToRts,
        // SQE exists for UD and UC (a send-side error); RC errors go to ERR.
        (Sqe, Rts) if t != QpType::Rc => SqeToRts,
        (Rts, Sqd) => RtsToSqd,
        (Sqd, Rts) => SqdToRts,
        (Sqd, Sqd) => SqdToSqd,
        _ => return None,
    })
}

/// Attributes of the RESET→INIT and INIT→INIT transitions.
const fn init_attrs(t: QpType) -> M {
    match t {
        QpType::Ud => M::PKEY_INDEX.union(M::PORT).union(M::QKEY),
        QpType::Uc | QpType::Rc => M::PKEY_INDEX.union(M::PORT).union(M::ACCESS_FLAGS),
    }
}

impl Transition {
    /// The state the transition leads to.
    pub fn to(self) -> QpState {
        use Transition::*;
        match self {
            ToReset => QpState::Reset,
            ToErr => QpState::Err,
            ResetToInit | InitToInit => QpState::Init,
            InitToRtr => QpState::Rtr,
            RtrToRts | RtsToRts | SqeToRts | SqdToRts => QpState::Rts,
            RtsToSqd | SqdToSqd => QpState::Sqd,
        }
    }
}

/// The rule for `from → to` on transport `t`, or `None` when the transition does not exist.
/// `STATE` itself is handled by [`check`].
pub fn rule_for(t: QpType, from: QpState, to: QpState) -> Option<Rule> {
    transition(t, from, to).map(|tr| tr.rule(t))
}

impl Transition {
    /// The attributes this transition requires and allows on transport `t`.
    pub fn rule(self, t: QpType) -> Rule {
        use QpType::*;
        use Transition::*;
        match self {
            ToReset | ToErr => rule(NONE, NONE),
            ResetToInit => rule(init_attrs(t), NONE),
            InitToInit => rule(NONE, init_attrs(t)),
            InitToRtr => match t {
                Ud => rule(NONE, M::PKEY_INDEX.union(M::QKEY)),
                Uc => rule(
                    M::AV.union(M::PATH_MTU).union(M::DEST_QPN).union(M::RQ_PSN),
                    M::ALT_PATH.union(M::ACCESS_FLAGS).union(M::PKEY_INDEX),
                ),
                Rc => rule(
                    M::AV
                        .union(M::PATH_MTU)
                        .union(M::DEST_QPN)
                        .union(M::RQ_PSN)
                        .union(M::MAX_DEST_RD_ATOMIC)
                        .union(M::MIN_RNR_TIMER),
                    M::ALT_PATH.union(M::ACCESS_FLAGS).union(M::PKEY_INDEX),
                ),
            },
            RtrToRts => match t {
                Ud => rule(M::SQ_PSN, M::CUR_STATE.union(M::QKEY)),
                Uc => rule(
                    M::SQ_PSN,
                    M::CUR_STATE
                        .union(M::ALT_PATH)
                        .union(M::ACCESS_FLAGS)
                        .union(M::PATH_MIG_STATE),
                ),
                Rc => rule(
                    M::TIMEOUT
                        .union(M::RETRY_CNT)
                        .union(M::RNR_RETRY)
                        .union(M::SQ_PSN)
                        .union(M::MAX_QP_RD_ATOMIC),
                    M::CUR_STATE
                        .union(M::ALT_PATH)
                        .union(M::ACCESS_FLAGS)
                        .union(M::MIN_RNR_TIMER)
                        .union(M::PATH_MIG_STATE),
                ),
            },
            RtsToRts | SqdToRts => match t {
                Ud => rule(NONE, M::CUR_STATE.union(M::QKEY)),
                Uc => rule(
                    NONE,
                    M::CUR_STATE
                        .union(M::ACCESS_FLAGS)
                        .union(M::ALT_PATH)
                        .union(M::PATH_MIG_STATE),
                ),
                Rc => rule(
                    NONE,
                    M::CUR_STATE
                        .union(M::ACCESS_FLAGS)
                        .union(M::ALT_PATH)
                        .union(M::PATH_MIG_STATE)
                        .union(M::MIN_RNR_TIMER),
                ),
            },
            RtsToSqd => rule(NONE, M::EN_SQD_ASYNC_NOTIFY),
            SqdToSqd => match t {
                Ud => rule(NONE, M::PKEY_INDEX.union(M::QKEY)),
                Uc => rule(
                    NONE,
                    M::AV
                        .union(M::ALT_PATH)
                        .union(M::ACCESS_FLAGS)
                        .union(M::PKEY_INDEX)
                        .union(M::PATH_MIG_STATE),
                ),
                Rc => rule(
                    NONE,
                    M::PORT
                        .union(M::AV)
                        .union(M::TIMEOUT)
                        .union(M::RETRY_CNT)
                        .union(M::RNR_RETRY)
                        .union(M::MAX_QP_RD_ATOMIC)
                        .union(M::MAX_DEST_RD_ATOMIC)
                        .union(M::ALT_PATH)
                        .union(M::ACCESS_FLAGS)
                        .union(M::PKEY_INDEX)
                        .union(M::MIN_RNR_TIMER)
                        .union(M::PATH_MIG_STATE),
                ),
            },
            // `transition` never names SQE → RTS for RC (its send-side errors go to ERR).
            SqeToRts => match t {
                Ud => rule(NONE, M::CUR_STATE.union(M::QKEY)),
                Uc | Rc => rule(NONE, M::CUR_STATE.union(M::ACCESS_FLAGS)),
            },
        }
    }
}

/// Why a modify was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// No such transition.
    Transition,
    /// Required attributes missing.
    Missing(M),
    /// Attributes not allowed.
    Unexpected(M),
}

/// Checks a modify from `cur` with `mask` (and target `attr_state` when `STATE` is set) and
/// returns the target state.
///
/// # Errors
/// The [`Violation`].
pub fn check(t: QpType, cur: QpState, attr_state: QpState, mask: M) -> Result<QpState, Violation> {
    let to = if mask.contains(M::STATE) {
        attr_state
    } else {
        cur
    };
    let rule = rule_for(t, cur, to).ok_or(Violation::Transition)?;
    let given = mask - M::STATE;
    let missing = rule.required - given;
    if !missing.is_empty() {
        return Err(Violation::Missing(missing));
    }
    let unexpected = given - rule.required - rule.optional;
    if !unexpected.is_empty() {
        return Err(Violation::Unexpected(unexpected));
    }
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use QpState::{Err as Error, Init, Reset, Rtr, Rts, Sqe};
    use QpType::*;

    #[test]
    fn pyverbs_masks_are_accepted() {
        // rdma-core's QP.to_init/to_rtr/to_rts masks (`pyverbs/qp.pyx`).
        let init_rc = M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS;
        assert_eq!(check(Rc, Reset, Init, init_rc), Ok(Init));
        let rtr_rc = M::STATE
            | M::AV
            | M::PATH_MTU
            | M::DEST_QPN
            | M::RQ_PSN
            | M::MAX_DEST_RD_ATOMIC
            | M::MIN_RNR_TIMER;
        assert_eq!(check(Rc, Init, Rtr, rtr_rc), Ok(Rtr));
        let rts_rc =
            M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
        assert_eq!(check(Rc, Rtr, Rts, rts_rc), Ok(Rts));
        assert_eq!(
            check(
                Uc,
                Init,
                Rtr,
                M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN
            ),
            Ok(Rtr)
        );
        assert_eq!(check(Uc, Rtr, Rts, M::STATE | M::SQ_PSN), Ok(Rts));
        assert_eq!(
            check(
                Ud,
                Reset,
                Init,
                M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY
            ),
            Ok(Init)
        );
        assert_eq!(check(Ud, Init, Rtr, M::STATE), Ok(Rtr));
        assert_eq!(check(Ud, Rtr, Rts, M::STATE | M::SQ_PSN), Ok(Rts));
    }

    #[test]
    fn missing_and_unexpected_attributes_are_reported() {
        assert_eq!(
            check(Rc, Reset, Init, M::STATE | M::PKEY_INDEX | M::PORT),
            Err(Violation::Missing(M::ACCESS_FLAGS))
        );
        assert_eq!(
            check(
                Ud,
                Reset,
                Init,
                M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY | M::ACCESS_FLAGS
            ),
            Err(Violation::Unexpected(M::ACCESS_FLAGS))
        );
        assert_eq!(
            check(Rc, Rtr, Rts, M::STATE | M::SQ_PSN),
            Err(Violation::Missing(
                M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::MAX_QP_RD_ATOMIC
            ))
        );
    }

    #[test]
    fn invalid_transitions_are_refused() {
        for t in [Rc, Uc, Ud] {
            assert_eq!(check(t, Reset, Rtr, M::STATE), Err(Violation::Transition));
            assert_eq!(check(t, Reset, Rts, M::STATE), Err(Violation::Transition));
            assert_eq!(check(t, Init, Rts, M::STATE), Err(Violation::Transition));
            assert_eq!(check(t, Error, Rts, M::STATE), Err(Violation::Transition));
            assert_eq!(check(t, Rtr, Init, M::STATE), Err(Violation::Transition));
            // Every state may go to RESET, and every state but RESET to ERR (Linux's table).
            for s in QpState::ALL {
                assert!(check(t, s, Reset, M::STATE).is_ok());
                assert_eq!(
                    check(t, s, Error, M::STATE).is_ok(),
                    s != Reset,
                    "{s} => ERR"
                );
            }
        }
        assert_eq!(check(Rc, Sqe, Rts, M::STATE), Err(Violation::Transition));
        assert_eq!(check(Uc, Sqe, Rts, M::STATE), Ok(Rts));
    }

    #[test]
    fn every_named_transition_leads_where_it_says() {
        for t in [Rc, Uc, Ud] {
            for from in QpState::ALL {
                for to in QpState::ALL {
                    if let Some(tr) = transition(t, from, to) {
                        assert_eq!(tr.to(), to, "{t:?} {from} -> {to}");
                    }
                }
            }
        }
        assert_eq!(transition(Rc, Sqe, Rts), None);
        assert_eq!(transition(Ud, Sqe, Rts), Some(Transition::SqeToRts));
        assert_eq!(transition(Rc, Reset, Error), None);
        assert_eq!(transition(Rc, Init, Error), Some(Transition::ToErr));
    }

    #[test]
    fn modify_without_state_uses_the_same_state_rule() {
        assert_eq!(check(Rc, Rts, Reset, M::ACCESS_FLAGS), Ok(Rts));
        assert_eq!(
            check(Rc, Rtr, Reset, M::ACCESS_FLAGS),
            Err(Violation::Transition)
        );
    }
}

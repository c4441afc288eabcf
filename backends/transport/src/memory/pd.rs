//! The protection-domain walk: every object a work request names, the domain it must share,
//! where that is checked, and what a request breaking the rule ends with.
//!
//! IBTA ties each QP, SRQ, memory region, memory window and address handle to one protection
//! domain (IBA 10.2.3), and a work request may only name objects of its queue's domain. The
//! table below is that rule walked over chapters 10 and 11, one row per (object, check):
//!
//! | row | named by | must hold | checked in | violation |
//! |---|---|---|---|---|
//! | `gather_lkey_of_a_send` | SEND (± imm, ± inv) gather entry | MR in the QP's PD (IBA 10.6.3, 11.4.1.1) | `requester::validate` → [`MemoryTable::check_local`] | `LOC_PROT_ERR` |
//! | `gather_lkey_of_a_write` | RDMA WRITE (± imm) gather entry | MR in the QP's PD (IBA 10.6.3, 11.4.1.1) | `requester::validate` | `LOC_PROT_ERR` |
//! | `scatter_lkey_of_a_read` | RDMA READ scatter entry | MR in the QP's PD, local write (IBA 10.6.3, 10.8.3) | `completer` → [`MemoryTable::local`] | `LOC_PROT_ERR` |
//! | `result_lkey_of_an_atomic` | atomic's 8-byte result buffer | MR in the QP's PD, local write (IBA 10.6.3, 10.8.3.4) | `completer` → [`MemoryTable::local`] | `LOC_PROT_ERR` |
//! | `receive_lkey_on_the_rq` | receive scatter entry, QP's own RQ | MR in the QP's PD (IBA 10.6.3, 11.4.1.2) | `responder::recv` → [`MemoryTable::local`] | receive `LOC_PROT_ERR`, sender `REM_OP_ERR` |
//! | `receive_lkey_on_an_srq` | receive scatter entry, SRQ | MR in the SRQ's PD, which may differ from the QP's (IBA 10.2.9.2) | `responder::recv` (the SRQ's domain comes with its WQE) | receive `LOC_PROT_ERR`, sender `REM_OP_ERR` |
//! | `rkey_of_an_mr` | WRITE / READ / atomic rkey naming an MR | MR in the responder QP's PD (IBA 9.4, 9.7.5, 10.6.3) | `responder` → [`MemoryTable::remote`] | `REM_ACCESS_ERR` |
//! | `rkey_of_a_type1_window` | the same, naming a type-1 window | window in the responder QP's PD (IBA 10.6.7.2.1, 9.7.5) | [`MemoryTable::remote`] | `REM_ACCESS_ERR` |
//! | `rkey_of_a_type2_window` | the same, naming a type-2 window | window in the responder QP's PD and bound to that QP (IBA 10.6.7.2.2, 9.7.5) | [`MemoryTable::remote`] | `REM_ACCESS_ERR` |
//! | `window_of_a_bind` | BIND_MW's window | window in the QP's PD (IBA 10.6.7.2) | [`MemoryTable::bind`] | `MW_BIND_ERR` |
//! | `mr_of_a_bind` | BIND_MW's MR | MR in the QP's PD (IBA 10.6.7.2) | [`MemoryTable::bind`] | `MW_BIND_ERR` |
//! | `bind_right_of_a_bind_mr` | BIND_MW's MR | MR registered with `MW_BIND` (IBA 10.6.7.2, 10.6.3.1) | [`MemoryTable::bind`] | `MW_BIND_ERR` |
//! | `key_of_a_type2_bind` | BIND_MW's new rkey | its index names a window of the QP's PD; the consumer picks only the tag byte (IBA 10.6.7.2.2) | [`MemoryTable::bind`] | `MW_BIND_ERR` |
//! | `type1_bind_through_the_verb` | `bind_mw` (type 1) | window and MR in the QP's PD (IBA 10.6.7.2.1) | [`MemoryTable::bind`] | `MW_BIND_ERR` |
//! | `key_of_a_local_invalidate` | LOCAL_INV's key | window in the QP's PD, bound to that QP (IBA 10.6.7.2.2, 10.8.3) | [`MemoryTable::invalidate`] | `MW_BIND_ERR` |
//! | `key_of_a_send_with_invalidate` | SEND_WITH_INV's key | window in the responder QP's PD, bound to that QP (IBA 10.6.7.2.2, 9.4) | `responder::rc` → [`MemoryTable::invalidate`] | sender success, receive `REM_INV_REQ_ERR` (class J) |
//! | `address_handle_of_a_ud_send` | UD SEND (± imm) address handle | AH in the QP's PD (IBA 10.2.3, 11.4.1.1) | verbs-core at post (`send_rules`) | refused at post |
//!
//! [`PD_RULES`] holds the same rows as data: the conformance suite runs one case per row on
//! every backend (`tests/conformance/pd_walk.rs` and, for windows, `pd_walk_mw.rs`; each
//! asserts the outcome given here), and a test below checks that every send operation appears
//! in some row, so that a new operation cannot skip the walk. The soft device, the UDP device and the emulated ConnectX-3 all run
//! this engine, so each check has one home, and no backend deviates from the table. On a real
//! ConnectX-3 (`mlx4_hw`) the same cases run, and only the address-handle row is checked by this
//! code: the other statuses there are the hardware's own, not yet confirmed on one.

#[cfg(doc)]
use super::MemoryTable;
use portverbs_hal::wc::WcStatus;
use portverbs_hal::wr::SendOps;

/// Which request names the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NamedBy {
    /// Send work requests of these operations.
    Send(SendOps),
    /// A receive work request (a QP's RQ or an SRQ).
    Recv,
}

/// What a request that breaks the rule ends with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Refused at post with a typed error; nothing is queued.
    Refused,
    /// The send request completes with this status. The responder consumes no receive, but
    /// for a WRITE with immediate, which takes one before its key is checked and completes it
    /// with `LOC_ACCESS_ERR` (README, "Deviations from IBTA").
    Requester(WcStatus),
    /// The responder takes a receive for the message and completes it with `receive`; the
    /// send request completes with `requester`.
    Receive {
        /// The send request's status.
        requester: WcStatus,
        /// The receive's status.
        receive: WcStatus,
    },
}

/// One row of the walk.
#[derive(Debug, Clone, Copy)]
pub struct PdRule {
    /// The row's name; also the name of its conformance case.
    pub name: &'static str,
    /// The requests that name the object.
    pub named_by: NamedBy,
    /// What must hold, with the IBTA sections that say so.
    pub rule: &'static str,
    /// What a violating request ends with.
    pub outcome: Outcome,
}

const SENDS: SendOps = SendOps::SEND
    .union(SendOps::SEND_WITH_IMM)
    .union(SendOps::SEND_WITH_INV);
const WRITES: SendOps = SendOps::RDMA_WRITE.union(SendOps::RDMA_WRITE_WITH_IMM);
const ATOMICS: SendOps = SendOps::ATOMIC_CMP_SWP.union(SendOps::ATOMIC_FETCH_ADD);
const REMOTE: SendOps = WRITES.union(SendOps::RDMA_READ).union(ATOMICS);

const LOC_PROT: Outcome = Outcome::Requester(WcStatus::LocProtErr);
const REM_ACCESS: Outcome = Outcome::Requester(WcStatus::RemAccessErr);
const BIND_ERR: Outcome = Outcome::Requester(WcStatus::MwBindErr);
const RECV_PROT: Outcome = Outcome::Receive {
    requester: WcStatus::RemOpErr,
    receive: WcStatus::LocProtErr,
};

/// The walk, row by row (the table in this module's documentation).
pub const PD_RULES: &[PdRule] = &[
    PdRule {
        name: "gather_lkey_of_a_send",
        named_by: NamedBy::Send(SENDS),
        rule: "gather MR in the QP's PD (IBA 10.6.3, 11.4.1.1)",
        outcome: LOC_PROT,
    },
    PdRule {
        name: "gather_lkey_of_a_write",
        named_by: NamedBy::Send(WRITES),
        rule: "gather MR in the QP's PD (IBA 10.6.3, 11.4.1.1)",
        outcome: LOC_PROT,
    },
    PdRule {
        name: "scatter_lkey_of_a_read",
        named_by: NamedBy::Send(SendOps::RDMA_READ),
        rule: "scatter MR in the QP's PD (IBA 10.6.3, 10.8.3)",
        outcome: LOC_PROT,
    },
    PdRule {
        name: "result_lkey_of_an_atomic",
        named_by: NamedBy::Send(ATOMICS),
        rule: "result-buffer MR in the QP's PD (IBA 10.6.3, 10.8.3.4)",
        outcome: LOC_PROT,
    },
    PdRule {
        name: "receive_lkey_on_the_rq",
        named_by: NamedBy::Recv,
        rule: "receive MR in the QP's PD (IBA 10.6.3, 11.4.1.2)",
        outcome: RECV_PROT,
    },
    PdRule {
        name: "receive_lkey_on_an_srq",
        named_by: NamedBy::Recv,
        rule: "receive MR in the SRQ's PD, not the QP's (IBA 10.2.9.2)",
        outcome: RECV_PROT,
    },
    PdRule {
        name: "rkey_of_an_mr",
        named_by: NamedBy::Send(REMOTE),
        rule: "MR in the responder QP's PD (IBA 9.4, 9.7.5, 10.6.3)",
        outcome: REM_ACCESS,
    },
    PdRule {
        name: "rkey_of_a_type1_window",
        named_by: NamedBy::Send(REMOTE),
        rule: "type-1 window in the responder QP's PD (IBA 10.6.7.2.1, 9.7.5)",
        outcome: REM_ACCESS,
    },
    PdRule {
        name: "rkey_of_a_type2_window",
        named_by: NamedBy::Send(REMOTE),
        rule: "type-2 window in the responder QP's PD, bound to it (IBA 10.6.7.2.2, 9.7.5)",
        outcome: REM_ACCESS,
    },
    PdRule {
        name: "window_of_a_bind",
        named_by: NamedBy::Send(SendOps::BIND_MW),
        rule: "window in the QP's PD (IBA 10.6.7.2)",
        outcome: BIND_ERR,
    },
    PdRule {
        name: "mr_of_a_bind",
        named_by: NamedBy::Send(SendOps::BIND_MW),
        rule: "MR in the QP's PD (IBA 10.6.7.2)",
        outcome: BIND_ERR,
    },
    PdRule {
        name: "bind_right_of_a_bind_mr",
        named_by: NamedBy::Send(SendOps::BIND_MW),
        rule: "MR registered with MW_BIND (IBA 10.6.7.2, 10.6.3.1)",
        outcome: BIND_ERR,
    },
    PdRule {
        name: "key_of_a_type2_bind",
        named_by: NamedBy::Send(SendOps::BIND_MW),
        rule: "new rkey's index names a window of the QP's PD (IBA 10.6.7.2.2)",
        outcome: BIND_ERR,
    },
    PdRule {
        name: "type1_bind_through_the_verb",
        named_by: NamedBy::Send(SendOps::BIND_MW),
        rule: "bind_mw: window and MR in the QP's PD (IBA 10.6.7.2.1)",
        outcome: BIND_ERR,
    },
    PdRule {
        name: "key_of_a_local_invalidate",
        named_by: NamedBy::Send(SendOps::LOCAL_INV),
        rule: "window in the QP's PD, bound to it (IBA 10.6.7.2.2, 10.8.3)",
        outcome: BIND_ERR,
    },
    PdRule {
        name: "key_of_a_send_with_invalidate",
        named_by: NamedBy::Send(SendOps::SEND_WITH_INV),
        rule: "window in the responder QP's PD, bound to it (IBA 10.6.7.2.2, 9.4)",
        outcome: Outcome::Receive {
            requester: WcStatus::Success,
            receive: WcStatus::RemInvReqErr,
        },
    },
    PdRule {
        name: "address_handle_of_a_ud_send",
        named_by: NamedBy::Send(SendOps::SEND.union(SendOps::SEND_WITH_IMM)),
        rule: "address handle in the QP's PD (IBA 10.2.3, 11.4.1.1)",
        outcome: Outcome::Refused,
    },
];

/// The row called `name`.
///
/// # Panics
/// No row has that name (a test naming a row that is not in the table).
pub fn rule(name: &str) -> &'static PdRule {
    PD_RULES
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no PD rule named {name}"))
}

/// The send operations some row names an object of.
pub fn walked_ops() -> SendOps {
    PD_RULES
        .iter()
        .filter_map(|r| match r.named_by {
            NamedBy::Send(ops) => Some(ops),
            NamedBy::Recv => None,
        })
        .fold(SendOps::empty(), |a, b| a | b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_send_operation_is_walked() {
        let missing = SendOps::all() - walked_ops();
        assert!(
            missing.is_empty(),
            "no PD rule names an object of {missing:?}: add its rows to PD_RULES"
        );
    }

    #[test]
    fn rows_have_distinct_names_and_receives_are_walked() {
        let mut names: Vec<_> = PD_RULES.iter().map(|r| r.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PD_RULES.len(), "duplicate row names");
        assert!(PD_RULES.iter().any(|r| r.named_by == NamedBy::Recv));
        assert_eq!(rule("mr_of_a_bind").outcome, BIND_ERR);
    }

    #[test]
    fn the_documented_table_lists_every_row() {
        let doc = include_str!("pd.rs");
        for r in PD_RULES {
            assert!(
                doc.contains(&format!("//! | `{}` |", r.name)),
                "the module's table lacks {}",
                r.name
            );
        }
    }
}

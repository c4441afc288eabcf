//! Completion vocabulary: status codes, opcodes and flags with libibverbs values, the
//! application's completion ([`WorkCompletion`]) and the decoded device CQE ([`Cqe`]).
//!
//! # One completion, and the device's reference beside it
//!
//! The fields of a completion live in one place, [`WorkCompletion`]: the application's
//! `struct ibv_wc`, a fixed `repr(C)` layout of 40 bytes and the element of the array the
//! application hands to a poll. What a device reports in a CQE is that completion (with
//! `wr_id` still 0: a device never knows it, the core maps it) plus a [`WqeRef`], the device's
//! word on which work request retired. [`Cqe`] is exactly that pair, `wc` and `wqe`, with no
//! field of its own.
//!
//! The reference stays outside [`WorkCompletion`] on purpose. It is what the device said
//! (untrusted) and means nothing to the application, so the application's array has no field
//! for it; adding one would grow every slot to 48 bytes and the stores of every poll with it.
//! The fast poll path ([`crate::queue::CompletionQueue::poll_with`], which the mlx4 driver
//! implements itself) therefore decodes each device CQE straight into the application's slot
//! and passes the [`WqeRef`] beside it, in registers, to the core, which checks it and turns
//! it into `wr_id`.
//!
//! [`Cqe`] serves the places that have no application array: what a device model writes into
//! its CQ ring (the transport engine's completions, the software device's CQE encoder, the
//! mlx4 model), what a backend's CQE decoder returns when asked for a self-contained value, and
//! what [`crate::queue::CompletionQueue::poll_one`] returns one at a time (a CQ clean before a
//! QP is destroyed, test drains). Moving between the two forms is a field access: `cqe.wc` is
//! the application's completion, `cqe.wqe` the reference the core resolves.

use std::fmt;

/// Completion status (`enum ibv_wc_status`). `Display` prints `ibv_wc_status_str` wording.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcStatus {
    /// The operation completed.
    Success = 0,
    /// Local length error: a message did not fit the receive buffer, or a length was invalid.
    LocLenErr = 1,
    /// Local QP operation error (malformed WQE, invalid operation for the QP).
    LocQpOpErr = 2,
    /// Local EE context operation error (RD; unused).
    LocEecOpErr = 3,
    /// Local protection error: an lkey was invalid or lacked the right.
    LocProtErr = 4,
    /// Flushed: the QP was in the error state.
    WrFlushErr = 5,
    /// Memory-window bind error.
    MwBindErr = 6,
    /// Bad response (unexpected opcode from the responder).
    BadRespErr = 7,
    /// Local access error (a protection error on a local buffer at the responder).
    LocAccessErr = 8,
    /// Remote invalid request (NAK invalid request).
    RemInvReqErr = 9,
    /// Remote access error (NAK remote access error).
    RemAccessErr = 10,
    /// Remote operational error (NAK remote operational error).
    RemOpErr = 11,
    /// Transport retries exhausted.
    RetryExcErr = 12,
    /// RNR retries exhausted.
    RnrRetryExcErr = 13,
    /// Local RDD violation (RD; unused).
    LocRddViolErr = 14,
    /// Remote invalid RD request (RD; unused).
    RemInvRdReqErr = 15,
    /// Remote aborted.
    RemAbortErr = 16,
    /// Invalid EE context number (RD; unused).
    InvEecnErr = 17,
    /// Invalid EE context state (RD; unused).
    InvEecStateErr = 18,
    /// Fatal error (device).
    FatalErr = 19,
    /// Response timeout.
    RespTimeoutErr = 20,
    /// Any other error.
    GeneralErr = 21,
}

impl WcStatus {
    /// Decodes the numeric value; unknown values become `GeneralErr`.
    pub fn from_u8(v: u8) -> Self {
        use WcStatus::*;
        const ALL: [WcStatus; 22] = [
            Success,
            LocLenErr,
            LocQpOpErr,
            LocEecOpErr,
            LocProtErr,
            WrFlushErr,
            MwBindErr,
            BadRespErr,
            LocAccessErr,
            RemInvReqErr,
            RemAccessErr,
            RemOpErr,
            RetryExcErr,
            RnrRetryExcErr,
            LocRddViolErr,
            RemInvRdReqErr,
            RemAbortErr,
            InvEecnErr,
            InvEecStateErr,
            FatalErr,
            RespTimeoutErr,
            GeneralErr,
        ];
        ALL.get(usize::from(v)).copied().unwrap_or(GeneralErr)
    }

    /// True for `Success`.
    pub fn is_ok(self) -> bool {
        self == Self::Success
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Success => "success",
            Self::LocLenErr => "local length error",
            Self::LocQpOpErr => "local QP operation error",
            Self::LocEecOpErr => "local EE context operation error",
            Self::LocProtErr => "local protection error",
            Self::WrFlushErr => "Work Request Flushed Error",
            Self::MwBindErr => "memory management operation error",
            Self::BadRespErr => "bad response error",
            Self::LocAccessErr => "local access error",
            Self::RemInvReqErr => "remote invalid request error",
            Self::RemAccessErr => "remote access error",
            Self::RemOpErr => "remote operation error",
            Self::RetryExcErr => "transport retry counter exceeded",
            Self::RnrRetryExcErr => "RNR retry counter exceeded",
            Self::LocRddViolErr => "local RDD violation error",
            Self::RemInvRdReqErr => "remote invalid RD request",
            Self::RemAbortErr => "aborted error",
            Self::InvEecnErr => "invalid EE context number",
            Self::InvEecStateErr => "invalid EE context state",
            Self::FatalErr => "fatal error",
            Self::RespTimeoutErr => "response timeout error",
            Self::GeneralErr => "general error",
        })
    }
}

/// Completion opcode (`enum ibv_wc_opcode`). Only meaningful for successful completions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WcOpcode {
    /// A send (any flavour) completed.
    Send = 0,
    /// An RDMA write completed.
    RdmaWrite = 1,
    /// An RDMA read completed.
    RdmaRead = 2,
    /// A compare-and-swap completed.
    CompSwap = 3,
    /// A fetch-and-add completed.
    FetchAdd = 4,
    /// A memory-window bind completed.
    BindMw = 5,
    /// A local invalidate completed.
    LocalInv = 6,
    /// A receive completed (send, send-with-imm, send-with-inv).
    Recv = 128,
    /// A receive consumed by an RDMA write with immediate.
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// True for the receive-side opcodes.
    pub fn is_recv(self) -> bool {
        matches!(self, Self::Recv | Self::RecvRdmaWithImm)
    }
}

bitflags::bitflags! {
    /// Completion flags (`enum ibv_wc_flags` values).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFlags: u32 {
        /// The first 40 bytes of a UD receive buffer hold the GRH (or, on RoCEv2 over IPv4,
        /// 20 reserved bytes then the IPv4 header).
        const GRH = 1;
        /// `imm` holds immediate data.
        const WITH_IMM = 1 << 1;
        /// The IP checksum was verified.
        const IP_CSUM_OK = 1 << 2;
        /// `imm` holds the rkey invalidated by a SEND_WITH_INV.
        const WITH_INV = 1 << 3;
    }
}

/// One work completion (`struct ibv_wc`). Defined here, not in verbs-core, so that a backend's
/// CQE decoder writes the application's completion array directly
/// ([`crate::queue::CompletionQueue::poll_with`]); the core then fills in `wr_id`.
///
/// The layout is fixed (`repr(C)`, 40 bytes, no padding) with the fields a send completion sets
/// first and those it leaves zero together at the end, so that a decoder's stores of constant
/// zeros merge into a few wide ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct WorkCompletion {
    /// `wr_id` of the work request.
    pub wr_id: u64,
    /// The local QP.
    pub qp_num: u32,
    /// Bytes received (receives, READs, atomics).
    pub byte_len: u32,
    /// Status.
    pub status: WcStatus,
    /// Opcode (valid for successful completions).
    pub opcode: WcOpcode,
    /// Service level.
    pub sl: u8,
    /// DLID path bits.
    pub dlid_path_bits: u8,
    /// Flags.
    pub wc_flags: WcFlags,
    /// Vendor error syndrome.
    pub vendor_err: u32,
    /// Immediate data (with `WITH_IMM`) or the invalidated rkey (with `WITH_INV`).
    pub imm_data: u32,
    /// Source QP (UD receives; the connected peer otherwise).
    pub src_qp: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
}
const _: () = assert!(size_of::<WorkCompletion>() == 40);

impl Default for WorkCompletion {
    fn default() -> Self {
        Self {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            qp_num: 0,
            src_qp: 0,
            wc_flags: WcFlags::empty(),
            pkey_index: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
        }
    }
}

impl WorkCompletion {
    /// True for a successful completion.
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }

    /// Immediate data, if the message carried some.
    pub fn imm(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_IMM)
            .then_some(self.imm_data)
    }

    /// The rkey a SEND_WITH_INV invalidated.
    pub fn invalidated_rkey(&self) -> Option<u32> {
        self.wc_flags
            .contains(WcFlags::WITH_INV)
            .then_some(self.imm_data)
    }
}

/// Which work request a completion refers to, as the device reported it (untrusted): the core
/// resolves it to a `wr_id` through the QP named by [`WorkCompletion::qp_num`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WqeRef {
    /// A send-queue completion.
    pub is_send: bool,
    /// Send completions: the 16-bit producer counter of the completed WQE. SRQ receives: the
    /// SRQ slot index. Plain receives: unused (receive WQEs retire in order).
    pub index: u16,
}

/// A completion as decoded from a device CQE, before the core maps it to a `wr_id`: the
/// completion the application will see (`wc`, with `wc.wr_id` left 0) and, beside it, the
/// device's reference to the work request it retires (`wqe`).
///
/// Backends fill it from their own CQE format; `verbs-core` checks every field it uses
/// (the QPN must name a live QP on this CQ, the WQE index must lie inside the ring) because
/// the contents come from a device and are not trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cqe {
    /// The completion as the application sees it; `wr_id` stays 0 until the core maps it.
    pub wc: WorkCompletion,
    /// The work request the device says completed (untrusted).
    pub wqe: WqeRef,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_values_match_libibverbs() {
        assert_eq!(WcStatus::WrFlushErr as u8, 5);
        assert_eq!(WcStatus::RetryExcErr as u8, 12);
        assert_eq!(WcStatus::RnrRetryExcErr as u8, 13);
        assert_eq!(WcStatus::GeneralErr as u8, 21);
        for v in 0..=21u8 {
            assert_eq!(WcStatus::from_u8(v) as u8, v);
        }
        assert_eq!(WcStatus::from_u8(200), WcStatus::GeneralErr);
    }

    #[test]
    fn status_strings_follow_ibv_wc_status_str() {
        assert_eq!(WcStatus::Success.to_string(), "success");
        assert_eq!(
            WcStatus::RetryExcErr.to_string(),
            "transport retry counter exceeded"
        );
    }

    #[test]
    fn cqe_default_is_a_zeroed_success() {
        let c = Cqe::default();
        assert_eq!(c.wc, WorkCompletion::default());
        assert_eq!((c.wc.wr_id, c.wc.status), (0, WcStatus::Success));
        assert_eq!(
            c.wqe,
            WqeRef {
                is_send: false,
                index: 0
            }
        );
    }

    #[test]
    fn opcode_values_match_libibverbs() {
        assert_eq!(WcOpcode::Recv as u8, 128);
        assert_eq!(WcOpcode::RecvRdmaWithImm as u8, 129);
        assert!(WcOpcode::Recv.is_recv());
        assert!(!WcOpcode::RdmaRead.is_recv());
    }
}

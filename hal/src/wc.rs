//! Completion vocabulary: status codes, opcodes and flags with libibverbs values, and the
//! portable decoded CQE ([`Cqe`]) that a backend's CQE decoder produces.
//!
//! # Why a completion has two shapes
//!
//! A completion is a [`WorkCompletion`] plus a [`WqeRef`], and [`Cqe`] is the two in one
//! value ([`Cqe::into_parts`], [`Cqe::from_parts`]). They are kept apart on purpose:
//!
//! * [`WorkCompletion`] is the application's `struct ibv_wc`: a fixed `repr(C)` layout of
//!   40 bytes, and the element of the array the application hands to a poll. The fast poll
//!   path ([`crate::queue::CompletionQueue::poll_with`], which the mlx4 driver implements
//!   itself) decodes each device CQE straight into the application's slot and passes the
//!   [`WqeRef`] beside it, in registers, to the core, which turns it into `wr_id`. The
//!   reference is what the device said (untrusted) and means nothing to the application, so it
//!   has no field in the application's array; adding one would grow every slot to 48 bytes
//!   and the stores of every poll with it.
//! * [`Cqe`] is the self-contained form for the places that have no application array and
//!   no `wr_id`: what a device model writes into its CQ ring (the transport engine's
//!   completions, the software device's CQE encoder, the mlx4 model), and what
//!   [`crate::queue::CompletionQueue::poll_one`] returns one at a time (a CQ clean before a
//!   QP is destroyed, test drains). A device never knows `wr_id`: the core maps it.
//!
//! So the split follows who may see what rather than a second model of a completion: one list
//! of fields ([`Cqe`]'s mirror [`WorkCompletion`]'s, `wr_id` aside), crossed only by the two
//! conversions, which are plain moves.

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

/// A completion as decoded from a device CQE, before the core maps it to a `wr_id`.
///
/// Backends fill it from their own CQE format; `verbs-core` checks every field it uses
/// (the QPN must name a live QP on this CQ, the WQE index must lie inside the ring) because
/// the contents come from a device and are not trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    /// Local QP the completion belongs to.
    pub qpn: u32,
    /// True for send-queue completions.
    pub is_send: bool,
    /// Send completions: the 16-bit producer counter of the completed WQE. SRQ receives: the SRQ
    /// slot index. Plain receives: unused (receive WQEs retire in order).
    pub wqe_index: u16,
    /// Status.
    pub status: WcStatus,
    /// Vendor syndrome (error completions).
    pub vendor_err: u32,
    /// Opcode (successful completions).
    pub opcode: WcOpcode,
    /// Bytes transferred (receives, reads, atomics).
    pub byte_len: u32,
    /// Immediate data or invalidated rkey, as `flags` says.
    pub imm: u32,
    /// Flags.
    pub flags: WcFlags,
    /// Source QP (UD receives).
    pub src_qp: u32,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// Destination-LID path bits.
    pub dlid_path_bits: u8,
    /// P_Key index (GSI receives).
    pub pkey_index: u16,
}

impl Default for Cqe {
    fn default() -> Self {
        Self {
            qpn: 0,
            is_send: false,
            wqe_index: 0,
            status: WcStatus::Success,
            vendor_err: 0,
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm: 0,
            flags: WcFlags::empty(),
            src_qp: 0,
            slid: 0,
            sl: 0,
            dlid_path_bits: 0,
            pkey_index: 0,
        }
    }
}

impl Cqe {
    /// Splits the entry into the completion the application sees (`wr_id` still 0) and the
    /// reference the core resolves.
    #[inline]
    pub fn into_parts(self) -> (WorkCompletion, WqeRef) {
        (
            WorkCompletion {
                wr_id: 0,
                status: self.status,
                opcode: self.opcode,
                vendor_err: self.vendor_err,
                byte_len: self.byte_len,
                imm_data: self.imm,
                qp_num: self.qpn,
                src_qp: self.src_qp,
                wc_flags: self.flags,
                pkey_index: self.pkey_index,
                slid: self.slid,
                sl: self.sl,
                dlid_path_bits: self.dlid_path_bits,
            },
            WqeRef {
                is_send: self.is_send,
                index: self.wqe_index,
            },
        )
    }

    /// The inverse of [`Cqe::into_parts`] (`wc.wr_id` is dropped).
    #[inline]
    pub fn from_parts(wc: &WorkCompletion, wqe: WqeRef) -> Self {
        Self {
            qpn: wc.qp_num,
            is_send: wqe.is_send,
            wqe_index: wqe.index,
            status: wc.status,
            vendor_err: wc.vendor_err,
            opcode: wc.opcode,
            byte_len: wc.byte_len,
            imm: wc.imm_data,
            flags: wc.wc_flags,
            src_qp: wc.src_qp,
            slid: wc.slid,
            sl: wc.sl,
            dlid_path_bits: wc.dlid_path_bits,
            pkey_index: wc.pkey_index,
        }
    }
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
    fn cqe_parts_round_trip() {
        let c = Cqe {
            qpn: 0x12,
            is_send: true,
            wqe_index: 0xfffe,
            status: WcStatus::RemAccessErr,
            vendor_err: 0x22,
            opcode: WcOpcode::RdmaRead,
            byte_len: 77,
            imm: 0xdead,
            flags: WcFlags::WITH_IMM | WcFlags::GRH,
            src_qp: 0x34,
            slid: 9,
            sl: 3,
            dlid_path_bits: 5,
            pkey_index: 2,
        };
        let (wc, r) = c.into_parts();
        assert_eq!(
            (wc.wr_id, wc.qp_num, wc.imm(), wc.byte_len),
            (0, 0x12, Some(0xdead), 77)
        );
        assert_eq!(
            r,
            WqeRef {
                is_send: true,
                index: 0xfffe
            }
        );
        assert_eq!(Cqe::from_parts(&wc, r), c);
    }

    #[test]
    fn opcode_values_match_libibverbs() {
        assert_eq!(WcOpcode::Recv as u8, 128);
        assert_eq!(WcOpcode::RecvRdmaWithImm as u8, 129);
        assert!(WcOpcode::Recv.is_recv());
        assert!(!WcOpcode::RdmaRead.is_recv());
    }
}

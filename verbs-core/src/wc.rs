//! Work completions (`struct ibv_wc`).

use portverbs_hal::wc::{WcFlags, WcOpcode, WcStatus};

/// One work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// `wr_id` of the work request.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// Opcode (valid for successful completions).
    pub opcode: WcOpcode,
    /// Vendor error syndrome.
    pub vendor_err: u32,
    /// Bytes received (receives, READs, atomics).
    pub byte_len: u32,
    /// Immediate data (with `WITH_IMM`) or the invalidated rkey (with `WITH_INV`).
    pub imm_data: u32,
    /// The local QP.
    pub qp_num: u32,
    /// Source QP (UD receives; the connected peer otherwise).
    pub src_qp: u32,
    /// Flags.
    pub wc_flags: WcFlags,
    /// P_Key index.
    pub pkey_index: u16,
    /// Source LID.
    pub slid: u16,
    /// Service level.
    pub sl: u8,
    /// DLID path bits.
    pub dlid_path_bits: u8,
}

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

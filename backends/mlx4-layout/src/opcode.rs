//! Firmware command opcodes (Linux `include/linux/mlx4/cmd.h`) and the opcode modifiers this
//! driver uses.

#![allow(missing_docs)]

use portverbs_hal::qp_state::Transition;

pub const QUERY_DEV_CAP: u16 = 0x003;
pub const QUERY_FW: u16 = 0x004;
pub const QUERY_ADAPTER: u16 = 0x006;
pub const INIT_HCA: u16 = 0x007;
pub const CLOSE_HCA: u16 = 0x008;
pub const INIT_PORT: u16 = 0x009;
pub const CLOSE_PORT: u16 = 0x00a;
pub const QUERY_HCA: u16 = 0x00b;
pub const SET_PORT: u16 = 0x00c;
pub const SW2HW_MPT: u16 = 0x00d;
pub const QUERY_MPT: u16 = 0x00e;
pub const HW2SW_MPT: u16 = 0x00f;
pub const WRITE_MTT: u16 = 0x011;
pub const MAP_EQ: u16 = 0x012;
pub const SW2HW_EQ: u16 = 0x013;
pub const HW2SW_EQ: u16 = 0x014;
pub const QUERY_EQ: u16 = 0x015;
pub const SW2HW_CQ: u16 = 0x016;
pub const HW2SW_CQ: u16 = 0x017;
pub const QUERY_CQ: u16 = 0x018;
pub const RST2INIT_QP: u16 = 0x019;
pub const INIT2RTR_QP: u16 = 0x01a;
pub const RTR2RTS_QP: u16 = 0x01b;
pub const RTS2RTS_QP: u16 = 0x01c;
pub const SQERR2RTS_QP: u16 = 0x01d;
pub const ERR_QP: u16 = 0x01e;
pub const RTS2SQD_QP: u16 = 0x01f;
pub const SQD2RTS_QP: u16 = 0x020;
pub const RST_QP: u16 = 0x021;
pub const QUERY_QP: u16 = 0x022;
pub const CONF_SPECIAL_QP: u16 = 0x023;
pub const MAD_IFC: u16 = 0x024;
/// Reads one entry of the multicast group (MCG) table into the outbox (in_mod: its index).
pub const READ_MCG: u16 = 0x025;
/// Writes one MCG table entry from the inbox (in_mod: its index; opmod 0).
pub const WRITE_MCG: u16 = 0x026;
/// Hashes the MGID in the inbox to its MCG hash bucket (the immediate output).
pub const MGID_HASH: u16 = 0x027;
pub const MODIFY_CQ: u16 = 0x02c;
pub const INIT2INIT_QP: u16 = 0x02d;
pub const NOP: u16 = 0x031;
pub const MOD_STAT_CFG: u16 = 0x034;
pub const SW2HW_SRQ: u16 = 0x035;
pub const HW2SW_SRQ: u16 = 0x036;
pub const QUERY_SRQ: u16 = 0x037;
pub const SQD2SQD_QP: u16 = 0x038;
pub const ARM_SRQ: u16 = 0x040;
pub const QUERY_PORT: u16 = 0x043;
pub const RUN_FW: u16 = 0xff6;
pub const UNMAP_ICM: u16 = 0xff9;
pub const MAP_ICM: u16 = 0xffa;
pub const UNMAP_ICM_AUX: u16 = 0xffb;
pub const MAP_ICM_AUX: u16 = 0xffc;
pub const SET_ICM_SIZE: u16 = 0xffd;
pub const UNMAP_FA: u16 = 0xffe;
pub const MAP_FA: u16 = 0xfff;

/// HW2SW_* without an outbox (what Linux uses).
pub const OPMOD_NO_OUTBOX: u8 = 1;
/// 2RST_QP without an outbox.
pub const OPMOD_RST_NO_OUTBOX: u8 = 2;
/// MODIFY_CQ: resize.
pub const OPMOD_CQ_RESIZE: u8 = 0;
/// NOP's in_modifier (Linux and mthca always use it).
pub const NOP_IN_MOD: u32 = 0x1f;

/// A readable name for logs and errors.
pub fn name(op: u16) -> &'static str {
    match op {
        QUERY_DEV_CAP => "QUERY_DEV_CAP",
        QUERY_FW => "QUERY_FW",
        QUERY_ADAPTER => "QUERY_ADAPTER",
        INIT_HCA => "INIT_HCA",
        CLOSE_HCA => "CLOSE_HCA",
        INIT_PORT => "INIT_PORT",
        CLOSE_PORT => "CLOSE_PORT",
        QUERY_HCA => "QUERY_HCA",
        SET_PORT => "SET_PORT",
        SW2HW_MPT => "SW2HW_MPT",
        QUERY_MPT => "QUERY_MPT",
        HW2SW_MPT => "HW2SW_MPT",
        WRITE_MTT => "WRITE_MTT",
        MAP_EQ => "MAP_EQ",
        SW2HW_EQ => "SW2HW_EQ",
        HW2SW_EQ => "HW2SW_EQ",
        QUERY_EQ => "QUERY_EQ",
        SW2HW_CQ => "SW2HW_CQ",
        HW2SW_CQ => "HW2SW_CQ",
        QUERY_CQ => "QUERY_CQ",
        RST2INIT_QP => "RST2INIT_QP",
        INIT2RTR_QP => "INIT2RTR_QP",
        RTR2RTS_QP => "RTR2RTS_QP",
        RTS2RTS_QP => "RTS2RTS_QP",
        SQERR2RTS_QP => "SQERR2RTS_QP",
        ERR_QP => "2ERR_QP",
        RTS2SQD_QP => "RTS2SQD_QP",
        SQD2RTS_QP => "SQD2RTS_QP",
        RST_QP => "2RST_QP",
        QUERY_QP => "QUERY_QP",
        CONF_SPECIAL_QP => "CONF_SPECIAL_QP",
        MAD_IFC => "MAD_IFC",
        READ_MCG => "READ_MCG",
        WRITE_MCG => "WRITE_MCG",
        MGID_HASH => "MGID_HASH",
        MODIFY_CQ => "MODIFY_CQ",
        INIT2INIT_QP => "INIT2INIT_QP",
        NOP => "NOP",
        MOD_STAT_CFG => "MOD_STAT_CFG",
        SW2HW_SRQ => "SW2HW_SRQ",
        HW2SW_SRQ => "HW2SW_SRQ",
        QUERY_SRQ => "QUERY_SRQ",
        SQD2SQD_QP => "SQD2SQD_QP",
        ARM_SRQ => "ARM_SRQ",
        QUERY_PORT => "QUERY_PORT",
        RUN_FW => "RUN_FW",
        UNMAP_ICM => "UNMAP_ICM",
        MAP_ICM => "MAP_ICM",
        UNMAP_ICM_AUX => "UNMAP_ICM_AUX",
        MAP_ICM_AUX => "MAP_ICM_AUX",
        SET_ICM_SIZE => "SET_ICM_SIZE",
        UNMAP_FA => "UNMAP_FA",
        MAP_FA => "MAP_FA",
        _ => "unknown command",
    }
}

/// The firmware command of a QP state transition (the HAL's table names the transition).
pub fn qp_command(t: Transition) -> u16 {
    match t {
        Transition::ToReset => RST_QP,
        Transition::ToErr => ERR_QP,
        Transition::ResetToInit => RST2INIT_QP,
        Transition::InitToInit => INIT2INIT_QP,
        Transition::InitToRtr => INIT2RTR_QP,
        Transition::RtrToRts => RTR2RTS_QP,
        Transition::RtsToRts => RTS2RTS_QP,
        Transition::SqeToRts => SQERR2RTS_QP,
        Transition::RtsToSqd => RTS2SQD_QP,
        Transition::SqdToRts => SQD2RTS_QP,
        Transition::SqdToSqd => SQD2SQD_QP,
    }
}

/// The transition a firmware command performs; `None` for commands that are not QP
/// transitions.
pub fn qp_transition(opcode: u16) -> Option<Transition> {
    Some(match opcode {
        RST_QP => Transition::ToReset,
        ERR_QP => Transition::ToErr,
        RST2INIT_QP => Transition::ResetToInit,
        INIT2INIT_QP => Transition::InitToInit,
        INIT2RTR_QP => Transition::InitToRtr,
        RTR2RTS_QP => Transition::RtrToRts,
        RTS2RTS_QP => Transition::RtsToRts,
        SQERR2RTS_QP => Transition::SqeToRts,
        RTS2SQD_QP => Transition::RtsToSqd,
        SQD2RTS_QP => Transition::SqdToRts,
        SQD2SQD_QP => Transition::SqdToSqd,
        _ => return None,
    })
}

/// Whether a transition command carries a QP context mailbox (2RST, 2ERR and RTS2SQD do not).
pub fn qp_command_has_mailbox(t: Transition) -> bool {
    !matches!(
        t,
        Transition::ToReset | Transition::ToErr | Transition::RtsToSqd
    )
}

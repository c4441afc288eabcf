//! Command status codes (Linux `mlx4/cmd.c`, `mlx4_status_to_errno`), and their translation into
//! the HAL's typed errors.

use portverbs_hal::error::CommandError;

/// A firmware command status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Status {
    /// Success.
    Ok = 0x00,
    /// Internal error.
    InternalErr = 0x01,
    /// Opcode not supported.
    BadOp = 0x02,
    /// Bad parameter.
    BadParam = 0x03,
    /// Command not allowed in the current system state.
    BadSysState = 0x04,
    /// Bad object number.
    BadResource = 0x05,
    /// Resource busy.
    ResourceBusy = 0x06,
    /// Limit exceeded.
    ExceedLim = 0x08,
    /// Object in the wrong state.
    BadResState = 0x09,
    /// Bad index.
    BadIndex = 0x0a,
    /// Flash checksum failure.
    BadNvmem = 0x0b,
    /// ICM not mapped for the object.
    IcmError = 0x0c,
    /// Illegal QP transition.
    BadQpState = 0x10,
    /// Bad segment parameter.
    BadSegParam = 0x20,
    /// MPT has bound windows.
    RegBound = 0x21,
    /// LAM not pre-allocated.
    LamNotPre = 0x22,
    /// Bad packet.
    BadPkt = 0x30,
    /// Bad size.
    BadSize = 0x40,
    /// Multi-function request.
    MultiFuncReq = 0x50,
}

impl Status {
    /// Decodes a status byte; unknown codes are `None`.
    pub fn from_u8(v: u8) -> Option<Self> {
        use Status::*;
        Some(match v {
            0x00 => Ok,
            0x01 => InternalErr,
            0x02 => BadOp,
            0x03 => BadParam,
            0x04 => BadSysState,
            0x05 => BadResource,
            0x06 => ResourceBusy,
            0x08 => ExceedLim,
            0x09 => BadResState,
            0x0a => BadIndex,
            0x0b => BadNvmem,
            0x0c => IcmError,
            0x10 => BadQpState,
            0x20 => BadSegParam,
            0x21 => RegBound,
            0x22 => LamNotPre,
            0x30 => BadPkt,
            0x40 => BadSize,
            0x50 => MultiFuncReq,
            _ => return None,
        })
    }

    /// What the code means, in words.
    pub fn meaning(code: u8) -> &'static str {
        match Self::from_u8(code) {
            Some(Self::Ok) => "ok",
            Some(Self::InternalErr) => "internal error",
            Some(Self::BadOp) => "opcode not supported",
            Some(Self::BadParam) => "bad parameter",
            Some(Self::BadSysState) => "not allowed in the current system state",
            Some(Self::BadResource) => "bad object number",
            Some(Self::ResourceBusy) => "resource busy",
            Some(Self::ExceedLim) => "limit exceeded",
            Some(Self::BadResState) => "object in the wrong state",
            Some(Self::BadIndex) => "bad index",
            Some(Self::BadNvmem) => "flash checksum error",
            Some(Self::IcmError) => "ICM not mapped for the object",
            Some(Self::BadQpState) => "illegal QP state transition",
            Some(Self::BadSegParam) => "bad segment parameter",
            Some(Self::RegBound) => "memory windows are bound to the region",
            Some(Self::LamNotPre) => "LAM not pre-allocated",
            Some(Self::BadPkt) => "bad packet",
            Some(Self::BadSize) => "bad size",
            Some(Self::MultiFuncReq) => "multi-function request",
            None => "unknown status",
        }
    }
}

/// The HAL error for a failed command: `Busy` for the codes that mean "in use", the firmware
/// status with its meaning otherwise.
pub fn to_error(opcode: u16, status: u8) -> CommandError {
    match Status::from_u8(status) {
        Some(Status::RegBound | Status::ResourceBusy) => CommandError::Busy {
            object: super::opcode::name(opcode),
            reason: Status::meaning(status).to_string(),
        },
        _ => CommandError::Firmware {
            opcode,
            status,
            meaning: Status::meaning(status),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_code_round_trips() {
        for v in 0..=255u8 {
            if let Some(s) = Status::from_u8(v) {
                assert_eq!(s as u8, v);
                assert_ne!(Status::meaning(v), "unknown status");
            } else {
                assert_eq!(Status::meaning(v), "unknown status");
            }
        }
    }

    #[test]
    fn errors_name_the_command() {
        let e = to_error(super::super::opcode::RST2INIT_QP, 0x10);
        assert!(e.to_string().contains("illegal QP state transition"), "{e}");
        assert!(matches!(
            to_error(super::super::opcode::HW2SW_MPT, 0x21),
            CommandError::Busy { .. }
        ));
    }
}

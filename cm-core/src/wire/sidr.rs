//! SIDR_REQ and SIDR_REP: service ID resolution for UD QPs (IBA chapter 12;
//! Linux `include/rdma/ibta_vol1_c12.h`).

use super::bits::{
    Payload, array_at, put_bytes, put_u16, put_u24, put_u32, put_u64, u16_at, u24_at, u32_at,
    u64_at,
};
use crate::MadError;

/// Private data bytes a SIDR_REQ carries.
pub const SIDR_REQ_PRIVATE_DATA: usize = 216;
/// Private data bytes a SIDR_REP carries.
pub const SIDR_REP_PRIVATE_DATA: usize = 136;

/// SIDR_REQ: which QP serves this service ID?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrReq {
    /// Request ID (Linux: the sender's local communication ID).
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// Service ID.
    pub service_id: u64,
    /// Private data.
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA],
}

impl SidrReq {
    pub(super) fn parse(p: &Payload) -> Self {
        Self {
            request_id: u32_at(p, 0),
            pkey: u16_at(p, 4),
            service_id: u64_at(p, 8),
            private_data: array_at(p, 16),
        }
    }

    pub(super) fn emit(&self, p: &mut Payload) {
        put_u32(p, 0, self.request_id);
        put_u16(p, 4, self.pkey);
        put_u64(p, 8, self.service_id);
        put_bytes(p, 16, &self.private_data);
    }
}

/// SIDR_REP status (Linux `enum ib_cm_sidr_status`, `rdma/ib_cm.h`); unknown values preserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SidrStatus {
    /// 0: the QPN and Q_Key are valid.
    Success,
    /// 1: no listener for the service ID.
    ServiceNotSupported,
    /// 2: the listener refused.
    Rejected,
    /// 3: no QP.
    NoQp,
    /// 4: redirect.
    Redirect,
    /// 5: unsupported version.
    UnsupportedVersion,
    /// Any other value.
    Other(u8),
}

impl SidrStatus {
    /// The wire value.
    pub const fn to_u8(self) -> u8 {
        match self {
            Self::Success => 0,
            Self::ServiceNotSupported => 1,
            Self::Rejected => 2,
            Self::NoQp => 3,
            Self::Redirect => 4,
            Self::UnsupportedVersion => 5,
            Self::Other(v) => v,
        }
    }

    /// The status for a wire value.
    pub const fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::Success,
            1 => Self::ServiceNotSupported,
            2 => Self::Rejected,
            3 => Self::NoQp,
            4 => Self::Redirect,
            5 => Self::UnsupportedVersion,
            other => Self::Other(other),
        }
    }
}

/// SIDR_REP: the answer to a SIDR_REQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SidrRep {
    /// Request ID, echoed.
    pub request_id: u32,
    /// Status.
    pub status: SidrStatus,
    /// Additional Information Length (0..=72).
    pub info_len: u8,
    /// ECE vendor ID (24 bits: bytes 6, 7 and 11).
    pub vendor_id: u32,
    /// The UD QPN serving the service (24 bits).
    pub qpn: u32,
    /// Service ID.
    pub service_id: u64,
    /// The QP's Q_Key.
    pub qkey: u32,
    /// Additional information.
    pub info: [u8; 72],
    /// Private data.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA],
}

impl SidrRep {
    pub(super) fn parse(p: &Payload) -> Result<Self, MadError> {
        let info_len = p[5];
        if info_len > 72 {
            return Err(MadError::InfoLength(info_len));
        }
        Ok(Self {
            request_id: u32_at(p, 0),
            status: SidrStatus::from_u8(p[4]),
            info_len,
            vendor_id: (u32::from(u16_at(p, 6)) << 8) | u32::from(p[11]),
            qpn: u24_at(p, 8),
            service_id: u64_at(p, 12),
            qkey: u32_at(p, 20),
            info: array_at(p, 24),
            private_data: array_at(p, 96),
        })
    }

    pub(super) fn emit(&self, p: &mut Payload) {
        put_u32(p, 0, self.request_id);
        p[4] = self.status.to_u8();
        p[5] = self.info_len.min(72);
        put_u16(p, 6, (self.vendor_id >> 8) as u16);
        put_u24(p, 8, self.qpn);
        p[11] = self.vendor_id as u8;
        put_u64(p, 12, self.service_id);
        put_u32(p, 20, self.qkey);
        put_bytes(p, 24, &self.info);
        put_bytes(p, 96, &self.private_data);
    }
}

//! REJ, ConnectReject (attribute 0x0012, IBA chapter 12), its reason codes and the 2-bit
//! "message" field shared with MRA.

use super::bits::{
    Payload, array_at, bits_at, put_bits, put_bytes, put_u16, put_u32, u16_at, u32_at,
};
use crate::MadError;

/// The 2-bit "message REJected / MRAed" field: every value is representable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MsgKind {
    /// 0: the REQ.
    Req,
    /// 1: the REP.
    Rep,
    /// 2: no message / other (LAP for an MRA).
    Other,
    /// 3: reserved, preserved as received.
    Reserved,
}

impl MsgKind {
    pub(super) const fn from_bits(v: u8) -> Self {
        match v & 3 {
            0 => Self::Req,
            1 => Self::Rep,
            2 => Self::Other,
            _ => Self::Reserved,
        }
    }

    pub(super) const fn to_bits(self) -> u8 {
        match self {
            Self::Req => 0,
            Self::Rep => 1,
            Self::Other => 2,
            Self::Reserved => 3,
        }
    }
}

/// REJ reason codes (Linux `enum ib_cm_rej_reason`, `rdma/ib_cm.h`); unknown codes are preserved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejReason {
    /// 1: no QP available.
    NoQp,
    /// 3: no resources available.
    NoResources,
    /// 4: timeout (the active side gave up; ARI = its CA GUID).
    Timeout,
    /// 5: unsupported request.
    UnsupportedRequest,
    /// 6: invalid communication ID.
    InvalidCommId,
    /// 7: invalid communication instance.
    InvalidCommInstance,
    /// 8: invalid service ID (no listener).
    InvalidServiceId,
    /// 9: invalid transport service type.
    InvalidTransportType,
    /// 10: stale connection.
    StaleConnection,
    /// 12: invalid GID.
    InvalidGid,
    /// 26: invalid path MTU.
    InvalidMtu,
    /// 27: insufficient responder resources.
    InsufficientResponderResources,
    /// 28: consumer reject (what rdma_reject and destroy send).
    ConsumerReject,
    /// 29: invalid RNR retry count.
    InvalidRnrRetry,
    /// 30: duplicate local communication ID.
    DuplicateLocalCommId,
    /// 31: invalid class version.
    InvalidClassVersion,
    /// 35: vendor option not supported (ECE).
    VendorOptionNotSupported,
    /// Any other code, kept as received.
    Other(u16),
}

impl RejReason {
    /// The wire value.
    pub const fn to_u16(self) -> u16 {
        match self {
            Self::NoQp => 1,
            Self::NoResources => 3,
            Self::Timeout => 4,
            Self::UnsupportedRequest => 5,
            Self::InvalidCommId => 6,
            Self::InvalidCommInstance => 7,
            Self::InvalidServiceId => 8,
            Self::InvalidTransportType => 9,
            Self::StaleConnection => 10,
            Self::InvalidGid => 12,
            Self::InvalidMtu => 26,
            Self::InsufficientResponderResources => 27,
            Self::ConsumerReject => 28,
            Self::InvalidRnrRetry => 29,
            Self::DuplicateLocalCommId => 30,
            Self::InvalidClassVersion => 31,
            Self::VendorOptionNotSupported => 35,
            Self::Other(v) => v,
        }
    }

    /// The reason for a wire value.
    pub const fn from_u16(v: u16) -> Self {
        match v {
            1 => Self::NoQp,
            3 => Self::NoResources,
            4 => Self::Timeout,
            5 => Self::UnsupportedRequest,
            6 => Self::InvalidCommId,
            7 => Self::InvalidCommInstance,
            8 => Self::InvalidServiceId,
            9 => Self::InvalidTransportType,
            10 => Self::StaleConnection,
            12 => Self::InvalidGid,
            26 => Self::InvalidMtu,
            27 => Self::InsufficientResponderResources,
            28 => Self::ConsumerReject,
            29 => Self::InvalidRnrRetry,
            30 => Self::DuplicateLocalCommId,
            31 => Self::InvalidClassVersion,
            35 => Self::VendorOptionNotSupported,
            other => Self::Other(other),
        }
    }
}

/// Bytes of Additional Rejection Information a REJ holds.
pub const ARI_LEN: usize = 72;
/// Private data bytes a REJ carries.
pub const REJ_PRIVATE_DATA: usize = 148;

/// REJ: a connection attempt (or a connection) is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rej {
    /// The sender's communication ID (0 when Linux rejects a REQ it has not accepted).
    pub local_comm_id: u32,
    /// The receiver's communication ID.
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub msg_rejected: MsgKind,
    /// Reject Info Length: meaningful bytes of `ari` (0..=72).
    pub ari_len: u8,
    /// Why.
    pub reason: RejReason,
    /// Additional Rejection Information.
    pub ari: [u8; ARI_LEN],
    /// Private data.
    pub private_data: [u8; REJ_PRIVATE_DATA],
}

impl Rej {
    pub(super) fn parse(p: &Payload) -> Result<Self, MadError> {
        let ari_len = bits_at(p, 9, 7, 7);
        if usize::from(ari_len) > ARI_LEN {
            return Err(MadError::AriLength(ari_len));
        }
        Ok(Self {
            local_comm_id: u32_at(p, 0),
            remote_comm_id: u32_at(p, 4),
            msg_rejected: MsgKind::from_bits(bits_at(p, 8, 7, 2)),
            ari_len,
            reason: RejReason::from_u16(u16_at(p, 10)),
            ari: array_at(p, 12),
            private_data: array_at(p, 84),
        })
    }

    pub(super) fn emit(&self, p: &mut Payload) {
        put_u32(p, 0, self.local_comm_id);
        put_u32(p, 4, self.remote_comm_id);
        put_bits(p, 8, 7, 2, self.msg_rejected.to_bits());
        put_bits(p, 9, 7, 7, self.ari_len.min(ARI_LEN as u8));
        put_u16(p, 10, self.reason.to_u16());
        put_bytes(p, 12, &self.ari);
        put_bytes(p, 84, &self.private_data);
    }
}

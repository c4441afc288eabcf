//! The MAD common header (24 bytes, Linux's `struct ib_mad_hdr`) as a checked view and a
//! representation.
//!
//! ```text
//! 0 BaseVersion  1 MgmtClass  2 ClassVersion  3 R(0x80)|Method
//! 4..6 Status  6..8 ClassSpecific  8..16 TransactionID
//! 16..18 AttributeID  18..20 reserved  20..24 AttributeModifier
//! ```

use super::bits::Payload;
use super::{MAD_HEADER_LEN, MAD_LEN, PAYLOAD_LEN};
use crate::MadError;

mod field {
    pub(super) const BASE_VERSION: usize = 0;
    pub(super) const CLASS: usize = 1;
    pub(super) const CLASS_VERSION: usize = 2;
    pub(super) const METHOD: usize = 3;
    pub(super) const STATUS: usize = 4;
    pub(super) const CLASS_SPECIFIC: usize = 6;
    pub(super) const TID: usize = 8;
    pub(super) const ATTR_ID: usize = 16;
    pub(super) const ATTR_MOD: usize = 20;
}

/// MAD base version accepted and sent.
pub const BASE_VERSION: u8 = 1;
/// Management class Communication Management.
pub const CLASS_CM: u8 = 0x07;
/// CM class version (IB spec 1.2), the only one Linux registers.
pub const CM_CLASS_VERSION: u8 = 2;
/// Method Send, the only method of every CM message.
pub const METHOD_SEND: u8 = 0x03;

/// CM attribute IDs this CM parses (IBA chapter 12; Linux's `CM_*_ATTR_ID`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttrId {
    /// 0x0010 ConnectRequest.
    Req,
    /// 0x0011 MsgRcptAck.
    Mra,
    /// 0x0012 ConnectReject.
    Rej,
    /// 0x0013 ConnectReply.
    Rep,
    /// 0x0014 ReadyToUse.
    Rtu,
    /// 0x0015 DisconnectRequest.
    Dreq,
    /// 0x0016 DisconnectReply.
    Drep,
    /// 0x0017 ServiceIDResReq.
    SidrReq,
    /// 0x0018 ServiceIDResReqResp.
    SidrRep,
    /// 0x0019 LoadAlternatePath.
    Lap,
    /// 0x001A AlternatePathResponse.
    Apr,
}

impl AttrId {
    /// The wire value.
    pub const fn to_u16(self) -> u16 {
        match self {
            Self::Req => 0x0010,
            Self::Mra => 0x0011,
            Self::Rej => 0x0012,
            Self::Rep => 0x0013,
            Self::Rtu => 0x0014,
            Self::Dreq => 0x0015,
            Self::Drep => 0x0016,
            Self::SidrReq => 0x0017,
            Self::SidrRep => 0x0018,
            Self::Lap => 0x0019,
            Self::Apr => 0x001A,
        }
    }

    /// The attribute for a wire value, `None` for ClassPortInfo and unassigned values.
    pub const fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0x0010 => Self::Req,
            0x0011 => Self::Mra,
            0x0012 => Self::Rej,
            0x0013 => Self::Rep,
            0x0014 => Self::Rtu,
            0x0015 => Self::Dreq,
            0x0016 => Self::Drep,
            0x0017 => Self::SidrReq,
            0x0018 => Self::SidrRep,
            0x0019 => Self::Lap,
            0x001A => Self::Apr,
            _ => return None,
        })
    }
}

/// The MAD common header, every field as received (unknown values preserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MadHeader {
    /// BaseVersion.
    pub base_version: u8,
    /// MgmtClass.
    pub mgmt_class: u8,
    /// ClassVersion.
    pub class_version: u8,
    /// Method with the response bit (0x80).
    pub method: u8,
    /// Status.
    pub status: u16,
    /// ClassSpecific.
    pub class_specific: u16,
    /// TransactionID.
    pub tid: u64,
    /// AttributeID (raw).
    pub attr_id: u16,
    /// AttributeModifier.
    pub attr_mod: u32,
}

impl MadHeader {
    /// The header of a CM message as this CM sends it.
    pub const fn cm(tid: u64, attr: AttrId, attr_mod: u32) -> Self {
        Self {
            base_version: BASE_VERSION,
            mgmt_class: CLASS_CM,
            class_version: CM_CLASS_VERSION,
            method: METHOD_SEND,
            status: 0,
            class_specific: 0,
            tid,
            attr_id: attr.to_u16(),
            attr_mod,
        }
    }

    /// Checks what Linux's MAD layer and CM agent check (`core/mad.c`, `core/cm.c`) and returns the
    /// attribute.
    pub fn check_cm(&self) -> Result<AttrId, MadError> {
        if self.base_version != BASE_VERSION {
            return Err(MadError::BaseVersion(self.base_version));
        }
        if self.mgmt_class != CLASS_CM {
            return Err(MadError::NotCm(self.mgmt_class));
        }
        if self.class_version != CM_CLASS_VERSION {
            return Err(MadError::ClassVersion(self.class_version));
        }
        if self.method != METHOD_SEND {
            return Err(MadError::Method(self.method));
        }
        AttrId::from_u16(self.attr_id).ok_or(MadError::Attribute(self.attr_id))
    }

    /// Writes the header into the first 24 bytes of `out` (the reserved field zeroed).
    pub fn emit(&self, out: &mut [u8; MAD_LEN]) {
        out[field::BASE_VERSION] = self.base_version;
        out[field::CLASS] = self.mgmt_class;
        out[field::CLASS_VERSION] = self.class_version;
        out[field::METHOD] = self.method;
        out[field::STATUS..field::STATUS + 2].copy_from_slice(&self.status.to_be_bytes());
        out[field::CLASS_SPECIFIC..field::CLASS_SPECIFIC + 2]
            .copy_from_slice(&self.class_specific.to_be_bytes());
        out[field::TID..field::TID + 8].copy_from_slice(&self.tid.to_be_bytes());
        out[field::ATTR_ID..field::ATTR_ID + 2].copy_from_slice(&self.attr_id.to_be_bytes());
        out[field::ATTR_ID + 2..field::ATTR_MOD].fill(0);
        out[field::ATTR_MOD..field::ATTR_MOD + 4].copy_from_slice(&self.attr_mod.to_be_bytes());
    }
}

/// A checked view of a received MAD: once [`MadView::new_checked`] succeeded, no accessor
/// panics.
#[derive(Debug, Clone, Copy)]
pub struct MadView<'a> {
    bytes: &'a [u8; MAD_LEN],
}

impl<'a> MadView<'a> {
    /// Checks the length (exactly [`MAD_LEN`] bytes).
    pub fn new_checked(bytes: &'a [u8]) -> Result<Self, MadError> {
        let bytes =
            <&[u8; MAD_LEN]>::try_from(bytes).map_err(|_| MadError::Length { len: bytes.len() })?;
        Ok(Self { bytes })
    }

    /// The common header.
    pub fn header(&self) -> MadHeader {
        let b = self.bytes;
        let be16 = |at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
        let mut tid = [0u8; 8];
        tid.copy_from_slice(&b[field::TID..field::TID + 8]);
        MadHeader {
            base_version: b[field::BASE_VERSION],
            mgmt_class: b[field::CLASS],
            class_version: b[field::CLASS_VERSION],
            method: b[field::METHOD],
            status: be16(field::STATUS),
            class_specific: be16(field::CLASS_SPECIFIC),
            tid: u64::from_be_bytes(tid),
            attr_id: be16(field::ATTR_ID),
            attr_mod: u32::from_be_bytes([
                b[field::ATTR_MOD],
                b[field::ATTR_MOD + 1],
                b[field::ATTR_MOD + 2],
                b[field::ATTR_MOD + 3],
            ]),
        }
    }

    /// The 232 bytes of class data.
    pub fn payload(&self) -> Payload {
        let mut p = [0u8; PAYLOAD_LEN];
        p.copy_from_slice(&self.bytes[MAD_HEADER_LEN..]);
        p
    }
}

//! CM MAD wire formats (IBA chapter 12, Linux `include/rdma/ibta_vol1_c12.h`): a checked view
//! of the 24-byte MAD
//! common header ([`MadView`]) and one representation per CM message ([`Req`], [`Mra`],
//! [`Rej`], [`Rep`], [`Rtu`], [`Dreq`], [`Drep`], [`SidrReq`], [`SidrRep`]), and rdma_cm's
//! CMA private-data header and service IDs ([`CmaHeader`], [`service_id`]).
//!
//! [`Mad::parse`] takes exactly 256 bytes and never panics; [`Mad::emit`] writes 256 bytes,
//! masking values wider than their field and zeroing every reserved bit. Private data is kept
//! at its full fixed size, as Linux reports it (trailing zeros are indistinguishable from data).

mod bits;
mod cma;
mod conn;
mod header;
mod reject;
mod req;
mod sidr;

pub use cma::{
    CMA_HEADER_LEN, CmaHeader, IP_CM_SERVICE_ID, IP_CM_SERVICE_MASK, PortSpace, service_id,
    split_service_id,
};
pub use conn::{Drep, Dreq, Mra, REP_PRIVATE_DATA, Rep, Rtu};
pub use header::{
    AttrId, BASE_VERSION, CLASS_CM, CM_CLASS_VERSION, METHOD_SEND, MadHeader, MadView,
};
pub use reject::{ARI_LEN, MsgKind, REJ_PRIVATE_DATA, Rej, RejReason};
pub use req::{REQ_PRIVATE_DATA, Req, ReqPath};
pub use sidr::{SIDR_REP_PRIVATE_DATA, SIDR_REQ_PRIVATE_DATA, SidrRep, SidrReq, SidrStatus};

use crate::MadError;
use bits::Payload;

/// A MAD's size: 24-byte common header plus 232 bytes of class data.
pub const MAD_LEN: usize = 256;
/// The MAD common header's size.
pub const MAD_HEADER_LEN: usize = 24;
/// The CM class data's size.
pub const PAYLOAD_LEN: usize = MAD_LEN - MAD_HEADER_LEN;

/// One CM message, by attribute.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // a MAD is a fixed 256 bytes; boxing would allocate per message
pub enum CmMessage {
    /// ConnectRequest (0x0010).
    Req(Req),
    /// MsgRcptAck (0x0011).
    Mra(Mra),
    /// ConnectReject (0x0012).
    Rej(Rej),
    /// ConnectReply (0x0013).
    Rep(Rep),
    /// ReadyToUse (0x0014).
    Rtu(Rtu),
    /// DisconnectRequest (0x0015).
    Dreq(Dreq),
    /// DisconnectReply (0x0016).
    Drep(Drep),
    /// ServiceIDResReq (0x0017).
    SidrReq(SidrReq),
    /// ServiceIDResReqResp (0x0018).
    SidrRep(SidrRep),
    /// LoadAlternatePath (0x0019) or AlternatePathResponse (0x001A): parsed only as far as the
    /// communication IDs, since Linux ignores both on RoCE ports and so does this CM.
    AltPath {
        /// Which of the two.
        attr: AttrId,
        /// Local Communication ID (bytes 0..4).
        local_comm_id: u32,
        /// Remote Communication ID (bytes 4..8).
        remote_comm_id: u32,
    },
}

impl CmMessage {
    /// The attribute ID this message travels under.
    pub fn attr(&self) -> AttrId {
        match self {
            Self::Req(_) => AttrId::Req,
            Self::Mra(_) => AttrId::Mra,
            Self::Rej(_) => AttrId::Rej,
            Self::Rep(_) => AttrId::Rep,
            Self::Rtu(_) => AttrId::Rtu,
            Self::Dreq(_) => AttrId::Dreq,
            Self::Drep(_) => AttrId::Drep,
            Self::SidrReq(_) => AttrId::SidrReq,
            Self::SidrRep(_) => AttrId::SidrRep,
            Self::AltPath { attr, .. } => *attr,
        }
    }

    fn parse(attr: AttrId, p: &Payload) -> Result<Self, MadError> {
        Ok(match attr {
            AttrId::Req => Self::Req(Req::parse(p)),
            AttrId::Mra => Self::Mra(Mra::parse(p)),
            AttrId::Rej => Self::Rej(Rej::parse(p)?),
            AttrId::Rep => Self::Rep(Rep::parse(p)),
            AttrId::Rtu => Self::Rtu(Rtu::parse(p)),
            AttrId::Dreq => Self::Dreq(Dreq::parse(p)),
            AttrId::Drep => Self::Drep(Drep::parse(p)),
            AttrId::SidrReq => Self::SidrReq(SidrReq::parse(p)),
            AttrId::SidrRep => Self::SidrRep(SidrRep::parse(p)?),
            AttrId::Lap | AttrId::Apr => Self::AltPath {
                attr,
                local_comm_id: bits::u32_at(p, 0),
                remote_comm_id: bits::u32_at(p, 4),
            },
        })
    }

    fn emit(&self, p: &mut Payload) {
        match self {
            Self::Req(m) => m.emit(p),
            Self::Mra(m) => m.emit(p),
            Self::Rej(m) => m.emit(p),
            Self::Rep(m) => m.emit(p),
            Self::Rtu(m) => m.emit(p),
            Self::Dreq(m) => m.emit(p),
            Self::Drep(m) => m.emit(p),
            Self::SidrReq(m) => m.emit(p),
            Self::SidrRep(m) => m.emit(p),
            Self::AltPath {
                local_comm_id,
                remote_comm_id,
                ..
            } => {
                bits::put_u32(p, 0, *local_comm_id);
                bits::put_u32(p, 4, *remote_comm_id);
            }
        }
    }
}

/// A whole CM MAD: the common header fields that vary, and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mad {
    /// TransactionID (Linux `cm.c`: REP, MRA, REJ, RTU re-use the REQ's; DREP echoes the DREQ's).
    pub tid: u64,
    /// AttributeModifier (ECE; 0 when unused).
    pub attr_mod: u32,
    /// The message.
    pub msg: CmMessage,
}

impl Mad {
    /// A MAD carrying `msg` with transaction ID `tid` and attribute modifier 0.
    pub fn new(tid: u64, msg: CmMessage) -> Self {
        Self {
            tid,
            attr_mod: 0,
            msg,
        }
    }

    /// Parses a received MAD: exactly [`MAD_LEN`] bytes, base version 1, class CM version 2,
    /// method Send, and a CM attribute handled here. Never panics.
    pub fn parse(bytes: &[u8]) -> Result<Self, MadError> {
        let view = MadView::new_checked(bytes)?;
        let hdr = view.header();
        let attr = hdr.check_cm()?;
        let msg = CmMessage::parse(attr, &view.payload())?;
        Ok(Self {
            tid: hdr.tid,
            attr_mod: hdr.attr_mod,
            msg,
        })
    }

    /// The 256 bytes of this MAD: header (version 1, class CM version 2, method Send, status 0)
    /// and the message, reserved bits zero.
    pub fn emit(&self) -> [u8; MAD_LEN] {
        let mut out = [0u8; MAD_LEN];
        let hdr = MadHeader::cm(self.tid, self.msg.attr(), self.attr_mod);
        hdr.emit(&mut out);
        let mut p: Payload = [0; PAYLOAD_LEN];
        self.msg.emit(&mut p);
        out[MAD_HEADER_LEN..].copy_from_slice(&p);
        out
    }
}

#[cfg(test)]
mod tests;

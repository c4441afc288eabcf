//! The software device's own queue formats. They are deliberately *not* mlx4's: little-endian,
//! fixed headers, one owner byte per entry. Both directions live here, as plain functions and inherent
//! methods: the host-side encoders and decoders the queue objects call, and the device-side WQE
//! decoders and CQE/EQE encoders the engine uses through the `Hca` adapter. The rings they are
//! copied into and out of are [`portverbs_dma::ring`]'s.
//!
//! | entry | size | layout |
//! |---|---|---|
//! | send WQE | stride ≥ 64 | [`SendHeader`] (64 B), then on UD a [`DatagramSeg`] (48 B), then SGEs (16 B each) or inline bytes |
//! | receive WQE | stride ≥ 32 | [`RecvHeader`] (16 B), then SGEs |
//! | CQE | 32 | [`SoftCqe`] |
//! | EQE | 16 | [`SoftEqe`] |
//!
//! Ownership: byte 0 of a WQE and the last byte of a CQE/EQE hold the owner bit (bit 0), equal
//! to the wrap parity of the producer's counter (see [`portverbs_dma::ring`]). WQE slots start
//! with owner = 1 (not valid on pass 0); the device initialises CQ/EQ entries the same way.

use portverbs_hal::attr::AddressVector;
use portverbs_hal::error::{CqeError, EqeError, WqeError};
use portverbs_hal::event::{
    CqErrorSyndrome, DeviceEvent, PortEventKind, QpEventKind, SrqEventKind,
};
use portverbs_hal::types::{AccessFlags, Gid, MwType, QpType};
use portverbs_hal::wc::{Cqe, WcFlags, WcOpcode, WcStatus};
use portverbs_hal::wr::{MwBind, Payload, RemoteAddr, SendFlags, SendOp, SendWr, Sge};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::engine::{RecvWqe, SendWqe, UdTarget, WqeFault};

/// Bytes of the send WQE header.
pub const SEND_HEADER: usize = 64;
/// Bytes of the UD datagram segment.
pub const DATAGRAM_SEG: usize = 48;
/// Bytes of the receive WQE header.
pub const RECV_HEADER: usize = 16;
/// Bytes of one scatter/gather entry.
pub const SGE_SIZE: usize = 16;
/// Smallest receive WQE slot (a header and one SGE): the `MIN` of the work-queue rings.
pub const RECV_MIN: usize = RECV_HEADER + SGE_SIZE;
/// Bytes of a CQE.
pub const CQE_SIZE: usize = 32;
/// Bytes of an EQE.
pub const EQE_SIZE: usize = 16;

/// Send WQE header.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SendHeader {
    /// Bit 0: owner.
    pub owner: u8,
    /// [`SoftOp`] code.
    pub opcode: u8,
    /// Bit 0 signaled, 1 solicited, 2 fence, 3 inline.
    pub flags: u8,
    /// Number of SGEs that follow.
    pub num_sge: u8,
    /// Immediate data / rkey to invalidate.
    pub imm: U32,
    /// Inline byte count.
    pub inline_len: U32,
    /// Remote key.
    pub rkey: U32,
    /// Remote address (bind: window start).
    pub raddr: U64,
    /// Compare value (bind: window length).
    pub compare: U64,
    /// Swap or add value.
    pub swap_add: U64,
    /// Reserved (the window is named by the index of `new_rkey`).
    pub reserved_mw: U32,
    /// Bind: the new rkey.
    pub new_rkey: U32,
    /// Bind: the MR's lkey.
    pub mr_lkey: U32,
    /// Bind: access flags (low 16 bits) and window type (bits 16..24).
    pub bind_info: U32,
    /// Reserved.
    pub reserved: [u8; 8],
}

/// UD datagram segment.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct DatagramSeg {
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Destination QP.
    pub remote_qpn: U32,
    /// Q_Key.
    pub qkey: U32,
    /// Flow label.
    pub flow_label: U32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Service level.
    pub sl: u8,
    /// Destination LID.
    pub dlid: U16,
    /// Port.
    pub port: u8,
    /// GRH present.
    pub is_global: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Reserved.
    pub reserved: [u8; 10],
}

/// One SGE as stored in a WQE.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SgeSeg {
    /// Address.
    pub addr: U64,
    /// Length.
    pub length: U32,
    /// Local key.
    pub lkey: U32,
}

/// Receive WQE header.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct RecvHeader {
    /// Number of SGEs.
    pub num_sge: u8,
    /// Reserved.
    pub reserved: [u8; 15],
}

/// Completion queue entry.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SoftCqe {
    /// Local QP.
    pub qpn: U32,
    /// Bytes.
    pub byte_len: U32,
    /// Immediate data or invalidated rkey.
    pub imm: U32,
    /// Source QP.
    pub src_qp: U32,
    /// WQE counter / SRQ slot.
    pub wqe_index: U16,
    /// `ibv_wc_status` value.
    pub status: u8,
    /// `ibv_wc_opcode` value (receive opcodes 128/129 fit in a byte).
    pub opcode: u8,
    /// `ibv_wc_flags` (low byte).
    pub flags: u8,
    /// Service level.
    pub sl: u8,
    /// Source LID.
    pub slid: U16,
    /// P_Key index.
    pub pkey_index: U16,
    /// 1 for send completions.
    pub is_send: u8,
    /// DLID path bits.
    pub dlid_path_bits: u8,
    /// Vendor syndrome.
    pub vendor_err: U16,
    /// Reserved.
    pub reserved: u8,
    /// Bit 0: owner.
    pub owner: u8,
}

/// Event queue entry.
#[derive(Debug, Clone, Copy, Default, FromBytes, IntoBytes, KnownLayout, Immutable)]
#[repr(C)]
pub struct SoftEqe {
    /// [`EventType`] code.
    pub event_type: u8,
    /// Subtype (which QP/SRQ/port event; CQ error syndrome).
    pub subtype: u8,
    /// Reserved.
    pub reserved: [u8; 2],
    /// Object number (CQN, QPN, SRQN, port).
    pub number: U32,
    /// Extra data.
    pub aux: U32,
    /// Reserved.
    pub reserved2: [u8; 3],
    /// Bit 0: owner.
    pub owner: u8,
}

const _: () = {
    assert!(size_of::<SendHeader>() == SEND_HEADER);
    assert!(size_of::<DatagramSeg>() == DATAGRAM_SEG);
    assert!(size_of::<SgeSeg>() == SGE_SIZE);
    assert!(size_of::<RecvHeader>() == RECV_HEADER);
    assert!(size_of::<SoftCqe>() == CQE_SIZE);
    assert!(size_of::<SoftEqe>() == EQE_SIZE);
    assert!(std::mem::offset_of!(SoftCqe, owner) == CQE_SIZE - 1);
    assert!(std::mem::offset_of!(SoftEqe, owner) == EQE_SIZE - 1);
};

/// Send opcodes of the soft format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SoftOp {
    /// SEND.
    Send = 1,
    /// SEND with immediate.
    SendImm = 2,
    /// SEND with invalidate.
    SendInv = 3,
    /// RDMA WRITE.
    Write = 4,
    /// RDMA WRITE with immediate.
    WriteImm = 5,
    /// RDMA READ.
    Read = 6,
    /// Compare and swap.
    CmpSwp = 7,
    /// Fetch and add.
    FetchAdd = 8,
    /// Memory-window bind.
    BindMw = 9,
    /// Local invalidate.
    LocalInv = 10,
}

const FLAG_SIGNALED: u8 = 1;
const FLAG_SOLICITED: u8 = 1 << 1;
const FLAG_FENCE: u8 = 1 << 2;
const FLAG_INLINE: u8 = 1 << 3;

/// Event types of the soft EQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EventType {
    /// Completion on CQ `number`.
    Completion = 1,
    /// QP event; subtype = [`QpEventKind`] index.
    Qp = 2,
    /// CQ error; subtype = syndrome.
    CqError = 3,
    /// SRQ event; subtype 0 limit, 1 catastrophic.
    Srq = 4,
    /// Port event; subtype 0 active, 1 down, 2 GID change.
    Port = 5,
    /// Device fatal.
    DeviceFatal = 6,
}

const QP_EVENTS: [QpEventKind; 8] = [
    QpEventKind::Fatal,
    QpEventKind::RequestError,
    QpEventKind::AccessError,
    QpEventKind::CommEstablished,
    QpEventKind::SqDrained,
    QpEventKind::PathMigrated,
    QpEventKind::PathMigrationError,
    QpEventKind::LastWqeReached,
];

/// Slot stride of a send queue.
pub fn send_stride(qp_type: QpType, max_sge: u32, max_inline: u32) -> usize {
    let fixed = SEND_HEADER
        + if qp_type == QpType::Ud {
            DATAGRAM_SEG
        } else {
            0
        };
    let data = (max_sge as usize * SGE_SIZE).max(max_inline as usize);
    (fixed + data).next_power_of_two().max(64)
}

/// Slot stride of a receive queue.
pub fn recv_stride(max_sge: u32) -> usize {
    (RECV_HEADER + max_sge.max(1) as usize * SGE_SIZE).next_power_of_two()
}

fn data_offset(qp_type: QpType) -> usize {
    SEND_HEADER
        + if qp_type == QpType::Ud {
            DATAGRAM_SEG
        } else {
            0
        }
}

/// Encoder of send WQEs for one queue geometry.
#[derive(Debug, Clone, Copy)]
pub struct SendFormat {
    /// Slot size.
    pub stride: usize,
    /// SGE capacity.
    pub max_sge: u32,
    /// Inline capacity.
    pub max_inline: u32,
}

/// Per-WQE facts the send encoder needs besides the work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeContext {
    /// Transport of the queue pair.
    pub qp_type: QpType,
    /// QP number.
    pub qpn: u32,
    /// Producer counter of this WQE.
    pub counter: u32,
    /// Owner bit to write (wrap parity of `counter`).
    pub owner: bool,
    /// Whether the WQE must generate a completion on success.
    pub signaled: bool,
}

impl SendFormat {
    /// Encodes `wr` into `out` (one ring slot) and returns the number of bytes used; the
    /// entry is complete, owner byte included.
    ///
    /// # Errors
    /// The request does not fit the slot or has no encoding on this queue.
    pub fn encode_send(
        &self,
        wr: &SendWr<'_>,
        ctx: &EncodeContext,
        out: &mut [u8],
    ) -> Result<usize, WqeError> {
        let mut h = SendHeader {
            owner: u8::from(ctx.owner),
            ..SendHeader::default()
        };
        let mut flags = 0;
        if ctx.signaled {
            flags |= FLAG_SIGNALED;
        }
        if wr.flags.contains(SendFlags::SOLICITED) {
            flags |= FLAG_SOLICITED;
        }
        if wr.flags.contains(SendFlags::FENCE) {
            flags |= FLAG_FENCE;
        }
        let set_remote = |h: &mut SendHeader, r: RemoteAddr| {
            h.raddr = U64::new(r.addr);
            h.rkey = U32::new(r.rkey);
        };
        h.opcode = match wr.op {
            SendOp::Send => SoftOp::Send,
            SendOp::SendWithImm { imm } => {
                h.imm = U32::new(imm);
                SoftOp::SendImm
            }
            SendOp::SendWithInv { rkey } => {
                h.imm = U32::new(rkey);
                SoftOp::SendInv
            }
            SendOp::RdmaWrite { remote } => {
                set_remote(&mut h, remote);
                SoftOp::Write
            }
            SendOp::RdmaWriteWithImm { remote, imm } => {
                set_remote(&mut h, remote);
                h.imm = U32::new(imm);
                SoftOp::WriteImm
            }
            SendOp::RdmaRead { remote } => {
                set_remote(&mut h, remote);
                SoftOp::Read
            }
            SendOp::AtomicCmpSwp {
                remote,
                compare,
                swap,
            } => {
                set_remote(&mut h, remote);
                h.compare = U64::new(compare);
                h.swap_add = U64::new(swap);
                SoftOp::CmpSwp
            }
            SendOp::AtomicFetchAdd { remote, add } => {
                set_remote(&mut h, remote);
                h.swap_add = U64::new(add);
                SoftOp::FetchAdd
            }
            SendOp::BindMw { bind } => {
                h.raddr = U64::new(bind.addr);
                h.compare = U64::new(bind.length);
                h.new_rkey = U32::new(bind.new_rkey);
                h.mr_lkey = U32::new(bind.mr_lkey);
                h.bind_info = U32::new(bind.access.bits() & 0xffff | (bind.mw_type as u32) << 16);
                SoftOp::BindMw
            }
            SendOp::LocalInv { rkey } => {
                h.imm = U32::new(rkey);
                SoftOp::LocalInv
            }
        } as u8;
        let mut at = data_offset(ctx.qp_type);
        if at > out.len() {
            return Err(WqeError::InlineTooLarge {
                given: at,
                max: out.len() as u32,
            });
        }
        match (ctx.qp_type, wr.ud) {
            (QpType::Ud, Some(ud)) => {
                let av = ud.av;
                let seg = DatagramSeg {
                    dgid: av.dgid.0,
                    remote_qpn: U32::new(ud.remote_qpn),
                    qkey: U32::new(ud.remote_qkey),
                    flow_label: U32::new(av.flow_label),
                    sgid_index: av.sgid_index,
                    hop_limit: av.hop_limit,
                    traffic_class: av.traffic_class,
                    sl: av.sl,
                    dlid: U16::new(av.dlid),
                    port: av.port_num,
                    is_global: u8::from(av.is_global),
                    static_rate: av.static_rate,
                    src_path_bits: av.src_path_bits,
                    reserved: [0; 10],
                };
                out[SEND_HEADER..SEND_HEADER + DATAGRAM_SEG].copy_from_slice(seg.as_bytes());
            }
            (QpType::Ud, None) => {
                return Err(WqeError::BadDestination {
                    reason: "a UD send needs an address handle",
                });
            }
            (_, Some(_)) => {
                return Err(WqeError::BadDestination {
                    reason: "connected QPs take no address handle",
                });
            }
            (_, None) => {}
        }
        match wr.payload {
            Payload::Inline(bytes) => {
                if bytes.len() > self.max_inline as usize || at + bytes.len() > out.len() {
                    return Err(WqeError::InlineTooLarge {
                        given: bytes.len(),
                        max: self.max_inline,
                    });
                }
                flags |= FLAG_INLINE;
                h.inline_len = U32::new(bytes.len() as u32);
                out[at..at + bytes.len()].copy_from_slice(bytes);
                at += bytes.len();
            }
            Payload::Sges(sges) => {
                if sges.len() > self.max_sge as usize || at + sges.len() * SGE_SIZE > out.len() {
                    return Err(WqeError::TooManySges {
                        given: sges.len(),
                        max: self.max_sge,
                    });
                }
                h.num_sge = sges.len() as u8;
                for sge in sges {
                    put_sge(&mut out[at..at + SGE_SIZE], sge);
                    at += SGE_SIZE;
                }
            }
        }
        h.flags = flags;
        out[..SEND_HEADER].copy_from_slice(h.as_bytes());
        Ok(at)
    }
}

fn put_sge(out: &mut [u8], sge: &Sge) {
    let seg = SgeSeg {
        addr: U64::new(sge.addr),
        length: U32::new(sge.length),
        lkey: U32::new(sge.lkey),
    };
    out.copy_from_slice(seg.as_bytes());
}

fn get_sge(bytes: &[u8]) -> Option<Sge> {
    let seg = SgeSeg::read_from_bytes(bytes.get(..SGE_SIZE)?).ok()?;
    Some(Sge {
        addr: seg.addr.get(),
        length: seg.length.get(),
        lkey: seg.lkey.get(),
    })
}

/// The owner bit of a send WQE slot.
pub fn send_owner(slot: &[u8]) -> bool {
    slot.first().is_some_and(|b| b & 1 == 1)
}

/// Device side: decodes a send WQE slot (the caller checked the owner bit).
///
/// # Errors
/// Unknown opcode, SGE count or inline length beyond the slot, bad window type.
pub fn decode_send(slot: &[u8], qp_type: QpType, out: &mut SendWqe) -> Result<(), WqeFault> {
    let h = SendHeader::read_from_bytes(slot.get(..SEND_HEADER).ok_or(WqeFault {
        reason: "slot smaller than a WQE header",
    })?)
    .map_err(|_| WqeFault {
        reason: "unreadable header",
    })?;
    let remote = RemoteAddr {
        addr: h.raddr.get(),
        rkey: h.rkey.get(),
    };
    out.op = match h.opcode {
        1 => SendOp::Send,
        2 => SendOp::SendWithImm { imm: h.imm.get() },
        3 => SendOp::SendWithInv { rkey: h.imm.get() },
        4 => SendOp::RdmaWrite { remote },
        5 => SendOp::RdmaWriteWithImm {
            remote,
            imm: h.imm.get(),
        },
        6 => SendOp::RdmaRead { remote },
        7 => SendOp::AtomicCmpSwp {
            remote,
            compare: h.compare.get(),
            swap: h.swap_add.get(),
        },
        8 => SendOp::AtomicFetchAdd {
            remote,
            add: h.swap_add.get(),
        },
        9 => {
            let info = h.bind_info.get();
            let mw_type = MwType::from_u8((info >> 16) as u8).ok_or(WqeFault {
                reason: "bad memory-window type",
            })?;
            SendOp::BindMw {
                bind: MwBind {
                    new_rkey: h.new_rkey.get(),
                    mw_type,
                    mr_lkey: h.mr_lkey.get(),
                    addr: h.raddr.get(),
                    length: h.compare.get(),
                    access: AccessFlags::from_bits_truncate(info & 0xffff),
                },
            }
        }
        10 => SendOp::LocalInv { rkey: h.imm.get() },
        _ => {
            return Err(WqeFault {
                reason: "unknown send opcode",
            });
        }
    };
    let mut flags = SendFlags::empty();
    if h.flags & FLAG_SOLICITED != 0 {
        flags |= SendFlags::SOLICITED;
    }
    if h.flags & FLAG_FENCE != 0 {
        flags |= SendFlags::FENCE;
    }
    if h.flags & FLAG_INLINE != 0 {
        flags |= SendFlags::INLINE;
    }
    out.flags = flags;
    out.signaled = h.flags & FLAG_SIGNALED != 0;
    out.ud = None;
    let at = data_offset(qp_type);
    if qp_type == QpType::Ud {
        let seg = DatagramSeg::read_from_bytes(slot.get(SEND_HEADER..at).ok_or(WqeFault {
            reason: "slot too small for a datagram segment",
        })?)
        .map_err(|_| WqeFault {
            reason: "unreadable datagram segment",
        })?;
        out.ud = Some(UdTarget {
            av: AddressVector {
                dgid: Gid(seg.dgid),
                sgid_index: seg.sgid_index,
                flow_label: seg.flow_label.get(),
                hop_limit: seg.hop_limit,
                traffic_class: seg.traffic_class,
                is_global: seg.is_global != 0,
                dlid: seg.dlid.get(),
                sl: seg.sl,
                src_path_bits: seg.src_path_bits,
                static_rate: seg.static_rate,
                port_num: seg.port,
            },
            remote_qpn: seg.remote_qpn.get(),
            remote_qkey: seg.qkey.get(),
        });
    }
    out.sges.clear();
    out.inline_data.clear();
    if flags.contains(SendFlags::INLINE) {
        let n = h.inline_len.get() as usize;
        let bytes = slot.get(at..at.saturating_add(n)).ok_or(WqeFault {
            reason: "inline data beyond the slot",
        })?;
        out.inline_data.extend_from_slice(bytes);
    } else {
        for i in 0..usize::from(h.num_sge) {
            let off = at + i * SGE_SIZE;
            let sge = slot
                .get(off..off + SGE_SIZE)
                .and_then(get_sge)
                .ok_or(WqeFault {
                    reason: "scatter/gather list beyond the slot",
                })?;
            out.sges.push(sge);
        }
    }
    Ok(())
}

/// Encoder of receive WQEs.
#[derive(Debug, Clone, Copy)]
pub struct RecvFormat {
    /// SGE capacity.
    pub max_sge: u32,
}

impl RecvFormat {
    /// Encodes a receive scatter list into `out` and returns the number of bytes used.
    ///
    /// # Errors
    /// Too many entries for the slot.
    pub fn encode_recv(&self, sges: &[Sge], out: &mut [u8]) -> Result<usize, WqeError> {
        let end = RECV_HEADER + sges.len() * SGE_SIZE;
        if sges.len() > self.max_sge as usize || end > out.len() {
            return Err(WqeError::TooManySges {
                given: sges.len(),
                max: self.max_sge,
            });
        }
        let h = RecvHeader {
            num_sge: sges.len() as u8,
            ..RecvHeader::default()
        };
        out[..RECV_HEADER].copy_from_slice(h.as_bytes());
        for (i, sge) in sges.iter().enumerate() {
            let at = RECV_HEADER + i * SGE_SIZE;
            put_sge(&mut out[at..at + SGE_SIZE], sge);
        }
        Ok(end)
    }
}

/// Device side: decodes a receive WQE slot.
///
/// # Errors
/// An SGE count beyond the slot.
pub fn decode_recv(slot: &[u8], out: &mut RecvWqe) -> Result<(), WqeFault> {
    let n = usize::from(*slot.first().ok_or(WqeFault {
        reason: "empty receive slot",
    })?);
    out.sges.clear();
    for i in 0..n {
        let at = RECV_HEADER + i * SGE_SIZE;
        let sge = slot
            .get(at..at + SGE_SIZE)
            .and_then(get_sge)
            .ok_or(WqeFault {
                reason: "receive scatter list beyond the slot",
            })?;
        out.sges.push(sge);
    }
    Ok(())
}

/// The CQE format.
#[derive(Debug, Clone, Copy)]
pub struct CqeCodec;

impl CqeCodec {
    /// Device side: encodes a completion with the given owner bit.
    pub fn encode(cqe: &Cqe, owner: bool) -> [u8; CQE_SIZE] {
        let e = SoftCqe {
            qpn: U32::new(cqe.qpn),
            byte_len: U32::new(cqe.byte_len),
            imm: U32::new(cqe.imm),
            src_qp: U32::new(cqe.src_qp),
            wqe_index: U16::new(cqe.wqe_index),
            status: cqe.status as u8,
            opcode: cqe.opcode as u8,
            flags: cqe.flags.bits() as u8,
            sl: cqe.sl,
            slid: U16::new(cqe.slid),
            pkey_index: U16::new(cqe.pkey_index),
            is_send: u8::from(cqe.is_send),
            dlid_path_bits: cqe.dlid_path_bits,
            vendor_err: U16::new(cqe.vendor_err as u16),
            reserved: 0,
            owner: u8::from(owner),
        };
        let mut b = [0u8; CQE_SIZE];
        b.copy_from_slice(e.as_bytes());
        b
    }
}

impl CqeCodec {
    /// The owner bit of a raw entry.
    pub fn owner_bit(entry: &[u8]) -> bool {
        entry.get(CQE_SIZE - 1).is_some_and(|b| b & 1 == 1)
    }

    /// Host side: decodes a raw entry whose ownership was already checked; `cqn` and `index`
    /// only label errors.
    ///
    /// # Errors
    /// Contents that make no sense.
    pub fn decode(entry: &[u8], cqn: u32, index: u32) -> Result<Cqe, CqeError> {
        let e = SoftCqe::read_from_bytes(entry.get(..CQE_SIZE).ok_or(CqeError::Malformed {
            cqn,
            index,
            what: "short entry",
        })?)
        .map_err(|_| CqeError::Malformed {
            cqn,
            index,
            what: "unreadable entry",
        })?;
        let is_send = match e.is_send {
            0 => false,
            1 => true,
            _ => {
                return Err(CqeError::Malformed {
                    cqn,
                    index,
                    what: "is_send is neither 0 nor 1",
                });
            }
        };
        if e.status > WcStatus::GeneralErr as u8 {
            return Err(CqeError::Malformed {
                cqn,
                index,
                what: "status out of range",
            });
        }
        let status = WcStatus::from_u8(e.status);
        let opcode = match (is_send, e.opcode) {
            (true, 0) => WcOpcode::Send,
            (true, 1) => WcOpcode::RdmaWrite,
            (true, 2) => WcOpcode::RdmaRead,
            (true, 3) => WcOpcode::CompSwap,
            (true, 4) => WcOpcode::FetchAdd,
            (true, 5) => WcOpcode::BindMw,
            (true, 6) => WcOpcode::LocalInv,
            (false, 128) => WcOpcode::Recv,
            (false, 129) => WcOpcode::RecvRdmaWithImm,
            (_, op) if status != WcStatus::Success => {
                // Opcodes of error completions are undefined; keep a harmless value.
                let _ = op;
                if is_send {
                    WcOpcode::Send
                } else {
                    WcOpcode::Recv
                }
            }
            (_, op) => {
                return Err(CqeError::BadOpcode {
                    cqn,
                    index,
                    dir: if is_send { "send" } else { "receive" },
                    opcode: op,
                });
            }
        };
        Ok(Cqe {
            qpn: e.qpn.get() & 0x00ff_ffff,
            is_send,
            wqe_index: e.wqe_index.get(),
            status,
            vendor_err: u32::from(e.vendor_err.get()),
            opcode,
            byte_len: e.byte_len.get(),
            imm: e.imm.get(),
            flags: WcFlags::from_bits_truncate(u32::from(e.flags)),
            src_qp: e.src_qp.get() & 0x00ff_ffff,
            slid: e.slid.get(),
            sl: e.sl,
            dlid_path_bits: e.dlid_path_bits,
            pkey_index: e.pkey_index.get(),
        })
    }
}

/// The EQE format.
#[derive(Debug, Clone, Copy)]
pub struct EqeCodec;

impl EqeCodec {
    /// Device side: encodes an event with the given owner bit.
    pub fn encode(ev: &DeviceEvent, owner: bool) -> [u8; EQE_SIZE] {
        let (t, sub, number, aux) = match *ev {
            DeviceEvent::Completion { cqn } => (EventType::Completion, 0, cqn, 0),
            DeviceEvent::Qp { qpn, kind } => {
                let i = QP_EVENTS.iter().position(|k| *k == kind).unwrap_or(0);
                (EventType::Qp, i as u8, qpn, 0)
            }
            DeviceEvent::CqError { cqn, syndrome } => {
                let s = match syndrome {
                    CqErrorSyndrome::Overrun => 1,
                    CqErrorSyndrome::AccessViolation => 2,
                    CqErrorSyndrome::Unknown(v) => v,
                };
                (EventType::CqError, s, cqn, 0)
            }
            DeviceEvent::Srq { srqn, kind } => {
                let s = match kind {
                    SrqEventKind::LimitReached => 0,
                    SrqEventKind::Catastrophic => 1,
                };
                (EventType::Srq, s, srqn, 0)
            }
            DeviceEvent::Port { port, kind } => {
                let s = match kind {
                    PortEventKind::Active => 0,
                    PortEventKind::Down => 1,
                    PortEventKind::GidChange => 2,
                };
                (EventType::Port, s, u32::from(port), 0)
            }
            DeviceEvent::DeviceFatal => (EventType::DeviceFatal, 0, 0, 0),
            // The soft device completes commands synchronously; these never go on its EQs.
            DeviceEvent::CommandDone { .. } | DeviceEvent::Unknown { .. } => {
                (EventType::DeviceFatal, 0xff, 0, 0)
            }
        };
        let e = SoftEqe {
            event_type: t as u8,
            subtype: sub,
            reserved: [0; 2],
            number: U32::new(number),
            aux: U32::new(aux),
            reserved2: [0; 3],
            owner: u8::from(owner),
        };
        let mut b = [0u8; EQE_SIZE];
        b.copy_from_slice(e.as_bytes());
        b
    }
}

impl EqeCodec {
    /// The owner bit of a raw entry.
    pub fn owner_bit(entry: &[u8]) -> bool {
        entry.get(EQE_SIZE - 1).is_some_and(|b| b & 1 == 1)
    }

    /// Host side: decodes a raw entry whose ownership was already checked; `eqn` and `index`
    /// only label errors.
    ///
    /// # Errors
    /// Contents that make no sense.
    pub fn decode(entry: &[u8], eqn: u32, index: u32) -> Result<DeviceEvent, EqeError> {
        let bad = |what| EqeError::Malformed { eqn, index, what };
        let e = SoftEqe::read_from_bytes(entry.get(..EQE_SIZE).ok_or(bad("short entry"))?)
            .map_err(|_| bad("unreadable entry"))?;
        let n = e.number.get();
        Ok(match e.event_type {
            1 => DeviceEvent::Completion { cqn: n },
            2 => DeviceEvent::Qp {
                qpn: n,
                kind: *QP_EVENTS
                    .get(usize::from(e.subtype))
                    .ok_or(bad("unknown QP event"))?,
            },
            3 => DeviceEvent::CqError {
                cqn: n,
                syndrome: match e.subtype {
                    1 => CqErrorSyndrome::Overrun,
                    2 => CqErrorSyndrome::AccessViolation,
                    v => CqErrorSyndrome::Unknown(v),
                },
            },
            4 => DeviceEvent::Srq {
                srqn: n,
                kind: match e.subtype {
                    0 => SrqEventKind::LimitReached,
                    1 => SrqEventKind::Catastrophic,
                    _ => return Err(bad("unknown SRQ event")),
                },
            },
            5 => DeviceEvent::Port {
                port: u8::try_from(n).map_err(|_| bad("port number out of range"))?,
                kind: match e.subtype {
                    0 => PortEventKind::Active,
                    1 => PortEventKind::Down,
                    2 => PortEventKind::GidChange,
                    _ => return Err(bad("unknown port event")),
                },
            },
            6 if e.subtype == 0 => DeviceEvent::DeviceFatal,
            t => DeviceEvent::Unknown {
                event_type: t,
                subtype: e.subtype,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portverbs_hal::wr::UdDest;

    fn ctx(qp_type: QpType) -> EncodeContext {
        EncodeContext {
            qp_type,
            qpn: 0x11,
            counter: 0,
            owner: false,
            signaled: true,
        }
    }

    fn round_trip(wr: &SendWr<'_>, qp_type: QpType) -> SendWqe {
        let fmt = SendFormat {
            stride: send_stride(qp_type, 4, 64),
            max_sge: 4,
            max_inline: 64,
        };
        let mut slot = vec![0u8; fmt.stride];
        fmt.encode_send(wr, &ctx(qp_type), &mut slot).unwrap();
        let mut out = SendWqe::default();
        decode_send(&slot, qp_type, &mut out).unwrap();
        out
    }

    #[test]
    fn send_wqe_round_trips_every_operation() {
        let sges = [Sge {
            addr: 0x1000,
            length: 64,
            lkey: 0x101,
        }];
        let remote = RemoteAddr {
            addr: 0xdead_0000,
            rkey: 0x2201,
        };
        let bind = MwBind {
            new_rkey: 0x302,
            mw_type: MwType::Type2,
            mr_lkey: 0x101,
            addr: 0x1000,
            length: 32,
            access: AccessFlags::REMOTE_READ,
        };
        let ops = SendOp::one_of_each(remote, bind);
        for op in ops {
            let wr = SendWr::new(1, op).sges(&sges).flags(SendFlags::FENCE);
            let got = round_trip(&wr, QpType::Rc);
            assert_eq!(got.op, op);
            assert_eq!(got.sges.as_slice(), &sges[..]);
            assert!(got.signaled);
            assert!(got.flags.contains(SendFlags::FENCE));
        }
    }

    #[test]
    fn inline_and_ud_round_trip() {
        let av = AddressVector {
            dgid: Gid::from_ipv4("10.0.0.2".parse().unwrap()),
            hop_limit: 64,
            is_global: true,
            port_num: 1,
            ..AddressVector::default()
        };
        let wr = SendWr::new(1, SendOp::Send).inline(b"hello").ud(UdDest {
            av: &av,
            remote_qpn: 0x22,
            remote_qkey: 0x1111,
        });
        let got = round_trip(&wr, QpType::Ud);
        assert_eq!(got.inline_data.as_slice(), b"hello");
        let ud = got.ud.unwrap();
        assert_eq!(ud.av, av);
        assert_eq!(ud.remote_qpn, 0x22);
        assert_eq!(ud.remote_qkey, 0x1111);
    }

    #[test]
    fn encoder_refuses_what_does_not_fit() {
        let fmt = SendFormat {
            stride: 128,
            max_sge: 2,
            max_inline: 32,
        };
        let mut slot = [0u8; 128];
        let sges = [Sge::default(); 3];
        let wr = SendWr::new(1, SendOp::Send).sges(&sges);
        assert!(matches!(
            fmt.encode_send(&wr, &ctx(QpType::Rc), &mut slot),
            Err(WqeError::TooManySges { given: 3, max: 2 })
        ));
        let big = [0u8; 33];
        let wr = SendWr::new(1, SendOp::Send).inline(&big);
        assert!(matches!(
            fmt.encode_send(&wr, &ctx(QpType::Rc), &mut slot),
            Err(WqeError::InlineTooLarge { .. })
        ));
        let wr = SendWr::new(1, SendOp::Send);
        assert!(matches!(
            fmt.encode_send(&wr, &ctx(QpType::Ud), &mut slot),
            Err(WqeError::BadDestination { .. })
        ));
    }

    #[test]
    fn device_side_decoder_rejects_garbage() {
        let mut out = SendWqe::default();
        let mut slot = [0u8; 64];
        slot[1] = 99;
        assert!(decode_send(&slot, QpType::Rc, &mut out).is_err());
        slot[1] = 1;
        slot[3] = 200; // 200 SGEs in a 64-byte slot
        assert!(decode_send(&slot, QpType::Rc, &mut out).is_err());
        assert!(decode_send(&slot[..10], QpType::Rc, &mut out).is_err());
        let mut r = RecvWqe::default();
        assert!(decode_recv(&[5u8; 32], &mut r).is_err());
    }

    #[test]
    fn cqe_round_trips_and_rejects_nonsense() {
        let cqe = Cqe {
            qpn: 0x11,
            is_send: false,
            wqe_index: 3,
            status: WcStatus::Success,
            opcode: WcOpcode::RecvRdmaWithImm,
            byte_len: 100,
            imm: 0xabcd,
            flags: WcFlags::WITH_IMM,
            src_qp: 0x22,
            ..Cqe::default()
        };
        let raw = CqeCodec::encode(&cqe, true);
        assert!(CqeCodec::owner_bit(&raw));
        assert_eq!(CqeCodec::decode(&raw, 1, 0).unwrap(), cqe);
        let mut bad = raw;
        bad[19] = 77; // receive opcode 77
        assert!(matches!(
            CqeCodec::decode(&bad, 1, 0),
            Err(CqeError::BadOpcode { opcode: 77, .. })
        ));
        bad = raw;
        bad[26] = 9;
        assert!(CqeCodec::decode(&bad, 1, 0).is_err());
        assert!(CqeCodec::decode(&raw[..8], 1, 0).is_err());
    }

    #[test]
    fn eqe_round_trips_every_event() {
        let events = [
            DeviceEvent::Completion { cqn: 5 },
            DeviceEvent::Qp {
                qpn: 0x11,
                kind: QpEventKind::LastWqeReached,
            },
            DeviceEvent::CqError {
                cqn: 2,
                syndrome: CqErrorSyndrome::Overrun,
            },
            DeviceEvent::Srq {
                srqn: 1,
                kind: SrqEventKind::LimitReached,
            },
            DeviceEvent::Port {
                port: 1,
                kind: PortEventKind::Down,
            },
            DeviceEvent::DeviceFatal,
        ];
        for ev in events {
            let raw = EqeCodec::encode(&ev, false);
            assert!(!EqeCodec::owner_bit(&raw));
            assert_eq!(EqeCodec::decode(&raw, 0, 0).unwrap(), ev);
        }
        let mut raw = EqeCodec::encode(
            &DeviceEvent::Qp {
                qpn: 1,
                kind: QpEventKind::Fatal,
            },
            false,
        );
        raw[1] = 200;
        assert!(EqeCodec::decode(&raw, 0, 0).is_err());
    }
}

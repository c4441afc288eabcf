//! Errors, typed per operation. Each carries the object number, the opcode or the attribute
//! involved, so that a log line says what went wrong where. Device failures are wrapped with
//! `#[source]`.

use std::fmt;

use portverbs_hal::attr::QpAttrMask;
use portverbs_hal::dma::DmaError;
use portverbs_hal::error::{CommandError, CqeError, EqeError, WqeError};
use portverbs_hal::types::{AccessFlags, Gid, Mtu, MwType, QpState, QpType, SpecialQp};
use thiserror::Error;

/// Opening a device.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The device refused a command during open.
    #[error("opening {device}: {source}")]
    Device {
        /// Device name.
        device: String,
        /// Cause.
        #[source]
        source: CommandError,
    },
    /// The platform could not provide the interrupt sinks of the event queues (out of file
    /// descriptors, …).
    #[error("creating the event queues' interrupt sinks: {0}")]
    Sinks(#[source] std::io::Error),
}

/// Queries of the device, ports, GIDs, P_Keys.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum QueryError {
    /// No such port (ports are numbered from 1).
    #[error("port {port} does not exist (the device has {count})")]
    NoSuchPort {
        /// Port asked for.
        port: u8,
        /// Ports on the device.
        count: u8,
    },
    /// An index beyond the table.
    #[error("{table} index {index} is beyond the table of {len} entries")]
    IndexOutOfRange {
        /// GID or P_Key.
        table: &'static str,
        /// Index asked for.
        index: u32,
        /// Table length.
        len: u32,
    },
    /// The GID-table entry is empty.
    #[error("GID index {index} of port {port} is empty")]
    EmptyGid {
        /// Port.
        port: u8,
        /// Index.
        index: u32,
    },
    /// The device refused.
    #[error(transparent)]
    Device(#[from] CommandError),
}

/// Allocating DMA-visible memory.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BufferError {
    /// Zero bytes asked for.
    #[error("a buffer needs at least one byte")]
    Empty,
    /// The device could not provide it.
    #[error(transparent)]
    Dma(#[from] DmaError),
}

/// Allocating or freeing a protection domain.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum PdError {
    /// Objects (or other handles) still use the PD.
    #[error("PD {pdn} is still in use by {users} other handles or objects")]
    Busy {
        /// PD number.
        pdn: u32,
        /// References besides the one being released.
        users: usize,
    },
    /// The device refused.
    #[error(transparent)]
    Device(#[from] CommandError),
}

/// Registering, re-registering or deregistering memory.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MrError {
    /// Remote write or atomic access without local write (IBA 10.6.3.1).
    #[error("access {access:?}: remote write and remote atomic need LOCAL_WRITE")]
    RemoteWithoutLocalWrite {
        /// Requested rights.
        access: AccessFlags,
    },
    /// A right that makes no sense on an MR.
    #[error("access {access:?} is not valid for a memory region")]
    InvalidAccess {
        /// Requested rights.
        access: AccessFlags,
    },
    /// The range does not lie inside the buffer.
    #[error("range {offset}+{len} is outside a buffer of {buffer_len} bytes")]
    OutOfRange {
        /// Offset.
        offset: usize,
        /// Length.
        len: usize,
        /// Buffer length.
        buffer_len: usize,
    },
    /// A range outside the MR ([`crate::Mr::sge`], [`crate::Mr::read`],
    /// [`crate::Mr::write`]), or an SGE longer than an `ibv_sge` can say (`u32::MAX`).
    #[error("{len} bytes at offset {offset} do not fit an MR of {mr_len} bytes")]
    OutsideMr {
        /// Offset asked for.
        offset: usize,
        /// Length asked for.
        len: usize,
        /// Length of the MR.
        mr_len: usize,
    },
    /// Copying into or out of the registered memory failed ([`crate::Mr::read`],
    /// [`crate::Mr::write`]).
    #[error("copying registered memory: {0}")]
    Memory(#[from] DmaError),
    /// The MR is not over memory the application handed over ([`crate::Pd::reg_host`]), or
    /// that memory is shared by other handles; nothing was deregistered.
    #[error("MR {lkey:#x} is not over application memory it alone holds")]
    NotHostMemory {
        /// Its lkey.
        lkey: u32,
    },
    /// A re-registration onto an empty range (`ibv_rereg_mr`'s `IBV_REREG_MR_ERR_INPUT`): the
    /// MR stays as it was.
    #[error("re-registration onto an empty range at offset {offset}: the MR is unchanged")]
    EmptyRange {
        /// Offset of the empty range in the buffer.
        offset: usize,
    },
    /// The buffer or PD belongs to another device.
    #[error("the {what} belongs to another device")]
    ForeignObject {
        /// Which object.
        what: &'static str,
    },
    /// The MR is still in use (bound memory windows).
    #[error("MR {lkey:#x} is busy: {source}")]
    Busy {
        /// Its lkey.
        lkey: u32,
        /// Device detail.
        #[source]
        source: CommandError,
    },
    /// The device refused.
    #[error(transparent)]
    Device(#[from] CommandError),
}

/// Allocating a memory window.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MwError {
    /// The device has no memory windows of that type.
    #[error("the device does not support memory windows of type {mw_type}")]
    Unsupported {
        /// Window type asked for.
        mw_type: u8,
    },
    /// The device refused.
    #[error(transparent)]
    Device(#[from] CommandError),
}

/// Creating, resizing or destroying a completion queue.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CqError {
    /// Entries outside `1..=max_cqe`.
    #[error("{requested} CQ entries requested, the device allows 1..={max}")]
    BadSize {
        /// Asked for.
        requested: u32,
        /// Device maximum.
        max: u32,
    },
    /// No such completion vector.
    #[error("completion vector {vector} does not exist (the device has {count})")]
    BadVector {
        /// Asked for.
        vector: u32,
        /// Available.
        count: u32,
    },
    /// The channel belongs to another device.
    #[error("the completion channel belongs to another device")]
    ForeignChannel,
    /// Resizing below the number of completions not yet polled.
    #[error("CQ {cqn:#x}: {pending} completions are unpolled, more than {requested} entries")]
    ResizeBelowPending {
        /// CQ number.
        cqn: u32,
        /// Unpolled completions.
        pending: u32,
        /// Asked for.
        requested: u32,
    },
    /// QPs or other handles still use the CQ.
    #[error("CQ {cqn:#x} is still in use by {users} other handles or QPs")]
    Busy {
        /// CQ number.
        cqn: u32,
        /// References besides the one being released.
        users: usize,
    },
    /// CQs or other handles still use the completion channel.
    #[error("the completion channel (EQ {eqn:#x}) is still used by {users} CQs or handles")]
    ChannelInUse {
        /// The channel's event queue.
        eqn: u32,
        /// CQs reporting to it and other handles of it.
        users: usize,
    },
    /// Completion events were read from the channel and not acknowledged.
    #[error("CQ {cqn:#x} has {unacked} unacknowledged completion events")]
    UnackedEvents {
        /// CQ number.
        cqn: u32,
        /// Events reported and not acknowledged.
        unacked: u64,
    },
    /// The platform could not provide the completion channel's interrupt sink (out of file
    /// descriptors, …).
    #[error("creating the completion channel's interrupt sink: {0}")]
    Sink(#[source] std::io::Error),
    /// The device refused.
    #[error(transparent)]
    Device(#[from] CommandError),
}

/// Reading or waiting for what an event queue delivers: CQ events of a completion channel,
/// the completion of a notify request, asynchronous events.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum WaitError {
    /// A malformed event was skipped; reading or waiting again is allowed.
    #[error(transparent)]
    BadEvent(#[from] EventError),
    /// The notify request completed with an error: the CQ was destroyed, is in error, or the
    /// device failed.
    #[error(transparent)]
    Notify(#[from] NotifyError),
    /// The timeout passed first (blocking waits only).
    #[error("nothing arrived before the timeout")]
    TimedOut,
    /// The interrupt sink could not be cleared or waited on: the platform call failed, or the
    /// context's sinks only poll ([`std::io::ErrorKind::Unsupported`]; open it with
    /// [`crate::LatchSinks`] or the platform's sinks).
    #[error("waiting on the event queue's interrupt sink: {0}")]
    Sink(#[source] std::io::Error),
}

/// Polling a completion queue.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PollError {
    /// The device wrote an entry that makes no sense; it was consumed, polling may continue.
    #[error(transparent)]
    BadCompletion(#[from] CqeError),
}

/// Waiting for a CQ notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum NotifyError {
    /// The CQ overflowed or failed; it is unusable.
    #[error("CQ {cqn:#x} is in error")]
    CqError {
        /// CQ number.
        cqn: u32,
    },
    /// The CQ was destroyed while the request was pending.
    #[error("CQ {cqn:#x} was destroyed")]
    Cancelled {
        /// CQ number.
        cqn: u32,
    },
    /// The device failed.
    #[error("the device failed")]
    DeviceFatal,
}

/// Processing an event queue.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum EventError {
    /// The device wrote a malformed event (consumed).
    #[error(transparent)]
    BadEvent(#[from] EqeError),
}

/// Creating or destroying a queue pair.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CreateQpError {
    /// A capacity beyond the device limits.
    #[error("{what} = {requested} exceeds the device limit {max}")]
    CapTooLarge {
        /// Which capacity.
        what: &'static str,
        /// Asked for.
        requested: u32,
        /// Device limit.
        max: u32,
    },
    /// A CQ, SRQ or PD from another device.
    #[error("the {what} belongs to another device")]
    ForeignObject {
        /// Which object.
        what: &'static str,
    },
    /// A special QP asked for with another transport than its own (GSI: UD).
    #[error("a {special:?} QP is {}, not {qp_type}", special.qp_type())]
    SpecialType {
        /// The special QP.
        special: SpecialQp,
        /// The transport asked for.
        qp_type: QpType,
    },
    /// The device refused.
    #[error(transparent)]
    Device(#[from] CommandError),
}

/// Destroying a queue pair explicitly.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DestroyQpError {
    /// Other handles to the QP exist.
    #[error("QP {qpn:#x} is still referenced by {users} other handles")]
    Busy {
        /// QP number.
        qpn: u32,
        /// Other references.
        users: usize,
    },
    /// The device refused.
    #[error(transparent)]
    Device(#[from] CommandError),
}

/// Modifying a queue pair (IBA 11.2.5.2, the attribute-mask table).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ModifyQpError {
    /// The transition is not in the IBTA state diagram for this transport.
    #[error("QP {qpn:#x} ({qp_type}): {from} => {to} is not a valid transition")]
    InvalidTransition {
        /// QP number.
        qpn: u32,
        /// Transport.
        qp_type: QpType,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// Required attributes are missing from the mask.
    #[error("QP {qpn:#x}: {from} => {to} requires {missing:?}")]
    MissingAttributes {
        /// QP number.
        qpn: u32,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// Attributes required and not given.
        missing: QpAttrMask,
    },
    /// Attributes the transition does not allow.
    #[error("QP {qpn:#x}: {from} => {to} does not allow {unexpected:?}")]
    UnexpectedAttributes {
        /// QP number.
        qpn: u32,
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
        /// Attributes given and not allowed.
        unexpected: QpAttrMask,
    },
    /// An attribute value out of range.
    #[error("QP {qpn:#x}: invalid {error}")]
    InvalidAttribute {
        /// QP number.
        qpn: u32,
        /// Which attribute and why.
        #[source]
        error: QpAttrError,
    },
    /// Another modify of this QP has not finished (verbs serialise a QP's modifies).
    #[error("QP {qpn:#x}: another modify of this QP is in progress")]
    InProgress {
        /// QP number.
        qpn: u32,
    },
    /// The device refused (e.g. it already moved the QP to ERR).
    #[error("QP {qpn:#x}: {source}")]
    Device {
        /// QP number.
        qpn: u32,
        /// Cause.
        #[source]
        source: CommandError,
    },
}

/// An attribute value a modify refused; [`QpAttrError::attribute`] names the mask bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum QpAttrError {
    /// The GSI QP's Q_Key is fixed (IBA 13.5.1.1).
    #[error("qkey {qkey:#x}: the GSI QP's Q_Key is 0x80010000")]
    GsiQkey {
        /// The value given.
        qkey: u32,
    },
    /// `port_num` is not a port of the device.
    #[error("port_num {port} (the device has ports 1 to {ports})")]
    Port {
        /// The value given.
        port: u8,
        /// Ports of the device.
        ports: u8,
    },
    /// `pkey_index` is past the P_Key table.
    #[error("pkey_index {index} (table of {table})")]
    PkeyIndex {
        /// The value given.
        index: u16,
        /// Table length.
        table: u16,
    },
    /// A PSN or QPN wider than 24 bits.
    #[error("{attr:?} {value:#x} (24 bits)")]
    Over24Bits {
        /// RQ_PSN, SQ_PSN or DEST_QPN.
        attr: QpAttrMask,
        /// The value given.
        value: u32,
    },
    /// A count or timer above its limit (the field's width or the device's maximum).
    #[error("{attr:?} {value} (at most {max})")]
    AboveMax {
        /// The attribute.
        attr: QpAttrMask,
        /// The value given.
        value: u32,
        /// The limit.
        max: u32,
    },
    /// An alternate path or path-migration state (quirk `NoAutomaticPathMigration`).
    #[error(
        "alternate path: automatic path migration is not supported (QuirkId::NoAutomaticPathMigration)"
    )]
    AltPathUnsupported {
        /// ALT_PATH and/or PATH_MIG_STATE, as given.
        attr: QpAttrMask,
    },
    /// `qp_access_flags` holds flags a QP cannot take.
    #[error("qp_access_flags {0:?}")]
    AccessFlags(AccessFlags),
    /// The address vector's port is not a port of the device.
    #[error("ah_attr.port_num {port} (the device has ports 1 to {ports})")]
    AvPort {
        /// The value given.
        port: u8,
        /// Ports of the device.
        ports: u8,
    },
    /// A RoCE port needs a GRH in the address vector.
    #[error("ah_attr: a RoCE port needs a GRH (is_global)")]
    RoceNeedsGrh,
    /// The address vector's source GID index is past the port's GID table.
    #[error("ah_attr.sgid_index {index} (table of {table})")]
    SgidIndex {
        /// The value given.
        index: u8,
        /// Table length.
        table: u32,
    },
    /// `path_mtu` above what the port supports.
    #[error("path_mtu {mtu} above the port's {max}")]
    PathMtu {
        /// The value given.
        mtu: Mtu,
        /// The port's maximum.
        max: Mtu,
    },
}

impl QpAttrError {
    /// The attribute (mask bit) whose value was refused.
    pub fn attribute(&self) -> QpAttrMask {
        match *self {
            Self::Port { .. } => QpAttrMask::PORT,
            Self::PkeyIndex { .. } => QpAttrMask::PKEY_INDEX,
            Self::GsiQkey { .. } => QpAttrMask::QKEY,
            Self::Over24Bits { attr, .. }
            | Self::AboveMax { attr, .. }
            | Self::AltPathUnsupported { attr } => attr,
            Self::AccessFlags(_) => QpAttrMask::ACCESS_FLAGS,
            Self::AvPort { .. } | Self::RoceNeedsGrh | Self::SgidIndex { .. } => QpAttrMask::AV,
            Self::PathMtu { .. } => QpAttrMask::PATH_MTU,
        }
    }
}

/// Why a work request was rejected at post time.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum PostErrorKind {
    /// The QP's state does not accept this queue's requests.
    #[error("QP is in {state}")]
    InvalidState {
        /// Current state.
        state: QpState,
    },
    /// The queue is full.
    #[error("queue full ({depth} outstanding)")]
    QueueFull {
        /// Queue depth.
        depth: u32,
    },
    /// More SGEs than the QP was created with.
    #[error("{given} SGEs, the queue allows {max}")]
    TooManySges {
        /// Given.
        given: usize,
        /// Allowed.
        max: u32,
    },
    /// More inline bytes than the QP was created with.
    #[error("{given} inline bytes, the queue allows {max}")]
    InlineTooLarge {
        /// Given.
        given: usize,
        /// Allowed.
        max: u32,
    },
    /// `INLINE` with a gather list: inline data is given as bytes (`SendWr::inline`), because
    /// registered memory is never read through a reference at post time.
    #[error("inline data must be given as bytes, not as a gather list")]
    InlineFromSges,
    /// The operation is not valid on this transport.
    #[error("{op} is not valid on a {qp_type} QP")]
    OpNotSupported {
        /// Operation.
        op: &'static str,
        /// Transport.
        qp_type: QpType,
    },
    /// UD sends need an address handle, connected ones must not have one.
    #[error("destination: {0}")]
    BadDestination(&'static str),
    /// A UD send through an address handle of another protection domain (IBA 10.2.3).
    #[error("the address handle is in PD {ah_pd:#x}, the QP in PD {qp_pd:#x}")]
    AhOfAnotherPd {
        /// The handle's domain.
        ah_pd: u32,
        /// The QP's domain.
        qp_pd: u32,
    },
    /// A memory-window bind or a local invalidate carries no data: a gather list or inline
    /// bytes given with one would be silently ignored, so the request is refused.
    #[error("{op} carries no payload: remove its gather entries and inline data")]
    PayloadNotAllowed {
        /// Operation.
        op: &'static str,
    },
    /// [`crate::Qp::bind_mw`] binds type-1 windows (`ibv_bind_mw`); a type-2 window is bound
    /// with a `BIND_MW` work request ([`crate::Mw::bind`]).
    #[error(
        "bind_mw binds type-1 windows; this window is {mw_type:?}: post a BIND_MW work request"
    )]
    WrongWindowType {
        /// The window's type.
        mw_type: MwType,
    },
    /// The QP receives through an SRQ; post to the SRQ.
    #[error("the QP receives through SRQ {srqn:#x}")]
    UsesSrq {
        /// SRQ number.
        srqn: u32,
    },
    /// The backend could not encode the request.
    #[error(transparent)]
    Encode(#[from] WqeError),
}

/// A post that stopped at `index`: requests before it were posted, it and later ones were not
/// (the `bad_wr` of libibverbs).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{queue} of QP {qpn:#x}: work request {index} (wr_id {wr_id:#x}) rejected: {kind}")]
pub struct PostError {
    /// "send queue", "receive queue" or "SRQ".
    pub queue: &'static str,
    /// QP (or SRQ) number.
    pub qpn: u32,
    /// Index of the first rejected request in the slice.
    pub index: usize,
    /// Its `wr_id`.
    pub wr_id: u64,
    /// Why.
    pub kind: PostErrorKind,
}

/// Creating or changing a shared receive queue.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SrqError {
    /// Size or SGEs beyond the device limits.
    #[error("{what} = {requested} exceeds the device limit {max}")]
    CapTooLarge {
        /// Which capacity.
        what: &'static str,
        /// Asked for.
        requested: u32,
        /// Device limit.
        max: u32,
    },
    /// The limit cannot exceed the queue size.
    #[error("SRQ limit {limit} is above its size {size}")]
    LimitTooLarge {
        /// Asked for.
        limit: u32,
        /// SRQ size.
        size: u32,
    },
    /// QPs or other handles still use the SRQ.
    #[error("SRQ {srqn:#x} is still in use by {users} other handles or QPs")]
    Busy {
        /// SRQ number.
        srqn: u32,
        /// Other references.
        users: usize,
    },
    /// The device refused.
    #[error(transparent)]
    Device(#[from] CommandError),
}

/// Attaching a QP to a multicast group or detaching it (`ibv_attach_mcast`,
/// `ibv_detach_mcast`; IBA 10.5.2.4 and 11.3.1.1).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum McastError {
    /// Only unreliable-datagram QPs join multicast groups (IBA 10.5.2.4); the special QPs
    /// (QP0, QP1) do not either. libibverbs returns EINVAL (`ib_attach_mcast` in Linux's
    /// `drivers/infiniband/core/verbs.c`).
    #[error("QP {qpn:#x} is a {qp_type} QP{}: only UD QPs attach to multicast groups",
            if *special { " (special)" } else { "" })]
    NotUd {
        /// QP number.
        qpn: u32,
        /// Its transport.
        qp_type: QpType,
        /// It is a special QP (QP0/QP1).
        special: bool,
    },
    /// The GID is not a multicast GID: neither `ff00::/8` nor the IPv4-mapped form of an
    /// IPv4 group (224.0.0.0/4), which is how rdma_cm names IPv4 groups on RoCEv2.
    #[error("{gid} is not a multicast GID")]
    NotMulticast {
        /// The GID given.
        gid: Gid,
    },
    /// The device has no multicast (it reports `max_mcast_grp == 0`).
    #[error("the device does not support multicast (max_mcast_grp is 0)")]
    Unsupported,
    /// Detaching a group the QP is not attached to.
    #[error("QP {qpn:#x} is not attached to {gid}")]
    NotAttached {
        /// QP number.
        qpn: u32,
        /// The group.
        gid: Gid,
    },
    /// A device limit would be exceeded: `max_mcast_grp` (groups), `max_mcast_qp_attach`
    /// (QPs in one group) or `max_total_mcast_qp_attach` (attachments in all).
    #[error("QP {qpn:#x}: attaching to {gid} exceeds the device's {limit} ({max})")]
    LimitReached {
        /// QP number.
        qpn: u32,
        /// The group.
        gid: Gid,
        /// The `ibv_device_attr` field whose limit was reached.
        limit: &'static str,
        /// Its value.
        max: u32,
    },
    /// The device refused.
    #[error("QP {qpn:#x}: {source}")]
    Device {
        /// QP number.
        qpn: u32,
        /// Cause.
        #[source]
        source: CommandError,
    },
}

/// Creating an address handle.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum AhError {
    /// RoCE ports need a GRH (IBA A16/A17: the destination is a GID).
    #[error("port {port} is Ethernet (RoCE): the address handle needs a GRH")]
    GrhRequired {
        /// Port.
        port: u8,
    },
    /// No such port.
    #[error("port {port} does not exist")]
    NoSuchPort {
        /// Port.
        port: u8,
    },
    /// The source GID index is beyond the table or empty.
    #[error("source GID index {index} is not valid on port {port}")]
    BadSgidIndex {
        /// Port.
        port: u8,
        /// Index.
        index: u8,
    },
    /// The destination GID is all zeros.
    #[error("the destination GID is empty")]
    EmptyDgid,
    /// `create_ah_from_wc` on a RoCE port: the completion says no GRH came with the datagram,
    /// so there is no sender to answer.
    #[error("port {port} is Ethernet (RoCE) and the completion carries no GRH")]
    NoGrh {
        /// Port.
        port: u8,
    },
    /// `create_ah_from_wc`: the GRH area of the receive could not be read.
    #[error("the received GRH: {0}")]
    BadGrh(#[from] crate::ah_wc::GrhError),
    /// `create_ah_from_wc`: the datagram was sent to a multicast group, which names no local
    /// GID to answer from.
    #[error("the datagram was sent to the multicast GID {gid}: no local GID to answer from")]
    MulticastDestination {
        /// The group's GID.
        gid: portverbs_hal::types::Gid,
    },
    /// `create_ah_from_wc`: no entry of the port's GID table holds the GID the datagram was
    /// sent to.
    #[error("GID {gid} is not in port {port}'s GID table")]
    NotLocalGid {
        /// Port.
        port: u8,
        /// The GRH's destination GID.
        gid: portverbs_hal::types::Gid,
    },
    /// Other handles of the address handle still exist.
    #[error("the address handle is still used by {users} other handles")]
    Busy {
        /// Other handles.
        users: usize,
    },
    /// A query of the device failed.
    #[error(transparent)]
    Device(#[from] CommandError),
}

/// A teardown that was refused (`destroy`, `dealloc`, `dereg`): why, and the handle, still
/// valid, given back so nothing is lost. It is an [`std::error::Error`], so `?` works where
/// the handle is not wanted back:
///
/// ```no_run
/// # fn demo<D: portverbs_hal::Device>(pd: portverbs_verbs::Pd<D>) -> Result<(), Box<dyn std::error::Error>> {
/// pd.dealloc()?; // Busy while MRs or QPs use it; the PD is then dropped with the error
/// # Ok(()) }
/// ```
///
/// and [`Refused::into_handle`] takes the handle back to retry later.
pub struct Refused<T, E> {
    error: E,
    handle: T,
}

impl<T, E> Refused<T, E> {
    pub(crate) fn new(error: E, handle: T) -> Self {
        Self { error, handle }
    }

    /// Why it was refused.
    pub fn error(&self) -> &E {
        &self.error
    }

    /// The handle, to keep using or to retry with.
    pub fn into_handle(self) -> T {
        self.handle
    }

    /// Both parts.
    pub fn into_parts(self) -> (E, T) {
        (self.error, self.handle)
    }
}

impl<T: fmt::Debug, E: fmt::Debug> fmt::Debug for Refused<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Refused")
            .field("error", &self.error)
            .field("handle", &self.handle)
            .finish()
    }
}

impl<T, E: fmt::Display> fmt::Display for Refused<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl<T: fmt::Debug, E: std::error::Error + 'static> std::error::Error for Refused<T, E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Handle(u32);

    fn teardown(busy: bool) -> Result<(), Refused<Handle, PdError>> {
        if busy {
            Err(Refused::new(PdError::Busy { pdn: 7, users: 2 }, Handle(7)))
        } else {
            Ok(())
        }
    }

    fn with_question_mark(busy: bool) -> Result<(), Box<dyn std::error::Error>> {
        teardown(busy)?;
        Ok(())
    }

    #[test]
    fn a_refused_teardown_is_an_error_and_gives_the_handle_back() {
        assert!(with_question_mark(false).is_ok());
        let e = with_question_mark(true).unwrap_err();
        assert_eq!(
            e.to_string(),
            PdError::Busy { pdn: 7, users: 2 }.to_string()
        );
        let refused = teardown(true).unwrap_err();
        assert!(matches!(refused.error(), PdError::Busy { pdn: 7, .. }));
        assert_eq!(refused.into_handle(), Handle(7));
    }
}

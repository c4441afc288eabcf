//! Errors a backend reports through the HAL: device-command failures, WQE encoding refusals,
//! and CQE/EQE contents that fail validation. Each carries the numbers needed to act on it.

use thiserror::Error;

/// A device command failed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CommandError {
    /// An argument is outside what the device supports.
    #[error("invalid argument: {what}")]
    InvalidArgument {
        /// Which argument, and why.
        what: String,
    },
    /// The device ran out of a resource (QP numbers, MPT entries, memory …).
    #[error("out of {resource}")]
    ResourceExhausted {
        /// The resource.
        resource: &'static str,
    },
    /// The object is still in use (a PD with children, an MR with bound windows …).
    #[error("{object} is busy: {reason}")]
    Busy {
        /// The object.
        object: &'static str,
        /// Why it cannot be released.
        reason: String,
    },
    /// No object with that number exists on the device.
    #[error("no {object} with number {number:#x}")]
    NoSuchObject {
        /// Kind of object.
        object: &'static str,
        /// Its number.
        number: u32,
    },
    /// The object is in a state that does not allow the command (e.g. an illegal QP transition).
    #[error("{object} {number:#x} in wrong state: {reason}")]
    BadState {
        /// Kind of object.
        object: &'static str,
        /// Its number.
        number: u32,
        /// Detail.
        reason: String,
    },
    /// The device does not implement the operation.
    #[error("not supported: {what}")]
    Unsupported {
        /// What was asked for.
        what: &'static str,
    },
    /// The firmware returned an error status for a command.
    #[error("firmware command {opcode:#06x} failed with status {status:#04x} ({meaning})")]
    Firmware {
        /// Command opcode.
        opcode: u16,
        /// Status byte.
        status: u8,
        /// The status name.
        meaning: &'static str,
    },
    /// The command did not complete in time.
    #[error("command {opcode:#06x} timed out after {millis} ms")]
    Timeout {
        /// Command opcode.
        opcode: u16,
        /// The limit that expired.
        millis: u64,
    },
    /// The device hit a fatal error; nothing more can be done with it.
    #[error("device is in a fatal error state")]
    DeviceFatal,
    /// The device was removed.
    #[error("device was removed")]
    Removed,
    /// DMA memory could not be provided.
    #[error(transparent)]
    Dma(#[from] crate::dma::DmaError),
}

/// A backend refused to encode a work request.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum WqeError {
    /// More gather entries than the WQE has room for.
    #[error("{given} scatter/gather entries, at most {max} fit")]
    TooManySges {
        /// Requested.
        given: usize,
        /// Limit.
        max: u32,
    },
    /// More inline bytes than the WQE has room for.
    #[error("{given} bytes of inline data, at most {max} fit")]
    InlineTooLarge {
        /// Requested.
        given: usize,
        /// Limit.
        max: u32,
    },
    /// The operation has no encoding on this queue (e.g. RDMA on UD, atomics on UC).
    #[error("operation {op} is not valid on this queue")]
    OpNotSupported {
        /// Operation name.
        op: &'static str,
    },
    /// A UD send without a destination, or a connected send with one.
    #[error("destination address missing or not allowed: {reason}")]
    BadDestination {
        /// Detail.
        reason: &'static str,
    },
    /// A slot index outside the ring (SRQ release).
    #[error("slot {slot} outside a ring of {depth}")]
    BadSlot {
        /// Slot.
        slot: u32,
        /// Ring size.
        depth: u32,
    },
    /// The device is unusable.
    #[error("device is in a fatal error state")]
    DeviceFatal,
}

/// A CQE whose owner bit says "valid" but whose contents do not make sense. The entry is
/// consumed (the consumer index moves past it) so that polling can continue.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum CqeError {
    /// Unknown opcode for the direction.
    #[error("CQE {index} on CQ {cqn:#x}: unknown {dir} opcode {opcode:#04x}")]
    BadOpcode {
        /// CQ number.
        cqn: u32,
        /// Consumer index of the entry.
        index: u32,
        /// "send" or "receive".
        dir: &'static str,
        /// Raw opcode.
        opcode: u8,
    },
    /// The CQE names a QP that is not attached to this CQ.
    #[error("CQE {index} on CQ {cqn:#x} names unknown QP {qpn:#x}")]
    UnknownQp {
        /// CQ number.
        cqn: u32,
        /// Consumer index of the entry.
        index: u32,
        /// QPN from the entry.
        qpn: u32,
    },
    /// The WQE index in the CQE does not correspond to an outstanding work request.
    #[error("CQE {index} on CQ {cqn:#x}: WQE index {wqe_index} not outstanding on QP {qpn:#x}")]
    BadWqeIndex {
        /// CQ number.
        cqn: u32,
        /// Consumer index of the entry.
        index: u32,
        /// QPN.
        qpn: u32,
        /// WQE index from the entry.
        wqe_index: u32,
    },
    /// Some other field is out of range.
    #[error("CQE {index} on CQ {cqn:#x}: {what}")]
    Malformed {
        /// CQ number.
        cqn: u32,
        /// Consumer index of the entry.
        index: u32,
        /// Which field.
        what: &'static str,
    },
    /// The CQ overflowed or the device reported it broken; the CQ is unusable.
    #[error("CQ {cqn:#x} is in error (overrun or device failure)")]
    CqInError {
        /// CQ number.
        cqn: u32,
    },
    /// The device is unusable.
    #[error("device is in a fatal error state")]
    DeviceFatal,
}

/// An EQE whose owner bit says "valid" but whose contents do not make sense; consumed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum EqeError {
    /// A field is out of range.
    #[error("EQE {index} on EQ {eqn}: {what}")]
    Malformed {
        /// EQ number.
        eqn: u32,
        /// Consumer index.
        index: u32,
        /// Which field.
        what: &'static str,
    },
    /// The device is unusable.
    #[error("device is in a fatal error state")]
    DeviceFatal,
}

/// The `resource` a device names in [`CommandError::ResourceExhausted`] when an
/// `attach_mcast` would pass one of its multicast limits, so that the core can say which
/// `ibv_device_attr` field was reached.
pub mod mcast_resource {
    /// `max_mcast_grp`: groups on the device.
    pub const GROUPS: &str = "multicast groups";
    /// `max_mcast_qp_attach`: QPs attached to one group.
    pub const QPS_PER_GROUP: &str = "QPs of one multicast group";
    /// `max_total_mcast_qp_attach`: attachments over all groups.
    pub const ATTACHMENTS: &str = "multicast attachments";
}

//! Device events, as decoded from a backend's EQE format: completion notifications, affiliated
//! and unaffiliated asynchronous events, and command completions.

/// What happened to a QP (affiliated asynchronous events, IBA 11.6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpEventKind {
    /// Catastrophic QP error; the QP is in ERR (`IBV_EVENT_QP_FATAL`).
    Fatal,
    /// Invalid request received by the responder (`IBV_EVENT_QP_REQ_ERR`).
    RequestError,
    /// Access violation at the responder (`IBV_EVENT_QP_ACCESS_ERR`).
    AccessError,
    /// First packet received in RTR (`IBV_EVENT_COMM_EST`).
    CommEstablished,
    /// The send queue drained on entering SQD (`IBV_EVENT_SQ_DRAINED`).
    SqDrained,
    /// Path migrated (`IBV_EVENT_PATH_MIG`).
    PathMigrated,
    /// Path migration failed (`IBV_EVENT_PATH_MIG_ERR`).
    PathMigrationError,
    /// Last WQE reached on a QP attached to an SRQ (`IBV_EVENT_QP_LAST_WQE_REACHED`).
    LastWqeReached,
}

/// What happened to an SRQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SrqEventKind {
    /// The number of posted receives fell below the armed limit (`IBV_EVENT_SRQ_LIMIT_REACHED`).
    LimitReached,
    /// Catastrophic SRQ error (`IBV_EVENT_SRQ_ERR`).
    Catastrophic,
}

/// What happened to a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortEventKind {
    /// The port became active (`IBV_EVENT_PORT_ACTIVE`).
    Active,
    /// The port went down (`IBV_EVENT_PORT_ERR`).
    Down,
    /// The GID table changed (`IBV_EVENT_GID_CHANGE`).
    GidChange,
}

/// Why a CQ failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CqErrorSyndrome {
    /// The device found the CQ full (overrun).
    Overrun,
    /// The device could not write the CQ buffer.
    AccessViolation,
    /// A syndrome value this crate does not know (kept for diagnostics).
    Unknown(u8),
}

/// One decoded event-queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceEvent {
    /// An armed CQ received a completion that satisfies its arming.
    Completion {
        /// CQ number.
        cqn: u32,
    },
    /// An affiliated QP event.
    Qp {
        /// QP number.
        qpn: u32,
        /// Event.
        kind: QpEventKind,
    },
    /// A CQ error (`IBV_EVENT_CQ_ERR`).
    CqError {
        /// CQ number.
        cqn: u32,
        /// Reason.
        syndrome: CqErrorSyndrome,
    },
    /// An SRQ event.
    Srq {
        /// SRQ number.
        srqn: u32,
        /// Event.
        kind: SrqEventKind,
    },
    /// A port event.
    Port {
        /// Port number (1-based).
        port: u8,
        /// Event.
        kind: PortEventKind,
    },
    /// The device failed (`IBV_EVENT_DEVICE_FATAL`); every object is unusable.
    DeviceFatal,
    /// A device command issued in event mode completed.
    CommandDone {
        /// Token given when the command was issued.
        token: u16,
        /// Device status code (0 = success).
        status: u8,
        /// Immediate output parameter.
        out_param: u64,
    },
    /// An event type this crate does not know; kept, never dropped silently.
    Unknown {
        /// Raw event type.
        event_type: u8,
        /// Raw subtype.
        subtype: u8,
    },
}

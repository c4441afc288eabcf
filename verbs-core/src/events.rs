//! Asynchronous events (`ibv_get_async_event`): what happened, and to which object.
//!
//! Events name objects by number rather than by handle, so an event can never keep an object
//! alive or refer to a freed one; applications map numbers to their objects
//! ([`crate::Qp::qp_num`], [`crate::Cq::cqn`], [`crate::Srq::srqn`]).

use std::fmt;

use portverbs_hal::event::{
    CqErrorSyndrome, DeviceEvent, PortEventKind, QpEventKind, SrqEventKind,
};

/// Kind of asynchronous event (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEventKind {
    /// `IBV_EVENT_CQ_ERR`: the CQ overflowed or failed.
    CqErr,
    /// `IBV_EVENT_QP_FATAL`.
    QpFatal,
    /// `IBV_EVENT_QP_REQ_ERR`: the responder saw an invalid request.
    QpReqErr,
    /// `IBV_EVENT_QP_ACCESS_ERR`: the responder saw an access violation.
    QpAccessErr,
    /// `IBV_EVENT_COMM_EST`.
    CommEst,
    /// `IBV_EVENT_SQ_DRAINED`.
    SqDrained,
    /// `IBV_EVENT_PATH_MIG`.
    PathMig,
    /// `IBV_EVENT_PATH_MIG_ERR`.
    PathMigErr,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`.
    QpLastWqeReached,
    /// `IBV_EVENT_SRQ_ERR`.
    SrqErr,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`.
    SrqLimitReached,
    /// `IBV_EVENT_PORT_ACTIVE`.
    PortActive,
    /// `IBV_EVENT_PORT_ERR`.
    PortErr,
    /// `IBV_EVENT_GID_CHANGE`.
    GidChange,
    /// `IBV_EVENT_DEVICE_FATAL`.
    DeviceFatal,
}

impl fmt::Display for AsyncEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::CqErr => "CQ error",
            Self::QpFatal => "local work queue catastrophic error",
            Self::QpReqErr => "invalid request local work queue error",
            Self::QpAccessErr => "local access violation work queue error",
            Self::CommEst => "communication established",
            Self::SqDrained => "send queue drained",
            Self::PathMig => "path migrated",
            Self::PathMigErr => "path migration request error",
            Self::QpLastWqeReached => "last WQE reached",
            Self::SrqErr => "SRQ catastrophic error",
            Self::SrqLimitReached => "SRQ limit reached",
            Self::PortActive => "port active",
            Self::PortErr => "port error",
            Self::GidChange => "GID table change",
            Self::DeviceFatal => "local catastrophic error",
        })
    }
}

/// The object an event concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventElement {
    /// A QP number.
    Qp(u32),
    /// A CQ number.
    Cq(u32),
    /// An SRQ number.
    Srq(u32),
    /// A port number.
    Port(u8),
    /// The whole device.
    Device,
}

/// One asynchronous event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// What happened.
    pub kind: AsyncEventKind,
    /// To what.
    pub element: EventElement,
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.element {
            EventElement::Qp(n) => write!(f, "{} on QP {n:#x}", self.kind),
            EventElement::Cq(n) => write!(f, "{} on CQ {n:#x}", self.kind),
            EventElement::Srq(n) => write!(f, "{} on SRQ {n:#x}", self.kind),
            EventElement::Port(p) => write!(f, "{} on port {p}", self.kind),
            EventElement::Device => write!(f, "{}", self.kind),
        }
    }
}

impl AsyncEvent {
    /// The asynchronous event a device event stands for (completions and command completions
    /// are not asynchronous events).
    pub fn from_device(ev: &DeviceEvent) -> Option<Self> {
        use AsyncEventKind as K;
        let (kind, element) = match *ev {
            DeviceEvent::Qp { qpn, kind } => (
                match kind {
                    QpEventKind::Fatal => K::QpFatal,
                    QpEventKind::RequestError => K::QpReqErr,
                    QpEventKind::AccessError => K::QpAccessErr,
                    QpEventKind::CommEstablished => K::CommEst,
                    QpEventKind::SqDrained => K::SqDrained,
                    QpEventKind::PathMigrated => K::PathMig,
                    QpEventKind::PathMigrationError => K::PathMigErr,
                    QpEventKind::LastWqeReached => K::QpLastWqeReached,
                },
                EventElement::Qp(qpn),
            ),
            DeviceEvent::CqError { cqn, syndrome } => {
                if let CqErrorSyndrome::Unknown(s) = syndrome {
                    tracing::warn!(cqn, syndrome = s, "CQ error with an unknown syndrome");
                }
                (K::CqErr, EventElement::Cq(cqn))
            }
            DeviceEvent::Srq { srqn, kind } => (
                match kind {
                    SrqEventKind::LimitReached => K::SrqLimitReached,
                    SrqEventKind::Catastrophic => K::SrqErr,
                },
                EventElement::Srq(srqn),
            ),
            DeviceEvent::Port { port, kind } => (
                match kind {
                    PortEventKind::Active => K::PortActive,
                    PortEventKind::Down => K::PortErr,
                    PortEventKind::GidChange => K::GidChange,
                },
                EventElement::Port(port),
            ),
            DeviceEvent::DeviceFatal => (K::DeviceFatal, EventElement::Device),
            DeviceEvent::Completion { .. }
            | DeviceEvent::CommandDone { .. }
            | DeviceEvent::Unknown { .. } => return None,
        };
        Some(Self { kind, element })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_events_map_to_ibv_events() {
        let ev = AsyncEvent::from_device(&DeviceEvent::Srq {
            srqn: 3,
            kind: SrqEventKind::LimitReached,
        })
        .unwrap();
        assert_eq!(ev.kind, AsyncEventKind::SrqLimitReached);
        assert_eq!(ev.element, EventElement::Srq(3));
        assert_eq!(ev.to_string(), "SRQ limit reached on SRQ 0x3");
        assert!(AsyncEvent::from_device(&DeviceEvent::Completion { cqn: 1 }).is_none());
    }
}

//! The EQE: encoded by the device, decoded by the host.

use portverbs_hal::error::EqeError;
use portverbs_hal::event::{
    CqErrorSyndrome, DeviceEvent, PortEventKind, QpEventKind, SrqEventKind,
};
use zerocopy::little_endian::U32;
use zerocopy::{FromBytes, IntoBytes};

use super::{EQE_SIZE, SoftEqe};

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

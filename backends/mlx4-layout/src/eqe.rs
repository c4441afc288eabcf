//! Event queue entries (Linux `struct mlx4_eqe`, `mlx4/eq.c`): the 32-byte EQE, event types,
//! and the translation to and from the portable [`DeviceEvent`]. [`decode`] treats the entry as
//! hostile.

#![allow(missing_docs)]

use portverbs_hal::error::EqeError;
use portverbs_hal::event::{
    CqErrorSyndrome, DeviceEvent, PortEventKind, QpEventKind, SrqEventKind,
};
use zerocopy::byteorder::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::layout;

/// Bytes per EQE.
pub const EQE_SIZE: usize = 32;

/// The EQE.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct EqeLayout {
    pub _r0: u8,
    pub event_type: u8,
    pub _r1: u8,
    pub subtype: u8,
    /// CQN / QPN / SRQN (bits 23:0) for object events.
    pub obj: U32,
    /// Command completion: token at 0x06 overlays `obj`'s low half; see [`CmdEqe`].
    pub data1: U32,
    /// Port events: port in bits 31:28. CQ error: syndrome in the low byte (0x0f).
    pub data2: U32,
    pub data3: U64,
    pub data4: U32,
    pub slave_id: u8,
    pub _r2: [u8; 2],
    /// bit7 owner.
    pub owner: u8,
}
layout!(EqeLayout, 32, {
    event_type: 0x01, subtype: 0x03, obj: 0x04, data1: 0x08, data2: 0x0c, data3: 0x10,
    data4: 0x18, slave_id: 0x1c, owner: 0x1f,
});

/// The command-completion view of an EQE (type 0x0a).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct CmdEqe {
    pub _r0: u8,
    pub event_type: u8,
    pub _r1: u8,
    pub subtype: u8,
    pub _r2: [u8; 2],
    pub token: U16,
    pub _r3: [u8; 7],
    pub status: u8,
    pub out_param: U64,
    pub _r4: [u8; 7],
    pub owner: u8,
}
layout!(CmdEqe, 32, { event_type: 0x01, token: 0x06, status: 0x0f, out_param: 0x10, owner: 0x1f });

/// Event types (Linux `enum mlx4_event`, `include/linux/mlx4/device.h`).
pub mod event_type {
    pub const COMP: u8 = 0x00;
    pub const PATH_MIG: u8 = 0x01;
    pub const COMM_EST: u8 = 0x02;
    pub const SQ_DRAINED: u8 = 0x03;
    pub const CQ_ERROR: u8 = 0x04;
    pub const WQ_CATAS_ERROR: u8 = 0x05;
    pub const EEC_CATAS_ERROR: u8 = 0x06;
    pub const PATH_MIG_FAILED: u8 = 0x07;
    pub const LOCAL_CATAS_ERROR: u8 = 0x08;
    pub const PORT_CHANGE: u8 = 0x09;
    pub const CMD: u8 = 0x0a;
    pub const ECC_DETECT: u8 = 0x0e;
    pub const EQ_OVERFLOW: u8 = 0x0f;
    pub const WQ_INVAL_REQ_ERROR: u8 = 0x10;
    pub const WQ_ACCESS_ERROR: u8 = 0x11;
    pub const SRQ_CATAS_ERROR: u8 = 0x12;
    pub const SRQ_QP_LAST_WQE: u8 = 0x13;
    pub const SRQ_LIMIT: u8 = 0x14;
}

/// Port-change subtypes.
pub mod port_subtype {
    pub const DOWN: u8 = 1;
    pub const ACTIVE: u8 = 4;
    /// GID table change (this model's use of the port-management type).
    pub const GID_CHANGE: u8 = 0x14;
}

/// The async event types this driver maps to its async EQ with MAP_EQ (Linux's mask).
pub const ASYNC_EVENT_MASK: u64 = {
    use event_type::*;
    (1 << PATH_MIG)
        | (1 << COMM_EST)
        | (1 << SQ_DRAINED)
        | (1 << CQ_ERROR)
        | (1 << WQ_CATAS_ERROR)
        | (1 << EEC_CATAS_ERROR)
        | (1 << PATH_MIG_FAILED)
        | (1 << LOCAL_CATAS_ERROR)
        | (1 << PORT_CHANGE)
        | (1 << ECC_DETECT)
        | (1 << EQ_OVERFLOW)
        | (1 << WQ_INVAL_REQ_ERROR)
        | (1 << WQ_ACCESS_ERROR)
        | (1 << SRQ_CATAS_ERROR)
        | (1 << SRQ_QP_LAST_WQE)
        | (1 << SRQ_LIMIT)
};

/// The owner bit's mask in an entry's last byte.
pub const OWNER_MASK: u8 = 0x80;

/// The owner bit of a raw entry.
pub fn owner(entry: &[u8]) -> bool {
    entry.get(EQE_SIZE - 1).is_some_and(|b| b & OWNER_MASK != 0)
}

/// Decodes an EQE whose ownership was checked.
///
/// # Errors
/// Too short, or a port event naming no valid port.
pub fn decode(entry: &[u8], eqn: u32, index: u32) -> Result<DeviceEvent, EqeError> {
    use event_type::*;
    let Ok((e, _)) = EqeLayout::read_from_prefix(entry) else {
        return Err(EqeError::Malformed {
            eqn,
            index,
            what: "entry shorter than 32 bytes",
        });
    };
    let obj = e.obj.get() & 0xff_ffff;
    let qp = |kind| DeviceEvent::Qp { qpn: obj, kind };
    Ok(match e.event_type {
        COMP => DeviceEvent::Completion { cqn: obj },
        PATH_MIG => qp(QpEventKind::PathMigrated),
        COMM_EST => qp(QpEventKind::CommEstablished),
        SQ_DRAINED => qp(QpEventKind::SqDrained),
        WQ_CATAS_ERROR => qp(QpEventKind::Fatal),
        PATH_MIG_FAILED => qp(QpEventKind::PathMigrationError),
        WQ_INVAL_REQ_ERROR => qp(QpEventKind::RequestError),
        WQ_ACCESS_ERROR => qp(QpEventKind::AccessError),
        SRQ_QP_LAST_WQE => qp(QpEventKind::LastWqeReached),
        SRQ_LIMIT => DeviceEvent::Srq {
            srqn: obj,
            kind: SrqEventKind::LimitReached,
        },
        SRQ_CATAS_ERROR => DeviceEvent::Srq {
            srqn: obj,
            kind: SrqEventKind::Catastrophic,
        },
        CQ_ERROR => DeviceEvent::CqError {
            cqn: obj,
            syndrome: match e.data2.get() as u8 {
                1 => CqErrorSyndrome::Overrun,
                2 => CqErrorSyndrome::AccessViolation,
                s => CqErrorSyndrome::Unknown(s),
            },
        },
        PORT_CHANGE => {
            let port = (e.data2.get() >> 28) as u8;
            if port == 0 {
                return Err(EqeError::Malformed {
                    eqn,
                    index,
                    what: "port event for port 0",
                });
            }
            let kind = match e.subtype {
                port_subtype::DOWN => PortEventKind::Down,
                port_subtype::ACTIVE => PortEventKind::Active,
                port_subtype::GID_CHANGE => PortEventKind::GidChange,
                subtype => {
                    return Ok(DeviceEvent::Unknown {
                        event_type: PORT_CHANGE,
                        subtype,
                    });
                }
            };
            DeviceEvent::Port { port, kind }
        }
        LOCAL_CATAS_ERROR | EEC_CATAS_ERROR => DeviceEvent::DeviceFatal,
        CMD => {
            let (c, _) = CmdEqe::read_from_prefix(entry).map_err(|_| EqeError::Malformed {
                eqn,
                index,
                what: "entry shorter than 32 bytes",
            })?;
            DeviceEvent::CommandDone {
                token: c.token.get(),
                status: c.status,
                out_param: c.out_param.get(),
            }
        }
        t => DeviceEvent::Unknown {
            event_type: t,
            subtype: e.subtype,
        },
    })
}

/// Encodes an event as the HCA writes it.
pub fn encode(ev: &DeviceEvent, owner: bool) -> [u8; EQE_SIZE] {
    use event_type::*;
    let mut e = EqeLayout {
        owner: if owner { OWNER_MASK } else { 0 },
        ..Default::default()
    };
    let mut set = |t: u8, obj: u32| {
        e.event_type = t;
        e.obj = (obj & 0xff_ffff).into();
    };
    match *ev {
        DeviceEvent::Completion { cqn } => set(COMP, cqn),
        DeviceEvent::Qp { qpn, kind } => set(
            match kind {
                QpEventKind::Fatal => WQ_CATAS_ERROR,
                QpEventKind::RequestError => WQ_INVAL_REQ_ERROR,
                QpEventKind::AccessError => WQ_ACCESS_ERROR,
                QpEventKind::CommEstablished => COMM_EST,
                QpEventKind::SqDrained => SQ_DRAINED,
                QpEventKind::PathMigrated => PATH_MIG,
                QpEventKind::PathMigrationError => PATH_MIG_FAILED,
                QpEventKind::LastWqeReached => SRQ_QP_LAST_WQE,
            },
            qpn,
        ),
        DeviceEvent::Srq { srqn, kind } => set(
            match kind {
                SrqEventKind::LimitReached => SRQ_LIMIT,
                SrqEventKind::Catastrophic => SRQ_CATAS_ERROR,
            },
            srqn,
        ),
        DeviceEvent::CqError { cqn, syndrome } => {
            set(CQ_ERROR, cqn);
            e.data2 = u32::from(match syndrome {
                CqErrorSyndrome::Overrun => 1,
                CqErrorSyndrome::AccessViolation => 2,
                CqErrorSyndrome::Unknown(s) => s,
            })
            .into();
        }
        DeviceEvent::Port { port, kind } => {
            e.event_type = PORT_CHANGE;
            e.subtype = match kind {
                PortEventKind::Down => port_subtype::DOWN,
                PortEventKind::Active => port_subtype::ACTIVE,
                PortEventKind::GidChange => port_subtype::GID_CHANGE,
            };
            e.data2 = (u32::from(port & 0xf) << 28).into();
        }
        DeviceEvent::DeviceFatal => e.event_type = LOCAL_CATAS_ERROR,
        DeviceEvent::CommandDone {
            token,
            status,
            out_param,
        } => {
            let c = CmdEqe {
                event_type: CMD,
                token: token.into(),
                status,
                out_param: out_param.into(),
                owner: e.owner,
                ..Default::default()
            };
            let mut out = [0u8; EQE_SIZE];
            out.copy_from_slice(c.as_bytes());
            return out;
        }
        DeviceEvent::Unknown {
            event_type,
            subtype,
        } => {
            e.event_type = event_type;
            e.subtype = subtype;
        }
    }
    let mut out = [0u8; EQE_SIZE];
    out.copy_from_slice(e.as_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip() {
        let evs = [
            DeviceEvent::Completion { cqn: 0x85 },
            DeviceEvent::Qp {
                qpn: 0x48,
                kind: QpEventKind::Fatal,
            },
            DeviceEvent::Qp {
                qpn: 0x48,
                kind: QpEventKind::LastWqeReached,
            },
            DeviceEvent::Srq {
                srqn: 3,
                kind: SrqEventKind::LimitReached,
            },
            DeviceEvent::CqError {
                cqn: 9,
                syndrome: CqErrorSyndrome::Overrun,
            },
            DeviceEvent::Port {
                port: 2,
                kind: PortEventKind::Active,
            },
            DeviceEvent::DeviceFatal,
            DeviceEvent::CommandDone {
                token: 0x1234,
                status: 0x10,
                out_param: 0xdead_beef_0000_0001,
            },
        ];
        for (i, ev) in evs.iter().enumerate() {
            let b = encode(ev, i % 2 == 1);
            assert_eq!(owner(&b), i % 2 == 1);
            assert_eq!(&decode(&b, 1, 0).unwrap(), ev);
        }
    }

    #[test]
    fn command_completion_fields_sit_where_the_facts_say() {
        let b = encode(
            &DeviceEvent::CommandDone {
                token: 0xabcd,
                status: 3,
                out_param: 0x1122_3344_5566_7788,
            },
            false,
        );
        assert_eq!(b[1], 0x0a);
        assert_eq!(&b[6..8], &[0xab, 0xcd]);
        assert_eq!(b[15], 3);
        assert_eq!(&b[16..24], &0x1122_3344_5566_7788u64.to_be_bytes());
    }

    #[test]
    fn port_zero_is_malformed() {
        let mut b = [0u8; 32];
        b[1] = event_type::PORT_CHANGE;
        b[3] = port_subtype::ACTIVE;
        assert!(decode(&b, 0, 0).is_err());
    }
}

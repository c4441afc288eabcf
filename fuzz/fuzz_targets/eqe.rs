//! Arbitrary bytes as an EQE the device wrote: `layout::eqe::decode` must not panic, decoded
//! numbers must fit their fields, the only refusal of a full entry is a port event naming no
//! port, and what it accepts must survive re-encoding unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use portverbs_hal::error::EqeError;
use portverbs_hal::event::DeviceEvent;
use portverbs_mlx4::layout::eqe::{self, event_type};

fuzz_target!(|data: &[u8]| {
    let res = eqe::decode(data, 3, 9);
    if data.len() < eqe::EQE_SIZE {
        assert!(matches!(res, Err(EqeError::Malformed { .. })), "{res:?}");
        return;
    }
    match res {
        Ok(ev) => {
            match ev {
                DeviceEvent::Completion { cqn: n }
                | DeviceEvent::Qp { qpn: n, .. }
                | DeviceEvent::Srq { srqn: n, .. }
                | DeviceEvent::CqError { cqn: n, .. } => assert!(n <= 0xff_ffff),
                DeviceEvent::Port { port, .. } => assert!((1..=15).contains(&port)),
                _ => {}
            }
            // A port change with an unknown subtype keeps no port in the portable event, so
            // it cannot be re-encoded faithfully.
            let lossy = matches!(
                ev,
                DeviceEvent::Unknown { event_type: t, .. } if t == event_type::PORT_CHANGE
            );
            if !lossy {
                for owner in [false, true] {
                    let again = eqe::encode(&ev, owner);
                    assert_eq!(eqe::owner(&again), owner);
                    assert_eq!(eqe::decode(&again, 3, 9), Ok(ev));
                }
            }
        }
        Err(EqeError::Malformed { .. }) => {
            assert_eq!(data[1], event_type::PORT_CHANGE);
            assert_eq!(data[12] >> 4, 0);
        }
        Err(e) => panic!("unexpected error: {e:?}"),
    }
});

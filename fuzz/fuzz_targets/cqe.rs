//! Arbitrary bytes as a CQE the device wrote: `layout::cqe::decode` must not panic, must never
//! complete an error CQE as Success, must name unknown opcodes, and what it accepts must survive
//! re-encoding unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use portverbs_hal::error::CqeError;
use portverbs_hal::wc::WcStatus;
use portverbs_mlx4::layout::cqe;

fuzz_target!(|data: &[u8]| {
    let res = cqe::decode(data, 0x85, 7);
    let Some(&osr) = data.get(cqe::CQE_SIZE - 1) else {
        assert!(matches!(res, Err(CqeError::Malformed { .. })), "{res:?}");
        return;
    };
    let opcode = osr & cqe::OPCODE_MASK;
    match res {
        Ok(c) => {
            assert_eq!(c.wqe.is_send, osr & cqe::IS_SEND_MASK != 0);
            assert!(c.wc.qp_num <= 0xff_ffff && c.wc.src_qp <= 0xff_ffff);
            assert!(c.wc.sl <= 0xf && c.wc.dlid_path_bits <= 0x7f && c.wc.pkey_index <= 0x7f);
            if opcode == cqe::OPCODE_ERROR {
                assert_ne!(
                    c.wc.status,
                    WcStatus::Success,
                    "error CQE completed as Success"
                );
            } else {
                assert_eq!(c.wc.status, WcStatus::Success);
            }
            for owner in [false, true] {
                let again = cqe::encode(&c, owner);
                assert_eq!(cqe::owner(&again), owner);
                assert_eq!(cqe::decode(&again, 0x85, 7), Ok(c));
            }
        }
        Err(CqeError::BadOpcode { opcode: o, .. }) => {
            assert_eq!(o, opcode);
            assert_ne!(o, cqe::OPCODE_ERROR);
        }
        Err(e) => panic!("unexpected error for a full entry: {e:?}"),
    }
});

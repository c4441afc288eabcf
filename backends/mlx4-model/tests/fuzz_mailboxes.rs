//! Arbitrary bytes in every mailbox the model parses, in WQEs, doorbell records and registers
//! never panic: every command completes (go clears) with a status the hardware defines.

mod util;

use portverbs_hal::types::{Gid, QpType};
use portverbs_mlx4::layout::ctx::{mpt_flag, service};
use portverbs_mlx4::layout::hcr::{StatusWord, dword};
use portverbs_mlx4::layout::opcode as op;
use portverbs_mlx4::layout::status::Status;
use portverbs_soft::Fabric;
use proptest::prelude::*;
use util::*;

/// Every opcode whose inbox the model parses, and a few more.
const OPCODES: &[u16] = &[
    op::INIT_HCA,
    op::MAP_FA,
    op::MAP_ICM_AUX,
    op::MAP_ICM,
    op::UNMAP_ICM,
    op::SET_ICM_SIZE,
    op::SW2HW_EQ,
    op::SW2HW_CQ,
    op::SW2HW_SRQ,
    op::SW2HW_MPT,
    op::WRITE_MTT,
    op::MODIFY_CQ,
    op::RST2INIT_QP,
    op::INIT2INIT_QP,
    op::INIT2RTR_QP,
    op::RTR2RTS_QP,
    op::RTS2RTS_QP,
    op::SQERR2RTS_QP,
    op::SQD2RTS_QP,
    op::SQD2SQD_QP,
    op::RTS2SQD_QP,
    op::ERR_QP,
    op::RST_QP,
    op::QUERY_QP,
    op::QUERY_CQ,
    op::QUERY_EQ,
    op::QUERY_SRQ,
    op::QUERY_MPT,
    op::HW2SW_MPT,
    op::HW2SW_CQ,
    op::HW2SW_EQ,
    op::HW2SW_SRQ,
    op::MAP_EQ,
    op::ARM_SRQ,
    op::SET_PORT,
    op::INIT_PORT,
    op::CLOSE_PORT,
    op::QUERY_PORT,
    op::CONF_SPECIAL_QP,
    op::CLOSE_HCA,
    op::MAD_IFC,
    op::MGID_HASH,
    op::READ_MCG,
    op::WRITE_MCG,
];

struct Live {
    fabric: Fabric,
    d: Dev,
    cq: Cq,
    qp: Qp,
    _p: Peer,
}

fn live(seed: u64) -> Live {
    let fabric = Fabric::stepped(seed);
    let mut d = Dev::new(&fabric, 2);
    d.bring_up();
    assert_eq!(d.cmd0(op::INIT_PORT, 0, 0, 1), 0);
    assert_eq!(d.set_gids(1, &[Gid::parse("10.9.0.1").unwrap()]), 0);
    let eq = d.eq(4, 6, 0);
    d.map_all_events(&eq);
    let cq = d.cq(128, 4, eq.eqn);
    let _mr = d.mr(
        16,
        1 << 14,
        1,
        mpt_flag::LOCAL_WRITE | mpt_flag::REMOTE_WRITE,
    );
    let p = peer(&fabric, "10.9.0.2", QpType::Rc);
    let qp = d.qp_init(0x48, service::RC, &cq, 1, (4, 7), (4, 5), 0);
    d.qp_rts(&qp, false, p.qp.qpn, p.gid, 1);
    p.connect(0x48, Gid::parse("10.9.0.1").unwrap(), 1);
    Live {
        fabric,
        d,
        cq,
        qp,
        _p: p,
    }
}

fn in_mod() -> impl Strategy<Value = u32> {
    prop_oneof![
        0u32..300,
        Just(0x48),
        Just(128),
        Just(16),
        Just(4),
        Just(1 | (5 << 8)),
        any::<u32>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_mailboxes_get_a_status(
        cmds in proptest::collection::vec(
            (proptest::sample::select(OPCODES), 0u8..16, in_mod(),
             proptest::collection::vec(any::<u8>(), 0..600), any::<u64>(), any::<bool>()),
            1..6,
        ),
        seed in 0u64..4,
    ) {
        let mut l = live(seed);
        for (opcode, opmod, in_mod, bytes, param, use_inbox) in cmds {
            l.d.inbox.fill(0, 4096, 0).unwrap();
            l.d.inbox.write(0, &bytes).unwrap();
            let in_param = if use_inbox { l.d.inbox.device_addr() } else { param };
            let out = if use_inbox { l.d.outbox.device_addr() } else { param.rotate_left(17) };
            l.d.post(opcode, opmod, in_param, in_mod, out, false, 0xffff);
            let w = StatusWord(l.d.hcr(dword::STATUS));
            prop_assert!(!w.go());
            prop_assert!(Status::from_u8(w.status()).is_some(), "status {:#x}", w.status());
        }
        let _ = l.fabric.run_until_idle();
        let _ = l.cq.poll();
        let _ = l.d.model.counts();
    }

    #[test]
    fn arbitrary_wqes_records_and_doorbells_never_panic(
        sq in proptest::collection::vec(any::<u8>(), 16 * 128),
        rq in proptest::collection::vec(any::<u8>(), 16 * 32),
        db in any::<u32>(),
        regs in proptest::collection::vec((0usize..(2 << 20) / 4, any::<u32>(), any::<bool>()), 0..24),
        heads in 1u32..40,
        seed in 0u64..4,
    ) {
        let mut l = live(seed);
        l.qp.buf.write(l.qp.sq_off, &sq).unwrap();
        l.qp.buf.write(l.qp.rq_off, &rq).unwrap();
        l.qp.db.write(0, &db.to_be_bytes()).unwrap();
        for _ in 0..heads.min(3) {
            l.d.send_doorbell(0x48);
        }
        for (dw, v, bar2) in regs {
            let off = dw * 4;
            if bar2 {
                let _ = l.d.bar2.write32(off, v);
                let _ = l.d.bar2.write64(off & !7, u64::from(v) << 32 | u64::from(v));
                let _ = l.d.bar2.write_wc(off & !63, &[v as u8; 64]);
            } else if off < (1 << 20) && off != 0xf0010 {
                let _ = l.d.bar0.write32(off, v & !(1 << 23));
            }
        }
        let _ = l.fabric.run_until_idle();
        let _ = l.cq.poll();
        // Whatever happened, the command interface still answers.
        let (s, _) = l.d.cmd_out(op::QUERY_FW, 0, 0);
        prop_assert_eq!(s, 0);
    }
}

//! Worked encodings, computed by hand from the mlx4 layouts, that the unit tests beside the layouts
//! do not already cover, each built with our layout types and compared byte for byte.
//!
//! Covered elsewhere: the HCR status words (`layout::hcr`), the CQ-arm and EQ-doorbell words
//! (`layout::uar`), the key rotation (`layout::keys`), the send CQE of an RDMA WRITE and the
//! second-pass SEND_WITH_IMM receive CQE (`layout::cqe`), and the SW2HW_CQ context
//! (`layout::ctx`).

use portverbs_mlx4::layout::ctx::Mpt;
use portverbs_mlx4::layout::eqe::event_type;
use portverbs_mlx4::layout::hcr::{self, Hcr, StatusWord};
use portverbs_mlx4::layout::wqe::{
    self, CtrlSeg, DataSeg, InlineSeg, RaddrSeg, ctrl, opcode as op,
};
use portverbs_mlx4::layout::{keys, opcode, uar};
use zerocopy::byteorder::big_endian::U32;
use zerocopy::{FromBytes, IntoBytes};

/// The big-endian dword at byte offset `off`.
fn be32(b: &[u8], off: usize) -> u32 {
    u32::from_be_bytes(b[off..off + 4].try_into().unwrap())
}

/// The owner bit a send WQE with producer counter `counter` carries in a ring of `wqe_cnt`
/// slots (set on odd passes, as rdma-core does).
fn owner_for(counter: u32, wqe_cnt: u32) -> u32 {
    if counter & wqe_cnt != 0 {
        ctrl::OWNER
    } else {
        0
    }
}

#[test]
fn hcr_first_command_after_reset_and_the_poll_token() {
    // QUERY_FW, polling, t = 1: dw5 = 0xffff0000 (poll token), dw6 = 0x00a00004.
    let h = Hcr {
        token: (u32::from(hcr::POLL_TOKEN) << 16).into(),
        status: StatusWord::post(opcode::QUERY_FW, 0, true, false).0.into(),
        ..Hcr::default()
    };
    let b = h.as_bytes();
    assert_eq!(be32(b, hcr::dword::TOKEN), 0xffff_0000);
    assert_eq!(be32(b, hcr::dword::STATUS), 0x00a0_0004);
    // The next command toggles t back to 0: QUERY_DEV_CAP.
    assert_eq!(
        StatusWord::post(opcode::QUERY_DEV_CAP, 0, false, false).0,
        0x0080_0003
    );
}

#[test]
fn hcr_2rst_qp_on_qp_0x48() {
    // dw2 = 0x00000048; dw6 = 0x00a02021 (opmod 2 in bits 15:12).
    let h = Hcr {
        in_modifier: 0x48.into(),
        status: StatusWord::post(opcode::RST_QP, opcode::OPMOD_RST_NO_OUTBOX, true, false)
            .0
            .into(),
        ..Hcr::default()
    };
    let b = h.as_bytes();
    assert_eq!(hcr::dword::IN_MODIFIER, 8);
    assert_eq!(&b[hcr::dword::IN_MODIFIER..][..4], &[0, 0, 0, 0x48]);
    assert_eq!(be32(b, hcr::dword::STATUS), 0x00a0_2021);
}

#[test]
fn map_eq_in_param_and_in_mod() {
    // in_param: bit n = event type n, e.g. command completions (0x0a) = 0x400.
    assert_eq!(1u64 << event_type::CMD, 0x400);
    // in_mod = EQ number; unmapping sets bit 31.
    let eqn = 1u32;
    assert_eq!((1u32 << 31) | eqn, 0x8000_0001);
    // Every type the async mask maps is a real event type (below 64, one bit each).
    let mask = portverbs_mlx4::layout::eqe::ASYNC_EVENT_MASK;
    for t in [
        event_type::PATH_MIG,
        event_type::COMM_EST,
        event_type::SQ_DRAINED,
        event_type::CQ_ERROR,
        event_type::WQ_CATAS_ERROR,
        event_type::PORT_CHANGE,
        event_type::WQ_INVAL_REQ_ERROR,
        event_type::WQ_ACCESS_ERROR,
        event_type::SRQ_CATAS_ERROR,
        event_type::SRQ_QP_LAST_WQE,
        event_type::SRQ_LIMIT,
    ] {
        assert_ne!(mask & (1 << t), 0, "async mask lacks event type {t:#x}");
    }
    // Completion events are routed by the CQ context, never by MAP_EQ.
    assert_eq!(mask & (1 << event_type::COMP), 0);
}

#[test]
fn mpt_key_field_and_sw2hw_mpt_in_mod() {
    // MPT index 0x21, first use: lkey = rkey = 0x2100, key field (0x08) = 0x21, in_mod = 0x21.
    let key = keys::index_to_key(0x21);
    assert_eq!(key, 0x0000_2100);
    let mpt = Mpt {
        key: keys::key_to_hw(key).into(),
        lkey: key.into(),
        ..Mpt::default()
    };
    let b = mpt.as_bytes();
    assert_eq!(be32(b, 0x08), 0x0000_0021);
    assert_eq!(be32(b, 0x20), 0x0000_2100);
    assert_eq!(keys::key_to_index(key, 1 << 17), 0x21);
    // Same index with tag byte 0x77 (iPXE style): key field 0x77000021, lkey 0x2177.
    let tagged = Mpt {
        key: 0x7700_0021.into(),
        ..Mpt::default()
    };
    assert_eq!(be32(tagged.as_bytes(), 0x08), 0x7700_0021);
    assert_eq!(keys::key_to_hw(0x2177), 0x7700_0021);
    assert_eq!(tagged.key.get().rotate_left(8), 0x2177);
    // Read back from device bytes.
    let back = Mpt::read_from_bytes(b).unwrap();
    assert_eq!(back.key.get(), 0x21);
}

#[test]
fn cq_arm_doorbell_as_one_64_bit_store() {
    // CQ 0x85, arm_sn 1, ci 0, "next": UAR+0x20 dword0 = 0x12000085, dword1 = 0.
    let dw0 = uar::cq_arm_word(1, uar::CQ_REQ_NOT, 0x85);
    let ci = 0u32;
    let v = (u64::from(dw0) << 32) | u64::from(ci & 0xff_ffff);
    assert_eq!(v.to_be_bytes(), [0x12, 0, 0, 0x85, 0, 0, 0, 0]);
    assert_eq!(uar::CQ_DOORBELL, 0x20);
    // After one event (sn 2), ci 0x10, solicited: dword0 = 0x21000085, dword1 = 0x10.
    let dw0 = uar::cq_arm_word(2, uar::CQ_REQ_NOT_SOL, 0x85);
    let v = (u64::from(dw0) << 32) | 0x10;
    assert_eq!(v.to_be_bytes(), [0x21, 0, 0, 0x85, 0, 0, 0, 0x10]);
}

#[test]
fn send_doorbell_for_qp_0x48() {
    // BE32 0x00004800 to UAR + 0x14.
    assert_eq!(uar::SEND_DOORBELL, 0x14);
    let v: U32 = (0x48u32 << 8).into();
    assert_eq!(v.as_bytes(), &[0x00, 0x00, 0x48, 0x00]);
}

/// The signaled SEND of 64 bytes with one SGE at WQE counter `counter` of a `wqe_cnt` ring.
fn send_wqe(counter: u32, wqe_cnt: u32) -> Vec<u8> {
    let ctrl_seg = CtrlSeg {
        owner_opcode: (owner_for(counter, wqe_cnt) | u32::from(op::SEND)).into(),
        fence_size: 2,
        srcrb_flags: ctrl::CQ_UPDATE.into(),
        ..CtrlSeg::default()
    };
    let data = DataSeg {
        byte_count: 64.into(),
        lkey: 0x2100.into(),
        addr: 0x1000.into(),
    };
    [ctrl_seg.as_bytes(), data.as_bytes()].concat()
}

#[test]
fn signaled_send_with_one_sge() {
    // ctrl: 0x0000000a, 0x00000002 (ds = 2), 0x0000000c (C = 3), 0x00000000;
    // data seg: 0x00000040, 0x00002100, 0x00000000_00001000.
    let w = send_wqe(0, 64);
    assert_eq!(w.len(), 32);
    let words: Vec<u32> = (0..8).map(|i| be32(&w, 4 * i)).collect();
    assert_eq!(
        words,
        [
            0x0000_000a,
            0x0000_0002,
            0x0000_000c,
            0x0000_0000,
            0x0000_0040,
            0x0000_2100,
            0x0000_0000,
            0x0000_1000
        ]
    );
    // ds counts the whole WQE in 16-byte units.
    assert_eq!(
        usize::from(w[7] & ctrl::DS_MASK) * 16,
        w.len(),
        "ds covers ctrl + one data segment"
    );
}

#[test]
fn same_slot_one_ring_pass_later() {
    // counter = wqe_cnt: same slot, owner bit set.
    let wqe_cnt = 64;
    let w = send_wqe(wqe_cnt, wqe_cnt);
    assert_eq!(be32(&w, 0), 0x8000_000a);
    assert_eq!(&w[4..], &send_wqe(0, wqe_cnt)[4..]);
    // Two passes later the bit is clear again.
    assert_eq!(be32(&send_wqe(2 * wqe_cnt, wqe_cnt), 0), 0x0000_000a);
}

#[test]
fn rdma_write_of_8_bytes_inline() {
    // ds = 3 = ctrl 1 + raddr 1 + inline ⌈(4 + 8) / 16⌉ = 1; header 0x80000008; C = 3.
    let payload = *b"8 bytes!";
    let inline_units = (size_of::<InlineSeg>() + payload.len()).div_ceil(16);
    let ds = (size_of::<CtrlSeg>() + size_of::<RaddrSeg>()) / 16 + inline_units;
    assert_eq!(ds, 3);
    let ctrl_seg = CtrlSeg {
        owner_opcode: u32::from(op::RDMA_WRITE).into(),
        fence_size: ds as u8,
        srcrb_flags: ctrl::CQ_UPDATE.into(),
        ..CtrlSeg::default()
    };
    let raddr = RaddrSeg {
        raddr: 0x7000_0000.into(),
        rkey: 0x2200.into(),
        ..RaddrSeg::default()
    };
    let header = InlineSeg {
        byte_count: (wqe::INLINE_SEG | payload.len() as u32).into(),
    };
    // One 64-byte slot (QP stride 64); the inline segment stays inside the first 64 bytes.
    let mut slot = [0u8; 64];
    let mut at = 0;
    for part in [
        ctrl_seg.as_bytes(),
        raddr.as_bytes(),
        header.as_bytes(),
        &payload[..],
    ] {
        slot[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    assert!(at <= ds * 16 && ds * 16 <= wqe::INLINE_ALIGN);
    assert_eq!(be32(&slot, 0), 0x0000_0008);
    assert_eq!(slot[7], 3);
    assert_eq!(be32(&slot, 8), 0x0000_000c);
    assert_eq!(be32(&slot, 32), 0x8000_0008);
    assert_eq!(&slot[36..44], &payload);
}

#[test]
fn rq_doorbell_record_after_three_receives() {
    // The record holds the 16-bit producer counter, big-endian: BE32 0x00000003.
    let head: u32 = 3;
    let rec: U32 = (head & 0xffff).into();
    assert_eq!(rec.as_bytes(), &[0, 0, 0, 3]);
    // It wraps at 2^16.
    let rec: U32 = ((0x1_0003u32) & 0xffff).into();
    assert_eq!(rec.as_bytes(), &[0, 0, 0, 3]);
}

#[test]
fn receive_wqe_terminator() {
    // A scatter list shorter than the slot ends with {0, MLX4_INVALID_LKEY, 0} (rdma-core
    // `providers/mlx4/qp.c`).
    let t = DataSeg {
        byte_count: 0.into(),
        lkey: wqe::INVALID_LKEY.into(),
        addr: 0.into(),
    };
    assert_eq!(
        t.as_bytes(),
        &[0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
}

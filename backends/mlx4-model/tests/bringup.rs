//! Bring-up by hand at the register level: the HCR protocol, the firmware state machine and its
//! refusals, objects created and destroyed with their contexts in ICM, bad numbers, illegal QP
//! transitions, unmapped ICM.

mod util;

use std::sync::Arc;

use portverbs_hal::event::DeviceEvent;
use portverbs_mlx4::PciFunction;
use portverbs_mlx4::layout::ctx::{
    CqContext, EqContext, Mpt, QpMailbox, SrqContext, mtt_split, qp_state,
};
use portverbs_mlx4::layout::hcr::{HCR_BASE, OWNER_SEMAPHORE, RESET_SEMAPHORE, StatusWord, dword};
use portverbs_mlx4::layout::mailbox::{DevCap, QueryFw, QueryPort};
use portverbs_mlx4::layout::opcode as op;
use portverbs_mlx4::layout::{keys, read};
use portverbs_soft::Fabric;
use util::*;
use zerocopy::IntoBytes;

const OK: u8 = 0x00;
const BAD_OP: u8 = 0x02;
const BAD_PARAM: u8 = 0x03;
const BAD_SYS_STATE: u8 = 0x04;
const BAD_RESOURCE: u8 = 0x05;
const RESOURCE_BUSY: u8 = 0x06;
const BAD_RES_STATE: u8 = 0x09;
const BAD_INDEX: u8 = 0x0a;
const ICM_ERROR: u8 = 0x0c;
const BAD_QP_STATE: u8 = 0x10;

fn dev() -> (Fabric, Dev) {
    let fabric = Fabric::stepped(1);
    let d = Dev::new(&fabric, 1);
    (fabric, d)
}

#[test]
fn pci_identity_and_bars() {
    let (_f, d) = dev();
    assert_eq!(d.func.ids(), (0x15b3, 0x1003));
    assert_eq!(d.func.config_read16(0).unwrap(), 0x15b3);
    assert_eq!(d.bar0.len(), 1 << 20);
    assert_eq!(d.bar2.len(), 2 << 20);
    assert!(d.func.bar(1).is_err());
    assert_eq!(d.func.reset_settle(), std::time::Duration::ZERO);
    assert_eq!(d.bar0.read32(RESET_SEMAPHORE).unwrap(), 0);
    assert_eq!(d.bar0.read32(OWNER_SEMAPHORE).unwrap(), 0, "acquired");
    assert_eq!(d.bar0.read32(OWNER_SEMAPHORE).unwrap(), 1, "now owned");
    d.bar0.write32(OWNER_SEMAPHORE, 0).unwrap();
    assert_eq!(d.bar0.read32(OWNER_SEMAPHORE).unwrap(), 0, "released");
    // DMA regions live at bus addresses unlike their host addresses.
    let m = d.alloc(100);
    assert_eq!(m.len(), 4096);
    assert!(m.device_addr() >= portverbs_mlx4_model::IOVA_BASE);
    assert_ne!(m.device_addr(), m.host_addr());
    assert!(
        d.func
            .route_interrupt(
                portverbs_mlx4_model::ModelConfig::default().num_vectors,
                Arc::new(Counter::default())
            )
            .is_err()
    );
}

#[test]
fn bring_up_by_hand() {
    let (_f, mut d) = dev();
    d.reset();
    assert_eq!(d.hcr(dword::STATUS) & (1 << 21), 0, "t reads 0 after reset");
    let (s, out) = d.cmd_out(op::QUERY_FW, 0, 0);
    assert_eq!(s, OK);
    let fw: QueryFw = read(&out).unwrap();
    assert_eq!((fw.fw_pages.get(), fw.cmd_if_rev.get()), (64, 3));
    d.bring_up();
    let (s, out) = d.cmd_out(op::QUERY_DEV_CAP, 0, 0);
    assert_eq!(s, OK);
    let cap: DevCap = read(&out).unwrap();
    assert_eq!(cap.log_rsvd_qp, 6);
    assert_eq!(cap.qpc_entry_sz.get(), 256);
    assert_eq!(cap.max_desc_sz_sq.get(), 1008);
    assert_eq!(cap.bf, 0x80);
    let (s, out) = d.cmd_out(op::QUERY_HCA, 0, 0);
    assert_eq!(s, OK);
    assert_eq!(&out[..0x130], Dev::init_hca_inbox().as_bytes());
    let (s, out) = d.cmd_out(op::QUERY_PORT, 0, 1);
    assert_eq!(s, OK);
    let p: QueryPort = read(&out).unwrap();
    assert_eq!(p.link, 0x02, "Ethernet, link down before INIT_PORT");
    assert_eq!(d.cmd0(op::INIT_PORT, 0, 0, 1), OK);
    let (_, out) = d.cmd_out(op::QUERY_PORT, 0, 1);
    assert_eq!(read::<QueryPort>(&out).unwrap().link, 0x82);
    assert_eq!(d.cmd0(op::INIT_PORT, 0, 0, 2), BAD_PARAM, "one port only");
    let c = d.model.counts();
    assert_eq!((c.fw_pages, c.aux_pages), (64, 1));
    assert_eq!(c.icm_pages as u64, ICM_BYTES / 4096 - 1);
}

#[test]
fn toggle_status_and_immediate_output() {
    let (_f, mut d) = dev();
    d.reset();
    // The first command after reset carries t = 1 (dw6 = 0x00a00004).
    assert!(d.toggle);
    d.run_fw();
    // An unknown opcode completes with BAD_OP and go clear.
    let (s, _) = d.cmd(0xabc, 0, 0, 0, 0);
    assert_eq!(s, BAD_OP);
    // SET_ICM_SIZE's immediate output lands in out_param.
    let (s, aux) = d.cmd(op::SET_ICM_SIZE, 0, ICM_SIZE, 0, 0xdead_beef);
    assert_eq!((s, aux), (OK, 1));
    let w = StatusWord(d.hcr(dword::STATUS));
    assert_eq!(w.opcode(), op::SET_ICM_SIZE);
    assert!(!w.go());
    // The status dword keeps the toggle bit as written, for both values.
    for _ in 0..3 {
        let t = d.toggle;
        d.cmd(op::QUERY_FW, 0, 0, 0, d.outbox.device_addr());
        assert_eq!(StatusWord(d.hcr(dword::STATUS)).toggle(), t);
    }
}

#[test]
fn event_mode_completion_eqe() {
    let (_f, mut d) = dev();
    d.bring_up();
    let sink = Arc::new(Counter::default());
    d.func.route_interrupt(3, sink.clone()).unwrap();
    let mut eq = d.eq(4, 6, 3);
    // Without an EQ mapped for command completions, e = 1 only clears go.
    d.post(op::NOP, 0, 0, 0x1f, 0, true, 7);
    assert!(!StatusWord(d.hcr(dword::STATUS)).go());
    assert!(eq.poll().is_empty());
    d.map_all_events(&eq);
    d.post(op::NOP, 0, 0, 0x1f, 0, true, 0x1234);
    let w = StatusWord(d.hcr(dword::STATUS));
    assert!(!w.go() && w.event());
    assert_eq!(
        eq.poll(),
        vec![DeviceEvent::CommandDone {
            token: 0x1234,
            status: 0,
            out_param: 0
        }]
    );
    assert_eq!(sink.get(), 1, "created armed: one interrupt");
    // Fired: no interrupt until re-armed.
    d.post(op::SET_ICM_SIZE, 0, 1, 0, 0, true, 0x55);
    assert_eq!(
        eq.poll(),
        vec![DeviceEvent::CommandDone {
            token: 0x55,
            status: BAD_SYS_STATE,
            out_param: 0
        }]
    );
    assert_eq!(sink.get(), 1);
    d.eq_doorbell(&eq, true);
    d.post(op::NOP, 0, 0, 0x1f, 0, true, 9);
    assert_eq!(eq.poll().len(), 1);
    assert_eq!(sink.get(), 2);
    // Arming with unconsumed EQEs interrupts at once.
    d.post(op::NOP, 0, 0, 0x1f, 0, true, 10);
    d.eq_doorbell(&eq, true);
    assert_eq!(sink.get(), 3);
}

#[test]
fn firmware_state_machine_refusals() {
    let (_f, mut d) = dev();
    d.reset();
    // Before RUN_FW only QUERY_FW, MAP_FA, UNMAP_FA, RUN_FW.
    for opcode in [
        op::QUERY_DEV_CAP,
        op::INIT_HCA,
        op::SET_ICM_SIZE,
        op::SW2HW_EQ,
        op::NOP,
    ] {
        assert_eq!(
            d.cmd0(opcode, 0, 0, 0),
            BAD_SYS_STATE,
            "{}",
            op::name(opcode)
        );
    }
    assert_eq!(d.cmd0(0x7ff, 0, 0, 0), BAD_OP);
    assert_eq!(
        d.cmd0(op::RUN_FW, 0, 0, 0),
        BAD_SYS_STATE,
        "no firmware area"
    );
    let fw = d.alloc(64 * 4096);
    let half = Dev::page_list(&fw, None, 32);
    assert_eq!(d.cmd_in(op::MAP_FA, 0, 32, &half), OK);
    assert_eq!(d.cmd0(op::RUN_FW, 0, 0, 0), BAD_SYS_STATE, "32 of 64 pages");
    // A chunk that is not in any DMA region, and a misaligned chunk.
    let mut bad = Dev::page_list(&fw, None, 1);
    bad[8..16].copy_from_slice(&0x1000u64.to_be_bytes());
    assert_eq!(d.cmd_in(op::MAP_FA, 0, 1, &bad), BAD_PARAM);
    bad[8..16].copy_from_slice(&((fw.device_addr() + 4096) | 1).to_be_bytes());
    assert_eq!(d.cmd_in(op::MAP_FA, 0, 1, &bad), BAD_PARAM);
    let rest = Dev::page_list(&fw, None, 64);
    assert_eq!(d.cmd_in(op::MAP_FA, 0, 32, &rest[32 * 16..]), OK);
    assert_eq!(d.cmd0(op::RUN_FW, 0, 0, 0), OK);
    // Before INIT_HCA: no objects, no second RUN_FW or MAP_FA.
    for opcode in [
        op::SW2HW_EQ,
        op::SW2HW_CQ,
        op::RST2INIT_QP,
        op::MAP_FA,
        op::RUN_FW,
        op::CLOSE_HCA,
    ] {
        assert_eq!(
            d.cmd0(opcode, 0, 0, 0),
            BAD_SYS_STATE,
            "{}",
            op::name(opcode)
        );
    }
    let init = Dev::init_hca_inbox();
    assert_eq!(
        d.cmd_in(op::INIT_HCA, 0, 0, init.as_bytes()),
        BAD_SYS_STATE,
        "no ICM size"
    );
    assert_eq!(d.cmd0(op::SET_ICM_SIZE, 0, 0, 0), BAD_PARAM);
    assert_eq!(d.cmd(op::SET_ICM_SIZE, 0, ICM_SIZE, 0, 0), (OK, 1));
    assert_eq!(
        d.cmd_in(op::INIT_HCA, 0, 0, init.as_bytes()),
        BAD_SYS_STATE,
        "no aux pages"
    );
    let aux = d.alloc(4096);
    assert_eq!(
        d.cmd_in(op::MAP_ICM_AUX, 0, 1, &Dev::page_list(&aux, None, 1)),
        OK
    );
    let mut m = init;
    m.version = 1;
    assert_eq!(
        d.cmd_in(op::INIT_HCA, 0, 0, m.as_bytes()),
        BAD_PARAM,
        "version"
    );
    let mut m = init;
    m.flags = 2.into();
    assert_eq!(
        d.cmd_in(op::INIT_HCA, 0, 0, m.as_bytes()),
        BAD_PARAM,
        "big-endian flag"
    );
    let mut m = init;
    m.qpc_base_log = (ICM_SIZE | u64::from(LOG_QP)).into();
    assert_eq!(
        d.cmd_in(op::INIT_HCA, 0, 0, m.as_bytes()),
        BAD_PARAM,
        "QPC outside ICM"
    );
    let mut m = init;
    m.cqc_base_log = (CQC | 30).into();
    assert_eq!(
        d.cmd_in(op::INIT_HCA, 0, 0, m.as_bytes()),
        BAD_PARAM,
        "too many CQs"
    );
    assert_eq!(d.cmd_in(op::INIT_HCA, 0, 0, init.as_bytes()), OK);
    // After INIT_HCA: no second INIT_HCA, RUN_FW, MAP_FA, SET_ICM_SIZE.
    for opcode in [
        op::INIT_HCA,
        op::RUN_FW,
        op::MAP_FA,
        op::SET_ICM_SIZE,
        op::UNMAP_FA,
    ] {
        assert_eq!(
            d.cmd0(opcode, 0, 0, 0),
            BAD_SYS_STATE,
            "{}",
            op::name(opcode)
        );
    }
    // CLOSE_HCA goes back to the pre-INIT state; UNMAP_FA back to before RUN_FW.
    assert_eq!(d.cmd0(op::CLOSE_HCA, 0, 0, 0), OK);
    assert_eq!(d.cmd0(op::SW2HW_EQ, 0, 0, 4), BAD_SYS_STATE);
    assert_eq!(
        d.cmd_in(op::INIT_HCA, 0, 0, init.as_bytes()),
        OK,
        "INIT_HCA again"
    );
    assert_eq!(d.cmd0(op::CLOSE_HCA, 0, 0, 0), OK);
    assert_eq!(d.cmd0(op::UNMAP_ICM_AUX, 0, 0, 0), OK);
    assert_eq!(d.cmd0(op::UNMAP_FA, 0, 0, 0), OK);
    assert_eq!(d.cmd0(op::QUERY_DEV_CAP, 0, 0, 0), BAD_SYS_STATE);
    assert_eq!(
        d.cmd0(op::RUN_FW, 0, 0, 0),
        BAD_SYS_STATE,
        "firmware area gone"
    );
}

fn icm_bytes(d: &Dev, virt: u64, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    d.icm.as_ref().unwrap().read(virt as usize, &mut v).unwrap();
    v
}

#[test]
fn objects_round_trip_through_icm() {
    let (_f, mut d) = dev();
    d.bring_up();
    // EQ.
    let eq = d.eq(5, 4, 0);
    let (s, out) = d.cmd_out(op::QUERY_EQ, 0, 5);
    assert_eq!(s, OK);
    let q: EqContext = read(&out).unwrap();
    assert_eq!((q.log_eq_size, q.flags.get() & 0xf00), (4, 0x900));
    let raw = icm_bytes(&d, EQC + 5 * 64, 64);
    assert_eq!(
        read::<EqContext>(&raw).unwrap().log_eq_size,
        4,
        "context lives in ICM"
    );
    // Every EQE starts hardware-owned.
    let mut e = [0u8; 32];
    eq.buf.read(15 * 32, &mut e).unwrap();
    assert_eq!(e[31], 0x80);
    assert_eq!(
        d.cmd_in(op::SW2HW_EQ, 0, 5, &[0u8; 64]),
        BAD_RES_STATE,
        "exists"
    );
    // CQ.
    let cq = d.cq(130, 3, eq.eqn);
    let (s, out) = d.cmd_out(op::QUERY_CQ, 0, 130);
    assert_eq!(s, OK);
    let c: CqContext = read(&out).unwrap();
    assert_eq!(c.logsize_usrpage.get(), (3 << 24) | UAR);
    assert_eq!(c.db_rec_addr.get(), cq.db.device_addr());
    let raw = icm_bytes(&d, CQC + 130 * 64, 64);
    assert_eq!(read::<CqContext>(&raw).unwrap().comp_eqn.get(), 5);
    assert_eq!(
        d.cmd0(op::HW2SW_EQ, 1, 0, 5),
        RESOURCE_BUSY,
        "a CQ reports to it"
    );
    // SRQ.
    let srq_buf = d.alloc(16 * 64);
    let srq_db = d.alloc(4);
    let first = d.mtt(&srq_buf);
    let ctx = srq_ctx(4, 6, first, 1, &srq_db);
    assert_eq!(d.cmd_in(op::SW2HW_SRQ, 0, 70, ctx.as_bytes()), OK);
    let (s, out) = d.cmd_out(op::QUERY_SRQ, 0, 70);
    assert_eq!(s, OK);
    assert_eq!(read::<SrqContext>(&out).unwrap().logstride, 2);
    assert_eq!(d.cmd0(op::ARM_SRQ, 0, 4, 70), OK);
    // MR.
    let mr = d.mr(0x21, 8192, 1, 0);
    let (s, out) = d.cmd_out(op::QUERY_MPT, 0, 0x21);
    assert_eq!(s, OK);
    let m: Mpt = read(&out).unwrap();
    assert_eq!(m.key.get(), keys::key_to_hw(mr.key));
    assert_eq!(m.flags.get() >> 28, 0, "hardware-owned");
    assert_eq!(
        read::<Mpt>(&icm_bytes(&d, DMPT + 0x21 * 64, 64))
            .unwrap()
            .start
            .get(),
        mr.addr
    );
    // QP.
    let qp = d.qp_init(0x48, 0, &cq, 1, (4, 6), (4, 5), 0);
    let (s, out) = d.cmd_out(op::QUERY_QP, 0, 0x48);
    assert_eq!(s, OK);
    let mb: QpMailbox = read(&out).unwrap();
    assert_eq!(mb.ctx.flags.get() >> 28, qp_state::INIT);
    assert_eq!(mb.ctx.cqn_send.get(), 130);
    assert_eq!(
        read::<QpMailbox>(&[&[0u8; 8][..], &icm_bytes(&d, QPC + 0x48 * 256, 0xf8)].concat())
            .unwrap()
            .ctx
            .flags
            .get()
            >> 28,
        qp_state::INIT
    );
    assert_eq!(
        d.cmd0(op::HW2SW_CQ, 1, 0, 130),
        RESOURCE_BUSY,
        "a QP uses it"
    );
    assert_eq!(
        d.cmd0(op::CLOSE_HCA, 0, 0, 0),
        RESOURCE_BUSY,
        "objects left"
    );
    let c = d.model.counts();
    assert_eq!((c.eqs, c.cqs, c.srqs, c.mpts, c.qps), (1, 1, 1, 1, 1));
    // Teardown; a second HW2SW is refused.
    assert_eq!(d.cmd0(op::RST_QP, 2, 0, qp.qpn), OK);
    let (s, out) = d.cmd_out(op::QUERY_QP, 0, 0x48);
    assert_eq!(s, OK);
    assert_eq!(
        read::<QpMailbox>(&out).unwrap().ctx.flags.get() >> 28,
        qp_state::RST
    );
    let (s, out) = d.cmd_out(op::HW2SW_MPT, 0, 0x21);
    assert_eq!(s, OK);
    assert_eq!(
        read::<Mpt>(&out).unwrap().start.get(),
        mr.addr,
        "with outbox"
    );
    assert_eq!(d.cmd0(op::HW2SW_MPT, 1, 0, 0x21), BAD_RES_STATE);
    assert_eq!(d.cmd0(op::HW2SW_SRQ, 1, 0, 70), OK);
    assert_eq!(d.cmd0(op::HW2SW_CQ, 1, 0, 130), OK);
    assert_eq!(d.cmd0(op::HW2SW_CQ, 1, 0, 130), BAD_RES_STATE);
    assert_eq!(d.cmd0(op::MAP_EQ, 0, 1 << 9, 5 | 1 << 31), OK, "unmap");
    assert_eq!(d.cmd0(op::HW2SW_EQ, 1, 0, 5), OK);
    assert_eq!(d.cmd0(op::HW2SW_EQ, 1, 0, 5), BAD_RES_STATE);
    assert_eq!(d.cmd0(op::CLOSE_HCA, 0, 0, 0), OK);
    let c = d.model.counts();
    assert_eq!(
        (
            c.eqs,
            c.cqs,
            c.srqs,
            c.mpts,
            c.qps,
            c.engine_qps,
            c.engine_mrs
        ),
        (0, 0, 0, 0, 0, 0, 0)
    );
}

#[test]
fn bad_numbers_unmapped_icm_and_bad_mailboxes() {
    let (_f, mut d) = dev();
    d.bring_up();
    let eq = d.eq(4, 4, 0);
    let eqc = EqContext {
        log_eq_size: 4,
        ..EqContext::default()
    };
    assert_eq!(d.cmd_in(op::SW2HW_EQ, 0, 16, eqc.as_bytes()), BAD_INDEX);
    assert_eq!(
        d.cmd_in(op::SW2HW_EQ, 0, 2, eqc.as_bytes()),
        BAD_RESOURCE,
        "reserved EQ"
    );
    assert_eq!(d.cmd0(op::MAP_EQ, 0, 1, 9), BAD_RES_STATE, "no such EQ");
    let cqc = CqContext::default();
    assert_eq!(d.cmd_in(op::SW2HW_CQ, 0, 300, cqc.as_bytes()), BAD_INDEX);
    assert_eq!(
        d.cmd_in(op::SW2HW_CQ, 0, 5, cqc.as_bytes()),
        BAD_RESOURCE,
        "reserved CQ"
    );
    assert_eq!(
        d.cmd_in(op::SW2HW_CQ, 0, 200, cqc.as_bytes()),
        ICM_ERROR,
        "CQC page not mapped"
    );
    assert_eq!(d.cmd0(op::QUERY_CQ, 0, 0, 140), BAD_RES_STATE);
    assert_eq!(
        d.cmd0(op::RST2INIT_QP, 0, 0, 10),
        BAD_RESOURCE,
        "firmware QP"
    );
    assert_eq!(d.cmd0(op::RST2INIT_QP, 0, 0, 1000), BAD_INDEX);
    assert_eq!(d.cmd0(op::SW2HW_MPT, 0, 0, 3), BAD_RESOURCE, "reserved MPT");
    assert_eq!(d.cmd0(op::SW2HW_MPT, 0, 0, 1 << 9), BAD_INDEX);
    // A CQ on an EQ that does not exist, and a CQ buffer with no MTT entries behind it.
    let db = d.alloc(8);
    let mut cqc = CqContext {
        logsize_usrpage: ((3 << 24) | UAR).into(),
        comp_eqn: 9.into(),
        db_rec_addr: db.device_addr().into(),
        ..CqContext::default()
    };
    assert_eq!(
        d.cmd_in(op::SW2HW_CQ, 0, 140, cqc.as_bytes()),
        BAD_RES_STATE
    );
    cqc.comp_eqn = eq.eqn.into();
    let (hi, lo) = mtt_split(3000);
    cqc.mtt_base_hi = hi;
    cqc.mtt_base_lo = lo.into();
    assert_eq!(
        d.cmd_in(op::SW2HW_CQ, 0, 140, cqc.as_bytes()),
        BAD_PARAM,
        "MTT not present"
    );
    // The CQ doorbell record at its host address instead of its bus address.
    let buf = d.alloc(256);
    let first = d.mtt(&buf);
    let (hi, lo) = mtt_split(first);
    cqc.mtt_base_hi = hi;
    cqc.mtt_base_lo = lo.into();
    cqc.db_rec_addr = db.host_addr().into();
    assert_eq!(
        d.cmd_in(op::SW2HW_CQ, 0, 140, cqc.as_bytes()),
        BAD_PARAM,
        "host address"
    );
    cqc.db_rec_addr = db.device_addr().into();
    assert_eq!(d.cmd_in(op::SW2HW_CQ, 0, 140, cqc.as_bytes()), OK);
    // Mailboxes at unmapped or host addresses.
    assert_eq!(d.cmd0(op::SW2HW_CQ, 0, 0x10, 141), BAD_PARAM);
    let host = d.inbox.host_addr();
    assert_eq!(d.cmd0(op::SW2HW_CQ, 0, host, 141), BAD_PARAM);
    let (s, _) = d.cmd(op::QUERY_FW, 0, 0, 0, d.outbox.host_addr());
    assert_eq!(s, BAD_PARAM);
    // An unknown service type.
    let mut mb = QpMailbox::default();
    mb.ctx.flags = ((qp_state::INIT << 28) | (0x6 << 16)).into();
    mb.ctx.cqn_send = 140.into();
    mb.ctx.cqn_recv = 140.into();
    assert_eq!(
        d.cmd_in(op::RST2INIT_QP, 0, 0x50, mb.as_bytes()),
        BAD_PARAM,
        "XRC"
    );
    // WRITE_MTT of too many entries.
    assert_eq!(d.cmd_in(op::WRITE_MTT, 0, 511, &[0u8; 16]), BAD_PARAM);
}

#[test]
fn illegal_qp_transitions() {
    let (_f, mut d) = dev();
    d.bring_up();
    let eq = d.eq(4, 4, 0);
    let cq = d.cq(128, 4, eq.eqn);
    let mut rtr = QpMailbox::default();
    rtr.ctx.flags = (qp_state::RTR << 28).into();
    assert_eq!(
        d.cmd_in(op::INIT2RTR_QP, 0, 0x50, rtr.as_bytes()),
        BAD_QP_STATE,
        "in RESET"
    );
    assert_eq!(d.cmd0(op::RTS2SQD_QP, 0, 0, 0x50), BAD_QP_STATE);
    let qp = d.qp_init(0x50, 0, &cq, 1, (4, 6), (4, 5), 0);
    let mut rts = QpMailbox::default();
    rts.ctx.flags = (qp_state::RTS << 28).into();
    assert_eq!(
        d.cmd_in(op::RTR2RTS_QP, 0, 0x50, rts.as_bytes()),
        BAD_QP_STATE,
        "INIT→RTS"
    );
    assert_eq!(
        d.cmd_in(op::RST2INIT_QP, 0, 0x50, rts.as_bytes()),
        BAD_QP_STATE,
        "not in RESET"
    );
    assert_eq!(
        d.cmd_in(op::INIT2RTR_QP, 0, 0x50, rts.as_bytes()),
        BAD_QP_STATE,
        "context state is not the target"
    );
    let mut init = QpMailbox::default();
    init.ctx.flags = (qp_state::INIT << 28).into();
    assert_eq!(d.cmd_in(op::INIT2INIT_QP, 0, 0x50, init.as_bytes()), OK);
    assert_eq!(d.cmd0(op::ERR_QP, 0, 0, 0x50), OK);
    assert_eq!(
        d.cmd_in(op::INIT2RTR_QP, 0, 0x50, rtr.as_bytes()),
        BAD_QP_STATE,
        "in ERR"
    );
    let (_, out) = d.cmd_out(op::QUERY_QP, 0, 0x50);
    assert_eq!(
        read::<QpMailbox>(&out).unwrap().ctx.flags.get() >> 28,
        qp_state::ERR
    );
    assert_eq!(d.cmd0(op::RST_QP, 2, 0, 0x50), OK);
    // RESET → ERR → RESET needs no context.
    assert_eq!(d.cmd0(op::ERR_QP, 0, 0, 0x51), OK);
    assert_eq!(d.cmd0(op::RST_QP, 2, 0, 0x51), OK);
    // And the QPN is usable again.
    let _qp2 = d.qp_init(0x50, 0, &cq, 1, (4, 6), (4, 5), 0);
    drop(qp);
    assert_eq!(d.cmd0(op::RST_QP, 2, 0, 0x50), OK);
    assert_eq!(d.model.counts().qps, 0);
    // HCR after all this is idle.
    assert!(!StatusWord(d.bar0.read32(HCR_BASE + dword::STATUS).unwrap()).go());
}

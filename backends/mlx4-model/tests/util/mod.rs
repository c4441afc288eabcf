//! A register-level harness: drives the model through its BARs and DMA memory with the layout
//! module only (no driver), the way iPXE's `hermon.c` does — HCR commands with the
//! toggle protocol, page lists, contexts, hand-written WQEs, CQEs and EQEs read by owner bit.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use portverbs_hal::dma::DmaMemory;
use portverbs_hal::error::CqeError;
use portverbs_hal::event::DeviceEvent;
use portverbs_hal::mmio::Mmio;
use portverbs_hal::notify::InterruptSink;
use portverbs_hal::types::{Gid, Mtu};
use portverbs_hal::wc::Cqe;
use portverbs_mlx4::PciFunction;
use portverbs_mlx4::layout::ctx::{
    AddressPath, CqContext, EQ_STATE_ARMED, EqContext, Mpt, PM_MIGRATED, QpMailbox, SrqContext,
    mpt_flag, mtt_split, params2, qp_state,
};
use portverbs_mlx4::layout::hcr::{HCR_BASE, POLL_TOKEN, RESET_REG, StatusWord, dword};
use portverbs_mlx4::layout::mailbox::{InitHca, PageListEntry};
use portverbs_mlx4::layout::opcode as op;
use portverbs_mlx4::layout::{cqe, eqe, keys, uar};
use portverbs_mlx4_model::{Mlx4Model, ModelConfig, ModelFunction};
use portverbs_soft::Fabric;
use zerocopy::IntoBytes;

/// The harness's UAR page (above the reserved ones).
pub const UAR: u32 = 8;
/// ICM layout used by every test (all tables small).
pub const QPC: u64 = 0x0;
pub const LOG_QP: u8 = 8;
pub const CQC: u64 = 0x1_0000;
pub const LOG_CQ: u8 = 8;
pub const DMPT: u64 = 0x1_4000;
pub const LOG_MPT: u8 = 8;
pub const MTT: u64 = 0x1_8000;
pub const SRQC: u64 = 0x2_0000;
pub const LOG_SRQ: u8 = 7;
pub const EQC: u64 = 0x2_2000;
/// The multicast group table: 16 entries of 128 bytes (8 hash buckets, 8 overflow entries).
pub const MCG: u64 = 0x2_2800;
pub const LOG_MCG: u8 = 4;
pub const LOG_MCG_ENTRY: u8 = 7;
pub const LOG_EQ: u8 = 4;
/// Bytes of ICM the harness backs with memory.
pub const ICM_BYTES: u64 = 0x2_3000;
/// The ICM virtual size given to SET_ICM_SIZE.
pub const ICM_SIZE: u64 = 0x4_0000;
/// The CQC page left unmapped (CQNs 192..255 have no ICM): ICM_ERROR tests.
pub const CQC_HOLE: u64 = CQC + 0x3000;

/// Counts interrupts.
#[derive(Debug, Default)]
pub struct Counter(pub AtomicU32);

impl InterruptSink for Counter {
    fn raise(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

impl Counter {
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::SeqCst)
    }
}

pub type Mem = Arc<dyn DmaMemory>;

/// The device under test and the memory the harness gave it.
pub struct Dev {
    pub model: Mlx4Model,
    pub func: Arc<ModelFunction>,
    pub bar0: Arc<dyn Mmio>,
    pub bar2: Arc<dyn Mmio>,
    pub toggle: bool,
    pub inbox: Mem,
    pub outbox: Mem,
    pub fw: Option<Mem>,
    pub aux: Option<Mem>,
    pub icm: Option<Mem>,
    pub next_mtt: u64,
}

pub struct Eq {
    pub eqn: u32,
    pub buf: Mem,
    pub log: u32,
    pub ci: u32,
}

pub struct Cq {
    pub cqn: u32,
    pub buf: Mem,
    pub log: u32,
    pub ci: u32,
    pub db: Mem,
}

pub struct Qp {
    pub qpn: u32,
    pub buf: Mem,
    pub sq_log: u32,
    pub sq_shift: u32,
    pub rq_log: u32,
    pub rq_shift: u32,
    pub sq_off: usize,
    pub rq_off: usize,
    pub db: Mem,
    pub sq_head: u32,
    pub rq_head: u32,
}

pub struct Mr {
    pub index: u32,
    pub key: u32,
    pub buf: Mem,
    pub addr: u64,
}

impl Dev {
    pub fn new(fabric: &Fabric, ports: u8) -> Self {
        let (model, func) = Mlx4Model::attach(
            fabric,
            ModelConfig {
                name: None,
                ports,
                mtu: Mtu::Mtu1024,
                num_vectors: 8,
            },
        )
        .unwrap();
        let bar0 = func.bar(0).unwrap();
        let bar2 = func.bar(2).unwrap();
        let inbox = func.alloc_dma(4096).unwrap();
        let outbox = func.alloc_dma(4096).unwrap();
        Self {
            model,
            func,
            bar0,
            bar2,
            toggle: true,
            inbox,
            outbox,
            fw: None,
            aux: None,
            icm: None,
            next_mtt: 128,
        }
    }

    /// Writes BE 1 to the reset register; the toggle restarts at 1.
    pub fn reset(&mut self) {
        self.bar0.write32(RESET_REG, 1).unwrap();
        self.toggle = true;
    }

    pub fn hcr(&self, d: usize) -> u32 {
        self.bar0.read32(HCR_BASE + d).unwrap()
    }

    /// Posts a command in polling mode and returns (status, out_param).
    pub fn cmd(
        &mut self,
        opcode: u16,
        opmod: u8,
        in_param: u64,
        in_mod: u32,
        out: u64,
    ) -> (u8, u64) {
        self.post(opcode, opmod, in_param, in_mod, out, false, POLL_TOKEN);
        let st = StatusWord(self.hcr(dword::STATUS));
        assert!(!st.go(), "go still set after {}", op::name(opcode));
        assert_eq!(st.toggle(), !self.toggle, "t reads back as written");
        let out = (u64::from(self.hcr(dword::OUT_PARAM_HI)) << 32)
            | u64::from(self.hcr(dword::OUT_PARAM_LO));
        (st.status(), out)
    }

    /// Writes the HCR and the status dword (go), flips the toggle.
    #[allow(clippy::too_many_arguments)]
    pub fn post(
        &mut self,
        opcode: u16,
        opmod: u8,
        in_param: u64,
        in_mod: u32,
        out: u64,
        event: bool,
        token: u16,
    ) {
        let w = |d: usize, v: u32| self.bar0.write32(HCR_BASE + d, v).unwrap();
        w(dword::IN_PARAM_HI, (in_param >> 32) as u32);
        w(dword::IN_PARAM_LO, in_param as u32);
        w(dword::IN_MODIFIER, in_mod);
        w(dword::OUT_PARAM_HI, (out >> 32) as u32);
        w(dword::OUT_PARAM_LO, out as u32);
        w(dword::TOKEN, u32::from(token) << 16);
        w(
            dword::STATUS,
            StatusWord::post(opcode, opmod, self.toggle, event).0,
        );
        self.toggle = !self.toggle;
    }

    /// A command with an inbox.
    pub fn cmd_in(&mut self, opcode: u16, opmod: u8, in_mod: u32, inbox: &[u8]) -> u8 {
        self.inbox.fill(0, 4096, 0).unwrap();
        self.inbox.write(0, inbox).unwrap();
        let addr = self.inbox.device_addr();
        self.cmd(opcode, opmod, addr, in_mod, 0).0
    }

    /// A command with an outbox.
    pub fn cmd_out(&mut self, opcode: u16, opmod: u8, in_mod: u32) -> (u8, Vec<u8>) {
        self.outbox.fill(0, 4096, 0).unwrap();
        let addr = self.outbox.device_addr();
        let (s, _) = self.cmd(opcode, opmod, 0, in_mod, addr);
        let mut v = vec![0u8; 4096];
        self.outbox.read(0, &mut v).unwrap();
        (s, v)
    }

    /// A command with neither.
    pub fn cmd0(&mut self, opcode: u16, opmod: u8, in_param: u64, in_mod: u32) -> u8 {
        self.cmd(opcode, opmod, in_param, in_mod, 0).0
    }

    pub fn alloc(&self, len: usize) -> Mem {
        self.func.alloc_dma(len).unwrap()
    }

    /// A page list of 4 KiB entries covering `region` (ICM virtual `virt` onwards).
    pub fn page_list(region: &Mem, virt: Option<u64>, pages: usize) -> Vec<u8> {
        let mut v = Vec::new();
        for i in 0..pages {
            let e = PageListEntry::new(
                virt.map_or(0, |b| b + i as u64 * 4096),
                region.device_addr() + i as u64 * 4096,
                0,
            );
            v.extend_from_slice(e.as_bytes());
        }
        v
    }

    /// QUERY_FW, MAP_FA, RUN_FW.
    pub fn run_fw(&mut self) {
        let (s, _) = self.cmd_out(op::QUERY_FW, 0, 0);
        assert_eq!(s, 0);
        let fw = self.alloc(64 * 4096);
        let list = Self::page_list(&fw, None, 64);
        assert_eq!(self.cmd_in(op::MAP_FA, 0, 64, &list), 0);
        assert_eq!(self.cmd0(op::RUN_FW, 0, 0, 0), 0);
        self.fw = Some(fw);
    }

    /// The INIT_HCA inbox of the harness layout.
    pub fn init_hca_inbox() -> InitHca {
        let mut m = InitHca {
            version: 2,
            ..InitHca::default()
        };
        m.qpc_base_log = (QPC | u64::from(LOG_QP)).into();
        m.srqc_base_log = (SRQC | u64::from(LOG_SRQ)).into();
        m.cqc_base_log = (CQC | u64::from(LOG_CQ)).into();
        m.eqc_base_log = (EQC | u64::from(LOG_EQ)).into();
        m.dmpt_base = DMPT.into();
        m.mw_log_mpt = ((1u32 << 31) | u32::from(LOG_MPT)).into();
        m.mtt_base = MTT.into();
        m.mcg_base = MCG.into();
        m.log_mc_entry_sz = LOG_MCG_ENTRY;
        m.log_mc_hash_sz = LOG_MCG - 1;
        m.log_mc_table_sz = LOG_MCG;
        m.log_uars = 8;
        m
    }

    /// Full bring-up: reset … INIT_HCA, with every table mapped except [`CQC_HOLE`].
    pub fn bring_up(&mut self) {
        self.reset();
        self.run_fw();
        let (s, _) = self.cmd_out(op::QUERY_DEV_CAP, 0, 0);
        assert_eq!(s, 0);
        let (s, aux) = self.cmd(op::SET_ICM_SIZE, 0, ICM_SIZE, 0, 0);
        assert_eq!(s, 0);
        assert!(aux >= 1);
        let aux_mem = self.alloc(aux as usize * 4096);
        let list = Self::page_list(&aux_mem, None, aux as usize);
        assert_eq!(self.cmd_in(op::MAP_ICM_AUX, 0, aux as u32, &list), 0);
        self.aux = Some(aux_mem);
        let icm = self.alloc(ICM_BYTES as usize);
        let mut list = Vec::new();
        for i in 0..(ICM_BYTES / 4096) {
            let virt = i * 4096;
            if virt == CQC_HOLE {
                continue;
            }
            let e = PageListEntry::new(virt, icm.device_addr() + virt, 0);
            list.extend_from_slice(e.as_bytes());
        }
        let n = (list.len() / 16) as u32;
        assert_eq!(self.cmd_in(op::MAP_ICM, 0, n, &list), 0);
        self.icm = Some(icm);
        let m = Self::init_hca_inbox();
        assert_eq!(self.cmd_in(op::INIT_HCA, 0, 0, m.as_bytes()), 0);
    }

    /// Writes MTT entries for every page of `region` with WRITE_MTT; returns the first index.
    pub fn mtt(&mut self, region: &Mem) -> u64 {
        let pages = region.len().div_ceil(4096);
        let first = self.next_mtt;
        self.next_mtt += pages.next_multiple_of(8) as u64;
        let mut inbox = Vec::new();
        inbox.extend_from_slice(&first.to_be_bytes());
        inbox.extend_from_slice(&0u64.to_be_bytes());
        for i in 0..pages {
            inbox.extend_from_slice(&((region.device_addr() + i as u64 * 4096) | 1).to_be_bytes());
        }
        assert_eq!(self.cmd_in(op::WRITE_MTT, 0, pages as u32, &inbox), 0);
        first
    }

    pub fn eq(&mut self, eqn: u32, log: u32, intr: u16) -> Eq {
        let buf = self.alloc(32 << log);
        let first = self.mtt(&buf);
        let (hi, lo) = mtt_split(first);
        let ctx = EqContext {
            flags: EQ_STATE_ARMED.into(),
            log_eq_size: log as u8,
            intr: intr.into(),
            mtt_base_hi: hi,
            mtt_base_lo: lo.into(),
            ..EqContext::default()
        };
        assert_eq!(self.cmd_in(op::SW2HW_EQ, 0, eqn, ctx.as_bytes()), 0);
        Eq {
            eqn,
            buf,
            log,
            ci: 0,
        }
    }

    /// Maps every async event type and command completions to `eq`.
    pub fn map_all_events(&mut self, eq: &Eq) {
        let mask = eqe::ASYNC_EVENT_MASK | (1 << eqe::event_type::CMD);
        assert_eq!(self.cmd0(op::MAP_EQ, 0, mask, eq.eqn), 0);
    }

    pub fn cq(&mut self, cqn: u32, log: u32, eqn: u32) -> Cq {
        let buf = self.alloc(32 << log);
        let db = self.alloc(8);
        let first = self.mtt(&buf);
        let (hi, lo) = mtt_split(first);
        let ctx = CqContext {
            logsize_usrpage: ((log << 24) | UAR).into(),
            comp_eqn: eqn.into(),
            mtt_base_hi: hi,
            mtt_base_lo: lo.into(),
            db_rec_addr: db.device_addr().into(),
            ..CqContext::default()
        };
        assert_eq!(self.cmd_in(op::SW2HW_CQ, 0, cqn, ctx.as_bytes()), 0);
        Cq {
            cqn,
            buf,
            log,
            ci: 0,
            db,
        }
    }

    /// An MR over a new region of `len` bytes at MPT `index` with `access` MPT flags.
    pub fn mr(&mut self, index: u32, len: usize, pd: u32, access: u32) -> Mr {
        let buf = self.alloc(len);
        let first = self.mtt(&buf);
        let key = keys::index_to_key(index);
        let mpt = Mpt {
            flags: (mpt_flag::STATUS_SW
                | mpt_flag::MIO
                | mpt_flag::REGION
                | mpt_flag::LOCAL_READ
                | access)
                .into(),
            key: keys::key_to_hw(key).into(),
            pd_flags: (pd | mpt_flag::EN_INV).into(),
            start: buf.host_addr().into(),
            length: (len as u64).into(),
            mtt_addr: (first * 8).into(),
            entity_size: 12.into(),
            ..Mpt::default()
        };
        assert_eq!(self.cmd_in(op::SW2HW_MPT, 0, index, mpt.as_bytes()), 0);
        Mr {
            index,
            key,
            addr: buf.host_addr(),
            buf,
        }
    }

    /// A QP in RESET → INIT: `svc` service type, SQ 2^sq_log × 2^sq_shift, RQ 2^rq_log × 2^rq_shift.
    #[allow(clippy::too_many_arguments)]
    pub fn qp_init(
        &mut self,
        qpn: u32,
        svc: u32,
        cq: &Cq,
        pd: u32,
        (sq_log, sq_shift): (u32, u32),
        (rq_log, rq_shift): (u32, u32),
        qkey: u32,
    ) -> Qp {
        let (sq_off, rq_off) = portverbs_mlx4::layout::wqe::queue_offsets(
            1 << sq_log,
            sq_shift,
            1 << rq_log,
            rq_shift,
        );
        let bytes = (1usize << (sq_log + sq_shift)) + (1usize << (rq_log + rq_shift));
        let buf = self.alloc(bytes);
        // Every SQ WQE starts "not yet valid" for pass 0 (owner = 1), stamped.
        for i in 0..1usize << sq_log {
            let at = sq_off + (i << sq_shift);
            buf.write(at, &0x8000_0000u32.to_be_bytes()).unwrap();
            for blk in (64..1usize << sq_shift).step_by(64) {
                buf.write(at + blk, &0xffff_ffffu32.to_be_bytes()).unwrap();
            }
        }
        let db = self.alloc(4);
        let first = self.mtt(&buf);
        let (hi, lo) = mtt_split(first);
        let mut mb = QpMailbox::default();
        let c = &mut mb.ctx;
        c.flags = ((qp_state::INIT << 28) | (svc << 16) | PM_MIGRATED).into();
        c.pd = pd.into();
        c.sq_size_stride = ((sq_log << 3) | (sq_shift - 4)) as u8;
        c.rq_size_stride = ((rq_log << 3) | (rq_shift - 4)) as u8;
        c.usr_page = UAR.into();
        c.cqn_send = cq.cqn.into();
        c.cqn_recv = cq.cqn.into();
        c.db_rec_addr = db.device_addr().into();
        c.mtt_base_hi = hi;
        c.mtt_base_lo = lo.into();
        c.pri_path.sched_queue = AddressPath::sched_queue_for(1, 0);
        c.params2 = (params2::RRE | params2::RWE | params2::RAE).into();
        c.qkey = qkey.into();
        assert_eq!(self.cmd_in(op::RST2INIT_QP, 0, qpn, mb.as_bytes()), 0);
        Qp {
            qpn,
            buf,
            sq_log,
            sq_shift,
            rq_log,
            rq_shift,
            sq_off,
            rq_off,
            db,
            sq_head: 0,
            rq_head: 0,
        }
    }

    /// An RC QP in INIT receiving through SRQ `srqn` (SQ 16 × 64 bytes, no RQ).
    pub fn qp_init_srq(&mut self, qpn: u32, cq: &Cq, srqn: u32) -> Qp {
        let buf = self.alloc(16 * 64);
        for i in 0..16 {
            buf.write(i * 64, &0x8000_0000u32.to_be_bytes()).unwrap();
        }
        let db = self.alloc(4);
        let first = self.mtt(&buf);
        let (hi, lo) = mtt_split(first);
        let mut mb = QpMailbox::default();
        let c = &mut mb.ctx;
        c.flags = ((qp_state::INIT << 28) | PM_MIGRATED).into();
        c.pd = 1.into();
        c.sq_size_stride = (4 << 3) | 2;
        c.usr_page = UAR.into();
        c.cqn_send = cq.cqn.into();
        c.cqn_recv = cq.cqn.into();
        c.db_rec_addr = db.device_addr().into();
        c.mtt_base_hi = hi;
        c.mtt_base_lo = lo.into();
        c.pri_path.sched_queue = AddressPath::sched_queue_for(1, 0);
        c.params2 = (params2::RRE | params2::RWE | params2::RIC).into();
        c.srqn = ((1 << 24) | srqn).into();
        assert_eq!(self.cmd_in(op::RST2INIT_QP, 0, qpn, mb.as_bytes()), 0);
        Qp {
            qpn,
            buf,
            sq_log: 4,
            sq_shift: 6,
            rq_log: 0,
            rq_shift: 4,
            sq_off: 0,
            rq_off: 0,
            db,
            sq_head: 0,
            rq_head: 0,
        }
    }

    /// INIT → RTR → RTS for an RC/UC QP to `dest` at `dgid` (UD: `dest` ignored).
    pub fn qp_rts(&mut self, qp: &Qp, ud: bool, dest: u32, dgid: Gid, psn: u32) {
        let mut mb = QpMailbox::default();
        let c = &mut mb.ctx;
        c.flags = (qp_state::RTR << 28).into();
        if !ud {
            c.mtu_msgmax = (3 << 5) | 31;
            c.remote_qpn = dest.into();
            c.pri_path.grh_mylmc = 0x80;
            c.pri_path.hop_limit = 64;
            c.pri_path.rgid = dgid.0;
            c.pri_path.sched_queue = AddressPath::sched_queue_for(1, 0);
            c.rnr_nextrecvpsn = ((1 << 24) | psn).into();
            c.params2 = (2 << 21).into();
        }
        assert_eq!(self.cmd_in(op::INIT2RTR_QP, 0, qp.qpn, mb.as_bytes()), 0);
        let mut mb = QpMailbox::default();
        let c = &mut mb.ctx;
        c.flags = (qp_state::RTS << 28).into();
        c.next_send_psn = psn.into();
        if !ud {
            c.pri_path.ackto = (14 << 3) | 1;
            c.params1 = ((8 << 28) | (2 << 21) | (7 << 16) | (7 << 13)).into();
        }
        assert_eq!(self.cmd_in(op::RTR2RTS_QP, 0, qp.qpn, mb.as_bytes()), 0);
    }

    /// Programs port 1's GID table with `gids` (SET_PORT, Ethernet GID table).
    pub fn set_gids(&mut self, port: u8, gids: &[Gid]) -> u8 {
        let mut table = vec![0u8; 128 * 16];
        for (i, g) in gids.iter().enumerate() {
            table[i * 16..i * 16 + 16].copy_from_slice(&g.0);
        }
        self.cmd_in(op::SET_PORT, 1, u32::from(port) | (5 << 8), &table)
    }

    /// UAR page `UAR`'s send doorbell for `qpn`.
    pub fn send_doorbell(&self, qpn: u32) {
        self.bar2
            .write32(UAR as usize * 4096 + uar::SEND_DOORBELL, qpn << 8)
            .unwrap();
    }

    /// Arms `cq` (cmd 1 solicited, 2 any) through the 64-bit CQ doorbell.
    pub fn arm_cq(&self, cq: &Cq, cmd: u32) {
        let d0 = uar::cq_arm_word(1, cmd, cq.cqn);
        cq.db
            .write(4, &uar::cq_arm_word(1, cmd, cq.ci).to_be_bytes())
            .unwrap();
        self.bar2
            .write64(
                UAR as usize * 4096 + uar::CQ_DOORBELL,
                (u64::from(d0) << 32) | u64::from(cq.ci & 0xff_ffff),
            )
            .unwrap();
    }

    /// EQ doorbell: consumer index and arm.
    pub fn eq_doorbell(&self, eq: &Eq, arm: bool) {
        let v = (eq.ci & 0xff_ffff) | if arm { uar::EQ_ARM } else { 0 };
        self.bar2.write32(uar::eq_doorbell(eq.eqn), v).unwrap();
    }
}

impl Eq {
    /// Takes every valid EQE (owner bit = wrap parity of the consumer index).
    pub fn poll(&mut self) -> Vec<DeviceEvent> {
        let mut v = Vec::new();
        loop {
            let n = 1u32 << self.log;
            let off = (self.ci & (n - 1)) as usize * 32;
            let mut e = [0u8; 32];
            self.buf.read(off, &mut e).unwrap();
            if eqe::owner(&e) != ((self.ci >> self.log) & 1 != 0) {
                break;
            }
            v.push(eqe::decode(&e, self.eqn, self.ci).unwrap());
            self.ci += 1;
        }
        v
    }
}

impl Cq {
    /// Takes every valid CQE and publishes the consumer index in the set_ci record.
    pub fn poll(&mut self) -> Vec<Result<Cqe, CqeError>> {
        let mut v = Vec::new();
        loop {
            let n = 1u32 << self.log;
            let off = (self.ci & (n - 1)) as usize * 32;
            let mut e = [0u8; 32];
            self.buf.read(off, &mut e).unwrap();
            if cqe::owner(&e) != ((self.ci >> self.log) & 1 != 0) {
                break;
            }
            v.push(cqe::decode(&e, self.cqn, self.ci));
            self.ci += 1;
        }
        self.db
            .write(0, &(self.ci & 0xff_ffff).to_be_bytes())
            .unwrap();
        v
    }

    pub fn ok(&mut self) -> Vec<Cqe> {
        self.poll().into_iter().map(Result::unwrap).collect()
    }
}

/// Control segment dword 0..3 for opcode `opcode`, `ds` 16-byte units, signaled, at counter
/// `counter` of a ring of 2^log.
pub fn ctrl(opcode: u8, ds: u8, counter: u32, log: u32, flags: u32, imm: u32) -> [u8; 16] {
    let owner = if (counter >> log) & 1 != 0 {
        1u32 << 31
    } else {
        0
    };
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&(owner | u32::from(opcode)).to_be_bytes());
    b[7] = ds;
    b[8..12].copy_from_slice(&flags.to_be_bytes());
    b[12..16].copy_from_slice(&imm.to_be_bytes());
    b
}

/// A data segment.
pub fn data_seg(len: u32, lkey: u32, addr: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&len.to_be_bytes());
    b[4..8].copy_from_slice(&lkey.to_be_bytes());
    b[8..16].copy_from_slice(&addr.to_be_bytes());
    b
}

impl Qp {
    /// Writes a send WQE (segments after ctrl given) at the SQ head; owner written last.
    pub fn post_send(&mut self, opcode: u8, flags: u32, imm: u32, segs: &[u8]) -> u32 {
        let ds = (16 + segs.len()).div_ceil(16) as u8;
        let c = self.sq_head;
        let at = self.sq_off + ((c & ((1 << self.sq_log) - 1)) as usize) * (1 << self.sq_shift);
        let ctrl = ctrl(opcode, ds, c, self.sq_log, flags, imm);
        self.buf.write(at + 16, segs).unwrap();
        self.buf.write(at + 4, &ctrl[4..]).unwrap();
        self.buf.write(at, &ctrl[..4]).unwrap();
        self.sq_head += 1;
        c
    }

    /// Posts one receive WQE (one data segment, then the terminator) and updates the record.
    pub fn post_recv(&mut self, len: u32, lkey: u32, addr: u64) {
        let c = self.rq_head;
        let at = self.rq_off + ((c & ((1 << self.rq_log) - 1)) as usize) * (1 << self.rq_shift);
        self.buf.write(at, &data_seg(len, lkey, addr)).unwrap();
        if 1 << self.rq_shift > 16 {
            self.buf.write(at + 16, &data_seg(0, 0x100, 0)).unwrap();
        }
        self.rq_head += 1;
        self.db
            .write(0, &(self.rq_head & 0xffff).to_be_bytes())
            .unwrap();
    }
}

/// A SRQ context for `log` WQEs of `2^shift` bytes.
pub fn srq_ctx(log: u32, shift: u32, first_mtt: u64, pd: u32, db: &Mem) -> SrqContext {
    let (hi, lo) = mtt_split(first_mtt);
    SrqContext {
        state_logsize_srqn: (log << 24).into(),
        logstride: (shift - 4) as u8,
        mtt_base_hi: hi,
        mtt_base_lo: lo.into(),
        pd: pd.into(),
        db_rec_addr: db.device_addr().into(),
        ..SrqContext::default()
    }
}

/// A soft device on the same fabric with one QP, one CQ and one 64 KiB MR (the shared
/// test-support peer), and draining its CQ.
#[allow(unused_imports)] // not every test binary drains
pub use portverbs_test_support::{HalPeer as Peer, drain};

/// A soft peer with address `ip` on `fabric`.
pub fn peer(fabric: &Fabric, ip: &str, qp_type: portverbs_hal::types::QpType) -> Peer {
    Peer::new(fabric, ip, qp_type)
}

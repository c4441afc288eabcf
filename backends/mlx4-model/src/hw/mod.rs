//! The device side of the model: everything the firmware and the HCA keep, behind the fabric
//! lock. [`ModelNode`] (the engine and [`Hw`]) is the [`portverbs_fabric::Node`] the fabric
//! drives; [`Hw`]'s `Hca` adapter reads WQEs and writes CQEs and EQEs in the mlx4 formats.
//! Commands reach it from the BAR0 handler through [`run_command`], doorbells from BAR2 as
//! kicks or through the lock ([`Ctx`]), both on the model's typed handle.
//!
//! Sub-modules: `mem` (DMA windows and the ICM map), `fw` (firmware state machine and ICM
//! commands), `eq`, `cq`, `srq`, `mpt` (memory), `qp` (QP transitions), `wqe` (WQE decoding),
//! `hca` (the engine seam), `port`.

mod cq;
mod eq;
mod fw;
mod hca;
mod mcg;
pub(crate) mod mem;
mod mpt;
mod port;
mod qp;
mod srq;
mod wqe;

use std::sync::Arc;

use portverbs_fabric::{EngineNode, NodeCtx};
use portverbs_hal::event::DeviceEvent;
use portverbs_hal::types::Mtu;
use portverbs_mlx4_layout::eqe;
use portverbs_mlx4_layout::opcode as op;
use portverbs_mlx4_layout::status::Status;
use portverbs_table::Table;
use portverbs_transport::{Engine, Packet};
use zerocopy::FromBytes;

use crate::caps;
use crate::shared::{Shared, Stats};
use cq::Cq;
use eq::Eq;
use fw::{Fw, Layout};
use mem::{Buf, Icm};
use mpt::MptRec;
use qp::Qp;
use srq::Srq;

/// Result of a command handler: the immediate output (if the command has one) or a status.
pub(crate) type CmdResult = Result<Option<u64>, Status>;

/// A latched HCR command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Command {
    pub(crate) in_param: u64,
    pub(crate) in_mod: u32,
    pub(crate) out_param: u64,
    pub(crate) opcode: u16,
    pub(crate) opmod: u8,
}

/// Live objects and mappings, for [`crate::ModelCounts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Live {
    pub(crate) eqs: usize,
    pub(crate) cqs: usize,
    pub(crate) qps: usize,
    pub(crate) srqs: usize,
    pub(crate) mpts: usize,
    pub(crate) icm_pages: usize,
    pub(crate) aux_pages: u64,
    pub(crate) fw_pages: u64,
    pub(crate) engine_qps: usize,
    pub(crate) engine_mrs: usize,
    pub(crate) engine_mws: usize,
}

/// The model on the fabric: its transport engine and its device side. The fabric steps it
/// (`impl DeviceSide` in `hca`); the model's handle reaches it through [`Ctx`].
pub(crate) type ModelNode = EngineNode<Hw>;

/// What the model's handle gets under the fabric lock.
pub(crate) type Ctx<'a> = NodeCtx<'a, ModelNode>;

/// The device side of one model. See the module documentation.
#[derive(Debug)]
pub(crate) struct Hw {
    shared: Arc<Shared>,
    ports: u8,
    mtu: Mtu,
    vectors: u32,
    fw: Fw,
    fa_pages: u64,
    icm_size: Option<u64>,
    aux_pages: u64,
    icm: Icm,
    layout: Option<Layout>,
    catastrophic: bool,
    eqs: Table<Eq>,
    cqs: Table<Cq>,
    srqs: Table<Srq>,
    qps: Table<Qp>,
    mpts: Table<MptRec>,
    /// Event type → EQ it is mapped to (MAP_EQ).
    event_eq: [Option<u32>; 64],
    port_up: [bool; 2],
    special_qp_base: Option<u32>,
    /// Port 1's GID table as SET_PORT gave it: the source GIDs an MLX header may carry.
    gsi_gids: Vec<portverbs_hal::types::Gid>,
    /// Set when the fabric routes of every port must go (reset, CLOSE_HCA, removal).
    drop_routes: bool,
    /// QPs in ERR whose receive doorbell records the HCA watches: mlx4 has no receive
    /// doorbell, so a receive posted to a QP in ERR is noticed here and flushed.
    errored: Vec<u32>,
    scratch: Vec<u8>,
    /// The multicast groups the model's ports joined on the fabric: those the engine has
    /// QPs attached to, as of the last command ([`sync_fabric_groups`]).
    fabric_groups: Vec<portverbs_hal::types::Gid>,
}

impl Hw {
    pub(crate) fn new(shared: Arc<Shared>, ports: u8, mtu: Mtu, vectors: u32) -> Self {
        Self {
            shared,
            ports,
            mtu,
            vectors,
            fw: Fw::Off,
            fa_pages: 0,
            icm_size: None,
            aux_pages: 0,
            icm: Icm::default(),
            layout: None,
            catastrophic: false,
            eqs: Table::default(),
            cqs: Table::default(),
            srqs: Table::default(),
            qps: Table::default(),
            mpts: Table::default(),
            event_eq: [None; 64],
            port_up: [false; 2],
            special_qp_base: None,
            gsi_gids: Vec::new(),
            drop_routes: false,
            errored: Vec::new(),
            scratch: Vec::new(),
            fabric_groups: Vec::new(),
        }
    }

    /// Live objects.
    pub(crate) fn live(&self, engine: &Engine) -> Live {
        let (engine_mrs, engine_mws) = engine.memory().live();
        Live {
            eqs: self.eqs.len(),
            cqs: self.cqs.len(),
            qps: self.qps.len(),
            srqs: self.srqs.len(),
            mpts: self.mpts.len(),
            icm_pages: self.icm.pages(),
            aux_pages: self.aux_pages,
            fw_pages: self.fa_pages,
            engine_qps: engine.qp_count(),
            engine_mrs,
            engine_mws,
        }
    }

    fn objects(&self) -> usize {
        self.eqs.len() + self.cqs.len() + self.srqs.len() + self.qps.len() + self.mpts.len()
    }

    /// Forgets every object (reset, CLOSE_HCA's caller, removal): engine state, tables, event
    /// routing, port state.
    fn forget_objects(&mut self, engine: &mut Engine) {
        engine.reset();
        for p in engine.ports_mut() {
            p.active = false;
            p.gids.clear();
        }
        self.eqs.clear();
        self.cqs.clear();
        self.srqs.clear();
        self.qps.clear();
        self.mpts.clear();
        self.event_eq = [None; 64];
        self.port_up = [false; 2];
        self.special_qp_base = None;
        self.gsi_gids.clear();
        self.drop_routes = true;
    }

    /// Power-on state: firmware off, ICM forgotten, no objects, no faults.
    pub(crate) fn reset(&mut self, engine: &mut Engine) {
        self.forget_objects(engine);
        self.fw = Fw::Off;
        self.fa_pages = 0;
        self.icm_size = None;
        self.aux_pages = 0;
        self.icm.clear();
        self.layout = None;
        self.catastrophic = false;
    }

    /// Surprise removal: the device stops touching memory and forgets everything. QPs are
    /// failed first (their flush completions are not written: the device is gone).
    pub(crate) fn remove(&mut self, engine: &mut Engine) {
        engine.fail_all(self);
        self.reset(engine);
    }

    /// Catastrophic error: LOCAL_CATAS on the EQ mapped for it, every QP flushed, later
    /// commands fail with INTERNAL_ERR.
    pub(crate) fn catastrophic(&mut self, engine: &mut Engine) {
        if self.catastrophic {
            return;
        }
        self.catastrophic = true;
        self.post_event(DeviceEvent::DeviceFatal);
        engine.fail_all(self);
    }

    // ---- memory helpers -------------------------------------------------------------------

    fn mailbox(&self, bus: u64, len: usize) -> Result<Buf, Status> {
        Buf::at(&self.shared.iova, bus, len).ok_or(Status::BadParam)
    }

    /// Reads an inbox laid out as `T`.
    fn inbox<T: FromBytes>(&self, bus: u64) -> Result<T, Status> {
        let b = self.mailbox(bus, size_of::<T>())?;
        let v = b.vec(0, size_of::<T>()).ok_or(Status::BadParam)?;
        T::read_from_bytes(&v).map_err(|_| Status::BadParam)
    }

    fn outbox(&self, bus: u64, data: &[u8]) -> Result<(), Status> {
        let b = self.mailbox(bus, data.len())?;
        if b.write(0, data) {
            Ok(())
        } else {
            Err(Status::BadParam)
        }
    }

    fn icm_read(&self, virt: u64, n: usize) -> Result<Vec<u8>, Status> {
        let mut v = vec![0u8; n];
        if self.icm.read(&self.shared.iova, virt, &mut v) {
            Ok(v)
        } else {
            Err(Status::IcmError)
        }
    }

    fn icm_write(&self, virt: u64, data: &[u8]) -> Result<(), Status> {
        if self.icm.write(&self.shared.iova, virt, data) {
            Ok(())
        } else {
            Err(Status::IcmError)
        }
    }

    fn layout(&self) -> Result<&Layout, Status> {
        self.layout.as_ref().ok_or(Status::BadSysState)
    }

    /// MTT entry `index` (BE64 `addr | present` in the ICM MTT table).
    fn mtt(&self, index: u64) -> Result<u64, Status> {
        let base = self.layout()?.mtt;
        let at = index
            .checked_mul(8)
            .and_then(|o| o.checked_add(base))
            .ok_or(Status::BadParam)?;
        let b = self.icm_read(at, 8).map_err(|_| Status::BadParam)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&b);
        Ok(u64::from_be_bytes(a))
    }

    /// Resolves `len` bytes starting `start` bytes into the buffer described by the MTT range
    /// beginning at entry `first` with pages of `1 << shift` bytes. The pages must be present
    /// and contiguous in one DMA region (a driver allocates each buffer as one region).
    fn resolve(&self, first: u64, shift: u32, start: u64, len: u64) -> Result<Buf, Status> {
        if !(12..=30).contains(&shift) {
            return Err(Status::BadParam);
        }
        let page = 1u64 << shift;
        let first = first.checked_add(start >> shift).ok_or(Status::BadParam)?;
        let in_page = start & (page - 1);
        let e0 = self.mtt(first)?;
        let base = e0 & !7;
        if e0 & 1 == 0 || base & (page - 1) != 0 {
            return Err(Status::BadParam);
        }
        let len_us = usize::try_from(len).map_err(|_| Status::BadParam)?;
        // One region must hold the whole range (this also bounds the page walk below).
        let buf = Buf::at(&self.shared.iova, base + in_page, len_us).ok_or(Status::BadParam)?;
        let pages = (in_page + len).div_ceil(page);
        for p in 1..pages {
            let e = self.mtt(first + p)?;
            if e & 1 == 0 || e & !7 != base + p * page {
                return Err(Status::BadParam);
            }
        }
        Ok(buf)
    }

    // ---- events ----------------------------------------------------------------------------

    /// CONF_SPECIAL_QP (Linux `mlx4/qp.c`): the base of a naturally aligned block of 8 QPNs above
    /// the firmware's, fixed while a special QP lives.
    fn conf_special_qp(&mut self, cmd: &Command) -> CmdResult {
        let base = cmd.in_mod & 0xff_ffff;
        let l = self.layout()?;
        if base % 8 != 0 || base < 1 << caps::LOG_RSVD_QP || base + 8 > 1 << l.log_qp {
            return Err(Status::BadParam);
        }
        let gsi = portverbs_hal::types::SpecialQp::GSI_QPN;
        if self.special_qp_base.is_some_and(|b| b != base) && self.qps.contains(gsi) {
            return Err(Status::BadResState);
        }
        self.special_qp_base = Some(base);
        Ok(None)
    }

    /// Delivers an event to the EQ its type is mapped to (completion events go through
    /// [`Hw::write_eqe`] directly).
    pub(crate) fn post_event(&mut self, ev: DeviceEvent) {
        // EQEs carry the hardware QPN; the engine knows the GSI QP as QP 1.
        let ev = match ev {
            DeviceEvent::Qp { qpn, kind } => DeviceEvent::Qp {
                qpn: self.hw_qpn(qpn),
                kind,
            },
            ev => ev,
        };
        let bytes = eqe::encode(&ev, false);
        match self.event_eq[usize::from(bytes[1] & 0x3f)] {
            Some(eqn) => {
                self.write_eqe(eqn, &ev);
            }
            None => Stats::bump(&self.shared.stats.lost_events),
        }
    }

    /// The command-completion EQE of an event-mode command, on the EQ mapped for type 0x0a.
    pub(crate) fn command_event(&mut self, token: u16, status: u8, out_param: u64) {
        self.post_event(DeviceEvent::CommandDone {
            token,
            status,
            out_param,
        });
    }
}

/// Checks an object number against the table size and the reserved count.
fn check_number(n: u32, log: u8, reserved: u32) -> Result<(), Status> {
    if u64::from(n) >= 1u64 << log {
        Err(Status::BadIndex)
    } else if n < reserved {
        Err(Status::BadResource)
    } else {
        Ok(())
    }
}

/// Runs one latched command with the fabric lock held and returns (status, immediate output).
pub(crate) fn run_command(ctx: &mut Ctx<'_>, cmd: &Command) -> (u8, Option<u64>) {
    let result = (|| -> CmdResult {
        let hw = &mut ctx.node.hw;
        hw.allowed(cmd.opcode)?;
        if let Some(status) = hw.shared.take_failure(cmd.opcode) {
            return Err(Status::from_u8(status).unwrap_or(Status::InternalErr));
        }
        if cmd.opcode == op::SET_PORT && port::is_gid_table(cmd) {
            return port::set_gid_table(ctx, cmd);
        }
        let ModelNode { engine, hw, .. } = &mut *ctx.node;
        let r = hw.execute(engine, ctx.now, ctx.out, cmd);
        if std::mem::take(&mut hw.drop_routes) {
            for (_, gid) in ctx.routes() {
                ctx.remove_route(gid);
            }
        }
        sync_fabric_groups(ctx);
        r
    })();
    match result {
        Ok(out) => (Status::Ok as u8, out),
        Err(s) => {
            tracing::debug!(
                opcode = op::name(cmd.opcode),
                status = Status::meaning(s as u8),
                "model command failed"
            );
            (s as u8, None)
        }
    }
}

/// Resets the device side (reset register) and drops its routes.
pub(crate) fn reset(ctx: &mut Ctx<'_>, remove: bool) {
    let ModelNode { engine, hw, .. } = &mut *ctx.node;
    if remove {
        hw.remove(engine);
    } else {
        hw.reset(engine);
    }
    hw.drop_routes = false;
    for (_, gid) in ctx.routes() {
        ctx.remove_route(gid);
    }
    sync_fabric_groups(ctx);
}

/// Makes the multicast groups the model's ports joined on the fabric those the engine has
/// QPs attached to (after a WRITE_MCG, a QP's destruction, a reset): the ports hear a group's
/// packets while the table lists a QP of this HCA in it.
fn sync_fabric_groups(ctx: &mut Ctx<'_>) {
    let want = ctx.node.engine.mcast_groups();
    let have = std::mem::take(&mut ctx.node.hw.fabric_groups);
    let ports = ctx.node.hw.ports;
    let mut kept = Vec::with_capacity(want.len());
    for gid in have {
        if want.contains(&gid) {
            kept.push(gid);
        } else {
            for port in 1..=ports {
                ctx.leave_mcast(port, gid);
            }
        }
    }
    for gid in want {
        if kept.contains(&gid) {
            continue;
        }
        for port in 1..=ports {
            // The fabric refuses only when its uplink cannot join the group on its network:
            // the group is then heard on the fabric alone.
            let _ = ctx.join_mcast(port, gid);
        }
        kept.push(gid);
    }
    ctx.node.hw.fabric_groups = kept;
}

impl Hw {
    /// The firmware state machine: before RUN_FW only QUERY_FW and MAP_FA; objects need INIT_HCA.
    fn allowed(&self, opcode: u16) -> Result<(), Status> {
        if !fw::known(opcode) {
            return Err(Status::BadOp);
        }
        if self.catastrophic {
            return Err(Status::InternalErr);
        }
        let ok = match self.fw {
            Fw::Off => matches!(
                opcode,
                op::QUERY_FW | op::MAP_FA | op::UNMAP_FA | op::RUN_FW
            ),
            Fw::Running => matches!(
                opcode,
                op::QUERY_FW
                    | op::QUERY_DEV_CAP
                    | op::QUERY_ADAPTER
                    | op::MOD_STAT_CFG
                    | op::QUERY_PORT
                    | op::SET_ICM_SIZE
                    | op::MAP_ICM_AUX
                    | op::UNMAP_ICM_AUX
                    | op::MAP_ICM
                    | op::UNMAP_ICM
                    | op::INIT_HCA
                    | op::UNMAP_FA
            ),
            Fw::Initialized => !matches!(
                opcode,
                op::MAP_FA
                    | op::UNMAP_FA
                    | op::RUN_FW
                    | op::MOD_STAT_CFG
                    | op::SET_ICM_SIZE
                    | op::MAP_ICM_AUX
                    | op::UNMAP_ICM_AUX
                    | op::INIT_HCA
            ),
        };
        if ok { Ok(()) } else { Err(Status::BadSysState) }
    }

    fn execute(
        &mut self,
        engine: &mut Engine,
        now: u64,
        out: &mut Vec<Packet>,
        cmd: &Command,
    ) -> CmdResult {
        match cmd.opcode {
            op::QUERY_FW
            | op::MAP_FA
            | op::UNMAP_FA
            | op::RUN_FW
            | op::QUERY_DEV_CAP
            | op::QUERY_ADAPTER
            | op::MOD_STAT_CFG
            | op::SET_ICM_SIZE
            | op::MAP_ICM_AUX
            | op::UNMAP_ICM_AUX
            | op::MAP_ICM
            | op::UNMAP_ICM
            | op::INIT_HCA
            | op::QUERY_HCA
            | op::NOP
            | fw::SYNC_TPT => self.firmware(cmd),
            op::CLOSE_HCA => self.close_hca(engine, cmd),
            op::QUERY_PORT | op::INIT_PORT | op::CLOSE_PORT | op::SET_PORT => {
                self.port_command(engine, cmd)
            }
            op::CONF_SPECIAL_QP => self.conf_special_qp(cmd),
            op::SW2HW_EQ | op::HW2SW_EQ | op::QUERY_EQ | op::MAP_EQ => self.eq_command(cmd),
            op::SW2HW_CQ | op::HW2SW_CQ | op::QUERY_CQ | op::MODIFY_CQ => self.cq_command(cmd),
            op::SW2HW_SRQ | op::HW2SW_SRQ | op::QUERY_SRQ | op::ARM_SRQ => self.srq_command(cmd),
            op::SW2HW_MPT | op::QUERY_MPT | op::HW2SW_MPT | op::WRITE_MTT => {
                self.mpt_command(engine, cmd)
            }
            op::MGID_HASH | op::READ_MCG | op::WRITE_MCG => self.mcg_command(engine, cmd),
            _ => self.qp_command(engine, now, out, cmd),
        }
    }
}

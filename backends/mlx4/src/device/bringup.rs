//! Bring-up and teardown (Linux `mlx4/reset.c`, `mlx4/main.c`).
//!
//! Open: check the function is an mlx4 PF, map BAR0/BAR2, reset through the reset register,
//! QUERY_FW, MAP_FA + RUN_FW, MOD_STAT_CFG is skipped (4 KiB pages are the default),
//! QUERY_DEV_CAP, QUERY_PORT per port, profile and ICM layout, SET_ICM_SIZE + MAP_ICM_AUX,
//! MAP_ICM of every table, INIT_HCA, QUERY_ADAPTER, the driver's command EQ (MAP_EQ for
//! command completions) and the switch to event mode, SET_PORT with the GID table and INIT_PORT
//! per port. Close runs the reverse: CLOSE_PORT, the command EQ back to software, polling mode,
//! CLOSE_HCA, UNMAP_ICM of every table, UNMAP_ICM_AUX, UNMAP_FA.
//!
//! Every failure names the step; a failed open gives back whatever it had set up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use portverbs_hal::block_on;
use portverbs_hal::caps::{AtomicCap, DeviceAttr, DeviceCapFlags, DeviceInfo};
use portverbs_hal::error::CommandError;
use portverbs_hal::rng::SplitMix64;
use portverbs_hal::types::Transport;
use thiserror::Error;
use zerocopy::{FromZeros, IntoBytes};

use super::objects::Objects;
use super::{BlueFlame, Inner, Mlx4Device, Nums};
use crate::alloc::Numbers;
use crate::caps::{self, CapsError, DevCaps, PortCaps};
use crate::cmd::{Cmd, CommandInterface, CommandMode};
use crate::config::Mlx4Config;
use crate::doorbell::DbPages;
use crate::icm::{self, Donated, IcmLayout, Profile, Table};
use crate::layout::hcr::{BAR0_MIN_LEN, RESET_REG, RESET_SEMAPHORE};
use crate::layout::mailbox::{InitHca, MAILBOX_SIZE};
use crate::layout::opcode;
use crate::mtt::Mtts;
use crate::pci::{PciError, PciFunction, is_mlx4_pf};
use crate::quirks::MLX4_QUIRKS;
use crate::regs::MappedBar2;
use crate::uar::Doorbells;

/// Why a device could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Not an mlx4-class physical function.
    #[error("{function}: PCI ID {vendor:04x}:{device:04x} is not an mlx4 physical function")]
    NotMlx4 {
        /// Function.
        function: String,
        /// Vendor ID.
        vendor: u16,
        /// Device ID.
        device: u16,
    },
    /// The PCI seam failed.
    #[error(transparent)]
    Pci(#[from] PciError),
    /// A step of the bring-up failed.
    #[error("{function}: {step} failed: {source}")]
    Step {
        /// Function.
        function: String,
        /// The step.
        step: &'static str,
        /// The command error.
        source: CommandError,
    },
    /// The firmware reported something unusable.
    #[error("{function}: {source}")]
    Caps {
        /// Function.
        function: String,
        /// What.
        source: CapsError,
    },
    /// The configuration does not fit the device.
    #[error("{function}: {what}")]
    Config {
        /// Function.
        function: String,
        /// What.
        what: String,
    },
}

/// The command EQ's size (entries).
const CMD_EQ_ENTRIES: u32 = 64;

impl Mlx4Device {
    /// Opens and brings up the HCA behind `pci` (blocking: a reset takes about a second on
    /// hardware).
    ///
    /// # Errors
    /// See [`OpenError`]; every message names the function and the failing step.
    pub fn open(pci: Arc<dyn PciFunction>, config: Mlx4Config) -> Result<Self, OpenError> {
        Self::open_with(pci, None, config)
    }

    /// [`Mlx4Device::open`], ringing doorbells through `mapped` (BAR2 mapped in one piece)
    /// when given.
    pub(crate) fn open_with(
        pci: Arc<dyn PciFunction>,
        mapped: Option<Arc<MappedBar2>>,
        config: Mlx4Config,
    ) -> Result<Self, OpenError> {
        let function = pci.name();
        let (vendor, device) = pci.ids();
        if !is_mlx4_pf(vendor, device) {
            return Err(OpenError::NotMlx4 {
                function,
                vendor,
                device,
            });
        }
        let bar0 = pci.bar(0)?;
        let doorbells = Doorbells::new(mapped, pci.doorbells(), pci.bar(2)?);
        if bar0.len() < BAR0_MIN_LEN {
            return Err(OpenError::Config {
                function,
                what: format!(
                    "BAR0 is {:#x} bytes, the HCR needs {BAR0_MIN_LEN:#x}",
                    bar0.len()
                ),
            });
        }
        let step = |step: &'static str| {
            let function = function.clone();
            move |source: CommandError| OpenError::Step {
                function,
                step,
                source,
            }
        };
        reset(&*pci, &*bar0).map_err(step("reset"))?;
        let hcr = CommandInterface::new(pci.clone(), bar0.clone(), config.command_timeout);
        let mut donated = Donated::default();
        let r = block_on(bring_up(&*pci, &hcr, &config, &mut donated, &function));
        let (fw, caps, ports, profile, layout) = match r {
            Ok(v) => v,
            Err(e) => {
                // Give back what the HCA holds (best effort), then report the first failure.
                let _ = block_on(hcr.exec(Cmd::new(opcode::CLOSE_HCA)));
                let _ = block_on(icm::unmap_all(&hcr, &mut donated));
                return Err(e);
            }
        };
        let uar = caps.reserved_uars;
        let bf = (config.blueflame && caps.bf_reg_size > 0).then(|| BlueFlame {
            page: crate::layout::uar::bf_page(caps.num_uars as usize, uar as usize),
            half: caps.bf_reg_size as usize / 2,
            regs: caps.bf_regs_per_page as usize,
        });
        let comp_eqs = super::eq::comp_eq_count(
            pci.num_vectors(),
            (1u32 << profile.log_eqs).saturating_sub(caps.reserved_eqs),
        );
        let attr = device_attr(&caps, &profile, fw, &function, comp_eqs);
        let info = DeviceInfo {
            name: config.name.clone(),
            driver: "mlx4",
            transport: Transport::InfiniBand,
            node_guid: attr.node_guid,
            quirks: MLX4_QUIRKS,
            progress: pci.progress(),
        };
        // The keys' bytes and the QP numbers come from the device's generator, so that a
        // peer cannot guess them: seeded from the OS unless the config pins a seed.
        let mut rng = SplitMix64::new(portverbs_hal::rng::seed(config.seed));
        // Above the firmware QPs and the 8 special QPs (Linux `mlx4/qp.c`).
        let qp = Numbers::new(
            caps.reserved_qps.next_multiple_of(8) + 8,
            1 << profile.log_qps,
        );
        let next_qpn = qp.first() + rng.below(u64::from(qp.span())) as u32;
        let nums = Nums {
            pd: Numbers::new(caps.reserved_pds.max(1), 1 << profile.log_qps.max(10)),
            eq: Numbers::new(caps.reserved_eqs, 1 << profile.log_eqs),
            cq: Numbers::new(caps.reserved_cqs, 1 << profile.log_cqs),
            qp,
            srq: Numbers::new(caps.reserved_srqs, 1 << profile.log_srqs),
            mpt: Numbers::new(caps.reserved_mpts.max(2), 1 << profile.log_mpts),
            mpt_tag: vec![0; 1 << profile.log_mpts],
            next_qpn,
            rng,
            bf_next: 0,
            gsi: false,
        };
        let inner = Arc::new(Inner {
            pci: pci.clone(),
            bar0: bar0.clone(),
            doorbells,
            hcr,
            fw,
            caps,
            ports,
            gids: config.gids.clone(),
            profile,
            mtts: Mtts::new(u64::from(caps.reserved_mtts) * 8, 1u64 << profile.log_mtts),
            layout,
            donated: Mutex::new(donated),
            info,
            attr,
            uar,
            bf,
            dbs: DbPages::default(),
            nums: Mutex::new(nums),
            objects: Mutex::new(Objects::default()),
            cmd_eqn: Mutex::new(None),
            demux: Mutex::new(None),
            #[cfg(target_os = "linux")]
            eq_waiter: Mutex::new(None),
            fatal: Arc::new(AtomicBool::new(false)),
            closed: AtomicBool::new(false),
            mcg: Mutex::new(super::mcg::McgState::default()),
            mcg_busy: AtomicBool::new(false),
        });
        let dev = Self(inner);
        block_on(dev.start(&config)).map_err(step("command EQ and ports"))?;
        Ok(dev)
    }

    /// After INIT_HCA: the command EQ, event mode, the ports.
    async fn start(&self, config: &Mlx4Config) -> Result<(), CommandError> {
        let eq = self
            .create_eq_internal(CMD_EQ_ENTRIES, 0, Some(self.0.hcr.sink()))
            .await?;
        let eqn = eq.eqn;
        let eq: Box<dyn portverbs_hal::queue::EventQueue> = Box::new(eq);
        self.0
            .hcr
            .exec(
                Cmd::new(opcode::MAP_EQ)
                    .in_param(1 << crate::layout::eqe::event_type::CMD)
                    .in_mod(eqn),
            )
            .await?;
        *self.0.cmd_eqn.lock().unwrap_or_else(|e| e.into_inner()) = Some(eqn);
        if config.command_mode == CommandMode::Events {
            self.0.hcr.use_events(eq);
            // The interrupt self-test Linux runs after switching (`mlx4/main.c`).
            self.0
                .hcr
                .exec(Cmd::new(opcode::NOP).in_mod(opcode::NOP_IN_MOD))
                .await?;
        } else {
            self.0.objects().parked_eqs.push(eq);
        }
        self.create_eq_pool().await?;
        // The special QPs' block (Linux `mlx4_init_qp_table`); QP1 lives there.
        self.0
            .hcr
            .exec(Cmd::new(opcode::CONF_SPECIAL_QP).in_mod(self.0.special_qp_base()))
            .await?;
        for port in 1..=self.0.caps.num_ports {
            let gids = self
                .0
                .gids
                .get(usize::from(port) - 1)
                .cloned()
                .unwrap_or_default();
            let mut inbox = vec![0u8; GID_TABLE_LEN * 16];
            for (i, g) in gids.iter().take(GID_TABLE_LEN).enumerate() {
                inbox[i * 16..i * 16 + 16].copy_from_slice(&g.0);
            }
            self.0
                .hcr
                .exec_in(
                    Cmd::new(opcode::SET_PORT)
                        .opmod(SET_PORT_ETH)
                        .in_mod(u32::from(port) | (SET_PORT_GID_TABLE << 8)),
                    &inbox,
                )
                .await?;
            self.0
                .hcr
                .exec(Cmd::new(opcode::INIT_PORT).in_mod(u32::from(port)))
                .await?;
        }
        Ok(())
    }
}

/// SET_PORT opcode modifier for Ethernet (RoCE) ports.
pub(crate) const SET_PORT_ETH: u8 = 1;
/// SET_PORT Ethernet sub-command "GID table" (Linux's `MLX4_SET_PORT_GID_TABLE`).
pub(crate) const SET_PORT_GID_TABLE: u32 = 5;
/// GID table entries per port (RoCE).
pub(crate) const GID_TABLE_LEN: usize = 128;

/// Resets through the reset register and waits for config space to answer (Linux `mlx4/reset.c`).
fn reset(pci: &dyn PciFunction, bar0: &dyn portverbs_hal::mmio::Mmio) -> Result<(), CommandError> {
    let err = crate::cmd::mmio_error;
    let deadline = Instant::now() + Duration::from_secs(10);
    while bar0.read32(RESET_SEMAPHORE).map_err(err)? != 0 {
        if Instant::now() >= deadline {
            return Err(CommandError::Timeout {
                opcode: 0,
                millis: 10_000,
            });
        }
        std::thread::yield_now();
    }
    bar0.write32(RESET_REG, 1).map_err(err)?;
    std::thread::sleep(pci.reset_settle());
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match pci.config_read16(0) {
            Ok(0xffff) | Err(_) if Instant::now() < deadline => std::thread::yield_now(),
            Ok(0xffff) | Err(_) => return Err(CommandError::Removed),
            Ok(_) => return Ok(()),
        }
    }
}

type Brought = (caps::FwInfo, DevCaps, Vec<PortCaps>, Profile, IcmLayout);

async fn bring_up(
    pci: &dyn PciFunction,
    hcr: &CommandInterface,
    config: &Mlx4Config,
    donated: &mut Donated,
    function: &str,
) -> Result<Brought, OpenError> {
    let step = |step: &'static str| {
        let function = function.to_string();
        move |source: CommandError| OpenError::Step {
            function,
            step,
            source,
        }
    };
    let caps_err = |source| OpenError::Caps {
        function: function.to_string(),
        source,
    };
    let mut out = vec![0u8; MAILBOX_SIZE];
    hcr.exec_out(Cmd::new(opcode::QUERY_FW), &mut out)
        .await
        .map_err(step("QUERY_FW"))?;
    let fw = caps::parse_fw(&out).map_err(caps_err)?;
    icm::start_firmware(pci, hcr, fw.fw_pages, donated)
        .await
        .map_err(step("MAP_FA/RUN_FW"))?;
    hcr.exec_out(Cmd::new(opcode::QUERY_DEV_CAP), &mut out)
        .await
        .map_err(step("QUERY_DEV_CAP"))?;
    let caps = caps::parse_dev_cap(&out).map_err(caps_err)?;
    if config.gids.len() > usize::from(caps.num_ports) {
        return Err(OpenError::Config {
            function: function.to_string(),
            what: format!(
                "GID tables for {} ports given, the device has {}",
                config.gids.len(),
                caps.num_ports
            ),
        });
    }
    let mut ports = Vec::new();
    for port in 1..=caps.num_ports {
        hcr.exec_out(
            Cmd::new(opcode::QUERY_PORT).in_mod(u32::from(port)),
            &mut out,
        )
        .await
        .map_err(step("QUERY_PORT"))?;
        ports.push(caps::parse_port(&out).map_err(caps_err)?);
    }
    let profile = Profile::for_device(&caps);
    let layout = IcmLayout::new(&caps, &profile);
    if caps.max_icm_sz != 0 && layout.total > caps.max_icm_sz {
        return Err(OpenError::Config {
            function: function.to_string(),
            what: format!(
                "the ICM layout needs {} bytes, the device allows {}",
                layout.total, caps.max_icm_sz
            ),
        });
    }
    icm::map_icm(pci, hcr, &layout, donated)
        .await
        .map_err(step("SET_ICM_SIZE/MAP_ICM_AUX/MAP_ICM"))?;
    let init = init_hca_inbox(&caps, &profile, &layout);
    hcr.exec_in(Cmd::new(opcode::INIT_HCA), init.as_bytes())
        .await
        .map_err(step("INIT_HCA"))?;
    hcr.exec_out(Cmd::new(opcode::QUERY_ADAPTER), &mut out)
        .await
        .map_err(step("QUERY_ADAPTER"))?;
    Ok((fw, caps, ports, profile, layout))
}

/// The INIT_HCA inbox for this layout (Linux `mlx4_INIT_HCA`).
fn init_hca_inbox(caps: &DevCaps, p: &Profile, l: &IcmLayout) -> InitHca {
    let mut m = InitHca::new_zeroed();
    m.version = 2;
    // 64-byte cache lines.
    m.cacheline = (2 << 5) | (1 << 4);
    // Little-endian host: bit1 stays 0. Check the port in UD address vectors.
    m.flags = 1.into();
    let base_log = |t: Table, log: u8| (l.get(t).base | u64::from(log)).into();
    m.qpc_base_log = base_log(Table::Qpc, p.log_qps);
    m.srqc_base_log = base_log(Table::Srqc, p.log_srqs);
    m.cqc_base_log = base_log(Table::Cqc, p.log_cqs);
    m.eqc_base_log = base_log(Table::Eqc, p.log_eqs);
    m.rdmarc_base_log = base_log(Table::Rdmarc, p.log_rdmarc);
    m.altc_base = l.get(Table::Altc).base.into();
    m.auxc_base = l.get(Table::Auxc).base.into();
    m.dmpt_base = l.get(Table::Dmpt).base.into();
    let mw = if caps.flags & crate::layout::mailbox::dev_flag::MEM_WINDOW != 0 {
        1 << 31
    } else {
        0
    };
    m.mw_log_mpt = (mw | u32::from(p.log_mpts)).into();
    m.mtt_base = l.get(Table::Mtt).base.into();
    m.cmpt_base = l.get(Table::Cmpt).base.into();
    if p.log_mcg > 0 {
        m.mcg_base = l.get(Table::Mcg).base.into();
        m.log_mc_entry_sz = crate::icm::LOG_MCG_ENTRY;
        m.log_mc_table_sz = p.log_mcg;
        m.log_mc_hash_sz = p.log_mcg - 1;
    }
    m.log_uars = caps.num_uars.trailing_zeros() as u8;
    m.uar_page_sz = 0;
    m
}

fn device_attr(
    caps: &DevCaps,
    p: &Profile,
    fw: caps::FwInfo,
    function: &str,
    comp_eqs: u32,
) -> DeviceAttr {
    let mut flags = DeviceCapFlags::RC_RNR_NAK_GEN
        | DeviceCapFlags::PORT_ACTIVE_EVENT
        | DeviceCapFlags::SYS_IMAGE_GUID
        | DeviceCapFlags::CURR_QP_STATE_MOD;
    if caps.flags & crate::layout::mailbox::dev_flag::MEM_WINDOW != 0 {
        flags |= DeviceCapFlags::MEM_WINDOW;
        use crate::layout::mailbox::bmme_flag;
        if caps.bmme_flags & (bmme_flag::TYPE_2B_WIN | bmme_flag::TYPE_2_WIN) != 0 {
            flags |= DeviceCapFlags::MEM_WINDOW_TYPE_2B;
        }
    }
    // Mellanox's OUI with the low bits from the function's address. (Real firmware answers
    // NodeInfo through MAD_IFC; this driver does not issue MADs yet.)
    let low = function.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let node_guid = 0x0002_c903_0000_0000 | (low & 0xffff_ffff);
    let qps = 1u32 << p.log_qps;
    let first_qp = caps.reserved_qps.next_multiple_of(8) + 8;
    let max_rd = 1u32 << caps.log_max_ra_res_qp.min(4);
    DeviceAttr {
        fw_ver: format!("{}.{}.{}", fw.version.0, fw.version.1, fw.version.2),
        node_guid,
        sys_image_guid: node_guid,
        max_mr_size: 1u64
            .checked_shl(u32::from(caps.log_max_mrw_sz))
            .unwrap_or(u64::MAX),
        page_size_cap: 0xffff_f000,
        vendor_id: 0x02c9,
        vendor_part_id: 4099,
        hw_ver: 0,
        board_id: "PORTVERBS_MLX4".into(),
        max_qp: qps - first_qp,
        max_qp_wr: (1u32 << caps.log_max_qp_sz.min(15)) - 64,
        device_cap_flags: flags,
        max_sge: caps.max_sg_sq.min(caps.max_sg_rq).min(32),
        max_sge_rd: caps.max_sg_rq.min(32),
        max_cq: (1u32 << p.log_cqs) - caps.reserved_cqs,
        max_cqe: (1u32 << caps.log_max_cq_sz.min(22)) - 1,
        max_mr: (1u32 << p.log_mpts) - caps.reserved_mpts,
        max_pd: (1u32 << p.log_qps.max(10)) - caps.reserved_pds.max(1),
        max_qp_rd_atom: max_rd,
        max_res_rd_atom: max_rd * qps,
        max_qp_init_rd_atom: 1 << caps.log_max_ra_req_qp.min(4),
        atomic_cap: if caps.flags & crate::layout::mailbox::dev_flag::ATOMIC != 0 {
            AtomicCap::Hca
        } else {
            AtomicCap::None
        },
        max_mw: (1u32 << p.log_mpts) - caps.reserved_mpts,
        max_ah: qps,
        // The MCG table (device::mcg): as many groups as there are overflow entries, so
        // that every advertised group fits whatever the hash does.
        max_mcast_grp: super::mcg::Geometry::of(caps, p).map_or(0, |g| g.max_groups),
        max_mcast_qp_attach: super::mcg::Geometry::of(caps, p).map_or(0, |g| g.per_group),
        max_total_mcast_qp_attach: super::mcg::Geometry::of(caps, p)
            .map_or(0, |g| g.max_groups * g.per_group),
        max_srq: (1u32 << p.log_srqs) - caps.reserved_srqs,
        max_srq_wr: (1u32 << caps.log_max_srq_sz.min(15)) - 1,
        max_srq_sge: caps.max_sg_rq.min(32),
        max_pkeys: 1,
        local_ca_ack_delay: caps.ack_delay,
        phys_port_cnt: caps.num_ports,
        max_inline_data: crate::queues::sq::MAX_INLINE,
        num_comp_vectors: comp_eqs,
        hca_core_clock: 0,
    }
}

/// Teardown (from `Drop`): reverse order, best effort, nothing may panic.
pub(super) fn close(inner: &Inner) {
    if inner.closed.swap(true, Ordering::AcqRel) {
        return;
    }
    let hcr = &inner.hcr;
    let gone = inner.fatal.load(Ordering::Acquire);
    let run = |cmd: Cmd| {
        if gone {
            return;
        }
        if let Err(e) = block_on(hcr.exec(cmd)) {
            tracing::warn!(op = opcode::name(cmd.opcode), %e, "teardown command failed");
        }
    };
    for port in 1..=inner.caps.num_ports {
        run(Cmd::new(opcode::CLOSE_PORT).in_mod(u32::from(port)));
    }
    // The interrupt thread first: it raises the sinks of the EQs given back below.
    #[cfg(target_os = "linux")]
    if let Some(w) = inner
        .eq_waiter
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        w.stop();
    }
    let pool = inner.demux.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(pool) = pool {
        run(Cmd::new(opcode::MAP_EQ)
            .in_param(crate::layout::eqe::ASYNC_EVENT_MASK)
            .in_mod(pool.async_eq.eqn | 1 << 31));
        for hw in pool.all() {
            run(Cmd::new(opcode::HW2SW_EQ)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(hw.eqn));
            inner.objects().release_eq(hw.eqn, &inner.mtts, &inner.dbs);
            if hw.vector != 0 {
                let _ = inner
                    .pci
                    .route_interrupt(hw.vector, Arc::new(portverbs_hal::notify::NullSink));
            }
        }
    }
    let eqn = inner
        .cmd_eqn
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take();
    if let Some(eqn) = eqn {
        // Back to polling first: the completion of the unmapping MAP_EQ itself would have no
        // EQ to go to.
        let _ = hcr.use_polling();
        run(Cmd::new(opcode::MAP_EQ)
            .in_param(1 << crate::layout::eqe::event_type::CMD)
            .in_mod(eqn | 1 << 31));
        run(Cmd::new(opcode::HW2SW_EQ)
            .opmod(opcode::OPMOD_NO_OUTBOX)
            .in_mod(eqn));
        inner.objects().release_eq(eqn, &inner.mtts, &inner.dbs);
    }
    run(Cmd::new(opcode::CLOSE_HCA));
    let mut donated = inner.donated.lock().unwrap_or_else(|e| e.into_inner());
    if gone {
        // After a catastrophic error the firmware answers nothing useful: reset the HCA (as
        // Linux's reset flow does), which returns every object, ICM page and the firmware
        // area to the host. A removed device ignores the write.
        if let Err(e) = reset(&*inner.pci, &*inner.bar0) {
            tracing::warn!(%e, "reset after a fatal error failed");
        }
    } else if let Err(e) = block_on(icm::unmap_all(hcr, &mut donated)) {
        tracing::warn!(%e, "giving ICM back failed");
    }
    *donated = Donated::default();
}

//! The public handles: [`Mlx4Model`] (fault injection, counters) and [`ModelFunction`] (the
//! PCI function a driver opens).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use portverbs_dma::HostMapped;
use portverbs_fabric::{Fabric, FabricError, NodeConfig, NodeHandle};
use portverbs_hal::dma::{DmaError, DmaMemory, HostMemory, MapHostError};
use portverbs_hal::mmio::Mmio;
use portverbs_hal::notify::InterruptSink;
use portverbs_hal::types::Mtu;
use portverbs_mlx4_layout::pci::{CONNECTX3, MELLANOX_VENDOR, PciError, PciFunction, UarDoorbells};
use portverbs_mlx4_layout::status::Status;
use portverbs_transport::{Engine, EngineConfig, EngineStats, PortInfo};
use thiserror::Error;

use crate::bar0::Bar0;
use crate::bar2::Bar2;
use crate::caps;
use crate::hw::{self, Hw, ModelNode};
use crate::shared::{CORRUPT_INDEX, CORRUPT_OPCODE, CORRUPT_QPN, FAIL_ARMED, Shared};

/// How to build a model.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    /// Name; `mlx4_modelN` by default.
    pub name: Option<String>,
    /// Ports: 1 or 2 (Ethernet / RoCE).
    pub ports: u8,
    /// Port MTU (QUERY_PORT's max IB MTU, the engine's port MTU).
    pub mtu: Mtu,
    /// MSI-X vectors. The mlx4 driver puts its command EQ on vector 0, the device's
    /// asynchronous EQ on vector 1 and one shared completion EQ on each vector above; every
    /// context's event queues are software queues on those.
    pub num_vectors: u32,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            name: None,
            ports: 1,
            mtu: Mtu::Mtu4096,
            num_vectors: 32,
        }
    }
}

/// Why a model could not be attached.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ModelError {
    /// A configuration value is out of range.
    #[error("bad model configuration: {0}")]
    Config(String),
    /// The fabric refused the device.
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// What the model holds now and what happened so far. After a driver tore everything down,
/// [`ModelCounts::is_clear`] holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ModelCounts {
    /// Live EQs.
    pub eqs: usize,
    /// Live CQs.
    pub cqs: usize,
    /// QPs not in RESET.
    pub qps: usize,
    /// Live SRQs.
    pub srqs: usize,
    /// MPTs in hardware ownership (regions and windows).
    pub mpts: usize,
    /// Regions / windows registered in the transport engine.
    pub engine_mrs: usize,
    /// Windows.
    pub engine_mws: usize,
    /// QPs in the transport engine.
    pub engine_qps: usize,
    /// ICM pages mapped with MAP_ICM.
    pub icm_pages: usize,
    /// Auxiliary pages mapped with MAP_ICM_AUX.
    pub aux_pages: u64,
    /// Firmware-area pages mapped with MAP_FA.
    pub fw_pages: u64,
    /// DMA regions mapped in the model's IOMMU (allocated and not yet dropped).
    pub dma_regions: usize,
    /// Commands posted (go written), ever.
    pub commands: u64,
    /// Send doorbells (UAR + 0x14), ever.
    pub send_doorbells: u64,
    /// BlueFlame posts, ever.
    pub blueflame_writes: u64,
    /// Doorbells ignored (unknown object, wrong UAR page, half a CQ doorbell), ever.
    pub ignored_doorbells: u64,
    /// Interrupts raised, ever.
    pub interrupts: u64,
    /// Events dropped (no EQ mapped, EQ full or missing), ever.
    pub lost_events: u64,
    /// EQ overruns, ever.
    pub eq_overflows: u64,
}

impl ModelCounts {
    /// True when no object, mapping or DMA region is left.
    pub fn is_clear(&self) -> bool {
        self.eqs == 0
            && self.cqs == 0
            && self.qps == 0
            && self.srqs == 0
            && self.mpts == 0
            && self.engine_mrs == 0
            && self.engine_mws == 0
            && self.engine_qps == 0
            && self.icm_pages == 0
            && self.aux_pages == 0
            && self.fw_pages == 0
            && self.dma_regions == 0
    }
}

#[derive(Debug)]
struct Inner {
    name: String,
    config: ModelConfig,
    handle: NodeHandle<ModelNode>,
    shared: Arc<Shared>,
    bar0: Arc<Bar0>,
    bar2: Arc<Bar2>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // BARs a driver still holds behave as after a surprise removal.
        self.shared.removed.store(true, Ordering::Release);
        self.handle.detach();
    }
}

/// A handle to one emulated HCA: fault injection and counters. Cheap to clone; the device
/// leaves the fabric when the last `Mlx4Model` and [`ModelFunction`] are gone.
#[derive(Debug, Clone)]
pub struct Mlx4Model {
    inner: Arc<Inner>,
}

/// The PCI function of a model, as the driver sees it.
#[derive(Debug)]
pub struct ModelFunction {
    inner: Arc<Inner>,
}

static NEXT: AtomicUsize = AtomicUsize::new(0);

impl Mlx4Model {
    /// Puts a new model on `fabric`. Its ports are down and have no GID until the driver
    /// brings them up (INIT_PORT) and programs their GID tables (SET_PORT).
    ///
    /// # Errors
    /// 0 or more than 2 ports, no interrupt vector, or the fabric refused the device.
    pub fn attach(
        fabric: &Fabric,
        config: ModelConfig,
    ) -> Result<(Self, Arc<ModelFunction>), ModelError> {
        if !(1..=2).contains(&config.ports) {
            return Err(ModelError::Config(format!(
                "{} ports (1 or 2)",
                config.ports
            )));
        }
        if config.num_vectors == 0 || config.num_vectors > 1024 {
            return Err(ModelError::Config(format!(
                "{} MSI-X vectors (1..=1024)",
                config.num_vectors
            )));
        }
        let name = config
            .name
            .clone()
            .unwrap_or_else(|| format!("mlx4_model{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        let shared = Arc::new(Shared::new(config.num_vectors));
        let hw = Hw::new(shared.clone(), config.ports, config.mtu, config.num_vectors);
        let handle = fabric.attach("mlx4-model", |joining| {
            // The ports have no GID (so no route) until the driver programs the GID table.
            let ports = (0..config.ports)
                .map(|_| PortInfo {
                    gids: Vec::new(),
                    mtu: config.mtu,
                    active: false,
                })
                .collect();
            let mut engine = Engine::new(
                EngineConfig {
                    max_qp: 1 << caps::LOG_MAX_QP,
                    max_keys: 1 << caps::LOG_MAX_MPT,
                    ..EngineConfig::default()
                },
                ports,
            );
            engine.set_max_train(joining.max_train);
            // The engine delivers what the MCG table lists (hw::mcg keeps it in step): as
            // many groups as the table has entries, as many QPs per group as an entry holds.
            let entries = 1u32 << caps::LOG_MAX_MCG;
            engine.set_mcast_limits(portverbs_transport::McastLimits {
                groups: entries,
                qps_per_group: portverbs_transport::MAX_MCAST_QPS_PER_GROUP,
                total: entries * portverbs_transport::MAX_MCAST_QPS_PER_GROUP,
            });
            let node_config = NodeConfig {
                name: name.clone(),
                routes: Vec::new(),
            };
            (
                node_config,
                ModelNode {
                    engine,
                    hw,
                    state: (),
                },
            )
        })?;
        let inner = Arc::new(Inner {
            name,
            config,
            bar0: Arc::new(Bar0::new(shared.clone(), handle.clone())),
            bar2: Arc::new(Bar2::new(shared.clone(), handle.clone())),
            handle,
            shared,
        });
        Ok((
            Self {
                inner: inner.clone(),
            },
            Arc::new(ModelFunction { inner }),
        ))
    }

    /// The model's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The fabric the model is on.
    pub fn fabric(&self) -> &Fabric {
        self.inner.handle.fabric()
    }

    /// While on, commands latch (go is set) but never complete; a reset clears the stuck
    /// command and the injection.
    pub fn inject_command_timeout(&self, on: bool) {
        self.inner.shared.cmd_timeout.store(on, Ordering::Release);
    }

    /// Slow firmware: while on, a command posted in event mode runs and frees the HCR at
    /// once, but its completion event waits until [`Mlx4Model::release_command_events`], as
    /// real firmware takes its time. A driver must not wait for it inside work it owes
    /// others (the CM's message processing, for one).
    pub fn hold_command_events(&self, on: bool) {
        self.inner.shared.hold_events.store(on, Ordering::Release);
    }

    /// Posts the command completions held by [`Mlx4Model::hold_command_events`], in order;
    /// returns how many.
    pub fn release_command_events(&self) -> usize {
        let held = std::mem::take(
            &mut *self
                .inner
                .shared
                .held
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let n = held.len();
        let _ = self.inner.handle.try_with(|ctx| {
            for (token, status, out) in held {
                ctx.node.hw.command_event(token, status, out);
            }
        });
        n
    }

    /// The next command with `opcode` fails with `status` without running (the object it
    /// names is left as it was), as firmware refusing a command would. One at a time: a later
    /// call replaces an injection not yet consumed.
    pub fn fail_next_command(&self, opcode: u16, status: Status) {
        let v = FAIL_ARMED | (u32::from(opcode) << 8) | status as u32;
        self.inner.shared.fail_command.store(v, Ordering::Release);
    }

    /// The next CQE written carries QPN 0xffffff and an opcode that exists in neither
    /// direction (a driver must refuse it).
    pub fn corrupt_next_cqe(&self) {
        self.inner
            .shared
            .corrupt_cqe
            .store(CORRUPT_OPCODE, Ordering::Release);
    }

    /// The next CQE written is well formed but names QPN 0xffffff, a QP the driver never
    /// made (the driver decodes it; the core must refuse it).
    pub fn misaddress_next_cqe(&self) {
        self.inner
            .shared
            .corrupt_cqe
            .store(CORRUPT_QPN, Ordering::Release);
    }

    /// The next CQE written is well formed and names the right QP, but its WQE counter is
    /// half the 16-bit counter space away from the work request it completes, so it names
    /// none outstanding (the driver decodes it; the core must refuse it).
    pub fn misindex_next_cqe(&self) {
        self.inner
            .shared
            .corrupt_cqe
            .store(CORRUPT_INDEX, Ordering::Release);
    }

    /// A catastrophic error: LOCAL_CATAS (type 0x08) on the EQ mapped for it, the
    /// catastrophic-error buffer becomes non-zero, every QP is flushed, and every later command
    /// fails with INTERNAL_ERR until a reset.
    pub fn catastrophic_error(&self) {
        self.inner.bar0.set_catastrophic();
        let _ = self.inner.handle.try_with(|ctx| {
            let ModelNode { engine, hw, .. } = &mut *ctx.node;
            hw.catastrophic(engine);
        });
    }

    /// Surprise removal: BAR reads fail with [`portverbs_hal::mmio::MmioError::Removed`],
    /// writes are ignored, config space reads all-ones, nothing more is written to DMA memory,
    /// and the device forgets every object (QPs are failed without completions). Permanent.
    pub fn remove(&self) {
        self.inner.shared.removed.store(true, Ordering::Release);
        let _ = self.inner.handle.try_with(|ctx| hw::reset(ctx, true));
    }

    /// Transport counters of the model's engine.
    pub fn engine_stats(&self) -> EngineStats {
        self.inner
            .handle
            .try_with(|ctx| ctx.node.engine.stats())
            .unwrap_or_default()
    }

    /// A catastrophic error of one QP, as a malformed WQE would cause: WQ_CATAS on the async
    /// EQ, the QP to ERR, its outstanding WQEs flushed.
    pub fn inject_qp_fatal(&self, qpn: u32) {
        let _ = self.inner.handle.try_with(|ctx| {
            let ModelNode { engine, hw, .. } = &mut *ctx.node;
            engine.qp_fatal(qpn, hw);
        });
    }

    /// The link of `port` goes down or comes back up (PORT_CHANGE event).
    pub fn set_port_active(&self, port: u8, active: bool) {
        let _ = self.inner.handle.try_with(|ctx| {
            let ModelNode { engine, hw, .. } = &mut *ctx.node;
            hw.set_link(engine, port, active);
        });
    }

    /// Live objects, mappings and DMA regions, and event counters.
    pub fn counts(&self) -> ModelCounts {
        let live = self
            .inner
            .handle
            .try_with(|ctx| ctx.node.hw.live(&ctx.node.engine))
            .unwrap_or_default();
        let s = &self.inner.shared.stats;
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        ModelCounts {
            eqs: live.eqs,
            cqs: live.cqs,
            qps: live.qps,
            srqs: live.srqs,
            mpts: live.mpts,
            engine_mrs: live.engine_mrs,
            engine_mws: live.engine_mws,
            engine_qps: live.engine_qps,
            icm_pages: live.icm_pages,
            aux_pages: live.aux_pages,
            fw_pages: live.fw_pages,
            dma_regions: self.inner.shared.iova.count(),
            commands: get(&s.commands),
            send_doorbells: get(&s.send_doorbells),
            blueflame_writes: get(&s.blueflame_writes),
            ignored_doorbells: get(&s.ignored_doorbells),
            interrupts: get(&s.interrupts),
            lost_events: get(&s.lost_events),
            eq_overflows: get(&s.eq_overflows),
        }
    }
}

impl PciFunction for ModelFunction {
    fn name(&self) -> String {
        self.inner.name.clone()
    }

    fn ids(&self) -> (u16, u16) {
        (MELLANOX_VENDOR, CONNECTX3)
    }

    fn bar(&self, index: u8) -> Result<Arc<dyn Mmio>, PciError> {
        match index {
            0 => Ok(self.inner.bar0.clone()),
            2 => Ok(self.inner.bar2.clone()),
            _ => Err(PciError::Bar {
                function: self.name(),
                bar: index,
                reason: "the model has BAR0 and BAR2 only".into(),
            }),
        }
    }

    fn doorbells(&self) -> Option<Arc<dyn UarDoorbells>> {
        Some(self.inner.bar2.clone())
    }

    /// Vendor ID at 0, device ID at 2, zero elsewhere; all-ones after removal. The model
    /// answers immediately after a reset (it never reads 0xffff in between).
    fn config_read16(&self, offset: u16) -> Result<u16, PciError> {
        if self.inner.shared.removed() {
            return Ok(0xffff);
        }
        Ok(match offset {
            0 => MELLANOX_VENDOR,
            2 => CONNECTX3,
            _ => 0,
        })
    }

    fn alloc_dma(&self, len: usize) -> Result<Arc<dyn HostMapped>, DmaError> {
        Ok(self.inner.shared.iova.alloc(len)?)
    }

    fn map_host(&self, memory: HostMemory) -> Result<Arc<dyn DmaMemory>, MapHostError> {
        Ok(self.inner.shared.iova.map_host(memory)?)
    }

    fn num_vectors(&self) -> u32 {
        self.inner.config.num_vectors
    }

    fn route_interrupt(&self, vector: u32, sink: Arc<dyn InterruptSink>) -> Result<(), PciError> {
        if self.inner.shared.route(vector, sink) {
            Ok(())
        } else {
            Err(PciError::Interrupt {
                function: self.name(),
                vector,
                reason: format!("the model has {} vectors", self.inner.config.num_vectors),
            })
        }
    }

    fn reset_settle(&self) -> Duration {
        Duration::ZERO
    }

    fn progress(&self) -> portverbs_hal::Progress {
        self.inner.handle.fabric().mode().progress()
    }

    fn attach_agent(&self, agent: std::sync::Weak<dyn portverbs_hal::ProgressAgent>) -> bool {
        self.inner.handle.fabric().attach_agent(agent)
    }
}

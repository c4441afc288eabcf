//! The software RDMA device: its own queue formats in DMA rings, its own doorbells, and the HAL
//! command interface; the transport itself is the shared engine (`portverbs-transport`).
//!
//! A [`SoftDevice`] is a handle to one device on a [`Fabric`]: the device side (`SimDevice`,
//! the fabric's [`portverbs_fabric::Node`]) sits in the fabric, and the handle reaches it again
//! through its typed [`NodeHandle`]. Besides the HAL it offers the
//! controls a test needs to exercise error paths: port state changes, a device-fatal error, a
//! catastrophic QP error, and resource counts that must return to zero.

mod commands;
pub(crate) mod doorbell;
pub mod format;
pub(crate) mod hw;
mod node;
mod queues;
pub(crate) mod state;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use portverbs_hal::ObjectCounts;
use portverbs_hal::caps::DeviceInfo;
use portverbs_hal::event::{DeviceEvent, PortEventKind};
use portverbs_hal::rng::SplitMix64;
use portverbs_hal::types::{Gid, PortState};

use portverbs_fabric::{Fabric, FabricError, NodeConfig, NodeHandle};

use crate::engine::{CcConfig, Engine, EngineConfig, EngineStats, Hca, Packet, PortInfo};
use doorbell::Kicker;
use hw::Hw;
pub(crate) use node::SimDevice;
use state::DevState;

pub use node::{DeviceConfig, PortConfig};
pub use queues::{SoftCq, SoftRq, SoftSq, SoftSrq};
pub use state::SOFT_QUIRKS;

/// A handle to one software device.
#[derive(Debug, Clone)]
pub struct SoftDevice {
    pub(crate) node: NodeHandle<SimDevice>,
    pub(crate) info: Arc<DeviceInfo>,
    pub(crate) kicker: Kicker,
    pub(crate) dma: Arc<AtomicUsize>,
    pub(crate) fatal: Arc<AtomicBool>,
}

impl SoftDevice {
    /// Puts a new soft device on `fabric`.
    ///
    /// # Errors
    /// [`FabricError::BadPortCount`] outside 1 to 254 ports, [`FabricError::DuplicateAddress`]
    /// when an address is already on the fabric, [`FabricError::TooManyDevices`].
    pub fn attach(fabric: &Fabric, config: DeviceConfig) -> Result<Self, FabricError> {
        let n = config.ports.len();
        if n == 0 || n > 254 {
            return Err(FabricError::BadPortCount(n));
        }
        let ports: Vec<_> = config
            .ports
            .iter()
            .map(|p| {
                (
                    p.addrs
                        .iter()
                        .map(|ip| Gid::from_ip(*ip))
                        .collect::<Vec<_>>(),
                    p.mtu,
                )
            })
            .collect();
        let routes: Vec<(u8, Gid)> = ports
            .iter()
            .enumerate()
            .flat_map(|(i, (gids, _))| gids.iter().map(move |g| ((i + 1) as u8, *g)))
            .collect();
        let progress = fabric.mode().progress();
        let cc = config.congestion.unwrap_or_else(|| {
            if fabric.mode() == portverbs_fabric::Mode::Stepped {
                CcConfig::default()
            } else {
                CcConfig::host_sockets()
            }
        });
        let node = fabric.attach("soft", |joining| {
            let index = joining.ordinal;
            let name = config.name.unwrap_or_else(|| format!("soft{index}"));
            let engine_ports = ports
                .iter()
                .map(|(gids, mtu)| PortInfo {
                    gids: gids.clone(),
                    mtu: *mtu,
                    active: true,
                })
                .collect();
            // The device's identifiers (keys, QP numbers) come from one seed: the fabric's
            // choice (the OS's randomness, or a stepped fabric's seed) unless pinned.
            let mut rng = SplitMix64::new(config.seed.unwrap_or(joining.seed));
            let state = DevState::new(name.clone(), index, ports, &mut rng, progress);
            let mut engine = Engine::new(
                EngineConfig {
                    max_qp: state::limits::MAX_QP,
                    seed: rng.next_u64(),
                    cc,
                    ..EngineConfig::default()
                },
                engine_ports,
            );
            engine.set_max_train(joining.max_train);
            engine.set_mcast_limits(portverbs_transport::McastLimits {
                groups: state.attr.max_mcast_grp,
                qps_per_group: state.attr.max_mcast_qp_attach,
                total: state.attr.max_total_mcast_qp_attach,
            });
            let device = SimDevice {
                engine,
                hw: Hw::default(),
                state,
            };
            (NodeConfig { name, routes }, device)
        })?;
        let (info, dma, fatal) = node.with(|ctx| {
            let s = &ctx.node.state;
            (Arc::new(s.info.clone()), s.dma.clone(), s.fatal.clone())
        });
        Ok(Self {
            kicker: Kicker(node.kicker().clone()),
            node,
            info,
            dma,
            fatal,
        })
    }

    /// The fabric this device is on.
    pub fn fabric(&self) -> &Fabric {
        self.node.fabric()
    }

    /// Runs `f` on this device's simulation state with the fabric lock held, then routes the
    /// packets it produced.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut SimDevice, u64, &mut Vec<Packet>) -> R) -> R {
        self.node.with(|ctx| f(ctx.node, ctx.now, ctx.out))
    }

    /// Live objects on this device.
    pub fn resources(&self) -> ObjectCounts {
        self.with(|d, _, _| ObjectCounts {
            pds: d.state.pds.len(),
            mrs: d.state.mrs.len(),
            mws: d.state.mws.len(),
            cqs: d.hw.cqs.len(),
            qps: d.engine.qp_count(),
            srqs: d.hw.srqs.len(),
            eqs: d.hw.eqs.len(),
            dma_regions: self.dma.load(Ordering::Relaxed),
            ..ObjectCounts::default()
        })
    }

    /// Transport counters of this device.
    pub fn engine_stats(&self) -> EngineStats {
        self.with(|d, _, _| d.engine.stats())
    }

    /// Events the device could not deliver (full or missing event queue).
    pub fn lost_events(&self) -> u64 {
        self.with(|d, _, _| d.hw.lost_events)
    }

    /// Takes a port down or brings it up, with the port event IBTA prescribes.
    pub fn set_port_active(&self, port: u8, active: bool) {
        self.with(|d, _, _| {
            let i = usize::from(port).wrapping_sub(1);
            let (Some(p), Some(e)) = (d.state.ports.get_mut(i), d.engine.ports_mut().get_mut(i))
            else {
                return;
            };
            if e.active == active {
                return;
            }
            e.active = active;
            p.attr.state = if active {
                PortState::Active
            } else {
                PortState::Down
            };
            let kind = if active {
                PortEventKind::Active
            } else {
                PortEventKind::Down
            };
            d.hw.post_event(DeviceEvent::Port { port, kind });
        });
    }

    /// Simulates a catastrophic device error: every QP is flushed, the device reports
    /// `DeviceFatal`, and every later command fails.
    pub fn inject_fatal(&self) {
        self.fatal.store(true, Ordering::SeqCst);
        self.with(|d, _, _| {
            d.engine.fail_all(&mut d.hw);
            d.hw.fatal();
        });
    }

    /// Simulates a catastrophic error of one QP (as a malformed WQE would cause).
    pub fn inject_qp_fatal(&self, qpn: u32) {
        self.with(|d, _, _| d.engine.qp_fatal(qpn, &mut d.hw));
    }

    pub(crate) fn is_fatal(&self) -> bool {
        self.fatal.load(Ordering::Acquire)
    }
}

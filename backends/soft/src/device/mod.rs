//! The software RDMA device: its own queue formats in DMA rings, its own doorbells, and the HAL
//! command interface; the transport itself is the shared [`crate::engine`].
//!
//! A [`SoftDevice`] is a handle to one device on a [`Fabric`]. Besides the HAL it offers the
//! controls a test needs to exercise error paths: port state changes, a device-fatal error, a
//! catastrophic QP error, and resource counts that must return to zero.

mod commands;
pub(crate) mod doorbell;
pub mod format;
pub(crate) mod hw;
mod queues;
pub(crate) mod state;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use portverbs_hal::caps::DeviceInfo;
use portverbs_hal::event::{DeviceEvent, PortEventKind};
use portverbs_hal::types::{Gid, PortState};

use crate::engine::{Engine, EngineConfig, EngineStats, Hca, Packet, PortInfo};
use crate::fabric::sim::{Node, Sim, SimDevice};
use crate::fabric::{DeviceConfig, Fabric, FabricError};
use doorbell::Kicker;
use hw::Hw;
use state::DevState;

pub use queues::{SoftCq, SoftRq, SoftSq, SoftSrq};
pub use state::SOFT_QUIRKS;

/// Live objects of a device; every count is zero once an application has released everything.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResourceCounts {
    /// Protection domains.
    pub pds: usize,
    /// Memory regions.
    pub mrs: usize,
    /// Memory windows.
    pub mws: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Queue pairs.
    pub qps: usize,
    /// Shared receive queues.
    pub srqs: usize,
    /// Event queues.
    pub eqs: usize,
    /// DMA regions (rings and buffers).
    pub dma_regions: usize,
}

impl ResourceCounts {
    /// True when nothing is allocated.
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }
}

/// A handle to one software device.
#[derive(Debug, Clone)]
pub struct SoftDevice {
    pub(crate) fabric: Fabric,
    pub(crate) index: usize,
    pub(crate) info: DeviceInfo,
    pub(crate) kicker: Kicker,
    pub(crate) dma: Arc<AtomicUsize>,
    pub(crate) fatal: Arc<AtomicBool>,
}

impl SoftDevice {
    pub(crate) fn attach(fabric: &Fabric, config: DeviceConfig) -> Result<Self, FabricError> {
        let n = config.ports.len();
        if n == 0 || n > 254 {
            return Err(FabricError::BadPortCount(n));
        }
        let mut sim = fabric.shared.lock();
        let index = sim.devices.len();
        let dev = u16::try_from(index).map_err(|_| FabricError::TooManyDevices)?;
        for port in &config.ports {
            for ip in &port.addrs {
                if sim.routes.contains_key(&Gid::from_ip(*ip)) {
                    return Err(FabricError::DuplicateAddress(*ip));
                }
            }
        }
        let name = config.name.unwrap_or_else(|| format!("soft{index}"));
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
        let engine_ports = ports
            .iter()
            .map(|(gids, mtu)| PortInfo {
                gids: gids.clone(),
                mtu: *mtu,
                active: true,
            })
            .collect();
        let state = DevState::new(name, index, ports.clone());
        let routes: Vec<(u8, Gid)> = ports
            .iter()
            .enumerate()
            .flat_map(|(i, (gids, _))| gids.iter().map(move |g| ((i + 1) as u8, *g)))
            .collect();
        let device = Self {
            fabric: fabric.clone(),
            index,
            info: state.info.clone(),
            kicker: fabric.shared.kicker(dev),
            dma: state.dma.clone(),
            fatal: state.fatal.clone(),
        };
        let mut engine = Engine::new(EngineConfig::default(), engine_ports);
        engine.set_max_train(sim.max_train());
        sim.devices.push(SimDevice {
            engine,
            hw: Hw::default(),
            state,
        });
        sim.add_routes(Node::Soft(index), &routes);
        Ok(device)
    }

    /// The fabric this device is on.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// Runs `f` on this device's simulation state with the fabric lock held, then routes the
    /// packets it produced.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut SimDevice, u64, &mut Vec<Packet>) -> R) -> R {
        let mut sim = self.fabric.shared.lock();
        if self.fabric.mode() == crate::fabric::Mode::Threaded {
            sim.now = self.fabric.shared.real_now();
        }
        let now = sim.now;
        let Sim { devices, out, .. } = &mut *sim;
        let r = f(&mut devices[self.index], now, out);
        sim.route_out();
        r
    }

    /// Live objects on this device.
    pub fn resources(&self) -> ResourceCounts {
        self.with(|d, _, _| ResourceCounts {
            pds: d.state.pds.len(),
            mrs: d.state.mrs.len(),
            mws: d.state.mws.len(),
            cqs: d.hw.cqs.len(),
            qps: d.engine.qp_count(),
            srqs: d.hw.srqs.len(),
            eqs: d.hw.eqs.len(),
            dma_regions: self.dma.load(Ordering::Relaxed),
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

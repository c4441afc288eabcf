//! Foreign device models on the fabric: devices whose queue formats are not the soft device's
//! (the emulated mlx4 HCA) but whose transport is the same [`Engine`], so that they and soft
//! devices talk to each other over RC, UC and UD.
//!
//! A foreign device implements [`ForeignDevice`] — the engine's [`Hca`] seam plus two hooks for
//! the kicks it sends itself — and is attached with [`super::Fabric::attach_foreign`]. It then
//! sits in the simulation exactly like a soft device: its engine runs in the same
//! [`super::Fabric::step`] (stepped mode, on virtual time, under the same seeded faults) or on the
//! engine thread (free-running mode). The [`ForeignHandle`] it gets back kicks it without a lock
//! (a doorbell), runs commands under the fabric lock ([`ForeignHandle::with`]), and changes its
//! GID routes while it runs (a driver programs its port's GID table at run time).
//!
//! Only foreign devices pay for dynamic dispatch; the soft device's own paths stay monomorphic.

use std::any::Any;
use std::fmt::Debug;

use portverbs_hal::types::Gid;

use super::sim::{ForeignSlot, Node, Routes, Sim};
use super::{Fabric, FabricError, Mode};
use crate::device::doorbell::{KickKind, Kicker};
use crate::engine::{Engine, EngineConfig, Hca, Packet, PortInfo};

/// A device model that is not a soft device. All methods run with the fabric lock held and must
/// not block (they may raise interrupts: [`portverbs_hal::notify::InterruptSink`] must not block
/// either).
pub trait ForeignDevice: Hca + Send + Debug + 'static {
    /// A kick sent through [`ForeignHandle::kick`] arrived; `what` is the value given there
    /// (the mlx4 model sends the QPN of a send doorbell).
    fn kick(&mut self, engine: &mut Engine, now: u64, what: u32, out: &mut Vec<Packet>);

    /// The lock-free kick channel overflowed and some kicks were lost: look at every queue once.
    fn rescan(&mut self, engine: &mut Engine, now: u64, out: &mut Vec<Packet>);

    /// Work the device finds by watching host memory rather than through a doorbell, looked
    /// for on every step of the fabric (the mlx4 model: receives posted to a QP in ERR, which
    /// has no receive doorbell). Returns whether it did anything. The default finds nothing.
    fn poll(&mut self, engine: &mut Engine, now: u64, out: &mut Vec<Packet>) -> bool {
        let _ = (engine, now, out);
        false
    }

    /// The concrete type, so the model finds itself again inside [`ForeignHandle::with`].
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// How to attach a foreign device.
#[derive(Debug, Clone)]
pub struct ForeignConfig {
    /// Device name (shown by [`Fabric::gids`]).
    pub name: String,
    /// Ports as the engine sees them (1 to 254); their GIDs become routes now, later ones are
    /// added with [`ForeignCtx::add_route`].
    pub ports: Vec<PortInfo>,
    /// Engine sizing (QP numbers, key space).
    pub engine: EngineConfig,
}

/// What [`ForeignHandle::with`] hands to its closure: the device, its engine, the time, the
/// packet buffer (routed when the closure returns), and the device's routes.
#[derive(Debug)]
pub struct ForeignCtx<'a> {
    /// The device model.
    pub device: &'a mut dyn ForeignDevice,
    /// Its transport engine.
    pub engine: &'a mut Engine,
    /// Current time in nanoseconds (virtual in stepped mode).
    pub now: u64,
    /// Packets produced; the fabric routes them after the closure.
    pub out: &'a mut Vec<Packet>,
    routes: &'a mut Routes,
    node: usize,
}

impl ForeignCtx<'_> {
    /// Routes `gid` to `port` of this device.
    ///
    /// # Errors
    /// [`FabricError::DuplicateAddress`] when another device or port owns the GID.
    pub fn add_route(&mut self, port: u8, gid: Gid) -> Result<(), FabricError> {
        let me = Node::Foreign(self.node);
        match self.routes.get(&gid) {
            Some(&(n, p)) if (n, p) == (me, port) => Ok(()),
            Some(_) => Err(FabricError::DuplicateAddress(gid.to_ip())),
            None => {
                self.routes.insert(gid, (me, port));
                Ok(())
            }
        }
    }

    /// Stops routing `gid` here; false when it was not this device's.
    pub fn remove_route(&mut self, gid: Gid) -> bool {
        match self.routes.get(&gid) {
            Some(&(n, _)) if n == Node::Foreign(self.node) => {
                self.routes.remove(&gid);
                true
            }
            _ => false,
        }
    }

    /// This device's routes, sorted.
    pub fn routes(&self) -> Vec<(u8, Gid)> {
        let me = Node::Foreign(self.node);
        let mut v: Vec<_> = self
            .routes
            .iter()
            .filter(|(_, (n, _))| *n == me)
            .map(|(g, &(_, p))| (p, *g))
            .collect();
        v.sort();
        v
    }
}

/// A foreign device's handle on its fabric. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ForeignHandle {
    fabric: Fabric,
    index: usize,
    kicker: Kicker,
}

impl Fabric {
    /// Attaches a foreign device model.
    ///
    /// # Errors
    /// Bad port count, a GID already on the fabric, or too many devices.
    pub fn attach_foreign(
        &self,
        config: ForeignConfig,
        device: Box<dyn ForeignDevice>,
    ) -> Result<ForeignHandle, FabricError> {
        let n = config.ports.len();
        if n == 0 || n > 254 {
            return Err(FabricError::BadPortCount(n));
        }
        let mut sim = self.shared.lock();
        let index = sim.foreign.len();
        let dev = u16::try_from(index).map_err(|_| FabricError::TooManyDevices)?;
        let routes: Vec<(u8, Gid)> = config
            .ports
            .iter()
            .enumerate()
            .flat_map(|(i, p)| {
                p.gids
                    .iter()
                    .filter(|g| !g.is_zero())
                    .map(move |g| ((i + 1) as u8, *g))
            })
            .collect();
        for (_, gid) in &routes {
            if sim.routes.contains_key(gid) {
                return Err(FabricError::DuplicateAddress(gid.to_ip()));
            }
        }
        let mut engine = Engine::new(config.engine, config.ports);
        engine.set_max_train(sim.max_train());
        sim.foreign.push(Some(ForeignSlot {
            name: config.name,
            engine,
            dev: device,
        }));
        sim.add_routes(Node::Foreign(index), &routes);
        Ok(ForeignHandle {
            fabric: self.clone(),
            index,
            kicker: self.shared.kicker(dev),
        })
    }
}

impl ForeignHandle {
    /// The fabric the device is on.
    pub fn fabric(&self) -> &Fabric {
        &self.fabric
    }

    /// Sends the device a kick without taking the fabric lock (a doorbell): the engine thread
    /// wakes up, or the next [`Fabric::step`] delivers it to [`ForeignDevice::kick`].
    pub fn kick(&self, what: u32) {
        self.kicker.kick(KickKind::Foreign(what));
    }

    /// Runs `f` with the fabric lock held, then routes the packets it produced.
    ///
    /// # Errors
    /// [`FabricError::Detached`] after [`ForeignHandle::detach`].
    pub fn with<R>(&self, f: impl FnOnce(&mut ForeignCtx<'_>) -> R) -> Result<R, FabricError> {
        let mut sim = self.fabric.shared.lock();
        if self.fabric.mode() == Mode::Threaded {
            sim.now = self.fabric.shared.real_now();
        }
        let now = sim.now;
        let Sim {
            foreign,
            routes,
            out,
            ..
        } = &mut *sim;
        let Some(Some(slot)) = foreign.get_mut(self.index) else {
            return Err(FabricError::Detached);
        };
        let mut ctx = ForeignCtx {
            device: &mut *slot.dev,
            engine: &mut slot.engine,
            now,
            out,
            routes,
            node: self.index,
        };
        let r = f(&mut ctx);
        sim.route_out();
        Ok(r)
    }

    /// Takes the device off the fabric: its routes go, its engine and model are dropped, kicks
    /// and packets for it are ignored from now on.
    pub fn detach(&self) {
        let slot = {
            let mut sim = self.fabric.shared.lock();
            let me = Node::Foreign(self.index);
            sim.routes.retain(|_, (n, _)| *n != me);
            sim.foreign.get_mut(self.index).and_then(Option::take)
        };
        // Dropped outside the lock: the model may release memory or handles of its own.
        drop(slot);
    }
}

//! Event queues: SW2HW_EQ with the EQ context (Linux `mlx4/eq.c`), MSI-X routing, HW2SW_EQ;
//! the device's EQ pool made at open, and the HAL's event queues on it ([`super::eq_demux`]).

use std::sync::Arc;

use portverbs_hal::device::EqParams;
use portverbs_hal::error::CommandError;
use portverbs_hal::notify::{InterruptSink, NullSink};
use portverbs_hal::queue::EventQueue;

use super::Mlx4Device;
use super::commands::log2;
use super::eq_demux::{Demux, HwEq};
use super::objects::EqRec;
use crate::cmd::Cmd;
use crate::layout::ctx::{EQ_STATE_ARMED, EqContext, mtt_split};
use crate::layout::eqe::ASYNC_EVENT_MASK;
use crate::layout::opcode;
use crate::layout::uar::EQ_ARM;
use crate::queues::eq::Mlx4Eq;

/// Entries of the asynchronous EQ.
const ASYNC_EQ_ENTRIES: u32 = 1024;
/// Entries of each completion EQ of the pool (shared by every CQ on it).
const COMP_EQ_ENTRIES: u32 = 4096;
/// Most completion EQs in the pool.
const MAX_COMP_EQS: u32 = 32;
/// MSI-X vector of the asynchronous EQ (vector 0 is the command EQ's); the completion EQs
/// take the vectors above it.
const ASYNC_VECTOR: u32 = 1;

/// How many completion EQs the pool has: one per MSI-X vector above the command and
/// asynchronous EQs' (Linux `mlx4_enable_msi_x`), within the EQ numbers the profile leaves
/// (`eq_numbers`, of which those two EQs take two), and at least one (it then shares the
/// asynchronous EQ's vector).
pub(crate) fn comp_eq_count(num_vectors: u32, eq_numbers: u32) -> u32 {
    let vectors = num_vectors.saturating_sub(ASYNC_VECTOR + 1);
    vectors
        .min(eq_numbers.saturating_sub(2))
        .clamp(1, MAX_COMP_EQS)
}

impl Mlx4Device {
    /// Creates a hardware EQ on MSI-X `vector`, routing the vector to `sink` if given.
    pub(crate) async fn create_eq_internal(
        &self,
        entries: u32,
        vector: u32,
        sink: Option<Arc<dyn InterruptSink>>,
    ) -> Result<Mlx4Eq, CommandError> {
        let cnt = (entries.max(1) + 1).next_power_of_two().max(64);
        let (ring, geom) = self.entry_ring(cnt, 0)?;
        let slots = Self::slots(&ring, geom)?;
        let eqn = self
            .0
            .nums()
            .eq
            .alloc()
            .ok_or(CommandError::ResourceExhausted { resource: "EQs" })?;
        let cmd = Cmd::new(opcode::SW2HW_EQ).in_mod(eqn);
        let r = self
            .sw2hw(cmd, ring.mem(), 0, ring.mem().len(), |first| {
                let (hi, lo) = mtt_split(first);
                EqContext {
                    flags: EQ_STATE_ARMED.into(),
                    log_eq_size: log2(cnt),
                    intr: (vector as u16).into(),
                    mtt_base_hi: hi,
                    mtt_base_lo: lo.into(),
                    ..Default::default()
                }
            })
            .await;
        let mtt = match r {
            Ok(m) => m,
            Err(e) => {
                self.0.nums().eq.free(eqn);
                return Err(e);
            }
        };
        if let Some(Err(e)) = sink.map(|s| self.0.pci.route_interrupt(vector, s)) {
            tracing::warn!(%e, "interrupt routing failed; the EQ can still be polled");
        }
        self.0.objects().eqs.insert(eqn, EqRec { mtt, _ring: ring });
        let uar = self.0.doorbells.page(eqn / 4);
        uar.eq(eqn % 4, EQ_ARM);
        Ok(Mlx4Eq::new(eqn, slots, uar, self.0.gsi_hw_qpn()))
    }

    /// Makes the EQ pool (at open, after the command EQ): the asynchronous EQ with every
    /// asynchronous event type mapped to it, and the completion EQs.
    pub(crate) async fn create_eq_pool(&self) -> Result<(), CommandError> {
        let count = self.0.attr.num_comp_vectors;
        let nvec = self.0.pci.num_vectors();
        let async_vector = ASYNC_VECTOR.min(nvec.saturating_sub(1));
        let mut made: Vec<Arc<HwEq>> = Vec::new();
        let r = async {
            for i in 0..=count {
                let (entries, vector) = if i == 0 {
                    (ASYNC_EQ_ENTRIES, async_vector)
                } else {
                    let v = ASYNC_VECTOR + i;
                    (COMP_EQ_ENTRIES, if v < nvec { v } else { async_vector })
                };
                // Routed below, once every fan-out sink exists.
                let eq = self.create_eq_internal(entries, vector, None).await?;
                made.push(HwEq::new(eq, vector));
            }
            self.cmd(
                Cmd::new(opcode::MAP_EQ)
                    .in_param(ASYNC_EVENT_MASK)
                    .in_mod(made[0].eqn),
            )
            .await
        }
        .await;
        if let Err(e) = r {
            for hw in made {
                let _ = self.destroy_hw_eq(hw.eqn, hw.vector).await;
            }
            return Err(e);
        }
        self.route_pool(&made);
        let async_eq = made.remove(0);
        *self.0.demux.lock().unwrap_or_else(|e| e.into_inner()) = Some(Demux::new(async_eq, made));
        Ok(())
    }

    /// Routes each vector of the pool (but vector 0, the command EQ's) to the fan-out sinks of
    /// its EQs: directly on a function that raises sinks itself; through a driver eventfd and
    /// the interrupt thread ([`super::eq_waiter`]) on one whose interrupts reach only eventfds.
    /// A vector routed twice reaches only the last sink, hence one route per vector. The
    /// highest vector goes first: VFIO then enables MSI-X once with every vector.
    fn route_pool(&self, pool: &[Arc<HwEq>]) {
        let mut by_vector: Vec<(u32, Vec<Arc<dyn InterruptSink>>)> = Vec::new();
        for hw in pool.iter().filter(|h| h.vector != 0) {
            match by_vector.iter_mut().find(|(v, _)| *v == hw.vector) {
                Some((_, sinks)) => sinks.push(hw.fan_out()),
                None => by_vector.push((hw.vector, vec![hw.fan_out()])),
            }
        }
        by_vector.sort_by_key(|(v, _)| std::cmp::Reverse(*v));
        let pci = &self.0.pci;
        let routes: Vec<(u32, Arc<dyn InterruptSink>)> = if pci.raises_sinks() {
            by_vector
                .into_iter()
                .map(|(v, mut sinks)| {
                    let sink = if sinks.len() == 1 {
                        sinks.remove(0)
                    } else {
                        Arc::new(Fanned(sinks))
                    };
                    (v, sink)
                })
                .collect()
        } else {
            self.eventfd_routes(by_vector)
        };
        for (vector, sink) in routes {
            if let Err(e) = pci.route_interrupt(vector, sink) {
                tracing::warn!(vector, %e, "interrupt routing failed; the EQ can still be polled");
            }
        }
    }

    /// The interrupt thread's eventfds for a function whose interrupts reach only eventfds
    /// (it starts with the first queue that can be woken, [`Mlx4Device::do_create_eq`]).
    #[cfg(target_os = "linux")]
    fn eventfd_routes(
        &self,
        by_vector: Vec<(u32, Vec<Arc<dyn InterruptSink>>)>,
    ) -> Vec<(u32, Arc<dyn InterruptSink>)> {
        match super::eq_waiter::EqWaiter::new(&self.0.info.name, by_vector) {
            Ok((waiter, fds)) => {
                *self.0.eq_waiter.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(Arc::new(waiter));
                fds
            }
            Err(e) => {
                tracing::warn!(%e, "no eventfds for the EQ pool; its EQs can only be polled");
                Vec::new()
            }
        }
    }

    /// Elsewhere no function signals eventfds only (VFIO is Linux's): nothing to route.
    #[cfg(not(target_os = "linux"))]
    fn eventfd_routes(
        &self,
        _by_vector: Vec<(u32, Vec<Arc<dyn InterruptSink>>)>,
    ) -> Vec<(u32, Arc<dyn InterruptSink>)> {
        Vec::new()
    }

    /// Gives a hardware EQ back (HW2SW_EQ) and forgets its vector's sink.
    pub(crate) async fn destroy_hw_eq(&self, eqn: u32, vector: u32) -> Result<(), CommandError> {
        self.hw2sw(
            Cmd::new(opcode::HW2SW_EQ)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(eqn),
        )
        .await?;
        self.0.objects().release_eq(eqn, &self.0.mtts, &self.0.dbs);
        self.0.nums().eq.free(eqn);
        if vector != 0 {
            let _ = self.0.pci.route_interrupt(vector, Arc::new(NullSink));
        }
        Ok(())
    }

    pub(crate) fn demux(&self) -> Result<Arc<Demux>, CommandError> {
        self.0
            .demux
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(CommandError::Removed)
    }

    pub(super) async fn do_create_eq(
        &self,
        params: EqParams,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Box<dyn EventQueue>, CommandError> {
        self.0.check_alive()?;
        let demux = self.demux()?;
        #[cfg(target_os = "linux")]
        if sink.eventfd().is_some() {
            // A queue that can be woken: the pool's interrupts must reach it.
            let waiter = self
                .0
                .eq_waiter
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(w) = waiter {
                w.start();
            }
        }
        demux.create(params.entries, params.kind, sink)
    }

    pub(super) async fn do_destroy_eq(&self, eqn: u32) -> Result<(), CommandError> {
        self.demux()?.destroy(eqn)
    }
}

/// Several fan-out sinks on one vector.
#[derive(Debug)]
struct Fanned(Vec<Arc<dyn InterruptSink>>);

impl InterruptSink for Fanned {
    fn raise(&self) {
        for s in &self.0 {
            s.raise();
        }
    }
}

//! Event queues: SW2HW_EQ with the EQ context (Linux `mlx4/eq.c`), MSI-X routing, HW2SW_EQ;
//! the device's EQ pool made at open, and the HAL's event queues on it ([`super::eq_demux`]).

use std::sync::Arc;

use portverbs_hal::device::{EqKind, EqParams};
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
                // Routed here, once the fan-out sink exists.
                let eq = self.create_eq_internal(entries, vector, None).await?;
                let hw = HwEq::new(eq, vector);
                if i == 0 && !self.0.pci.raises_sinks() {
                    // Bound to an eventfd when the first context's queue is made.
                } else if vector != 0 {
                    let _ = self.0.pci.route_interrupt(vector, hw.fan_out());
                }
                made.push(hw);
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
        let async_eq = made.remove(0);
        // A vector shared by several EQs reaches only the last sink routed to it: give the
        // asynchronous EQ's back to its fan-out when a completion EQ shares it.
        if made.iter().any(|h| h.vector == async_eq.vector) && async_eq.vector != 0 {
            let sinks: Vec<_> = std::iter::once(&async_eq)
                .chain(made.iter().filter(|h| h.vector == async_eq.vector))
                .map(HwEq::fan_out)
                .collect();
            let _ = self
                .0
                .pci
                .route_interrupt(async_eq.vector, Arc::new(Fanned(sinks)));
        }
        *self.0.demux.lock().unwrap_or_else(|e| e.into_inner()) = Some(Demux::new(async_eq, made));
        Ok(())
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
        let raises = self.0.pci.raises_sinks();
        if !raises
            && params.kind == EqKind::Async
            && demux.async_eq.unwatched()
            && demux.async_eq.vector != 0
        {
            let v = demux.async_eq.vector;
            if let Err(e) = self.0.pci.route_interrupt(v, sink.clone()) {
                tracing::warn!(%e, "routing the asynchronous EQ's vector failed");
            }
        }
        if raises || params.kind == EqKind::Async {
            return demux.create(params.entries, params.kind, sink);
        }
        // Interrupts reach eventfds only (VFIO): a completion queue keeps a hardware EQ and a
        // vector of its own, bound to its sink's eventfd. (The asynchronous EQ's vector
        // reaches the first context's sink; the others see its events when they look.)
        let vector = self
            .0
            .nums()
            .vectors
            .alloc()
            .ok_or(CommandError::ResourceExhausted {
                resource: "MSI-X vectors (one per completion channel on a VFIO function)",
            })?;
        let eq = match self
            .create_eq_internal(
                params.entries.max(COMP_EQ_ENTRIES),
                vector,
                Some(sink.clone()),
            )
            .await
        {
            Ok(eq) => eq,
            Err(e) => {
                self.0.nums().vectors.free(vector);
                return Err(e);
            }
        };
        demux.create_own(HwEq::new(eq, vector), params.entries, sink)
    }

    pub(super) async fn do_destroy_eq(&self, eqn: u32) -> Result<(), CommandError> {
        if let Some(hw) = self.demux()?.destroy(eqn)? {
            self.destroy_hw_eq(hw.eqn, hw.vector).await?;
            self.0.nums().vectors.free(hw.vector);
        }
        Ok(())
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

//! Event queues: SW2HW_EQ with the EQ context (Linux `mlx4/eq.c`), MSI-X routing, HW2SW_EQ.

use std::sync::Arc;

use portverbs_hal::device::{Device, EqKind, EqParams};
use portverbs_hal::error::CommandError;
use portverbs_hal::notify::{InterruptSink, NullSink};
use portverbs_hal::queue::EventQueue;

use super::Mlx4Device;
use super::commands::log2;
use super::objects::EqRec;
use crate::cmd::Cmd;
use crate::layout::ctx::{EQ_STATE_ARMED, EqContext, mtt_split};
use crate::layout::eqe::ASYNC_EVENT_MASK;
use crate::layout::opcode;
use crate::layout::uar::{EQ_ARM, eq_doorbell};
use crate::queues::eq::Mlx4Eq;

impl Mlx4Device {
    /// Creates an EQ routed to MSI-X `vector` (also used for the driver's command EQ).
    pub(crate) async fn create_eq_internal(
        &self,
        entries: u32,
        vector: u32,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Box<dyn EventQueue>, CommandError> {
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
        if let Err(e) = self.0.pci.route_interrupt(vector, sink) {
            tracing::warn!(%e, "interrupt routing failed; the EQ can still be polled");
        }
        self.0.objects().eqs.insert(
            eqn,
            EqRec {
                mtt,
                vector,
                _ring: ring,
            },
        );
        let _ = self.0.bar2.write32(eq_doorbell(eqn), EQ_ARM);
        Ok(Box::new(Mlx4Eq::new(
            eqn,
            slots,
            self.0.bar2.clone(),
            self.0.gsi_hw_qpn(),
        )))
    }

    pub(super) async fn do_create_eq(
        &self,
        params: EqParams,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Box<dyn EventQueue>, CommandError> {
        self.0.check_alive()?;
        // An MSI-X vector of its own, whatever the kind (a completion-vector number is a
        // hint of CPU affinity in libibverbs; here it only names the EQ).
        let vector = {
            let mut nums = self.0.nums();
            let in_use = nums.vectors.in_use();
            nums.vectors
                .alloc()
                .ok_or(CommandError::ResourceExhausted {
                    resource: "MSI-X vectors (one per event queue; destroy a completion \
                               channel or context)",
                })
                .inspect_err(|_| {
                    tracing::warn!(in_use, "every MSI-X vector has an event queue already")
                })?
        };
        let eq = match self.create_eq_internal(params.entries, vector, sink).await {
            Ok(eq) => eq,
            Err(e) => {
                self.0.nums().vectors.free(vector);
                return Err(e);
            }
        };
        if params.kind == EqKind::Async {
            let eqn = eq.eqn();
            if let Err(e) = self
                .cmd(
                    Cmd::new(opcode::MAP_EQ)
                        .in_param(ASYNC_EVENT_MASK)
                        .in_mod(eqn),
                )
                .await
            {
                let _ = self.destroy_eq(eqn).await;
                return Err(e);
            }
            self.0.objects().async_eqn = Some(eqn);
        }
        Ok(eq)
    }

    pub(super) async fn do_destroy_eq(&self, eqn: u32) -> Result<(), CommandError> {
        let is_async = self.0.objects().async_eqn == Some(eqn);
        if is_async {
            let _ = self
                .cmd(
                    Cmd::new(opcode::MAP_EQ)
                        .in_param(ASYNC_EVENT_MASK)
                        .in_mod(eqn | 1 << 31),
                )
                .await;
            self.0.objects().async_eqn = None;
        }
        self.hw2sw(
            Cmd::new(opcode::HW2SW_EQ)
                .opmod(opcode::OPMOD_NO_OUTBOX)
                .in_mod(eqn),
        )
        .await?;
        let vector = self.0.objects().eqs.get(&eqn).map(|r| r.vector);
        self.0.objects().release_eq(eqn, &self.0.mtts, &self.0.dbs);
        self.0.nums().eq.free(eqn);
        if let Some(v) = vector.filter(|&v| v != 0) {
            // Forget the sink (the model would raise it again); a VFIO route stays bound
            // until the vector is handed to the next EQ.
            let _ = self.0.pci.route_interrupt(v, Arc::new(NullSink));
            self.0.nums().vectors.free(v);
        }
        Ok(())
    }
}

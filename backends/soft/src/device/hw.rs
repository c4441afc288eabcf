//! The device side of the software HCA: its view of every ring, and the [`Hca`] adapter through
//! which the transport engine reads WQEs and writes CQEs and EQEs in the soft format.
//!
//! Everything here runs with the fabric lock held, on the engine thread (free-running mode) or
//! on the thread stepping the simulation.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use portverbs_hal::event::{CqErrorSyndrome, DeviceEvent, SrqEventKind};
use portverbs_hal::notify::InterruptSink;
use portverbs_hal::types::QpType;
use portverbs_hal::wc::{Cqe, WcStatus};
use portverbs_table::Table;

use super::doorbell::{ARM_ANY, CqDoorbell, EqDoorbell, RqDoorbell, SqDoorbell, SrqDoorbell};
use super::format::{self, CQE_SIZE, CqeCodec, EQE_SIZE, EqeCodec, RECV_MIN};
use crate::dma::SoftDma;
use crate::dma::ring::{Consumer, DeviceToHost, Geometry, HostToDevice, Producer, Slots};
use crate::engine::{Hca, RecvSource, RecvWqe, SendWqe, WqeFault};

/// A work queue ring as the device sees it.
#[derive(Debug)]
pub(crate) struct HwWq<D> {
    /// The slots (the host's own view may have a larger `MIN`).
    pub(crate) ring: Slots<RECV_MIN>,
    /// The device's consumer counter: receive WQEs (or SRQ index entries) taken. A send
    /// queue's WQEs are read by counter by the transport engine, which keeps that counter.
    pub(crate) ci: Consumer<HostToDevice>,
    pub(crate) db: Arc<D>,
}

impl<D> HwWq<D> {
    /// The device's view of `ring`, consuming from counter 0.
    pub(crate) fn new(ring: Slots<RECV_MIN>, db: Arc<D>) -> Self {
        let ci = Consumer::new(ring.geom());
        Self { ring, ci, db }
    }

    /// The ring's geometry.
    pub(crate) fn geom(&self) -> Geometry {
        self.ring.geom()
    }
}

/// A QP's queues.
#[derive(Debug)]
pub(crate) struct HwQp {
    pub(crate) qp_type: QpType,
    pub(crate) sq: HwWq<SqDoorbell>,
    pub(crate) rq: Option<HwWq<RqDoorbell>>,
}

/// An SRQ: WQE slots plus the ring of slot numbers in posting order.
#[derive(Debug)]
pub(crate) struct HwSrq {
    pub(crate) wq: HwWq<SrqDoorbell>,
    pub(crate) index_ring: Arc<SoftDma>,
    /// Armed limit (0 = not armed).
    pub(crate) limit: u32,
    /// Protection domain of the SRQ's receives.
    pub(crate) pd: u32,
}

/// A CQ.
#[derive(Debug)]
pub(crate) struct HwCq {
    pub(crate) ring: Slots<CQE_SIZE>,
    pub(crate) producer: Producer<DeviceToHost>,
    pub(crate) db: Arc<CqDoorbell>,
    pub(crate) eqn: u32,
    /// Counter of the latest solicited or error CQE.
    pub(crate) last_solicited: Option<u32>,
    pub(crate) in_error: bool,
}

/// An EQ.
#[derive(Debug)]
pub(crate) struct HwEq {
    pub(crate) ring: Slots<EQE_SIZE>,
    pub(crate) producer: Producer<DeviceToHost>,
    pub(crate) db: Arc<EqDoorbell>,
    pub(crate) sink: Arc<dyn InterruptSink>,
}

/// The device side of one soft HCA.
#[derive(Debug, Default)]
pub(crate) struct Hw {
    pub(crate) qps: Table<HwQp>,
    pub(crate) srqs: Table<HwSrq>,
    pub(crate) cqs: Table<HwCq>,
    pub(crate) eqs: Table<HwEq>,
    pub(crate) async_eqn: Option<u32>,
    scratch: Vec<u8>,
    /// Events dropped because an EQ was full or absent.
    pub(crate) lost_events: u64,
}

/// Copies one WQE slot out of its ring into `scratch` (the device reads DMA memory into its own
/// buffer before decoding it; the host may rewrite the slot at any time).
fn read_slot<'a>(
    scratch: &'a mut Vec<u8>,
    ring: &Slots<RECV_MIN>,
    counter: u32,
) -> Result<&'a [u8], WqeFault> {
    let slot = ring.at(counter);
    scratch.resize(slot.len(), 0);
    if !slot.read_at(0, scratch) {
        return Err(WqeFault {
            reason: "WQE slot outside its ring",
        });
    }
    Ok(scratch)
}

impl Hw {
    /// Writes an EQE; raises the interrupt if the EQ is armed.
    pub(crate) fn write_eqe(&mut self, eqn: u32, ev: &DeviceEvent) {
        let Some(eq) = self.eqs.get_mut(eqn) else {
            self.lost_events += 1;
            return;
        };
        let ci = eq.db.ci.load(Ordering::Acquire);
        if eq.producer.head().wrapping_sub(ci) >= eq.ring.geom().entries() {
            self.lost_events += 1;
            tracing::warn!(eqn, "event queue overflow, event lost");
            return;
        }
        let bytes = EqeCodec::encode(ev, eq.producer.owner_bit());
        let slot = eq.ring.at(eq.producer.head());
        let (body, owner) = bytes.split_at(EQE_SIZE - 1);
        let _ = slot.write_at(0, body);
        slot.store1::<{ EQE_SIZE - 1 }>(owner.first().copied().unwrap_or(0));
        eq.producer.advance(1);
        if eq.db.armed.swap(false, Ordering::AcqRel) {
            eq.sink.raise();
        }
    }

    fn fire(&mut self, cqn: u32, eqn: u32) {
        self.write_eqe(eqn, &DeviceEvent::Completion { cqn });
    }

    /// A CQ was armed: fire at once if a completion satisfying the arming is already there.
    pub(crate) fn check_arm(&mut self, cqn: u32) {
        let Some(cq) = self.cqs.get_mut(cqn) else {
            return;
        };
        let arm = cq.db.arm.load(Ordering::Acquire);
        if arm == 0 {
            return;
        }
        let ci = cq.db.ci.load(Ordering::Acquire);
        let pending = cq.producer.head().wrapping_sub(ci);
        let due = if arm & ARM_ANY != 0 {
            pending > 0
        } else {
            cq.last_solicited
                .is_some_and(|s| s.wrapping_sub(ci) < pending)
        };
        if due
            && cq
                .db
                .arm
                .compare_exchange(arm, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let eqn = cq.eqn;
            self.fire(cqn, eqn);
        }
    }

    /// Device fatal error: tell the host through the async EQ.
    pub(crate) fn fatal(&mut self) {
        self.post_event(DeviceEvent::DeviceFatal);
    }
}

impl Hca for Hw {
    #[inline]
    fn sq_head(&self, qpn: u32) -> Option<u32> {
        Some(self.qps.get(qpn)?.sq.db.head.load(Ordering::Acquire))
    }

    #[inline]
    fn read_send_wqe(&mut self, qpn: u32, counter: u32, out: &mut SendWqe) -> Result<(), WqeFault> {
        let Some(qp) = self.qps.get(qpn) else {
            return Err(WqeFault {
                reason: "no such QP",
            });
        };
        let (geom, qp_type) = (qp.sq.geom(), qp.qp_type);
        let slot = read_slot(&mut self.scratch, &qp.sq.ring, counter)?;
        if format::send_owner(slot) != geom.parity(counter) {
            return Err(WqeFault {
                reason: "owner bit does not match the WQE counter",
            });
        }
        format::decode_send(slot, qp_type, out)
    }

    fn take_recv_wqe(&mut self, source: RecvSource, out: &mut RecvWqe) -> Result<bool, WqeFault> {
        match source {
            RecvSource::Rq { qpn } => {
                let Some(qp) = self.qps.get_mut(qpn) else {
                    return Ok(false);
                };
                let Some(rq) = &mut qp.rq else {
                    return Ok(false);
                };
                let head = rq.db.head.load(Ordering::Acquire);
                let c = rq.ci.tail();
                if c == head {
                    return Ok(false);
                }
                rq.ci.advance(1);
                let slot = read_slot(&mut self.scratch, &rq.ring, c)?;
                format::decode_recv(slot, out)?;
                out.wqe_index = c;
                Ok(true)
            }
            RecvSource::Srq { srqn } => {
                let Some(srq) = self.srqs.get_mut(srqn) else {
                    return Ok(false);
                };
                let head = srq.wq.db.head.load(Ordering::Acquire);
                if srq.wq.ci.tail() == head {
                    return Ok(false);
                }
                let geom = srq.wq.geom();
                let at = geom.slot(srq.wq.ci.tail()) as usize * 4;
                let slot_no = srq.index_ring.load_u32(at).map_err(|_| WqeFault {
                    reason: "SRQ index ring unreadable",
                })?;
                if slot_no >= geom.entries() {
                    return Err(WqeFault {
                        reason: "SRQ slot number out of range",
                    });
                }
                srq.wq.ci.advance(1);
                let remaining = head.wrapping_sub(srq.wq.ci.tail());
                let limit_hit = srq.limit > 0 && remaining < srq.limit;
                if limit_hit {
                    srq.limit = 0;
                }
                let slot = read_slot(&mut self.scratch, &srq.wq.ring, slot_no)?;
                format::decode_recv(slot, out)?;
                out.wqe_index = slot_no;
                out.pd = srq.pd;
                if limit_hit {
                    self.post_event(DeviceEvent::Srq {
                        srqn,
                        kind: SrqEventKind::LimitReached,
                    });
                }
                Ok(true)
            }
        }
    }

    fn recv_posted(&self, source: RecvSource) -> u32 {
        match source {
            RecvSource::Rq { qpn } => self.qps.get(qpn).map_or(0, |qp| {
                qp.rq.as_ref().map_or(0, |rq| {
                    rq.db
                        .head
                        .load(Ordering::Acquire)
                        .wrapping_sub(rq.ci.tail())
                })
            }),
            RecvSource::Srq { srqn } => self.srqs.get(srqn).map_or(0, |s| {
                s.wq.db
                    .head
                    .load(Ordering::Acquire)
                    .wrapping_sub(s.wq.ci.tail())
            }),
        }
    }

    #[inline]
    fn post_completion(&mut self, cqn: u32, cqe: &Cqe, solicited: bool) -> bool {
        let Some(cq) = self.cqs.get_mut(cqn) else {
            self.lost_events += 1;
            return false;
        };
        if cq.in_error {
            return false;
        }
        let ci = cq.db.ci.load(Ordering::Acquire);
        let counter = cq.producer.head();
        // One entry always stays free (usable depth = entries - 1).
        if counter.wrapping_sub(ci) >= cq.ring.geom().entries() - 1 {
            cq.in_error = true;
            cq.db.error.store(true, Ordering::Release);
            tracing::warn!(cqn, "CQ overrun");
            self.post_event(DeviceEvent::CqError {
                cqn,
                syndrome: CqErrorSyndrome::Overrun,
            });
            return false;
        }
        let bytes = CqeCodec::encode(cqe, cq.producer.owner_bit());
        let slot = cq.ring.at(counter);
        // Body first, owner byte last (release): the host may poll it at once.
        let (body, owner) = bytes.split_at(CQE_SIZE - 1);
        let _ = slot.write_at(0, body);
        slot.store1::<{ CQE_SIZE - 1 }>(owner.first().copied().unwrap_or(0));
        cq.producer.advance(1);
        let satisfies_solicited = solicited || cqe.wc.status != WcStatus::Success;
        if satisfies_solicited {
            cq.last_solicited = Some(counter);
        }
        let arm = cq.db.arm.load(Ordering::Acquire);
        if arm != 0
            && (arm & ARM_ANY != 0 || satisfies_solicited)
            && cq
                .db
                .arm
                .compare_exchange(arm, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            let eqn = cq.eqn;
            self.fire(cqn, eqn);
        }
        true
    }

    fn post_event(&mut self, event: DeviceEvent) {
        match self.async_eqn {
            Some(eqn) => self.write_eqe(eqn, &event),
            None => self.lost_events += 1,
        }
    }

    fn qp_error(&mut self, qpn: u32) {
        if let Some(rq) = self.qps.get(qpn).and_then(|qp| qp.rq.as_ref()) {
            rq.db.in_error.store(true, Ordering::Release);
        }
    }

    fn reset_queues(&mut self, qpn: u32, _qp_type: QpType) {
        if let Some(qp) = self.qps.get_mut(qpn) {
            if let Some(rq) = &mut qp.rq {
                rq.ci.reset();
                rq.db.in_error.store(false, Ordering::Release);
            }
        }
    }
}

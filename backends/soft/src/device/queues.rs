//! The host side of the software device's queues: the HAL queue objects `verbs-core` drives.
//! They touch only their own ring memory and doorbell records (no lock, no allocation). Rings
//! are [`portverbs_dma::ring::Slots`], geometry checked when the queue was made: an entry's
//! owner byte is one atomic at a constant offset, and a WQE or CQE one copy.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use portverbs_hal::barrier;
use portverbs_hal::error::{CqeError, EqeError, WqeError};
use portverbs_hal::event::DeviceEvent;
use portverbs_hal::notify::InterruptSink;
use portverbs_hal::queue::{CompletionQueue, EventQueue, RecvQueue, SendQueue, SharedRecvQueue};
use portverbs_hal::types::QpType;
use portverbs_hal::wc::Cqe;
use portverbs_hal::wr::{SendWr, Sge};

use super::doorbell::{
    ARM_ANY, ARM_SOLICITED, CqDoorbell, EqDoorbell, KickKind, Kicker, RqDoorbell, SqDoorbell,
    SrqDoorbell,
};
use super::format::{
    CQE_SIZE, CqeCodec, EQE_SIZE, EncodeContext, EqeCodec, RECV_MIN, RecvFormat, SEND_HEADER,
    SendFormat,
};
use crate::dma::SoftDma;
use crate::dma::queue::{EventRing, WorkRing};
use crate::dma::ring::{HostToDevice, Producer, Slots};

/// A CQ's ring: the owner bit is bit 0 of a CQE's last byte (the soft format), and the host's
/// consumer counter.
pub(crate) type CqRing = EventRing<CQE_SIZE, { CQE_SIZE - 1 }, 1>;
/// An EQ's ring: the owner bit is bit 0 of an EQE's last byte, and the host's consumer counter.
pub(crate) type EqRing = EventRing<EQE_SIZE, { EQE_SIZE - 1 }, 1>;

/// Host side of a send queue.
#[derive(Debug)]
pub struct SoftSq {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    /// The WQE ring; its producer counter is verbs-core's.
    pub(crate) ring: WorkRing<SEND_HEADER>,
    pub(crate) fmt: SendFormat,
    pub(crate) depth: u32,
    pub(crate) db: Arc<SqDoorbell>,
    pub(crate) kicker: Kicker,
    pub(crate) fatal: Arc<AtomicBool>,
}

impl SoftSq {
    /// Marks every slot "not yet written" for pass 0: owner byte (byte 0) 1.
    pub(crate) fn init_slots(ring: &WorkRing<SEND_HEADER>) {
        let _ = ring.init(&[1]);
    }
}

impl SendQueue for SoftSq {
    fn depth(&self) -> u32 {
        self.depth
    }

    fn max_sge(&self) -> u32 {
        self.fmt.max_sge
    }

    fn max_inline(&self) -> u32 {
        self.fmt.max_inline
    }

    fn write_wqe(&mut self, counter: u32, wr: &SendWr<'_>, signaled: bool) -> Result<(), WqeError> {
        if self.fatal.load(Ordering::Relaxed) {
            return Err(WqeError::DeviceFatal);
        }
        let ctx = EncodeContext {
            qp_type: self.qp_type,
            qpn: self.qpn,
            counter,
            signaled,
        };
        // Encoded in place (the slot is the host's until its ownership byte says otherwise;
        // on an error the body may be overwritten, but the slot is not passed on), then the
        // ownership byte last (release): the device may start on it at once.
        let slot = self.ring.at(counter);
        slot.lend_mut(|bytes| self.fmt.encode_send(wr, &ctx, bytes))?;
        barrier::to_device();
        slot.store1::<0>(u8::from(self.ring.owner_bit(counter)));
        Ok(())
    }

    fn ring_doorbell(&mut self, _from: u32, to: u32) {
        self.db.head.store(to, Ordering::Release);
        if !self.db.scheduled.swap(true, Ordering::AcqRel) {
            self.kicker.kick(KickKind::Qp(self.qpn));
        }
    }

    fn reset(&mut self) {
        self.db.head.store(0, Ordering::Release);
        Self::init_slots(&self.ring);
    }
}

/// Host side of a QP's own receive queue.
#[derive(Debug)]
pub struct SoftRq {
    pub(crate) qpn: u32,
    /// The WQE ring (no owner byte: the doorbell record passes WQEs); its producer counter is
    /// verbs-core's.
    pub(crate) ring: WorkRing<RECV_MIN>,
    pub(crate) fmt: RecvFormat,
    pub(crate) depth: u32,
    pub(crate) db: Arc<RqDoorbell>,
    pub(crate) kicker: Kicker,
    pub(crate) scratch: Vec<u8>,
}

impl RecvQueue for SoftRq {
    fn depth(&self) -> u32 {
        self.depth
    }

    fn max_sge(&self) -> u32 {
        self.fmt.max_sge
    }

    fn write_wqe(&mut self, counter: u32, sges: &[Sge]) -> Result<(), WqeError> {
        let n = self.fmt.encode_recv(sges, &mut self.scratch)?;
        let _ = self
            .ring
            .write(counter, 0, self.scratch.get(..n).unwrap_or_default());
        Ok(())
    }

    fn ring_doorbell(&mut self, head: u32) {
        self.db.head.store(head, Ordering::Release);
        if self.db.in_error.load(Ordering::Acquire) {
            self.kicker.kick(KickKind::Qp(self.qpn));
        }
    }

    fn reset(&mut self) {
        self.db.head.store(0, Ordering::Release);
    }
}

/// Host side of an SRQ: a free list of slots plus the ring of slot numbers in posting order.
#[derive(Debug)]
pub struct SoftSrq {
    pub(crate) srqn: u32,
    pub(crate) ring: Slots<RECV_MIN>,
    pub(crate) index_ring: Arc<SoftDma>,
    pub(crate) fmt: RecvFormat,
    pub(crate) free: Vec<u32>,
    /// Producer counter of the index ring (the device consumes it in posting order).
    pub(crate) head: Producer<HostToDevice>,
    pub(crate) db: Arc<SrqDoorbell>,
    pub(crate) scratch: Vec<u8>,
}

impl SharedRecvQueue for SoftSrq {
    fn srqn(&self) -> u32 {
        self.srqn
    }

    fn depth(&self) -> u32 {
        self.ring.geom().entries()
    }

    fn max_sge(&self) -> u32 {
        self.fmt.max_sge
    }

    fn write_wqe(&mut self, sges: &[Sge]) -> Result<Option<u32>, WqeError> {
        let n = self.fmt.encode_recv(sges, &mut self.scratch)?;
        let Some(slot) = self.free.pop() else {
            return Ok(None);
        };
        let _ = self
            .ring
            .write(slot, 0, self.scratch.get(..n).unwrap_or_default());
        let at = self.head.geometry().slot(self.head.head()) as usize * 4;
        let _ = self.index_ring.store_u32(at, slot);
        self.head.advance(1);
        Ok(Some(slot))
    }

    fn ring_doorbell(&mut self) {
        self.db.head.store(self.head.head(), Ordering::Release);
    }

    fn release(&mut self, slot: u32) -> Result<(), WqeError> {
        let entries = self.ring.geom().entries();
        if slot >= entries || self.free.len() >= entries as usize {
            return Err(WqeError::BadSlot {
                slot,
                depth: entries,
            });
        }
        self.free.push(slot);
        Ok(())
    }
}

/// Host side of a CQ.
#[derive(Debug)]
pub struct SoftCq {
    pub(crate) cqn: u32,
    /// The CQE ring and the consumer counter.
    pub(crate) ring: CqRing,
    pub(crate) depth: u32,
    pub(crate) db: Arc<CqDoorbell>,
    pub(crate) kicker: Kicker,
}

impl CompletionQueue for SoftCq {
    fn cqn(&self) -> u32 {
        self.cqn
    }

    fn depth(&self) -> u32 {
        self.depth
    }

    fn poll_one(&mut self) -> Result<Option<Cqe>, CqeError> {
        let index = self.ring.tail();
        let Some(slot) = self.ring.poll() else {
            if self.db.error.load(Ordering::Acquire) {
                return Err(CqeError::CqInError { cqn: self.cqn });
            }
            return Ok(None);
        };
        barrier::from_device();
        let raw = slot.read::<0, CQE_SIZE>();
        self.ring.advance(1);
        CqeCodec::decode(&raw, self.cqn, index).map(Some)
    }

    fn publish_ci(&mut self) {
        self.db.ci.store(self.ring.tail(), Ordering::Release);
    }

    fn arm(&mut self, solicited_only: bool) {
        self.db.ci.store(self.ring.tail(), Ordering::Release);
        let bits = if solicited_only {
            ARM_SOLICITED
        } else {
            ARM_ANY
        };
        self.db.arm.store(bits, Ordering::SeqCst);
        self.kicker.kick(KickKind::Cq(self.cqn));
    }

    fn pending(&self) -> u32 {
        self.ring.pending()
    }

    fn event_delivered(&mut self) {}
}

/// Host side of an EQ.
#[derive(Debug)]
pub(crate) struct SoftEq {
    pub(crate) eqn: u32,
    /// The EQE ring and the consumer counter.
    pub(crate) ring: EqRing,
    pub(crate) db: Arc<EqDoorbell>,
    pub(crate) sink: Arc<dyn InterruptSink>,
}

impl EventQueue for SoftEq {
    fn eqn(&self) -> u32 {
        self.eqn
    }

    fn poll_one(&mut self) -> Result<Option<DeviceEvent>, EqeError> {
        let index = self.ring.tail();
        let Some(slot) = self.ring.poll() else {
            return Ok(None);
        };
        barrier::from_device();
        let raw = slot.read::<0, EQE_SIZE>();
        self.ring.advance(1);
        EqeCodec::decode(&raw, self.eqn, index).map(Some)
    }

    fn publish_ci(&mut self) {
        self.db.ci.store(self.ring.tail(), Ordering::Release);
    }

    fn arm(&mut self) {
        self.db.ci.store(self.ring.tail(), Ordering::Release);
        self.db.armed.store(true, Ordering::SeqCst);
        // An EQE written between the last poll and the arming would otherwise go unnoticed.
        if self.ring.poll().is_some() && self.db.armed.swap(false, Ordering::AcqRel) {
            self.sink.raise();
        }
    }
}

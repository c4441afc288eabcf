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
use crate::dma::ring::{Consumer, DeviceToHost, Slots};

/// Host side of a send queue.
#[derive(Debug)]
pub struct SoftSq {
    pub(crate) qpn: u32,
    pub(crate) qp_type: QpType,
    pub(crate) ring: Slots<SEND_HEADER>,
    pub(crate) fmt: SendFormat,
    pub(crate) depth: u32,
    pub(crate) db: Arc<SqDoorbell>,
    pub(crate) kicker: Kicker,
    pub(crate) scratch: Vec<u8>,
    pub(crate) fatal: Arc<AtomicBool>,
}

impl SoftSq {
    /// Marks every slot "not yet written" for pass 0.
    pub(crate) fn init_slots(ring: &Slots<SEND_HEADER>) {
        for i in 0..ring.geom().entries() {
            ring.at(i).store1::<0>(1);
        }
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
            owner: self.ring.geom().parity(counter),
            signaled,
        };
        let n = self.fmt.encode_send(wr, &ctx, &mut self.scratch)?;
        let slot = self.ring.at(counter);
        // Body first, ownership byte last (release): the device may start on it at once. The
        // scratch buffer is one slot long, so the copy stays inside the slot.
        let _ = slot.write_at(1, self.scratch.get(1..n).unwrap_or_default());
        barrier::to_device();
        slot.store1::<0>(self.scratch.first().copied().unwrap_or(1));
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
    pub(crate) ring: Slots<RECV_MIN>,
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
    pub(crate) head: u32,
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
        let at = self.ring.geom().slot(self.head) as usize * 4;
        let _ = self.index_ring.store_u32(at, slot);
        self.head = self.head.wrapping_add(1);
        Ok(Some(slot))
    }

    fn ring_doorbell(&mut self) {
        self.db.head.store(self.head, Ordering::Release);
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
    pub(crate) ring: Slots<CQE_SIZE>,
    pub(crate) consumer: Consumer<DeviceToHost>,
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
        let slot = self.ring.at(self.consumer.tail());
        let owner = slot.load1::<{ CQE_SIZE - 1 }>() & 1 == 1;
        if !self.consumer.owns(owner) {
            if self.db.error.load(Ordering::Acquire) {
                return Err(CqeError::CqInError { cqn: self.cqn });
            }
            return Ok(None);
        }
        barrier::from_device();
        let raw = slot.read::<0, CQE_SIZE>();
        let index = self.consumer.tail();
        self.consumer.advance(1);
        debug_assert!(CqeCodec::owner_bit(&raw) == owner);
        CqeCodec::decode(&raw, self.cqn, index).map(Some)
    }

    fn publish_ci(&mut self) {
        self.db.ci.store(self.consumer.tail(), Ordering::Release);
    }

    fn arm(&mut self, solicited_only: bool) {
        self.db.ci.store(self.consumer.tail(), Ordering::Release);
        let bits = if solicited_only {
            ARM_SOLICITED
        } else {
            ARM_ANY
        };
        self.db.arm.store(bits, Ordering::SeqCst);
        self.kicker.kick(KickKind::Cq(self.cqn));
    }

    fn pending(&self) -> u32 {
        let geom = self.consumer.geometry();
        let mut n = 0;
        let mut c = self.consumer.tail();
        while n < geom.entries() {
            let owner = self.ring.at(c).load1::<{ CQE_SIZE - 1 }>() & 1 == 1;
            if owner != geom.parity(c) {
                break;
            }
            n += 1;
            c = c.wrapping_add(1);
        }
        n
    }

    fn event_delivered(&mut self) {}
}

/// Host side of an EQ.
#[derive(Debug)]
pub(crate) struct SoftEq {
    pub(crate) eqn: u32,
    pub(crate) ring: Slots<EQE_SIZE>,
    pub(crate) consumer: Consumer<DeviceToHost>,
    pub(crate) db: Arc<EqDoorbell>,
    pub(crate) sink: Arc<dyn InterruptSink>,
}

impl SoftEq {
    fn head_owned(&self) -> bool {
        let owner = self
            .ring
            .at(self.consumer.tail())
            .load1::<{ EQE_SIZE - 1 }>()
            & 1
            == 1;
        self.consumer.owns(owner)
    }
}

impl EventQueue for SoftEq {
    fn eqn(&self) -> u32 {
        self.eqn
    }

    fn poll_one(&mut self) -> Result<Option<DeviceEvent>, EqeError> {
        if !self.head_owned() {
            return Ok(None);
        }
        barrier::from_device();
        let raw = self.ring.at(self.consumer.tail()).read::<0, EQE_SIZE>();
        let index = self.consumer.tail();
        self.consumer.advance(1);
        let _ = EqeCodec::owner_bit(&raw);
        EqeCodec::decode(&raw, self.eqn, index).map(Some)
    }

    fn publish_ci(&mut self) {
        self.db.ci.store(self.consumer.tail(), Ordering::Release);
    }

    fn arm(&mut self) {
        self.db.ci.store(self.consumer.tail(), Ordering::Release);
        self.db.armed.store(true, Ordering::SeqCst);
        // An EQE written between the last poll and the arming would otherwise go unnoticed.
        if self.head_owned() && self.db.armed.swap(false, Ordering::AcqRel) {
            self.sink.raise();
        }
    }
}

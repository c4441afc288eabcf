//! The software device's doorbells: records shared between the host-side queue objects and the
//! device, and the "kick" that tells the device to look at a queue.
//!
//! Records are atomics (the soft device's equivalent of mlx4's doorbell records in host memory).
//! A kick goes through a bounded lock-free channel to the engine; the send doorbell deduplicates
//! kicks with a `scheduled` flag, so a burst of posts costs one channel message. If the engine
//! thread is parked it is unparked; nothing on this path allocates or takes a lock shared with
//! another queue.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::Thread;

use crossbeam_channel::Sender;

/// Send-queue doorbell record.
#[derive(Debug, Default)]
pub(crate) struct SqDoorbell {
    /// Producer counter: WQEs before it are posted.
    pub(crate) head: AtomicU32,
    /// A kick is queued and not yet taken by the engine.
    pub(crate) scheduled: AtomicBool,
}

/// Receive-queue doorbell record.
#[derive(Debug, Default)]
pub(crate) struct RqDoorbell {
    /// Producer counter.
    pub(crate) head: AtomicU32,
    /// Set by the device while the QP is in ERR: new receives must be kicked to be flushed.
    pub(crate) in_error: AtomicBool,
}

/// SRQ doorbell record.
#[derive(Debug, Default)]
pub(crate) struct SrqDoorbell {
    /// Producer counter of the SRQ's index ring.
    pub(crate) head: AtomicU32,
}

/// Arm register bits of a CQ.
pub(crate) const ARM_ANY: u32 = 1;
/// Solicited-only arming.
pub(crate) const ARM_SOLICITED: u32 = 2;

/// CQ doorbell record.
#[derive(Debug, Default)]
pub(crate) struct CqDoorbell {
    /// Consumer index published by the host.
    pub(crate) ci: AtomicU32,
    /// Arm request ([`ARM_ANY`] or [`ARM_SOLICITED`]), cleared by the device when it fires.
    pub(crate) arm: AtomicU32,
    /// Set by the device on overrun.
    pub(crate) error: AtomicBool,
}

/// EQ doorbell record.
#[derive(Debug, Default)]
pub(crate) struct EqDoorbell {
    /// Consumer index published by the host.
    pub(crate) ci: AtomicU32,
    /// Armed: the next EQE raises the interrupt.
    pub(crate) armed: AtomicBool,
}

/// What a kick asks the device to look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KickKind {
    /// New send WQEs (or receives on a QP in error).
    Qp(u32),
    /// A CQ was armed: fire at once if completions are already waiting.
    Cq(u32),
    /// For a foreign device model (`Kick::dev` indexes the foreign devices): passed to its
    /// [`crate::fabric::ForeignDevice::kick`] as is.
    Foreign(u32),
}

/// A kick for device `dev`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kick {
    pub(crate) dev: u16,
    pub(crate) kind: KickKind,
}

/// Wakes the engine thread when it sleeps.
#[derive(Debug, Default)]
pub(crate) struct EngineWake {
    pub(crate) sleeping: AtomicBool,
    pub(crate) thread: OnceLock<Thread>,
}

impl EngineWake {
    pub(crate) fn wake(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            if let Some(t) = self.thread.get() {
                t.unpark();
            }
        }
    }
}

/// The host side's handle for kicking the device.
#[derive(Debug, Clone)]
pub(crate) struct Kicker {
    pub(crate) dev: u16,
    pub(crate) tx: Sender<Kick>,
    pub(crate) wake: std::sync::Arc<EngineWake>,
    /// Set when the channel was full: the engine rescans every queue.
    pub(crate) overflow: std::sync::Arc<AtomicBool>,
}

impl Kicker {
    pub(crate) fn kick(&self, kind: KickKind) {
        if self
            .tx
            .try_send(Kick {
                dev: self.dev,
                kind,
            })
            .is_err()
        {
            self.overflow.store(true, Ordering::Release);
        }
        self.wake.wake();
    }
}

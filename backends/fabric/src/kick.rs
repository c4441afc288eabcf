//! Doorbells into the fabric: the "kick" that tells a node to look at one of its queues.
//!
//! A kick goes through a bounded lock-free channel to whoever steps the fabric (the engine
//! thread, or the caller in stepped mode). If the engine thread is parked it is unparked;
//! nothing on this path allocates or takes a lock. When the channel is full the kick is not
//! lost: an overflow flag makes the next step ask every node to look at every queue once
//! ([`crate::Node::rescan`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::Thread;

use crossbeam_channel::Sender;

/// A kick for node `node`; `what` means what that node says it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kick {
    pub(crate) node: u16,
    pub(crate) what: u32,
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

/// A node's doorbell: sends it kicks without taking the fabric lock. Cheap to clone; every
/// queue of a device may hold one.
#[derive(Debug, Clone)]
pub struct Kicker {
    pub(crate) node: u16,
    pub(crate) tx: Sender<Kick>,
    pub(crate) wake: Arc<EngineWake>,
    /// Set when the channel was full: the next step rescans every node.
    pub(crate) overflow: Arc<AtomicBool>,
}

impl Kicker {
    /// Sends the node a kick: the engine thread wakes up, or the next [`crate::Fabric::step`]
    /// hands `what` to the node's [`crate::Node::kick`].
    #[inline]
    pub fn kick(&self, what: u32) {
        if self
            .tx
            .try_send(Kick {
                node: self.node,
                what,
            })
            .is_err()
        {
            self.overflow.store(true, Ordering::Release);
        }
        self.wake.wake();
    }
}

//! Doorbells into the fabric: the "kick" that tells a node to look at one of its queues.
//!
//! A kick goes through a bounded lock-free channel to whoever steps the fabric (the engine
//! thread, or the caller in stepped mode). If the engine thread sleeps it is woken (unparked,
//! or through the port I/O it sleeps on); nothing on this path allocates or takes a lock. On
//! a manual fabric the kick then steps the fabric on the caller's thread
//! ([`crate::progress`]: inline driving), unless another thread is stepping it. When the
//! channel is full the kick is not lost: an overflow flag makes the next step ask every node
//! to look at every queue once ([`crate::Node::rescan`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::Thread;

use crossbeam_channel::Sender;

use crate::Shared;
use crate::progress::PortIo;

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
    /// The port I/O the engine thread sleeps on, when a port lent it.
    pub(crate) io: OnceLock<Arc<dyn PortIo>>,
}

impl EngineWake {
    #[inline]
    pub(crate) fn wake(&self) {
        if self.sleeping.load(Ordering::SeqCst) {
            self.wake_now();
        }
    }

    /// Wakes the engine thread whether it sleeps or not (shutdown, a new agent or port).
    #[cold]
    pub(crate) fn wake_now(&self) {
        if let Some(io) = self.io.get() {
            io.wake();
        }
        if let Some(t) = self.thread.get() {
            t.unpark();
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
    /// A manual fabric: the kick steps it on the caller's thread.
    pub(crate) inline: Option<Weak<Shared>>,
}

impl Kicker {
    /// Sends the node a kick: the engine thread wakes up, or the next [`crate::Fabric::step`]
    /// hands `what` to the node's [`crate::Node::kick`]; on a manual fabric the fabric is
    /// stepped on this thread now (unless another thread is stepping it, which then takes
    /// the kick).
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
        if let Some(inline) = &self.inline {
            drive(inline);
            return;
        }
        self.wake.wake();
    }
}

/// The inline step of a manual fabric's kick (kept out of [`Kicker::kick`], which the
/// free-running fabrics' hot path inlines).
#[inline(never)]
fn drive(shared: &Weak<Shared>) {
    if let Some(s) = shared.upgrade() {
        s.drive_inline(false);
    }
}

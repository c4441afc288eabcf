//! CM timers in async code: the next deadline, and the timer an executor lends the CM.
//!
//! The CM's timers (a REQ, REP, DREQ or SIDR_REQ retransmitted, a connection leaving
//! TIMEWAIT) fire inside [`CmDevice::progress`]. A blocking wait sleeps at most until the next
//! one; an async wait has no clock of its own, and this layer may neither run a thread nor
//! name a runtime or platform crate. So the application (or the layer that owns its event
//! loop) lends the device a [`CmTimer`]: a way to make a future that completes at an instant,
//! such as `tokio::time::sleep_until` or a timerfd in the application's reactor (the facade
//! has ready-made ones: `portverbs::cm::TokioTimer` with its feature `tokio`, and on Windows
//! `portverbs::cm::PortTimer`, whose sleeps end in the completion-port waits of
//! `portverbs-windows`, with no thread). Every async
//! wait of the device then also awaits the next CM deadline, and a lost REQ is retransmitted
//! while the application only awaits `connect`. Without a timer the async waits behave as
//! before (timers fire when something wakes the task), and [`CmDevice::next_deadline`] tells
//! an event loop when to call [`CmDevice::progress`] itself.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use portverbs_hal::Device;

use crate::{CmDevice, ServiceError};

/// A future that completes at (or after) an instant, as a [`CmTimer`] makes it.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The application's timer, lent to a [`CmDevice`] with [`CmDevice::set_timer`] so that CM
/// timers fire in async waits.
pub trait CmTimer: Send + Sync + fmt::Debug {
    /// A future that completes at `deadline` (or later), waking the task that polls it.
    fn sleep_until(&self, deadline: Instant) -> Sleep;
}

impl<D: Device> CmDevice<D> {
    /// When the next CM timer is due (a retransmission or a TIMEWAIT exit), if one is armed:
    /// the instant at which [`CmDevice::progress`] next has timer work. An event loop without
    /// a [`CmTimer`] arms its own timer for it.
    pub fn next_deadline(&self) -> Option<Instant> {
        let due = self.state().agent.poll_timeout()?;
        Some(self.instant_of(due))
    }

    /// Lends the device a timer: from now on every async wait of this device (and of its
    /// listeners and connectors) also awaits the next CM deadline, so retransmissions and
    /// TIMEWAIT exits happen while the application only awaits. Replaces a timer set before.
    pub fn set_timer(&self, timer: Arc<dyn CmTimer>) {
        self.replace_timer(Some(timer));
    }

    /// Takes the timer back: async waits again rely on something waking the task.
    pub fn clear_timer(&self) {
        self.replace_timer(None);
    }

    /// Drives the device until it is removed: answers peers, retransmits and ends TIMEWAIT
    /// (with a [`CmTimer`] set) without anything else being awaited on it. An application
    /// that only holds connections and makes no calls spawns this on its executor, where a
    /// blocking application would call [`CmDevice::progress`] from time to time.
    ///
    /// # Errors
    /// [`ServiceError::Closed`] once the device failed (QP1 flushed), or QP1 failed.
    pub async fn run(&self) -> Result<(), ServiceError> {
        self.wait_async(|_| None::<()>).await
    }
}

//! A handle on the event queue a CQ reports to, for platform layers that complete requests
//! on the application's behalf (the Windows layer processes the event queues of the CQs its
//! OVERLAPPED requests wait on, whenever the device's doorbell rings).

use std::fmt;
use std::sync::Arc;

use portverbs_hal::device::Device;

use crate::context::EqShared;
use crate::cq::Cq;
use crate::error::EventError;

/// The event queue of a CQ (its completion channel's or its completion vector's). Holds the
/// queue, not the CQ, so destroying the CQ is not refused while one exists; a completion
/// channel is, as by any other user of its queue ([`crate::CompletionChannel::destroy`]).
pub struct EventQueueRef<D: Device> {
    eq: Arc<EqShared<D>>,
}

impl<D: Device> Clone for EventQueueRef<D> {
    fn clone(&self) -> Self {
        Self {
            eq: self.eq.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for EventQueueRef<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventQueueRef")
            .field("eqn", &self.eq.eqn)
            .finish()
    }
}

impl<D: Device> EventQueueRef<D> {
    /// The event queue number.
    pub fn eqn(&self) -> u32 {
        self.eq.eqn
    }

    /// Processes the queue: completes notify requests of its CQs and queues channel events,
    /// as [`Cq::process_events`] does. Returns how many device events were handled.
    ///
    /// # Errors
    /// A malformed event was skipped.
    pub fn process(&self) -> Result<usize, EventError> {
        self.eq.process(usize::MAX)
    }
}

impl<D: Device> Cq<D> {
    /// The event queue this CQ reports to, as a handle that keeps the CQ itself free to be
    /// destroyed.
    pub fn event_queue(&self) -> EventQueueRef<D> {
        EventQueueRef {
            eq: self.inner.eq.clone(),
        }
    }
}

//! Completion channels (`struct ibv_comp_channel`), the portable part: an event queue of its own
//! whose interrupts go to a caller-supplied sink, and the queue of CQ events read with
//! [`CompletionChannel::get_event`] and acknowledged with [`crate::Cq::ack_events`]. A platform
//! layer turns the sink into something pollable (an eventfd on Linux).

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};

use portverbs_hal::device::{Device, EqKind};
use portverbs_hal::notify::InterruptSink;

use crate::context::{Context, ContextInner, EqShared, lock};
use crate::cq::{Cq, CqInner};
use crate::error::{CqError, EventError};

pub(crate) struct ChannelInner<D: Device> {
    pub(crate) ctx: Arc<ContextInner<D>>,
    pub(crate) eq: Arc<EqShared<D>>,
    /// CQs with an unread event. Weak: an unread event keeps no CQ alive, and a CQ destroyed
    /// before its event was read simply has no event any more (as in libibverbs).
    events: Mutex<VecDeque<Weak<CqInner<D>>>>,
}

impl<D: Device> ChannelInner<D> {
    pub(crate) fn push(&self, cq: Weak<CqInner<D>>) {
        lock(&self.events).push_back(cq);
    }
}

impl<D: Device> Drop for ChannelInner<D> {
    fn drop(&mut self) {
        self.ctx.counts.channels.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A completion channel. Cheap to clone.
pub struct CompletionChannel<D: Device> {
    pub(crate) inner: Arc<ChannelInner<D>>,
}

impl<D: Device> Clone for CompletionChannel<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for CompletionChannel<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("eqn", &self.inner.eq.eqn)
            .field("queued", &self.queued())
            .finish()
    }
}

impl<D: Device> Context<D> {
    /// Creates a completion channel whose event queue interrupts `sink`
    /// (`ibv_create_comp_channel`).
    ///
    /// # Errors
    /// The device could not create the event queue.
    pub fn create_comp_channel(
        &self,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<CompletionChannel<D>, CqError> {
        let kind = EqKind::Completion { vector: 0 };
        let eq = EqShared::create(&self.inner, kind, sink)?;
        self.inner.counts.channels.fetch_add(1, Ordering::Relaxed);
        Ok(CompletionChannel {
            inner: Arc::new(ChannelInner {
                ctx: self.inner.clone(),
                eq,
                events: Mutex::new(VecDeque::new()),
            }),
        })
    }
}

impl<D: Device> CompletionChannel<D> {
    /// Drains the channel's event queue into its event list; returns how many device events
    /// were handled.
    ///
    /// # Errors
    /// A malformed event was skipped.
    pub fn process(&self) -> Result<usize, EventError> {
        self.inner.eq.process(usize::MAX)
    }

    /// The next CQ event (`ibv_get_cq_event`), without blocking. Each one must be acknowledged
    /// with [`Cq::ack_events`].
    ///
    /// # Errors
    /// A malformed event was skipped.
    pub fn get_event(&self) -> Result<Option<Cq<D>>, EventError> {
        if self.queued() == 0 {
            self.process()?;
        }
        let mut q = lock(&self.inner.events);
        while let Some(weak) = q.pop_front() {
            if let Some(inner) = weak.upgrade() {
                let cq = Cq { inner };
                cq.event_read();
                return Ok(Some(cq));
            }
        }
        Ok(None)
    }

    /// Events waiting to be read (for CQs that still exist).
    pub fn queued(&self) -> usize {
        lock(&self.inner.events)
            .iter()
            .filter(|w| w.strong_count() > 0)
            .count()
    }

    /// True when `cq` reports its completion events to this channel.
    pub fn owns(&self, cq: &Cq<D>) -> bool {
        cq.eqn() == self.inner.eq.eqn
    }

    /// The event queue number behind the channel.
    pub fn eqn(&self) -> u32 {
        self.inner.eq.eqn
    }
}

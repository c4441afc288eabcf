//! Completion channels (`struct ibv_comp_channel`): an event queue of its own whose interrupts
//! go to a sink from the context's [`crate::SinkFactory`], and the queue of CQ events read
//! with [`CompletionChannel::get_cq_event`] (or waited for) and acknowledged with
//! [`crate::Cq::ack_events`]. The sink decides how a thread blocks or a task is woken: an
//! eventfd on Linux, a latch anywhere ([`crate::LatchSinks`]).

use std::collections::VecDeque;
use std::fmt;
use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use portverbs_hal::device::{Device, EqKind};
use portverbs_hal::notify::InterruptSink;

use crate::context::{Context, ContextInner, EqShared, lock};
use crate::cq::{Cq, CqInner};
use crate::error::{CqError, EventError, Refused, WaitError};
use crate::wait::{block_until, manual, poll_until};

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

    /// Events waiting to be read (for CQs that still exist).
    pub(crate) fn queued(&self) -> usize {
        lock(&self.events)
            .iter()
            .filter(|w| w.strong_count() > 0)
            .count()
    }
}

impl<D: Device> Drop for ChannelInner<D> {
    fn drop(&mut self) {
        self.ctx.counts.channels.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A completion channel (`struct ibv_comp_channel`). Cheap to clone.
///
/// Create CQs on it with `CqInit { channel: Some(&chan), .. }`, arm them with
/// [`Cq::req_notify`], then take events: [`get_cq_event`](Self::get_cq_event) without
/// blocking, [`wait_cq_event`](Self::wait_cq_event) blocking the thread,
/// [`next_cq_event`](Self::next_cq_event) in `async` code, or wait for the fd
/// ([`as_fd`](Self::as_fd); poll, epoll in either mode, a reactor) and then call
/// `get_cq_event` until it returns `None`. Acknowledge each event with [`Cq::ack_events`]
/// (batching is fine); [`Cq::destroy`] is refused while any is unacknowledged.
///
/// Readiness only says "something may be waiting": a `None` right after a wakeup is normal.
/// It is never quiet while an event is queued: whoever reads one and leaves others behind
/// signals the channel again, so level-triggered pollers see it still readable and
/// edge-triggered ones get a new edge. Several threads or tasks may read one channel; each
/// event goes to exactly one of them.
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
    /// Creates a completion channel (`ibv_create_comp_channel`) whose event queue interrupts a
    /// sink from the context's [`crate::SinkFactory`]: an eventfd with the Linux platform's
    /// sinks, a latch with [`crate::LatchSinks`], nothing with [`crate::PollingSinks`] (then
    /// the channel can only be read, not waited on).
    ///
    /// # Errors
    /// The platform could not provide the sink ([`CqError::Sink`]), or the device could not
    /// create the event queue.
    pub fn create_comp_channel(&self) -> Result<CompletionChannel<D>, CqError> {
        let sink = self
            .inner
            .opts
            .sinks
            .channel_sink()
            .map_err(CqError::Sink)?;
        self.create_comp_channel_with(sink)
    }

    /// Creates a completion channel whose event queue interrupts `sink`, whatever the
    /// context's sinks are.
    ///
    /// # Errors
    /// The device could not create the event queue.
    pub fn create_comp_channel_with(
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
    /// Processes the channel's event queue: completes the notify requests of its CQs
    /// ([`Cq::notify`]) and queues the events of CQs armed with [`Cq::req_notify`]. Returns
    /// how many device events were handled. The reading and waiting calls do this themselves.
    ///
    /// # Errors
    /// A malformed event was skipped.
    pub fn process(&self) -> Result<usize, EventError> {
        self.inner.eq.process(usize::MAX)
    }

    /// The next CQ event without blocking (`ibv_get_cq_event` on a nonblocking channel): the
    /// CQ that got a completion after [`Cq::req_notify`], or `None`. Clears the channel's
    /// readiness first, so it is the call to make when its fd polled readable. Acknowledge
    /// the event with `cq.ack_events(1)` (or in batches).
    ///
    /// # Errors
    /// A malformed event was skipped (call again), or the sink failed.
    pub fn get_cq_event(&self) -> Result<Option<Cq<D>>, WaitError> {
        self.inner.eq.sink.clear().map_err(WaitError::Sink)?;
        if let Some(dev) = manual(self.inner.ctx.device()) {
            dev.dispatch();
        }
        self.look()
    }

    /// Blocks until a CQ event arrives and returns it (`ibv_get_cq_event` on a blocking
    /// channel). `None` waits for ever.
    ///
    /// # Errors
    /// [`WaitError::TimedOut`]; [`WaitError::Sink`] when the channel's sink cannot block;
    /// otherwise as [`CompletionChannel::get_cq_event`].
    pub fn wait_cq_event(&self, timeout: Option<Duration>) -> Result<Cq<D>, WaitError> {
        let dev = manual(self.inner.ctx.device());
        block_until(dev, &*self.inner.eq.sink, timeout, || self.look())
    }

    /// Waits for the next CQ event without blocking the thread.
    ///
    /// # Errors
    /// [`WaitError::Sink`] when the channel's sink cannot be awaited; otherwise as
    /// [`CompletionChannel::get_cq_event`].
    pub async fn next_cq_event(&self) -> Result<Cq<D>, WaitError> {
        let dev = manual(self.inner.ctx.device());
        poll_fn(|cx| poll_until(dev, &*self.inner.eq.sink, cx, |_| self.look())).await
    }

    /// The channel's pollable fd (`ibv_comp_channel::fd`), when its sink has one (the Linux
    /// platform's sinks do): readable when a CQ event may be waiting.
    #[cfg(unix)]
    pub fn as_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.eq.sink.as_fd()
    }

    /// Takes one event, processing the event queue if none is queued; raises the sink again
    /// when events are left behind or a malformed event was met.
    fn look(&self) -> Result<Option<Cq<D>>, WaitError> {
        let sink = &self.inner.eq.sink;
        if self.queued() == 0 {
            if let Err(e) = self.process() {
                sink.raise();
                return Err(e.into());
            }
        }
        let mut q = lock(&self.inner.events);
        let mut got = None;
        while let Some(weak) = q.pop_front() {
            if let Some(inner) = weak.upgrade() {
                let cq = Cq { inner };
                cq.event_read();
                got = Some(cq);
                break;
            }
        }
        if q.iter().any(|w| w.strong_count() > 0) {
            sink.raise();
        }
        Ok(got)
    }

    /// Destroys the channel now (`ibv_destroy_comp_channel`). Refused while CQs report to it
    /// or other handles of it exist; the handle is given back. (Dropping the last handle
    /// also releases it, once its CQs are gone.)
    ///
    /// # Errors
    /// [`CqError::ChannelInUse`], with the channel handed back.
    pub fn destroy(self) -> Result<(), Refused<Self, CqError>> {
        // The channel holds one reference to its EQ; every CQ on it holds another.
        let users = (Arc::strong_count(&self.inner) - 1) + (Arc::strong_count(&self.inner.eq) - 1);
        if users > 0 {
            let eqn = self.inner.eq.eqn;
            return Err(Refused::new(CqError::ChannelInUse { eqn, users }, self));
        }
        drop(self);
        Ok(())
    }

    /// Events waiting to be read (for CQs that still exist).
    pub fn queued(&self) -> usize {
        self.inner.queued()
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

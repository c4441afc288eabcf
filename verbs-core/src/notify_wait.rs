//! Waiting for a notify request ([`Cq::notify`]) by driving the CQ's event queue: blocking
//! ([`Cq::wait_notify`]) or as a future ([`Cq::notified`], [`Cq::wait_request`]).

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context as TaskContext, Poll, Waker};
use std::time::Duration;

use portverbs_hal::device::Device;

use crate::channel::ChannelInner;
use crate::context::EqShared;
use crate::cq::Cq;
use crate::error::WaitError;
use crate::notify::{NotifyKind, NotifyRequest};
use crate::wait::{RaiseOnWake, block_until, manual, poll_until};

/// What a waiter needs to drive a CQ's event queue. Holds no reference to the CQ itself, so
/// destroying the CQ is not refused while someone waits, and completes the request with
/// [`crate::NotifyError::Cancelled`].
struct Driver<D: Device> {
    eq: Arc<EqShared<D>>,
    channel: Option<Weak<ChannelInner<D>>>,
}

impl<D: Device> Driver<D> {
    fn of(cq: &Cq<D>) -> Self {
        Self {
            eq: cq.inner.eq.clone(),
            channel: cq.inner.channel.clone(),
        }
    }

    /// Processes the event queue, then asks `req` whether it completed (registering `cx`'s
    /// waker with it). The sink was cleared by the caller: raise it again when channel events
    /// were left queued for someone else, or a malformed event was met.
    fn look(
        &self,
        req: &mut NotifyRequest,
        cx: &mut TaskContext<'_>,
    ) -> Result<Option<()>, WaitError> {
        if let Poll::Ready(r) = Pin::new(&mut *req).poll(cx) {
            return r.map(Some).map_err(WaitError::from);
        }
        let processed = self.eq.process(usize::MAX);
        let leftover = self
            .channel
            .as_ref()
            .and_then(Weak::upgrade)
            .is_some_and(|ch| ch.queued() > 0);
        if processed.is_err() || leftover {
            self.eq.sink.raise();
        }
        processed?;
        match Pin::new(req).poll(cx) {
            Poll::Ready(r) => r.map(Some).map_err(WaitError::from),
            Poll::Pending => Ok(None),
        }
    }
}

impl<D: Device> Cq<D> {
    /// Blocks until `req` completes, processing this CQ's event queue (its completion
    /// channel's, or its completion vector's) whenever its sink is raised. `req` must come
    /// from [`Cq::notify`] on this CQ. Several threads may wait on CQs of one event queue:
    /// a request completed by another thread's processing wakes its waiter.
    ///
    /// CQ errors and device failure arrive on the asynchronous event queue, as in libibverbs:
    /// a [`NotifyKind::Errors`] request completes when something processes that queue
    /// ([`crate::Context::wait_async_event`], [`crate::Context::process_events`], …).
    ///
    /// # Errors
    /// The request's own error ([`WaitError::Notify`]: CQ destroyed, CQ error, device
    /// failure), [`WaitError::TimedOut`], a malformed event, or a sink that cannot block.
    pub fn wait_notify(
        &self,
        req: &mut NotifyRequest,
        timeout: Option<Duration>,
    ) -> Result<(), WaitError> {
        let driver = Driver::of(self);
        let waker = Waker::from(Arc::new(RaiseOnWake(driver.eq.sink.clone())));
        let mut cx = TaskContext::from_waker(&waker);
        let dev = manual(&driver.eq.dev.dev);
        block_until(dev, &*driver.eq.sink, timeout, || driver.look(req, &mut cx))
    }

    /// Requests a notification ([`Cq::notify`]) and returns a future that waits for it,
    /// driving the CQ's event queue. The request is armed now, before the future is first
    /// polled, so the usual loop is "arm, drain the CQ, await":
    ///
    /// ```no_run
    /// # use portverbs_verbs::{Cq, NotifyKind, WorkCompletion, WaitError};
    /// # async fn demo<D: portverbs_hal::Device>(cq: Cq<D>) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut wc = [WorkCompletion::default(); 16];
    /// loop {
    ///     let notified = cq.notified(NotifyKind::Any); // arm first …
    ///     while cq.poll(&mut wc)? > 0 { /* … then drain, so nothing slips between */ }
    ///     notified.await?;
    /// }
    /// # }
    /// ```
    ///
    /// The future holds no reference to the CQ: destroying the CQ completes it with
    /// [`crate::NotifyError::Cancelled`].
    pub fn notified(
        &self,
        kind: NotifyKind,
    ) -> impl Future<Output = Result<(), WaitError>> + Send + 'static {
        self.wait_request(self.notify(kind))
    }

    /// The future of a request made with [`Cq::notify`] on this CQ; see [`Cq::notified`].
    /// Any number of these futures, on any tasks, may wait on CQs of one event queue.
    pub fn wait_request(
        &self,
        mut req: NotifyRequest,
    ) -> impl Future<Output = Result<(), WaitError>> + Send + 'static {
        let driver = Driver::of(self);
        async move {
            let dev = manual(&driver.eq.dev.dev);
            poll_fn(|cx| poll_until(dev, &*driver.eq.sink, cx, |cx| driver.look(&mut req, cx)))
                .await
        }
    }
}

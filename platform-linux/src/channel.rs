//! Completion channels as pollable fds (`ibv_comp_channel` and its `fd`).

use std::fmt;
use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::Duration;

use portverbs_hal::device::Device;
use portverbs_verbs::{CompletionChannel, Context, Cq, EventError, NotifyRequest};

use crate::error::{ChannelError, NotifyWaitError, bad_event, would_block};
use crate::eventfd::{EventFd, EventFdSink};
use crate::wait::{self, Deadline};

/// A completion channel whose fd is an eventfd: readable when a CQ event may be waiting.
///
/// Create CQs on it with `CqInit { channel: Some(chan.channel()), .. }`, arm them with
/// [`Cq::req_notify`], wait for the fd (poll, epoll in either mode, tokio's `AsyncFd`), then
/// read events with [`CompChannel::get_cq_event`] until it returns `WouldBlock`, and
/// acknowledge each with [`Cq::ack_events`] (batching is fine); [`Cq::destroy`] is refused
/// while any is unacknowledged. Readiness may be spurious: `WouldBlock` right after a wakeup is
/// normal.
///
/// The fd is never left quiet while an event is queued: whoever drains it and leaves events
/// behind signals it again, so level-triggered pollers see it still readable and
/// edge-triggered ones (EPOLLET, tokio) get a new edge.
pub struct CompChannel<D: Device> {
    fd: Arc<EventFd>,
    channel: CompletionChannel<D>,
}

impl<D: Device> fmt::Debug for CompChannel<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompChannel")
            .field("fd", &self.fd.as_raw_fd())
            .field("channel", &self.channel)
            .finish()
    }
}

impl<D: Device> CompChannel<D> {
    /// Creates a completion channel on `ctx` (`ibv_create_comp_channel`): an eventfd, and an
    /// event queue whose interrupts signal it.
    ///
    /// # Errors
    /// No eventfd could be created, or the device refused the event queue.
    pub fn new(ctx: &Context<D>) -> Result<Self, ChannelError> {
        let fd = Arc::new(EventFd::new().map_err(ChannelError::EventFd)?);
        let channel = ctx.create_comp_channel(Arc::new(EventFdSink::new(fd.clone())))?;
        Ok(Self { fd, channel })
    }

    /// The portable channel, for `CqInit::channel`.
    pub fn channel(&self) -> &CompletionChannel<D> {
        &self.channel
    }

    /// The eventfd behind the channel.
    pub fn event_fd(&self) -> &EventFd {
        &self.fd
    }

    /// Drains the fd, then processes the channel's event queue: completes the notify requests
    /// of its CQs ([`Cq::notify`]) and queues the events of CQs armed with
    /// [`Cq::req_notify`]. Returns how many device events were handled. Call it when the fd
    /// is readable and you wait on notify requests rather than reading events;
    /// [`CompChannel::get_cq_event`] does it itself.
    ///
    /// # Errors
    /// The fd could not be read, or a malformed event was skipped (an `InvalidData` error
    /// carrying the [`portverbs_verbs::EventError`]); queued events stay readable.
    pub fn process(&self) -> io::Result<usize> {
        self.settle()?.map_err(bad_event)
    }

    /// Drains the fd, processes the event queue, and signals the fd again if events are left
    /// queued: the one step every reader of the channel takes.
    fn settle(&self) -> io::Result<Result<usize, EventError>> {
        self.fd.drain()?;
        let processed = self.channel.process();
        self.resignal_if_queued()?;
        Ok(processed)
    }

    fn resignal_if_queued(&self) -> io::Result<()> {
        if self.channel.queued() > 0 {
            self.fd.signal()?;
        }
        Ok(())
    }

    /// Reads the next CQ event without blocking (`ibv_get_cq_event` on a nonblocking fd):
    /// the CQ that got a completion after [`Cq::req_notify`]. Acknowledge it with
    /// `cq.ack_events(1)` (or in batches).
    ///
    /// # Errors
    /// `WouldBlock` when no event is waiting; `InvalidData` carrying a
    /// [`portverbs_verbs::EventError`] when a malformed event was skipped (call again); other
    /// kinds when the fd failed.
    pub fn get_cq_event(&self) -> io::Result<Cq<D>> {
        self.fd.drain()?;
        if let Err(e) = self.channel.process() {
            self.fd.signal()?;
            return Err(bad_event(e));
        }
        let got = self.channel.get_event();
        self.resignal_if_queued()?;
        match got {
            Ok(Some(cq)) => Ok(cq),
            Ok(None) => Err(would_block()),
            Err(e) => Err(bad_event(e)),
        }
    }

    /// Blocks (poll(2)) until a CQ event arrives and returns it, as `ibv_get_cq_event` on a
    /// blocking channel. `None` waits for ever.
    ///
    /// # Errors
    /// `TimedOut` when the timeout passed first; otherwise as [`CompChannel::get_cq_event`].
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<Cq<D>> {
        let deadline = Deadline::after(timeout);
        loop {
            match self.get_cq_event() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return r,
            }
            if !wait::readable(&*self.fd, deadline)? {
                return self.get_cq_event().map_err(|e| {
                    if e.kind() == io::ErrorKind::WouldBlock {
                        wait::timed_out()
                    } else {
                        e
                    }
                });
            }
        }
    }

    /// Blocks (poll(2)) until `req` completes, processing this channel's event queue whenever
    /// its fd is readable. `req` must come from [`Cq::notify`] on a CQ created with this
    /// channel (the completion of another CQ's request is noticed only if someone processes
    /// that CQ's event queue). Several threads may wait on one channel: a request completed
    /// by another thread's processing signals the fd, so its waiter wakes.
    ///
    /// # Errors
    /// The request's own error ([`NotifyWaitError::Notify`]: CQ destroyed, CQ error, device
    /// failure), [`NotifyWaitError::TimedOut`], a malformed event, or a failing fd.
    pub fn wait_notify(
        &self,
        req: &mut NotifyRequest,
        timeout: Option<Duration>,
    ) -> Result<(), NotifyWaitError> {
        let deadline = Deadline::after(timeout);
        let waker = Waker::from(Arc::new(SignalOnWake(self.fd.clone())));
        let mut cx = TaskContext::from_waker(&waker);
        loop {
            if let Poll::Ready(r) = Pin::new(&mut *req).poll(&mut cx) {
                return r.map_err(NotifyWaitError::from);
            }
            if !wait::readable(&*self.fd, deadline).map_err(NotifyWaitError::Io)? {
                return match req.try_result() {
                    Some(r) => r.map_err(NotifyWaitError::from),
                    None => Err(NotifyWaitError::TimedOut),
                };
            }
            self.process_for_wait()?;
        }
    }

    /// [`CompChannel::process`] with the errors of a notify wait.
    pub(crate) fn process_for_wait(&self) -> Result<usize, NotifyWaitError> {
        Ok(self.settle().map_err(NotifyWaitError::Io)??)
    }
}

/// The waker of a blocking wait: completing the request signals the channel's fd, which wakes
/// the poll(2) of whichever thread waits on it.
struct SignalOnWake(Arc<EventFd>);

impl Wake for SignalOnWake {
    fn wake(self: Arc<Self>) {
        let _ = self.0.signal();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let _ = self.0.signal();
    }
}

impl<D: Device> AsFd for CompChannel<D> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl<D: Device> AsRawFd for CompChannel<D> {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

//! Tokio integration (cargo feature `tokio`): the channel and event fds registered with
//! tokio's reactor through `tokio::io::unix::AsyncFd`, a `Future` for a CQ notify request, and
//! async get-event calls. Nothing here spawns a task or a thread: the futures make progress
//! when the application awaits them.

use std::fmt;
use std::future::{Future, poll_fn};
use std::io;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;

use portverbs_hal::device::Device;
use portverbs_verbs::{AsyncEvent, CompletionChannel, Cq, NotifyError, NotifyKind, NotifyRequest};
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

use crate::channel::CompChannel;
use crate::error::NotifyWaitError;
use crate::events::AsyncEvents;
use crate::sys::register_readable;

/// A [`CompChannel`] registered with the tokio reactor. Cheap to clone (clones share one
/// registration).
///
/// ```no_run
/// use portverbs_linux::{CompChannel, TokioCompChannel};
/// use portverbs_verbs::{CqInit, NotifyKind, WorkCompletion};
///
/// # async fn demo<D: portverbs_hal::Device>(dev: D) -> Result<(), Box<dyn std::error::Error>> {
/// let (ctx, _events) = portverbs_linux::open(dev).await?;
/// let chan = TokioCompChannel::new(CompChannel::new(&ctx)?)?;
/// let init = CqInit { entries: 64, channel: Some(chan.channel()), ..CqInit::default() };
/// let cq = ctx.create_cq(init).await?;
/// let mut wc = [WorkCompletion::default(); 16];
/// loop {
///     let notified = chan.notify(&cq, NotifyKind::Any); // arm first …
///     while cq.poll(&mut wc)? > 0 { /* … then drain, so nothing slips between */ }
///     notified.await?;
/// }
/// # }
/// ```
pub struct TokioCompChannel<D: Device> {
    fd: Arc<AsyncFd<CompChannel<D>>>,
}

impl<D: Device> Clone for TokioCompChannel<D> {
    fn clone(&self) -> Self {
        Self {
            fd: self.fd.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for TokioCompChannel<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokioCompChannel")
            .field("channel", self.fd.get_ref())
            .finish()
    }
}

/// What woke a notify wait first.
enum Woken<'a, D: Device> {
    Request(Result<(), NotifyError>),
    Fd(io::Result<AsyncFdReadyGuard<'a, CompChannel<D>>>),
}

impl<D: Device> TokioCompChannel<D> {
    /// Registers `channel`'s fd with the current tokio runtime (for reading).
    ///
    /// # Errors
    /// The registration failed.
    ///
    /// # Panics
    /// When called outside a tokio runtime (as `AsyncFd::new` does).
    pub fn new(channel: CompChannel<D>) -> io::Result<Self> {
        let fd = register_readable(channel)?;
        Ok(Self { fd: Arc::new(fd) })
    }

    /// The channel.
    pub fn get_ref(&self) -> &CompChannel<D> {
        self.fd.get_ref()
    }

    /// The channel's registration, for waiting on its readiness directly
    /// (`readable().await`, then `try_io(|fd| fd.get_ref().get_cq_event())`).
    pub fn async_fd(&self) -> &AsyncFd<CompChannel<D>> {
        &self.fd
    }

    /// The portable channel, for `CqInit::channel`.
    pub fn channel(&self) -> &CompletionChannel<D> {
        self.fd.get_ref().channel()
    }

    /// Waits for the next CQ event ([`CompChannel::get_cq_event`]); acknowledge it with
    /// [`Cq::ack_events`].
    ///
    /// # Errors
    /// As [`CompChannel::get_cq_event`], never `WouldBlock`.
    pub async fn get_cq_event(&self) -> io::Result<Cq<D>> {
        loop {
            let mut guard = self.fd.readable().await?;
            if let Ok(r) = guard.try_io(|fd| fd.get_ref().get_cq_event()) {
                return r;
            }
        }
    }

    /// Requests a notification on `cq` ([`Cq::notify`], NetworkDirect semantics) and returns
    /// the future of its completion. `cq` must have been created with this channel. The
    /// request is armed at once, before the future is first polled; the future holds no
    /// reference to the CQ, so destroying the CQ completes it with
    /// [`NotifyError::Cancelled`].
    pub fn notify(
        &self,
        cq: &Cq<D>,
        kind: NotifyKind,
    ) -> impl Future<Output = Result<(), NotifyWaitError>> + Send + 'static {
        self.wait_request(cq.notify(kind))
    }

    /// The future of a request made with [`Cq::notify`] on a CQ of this channel: it resolves
    /// when the request completes, processing the channel's event queue whenever the fd is
    /// readable. Any number of these futures, on any tasks, may wait on one channel.
    pub fn wait_request(
        &self,
        mut req: NotifyRequest,
    ) -> impl Future<Output = Result<(), NotifyWaitError>> + Send + 'static {
        let fd = self.fd.clone();
        async move {
            loop {
                let woken = {
                    let mut readable = pin!(fd.readable());
                    poll_fn(|cx| {
                        if let Poll::Ready(r) = Pin::new(&mut req).poll(cx) {
                            return Poll::Ready(Woken::Request(r));
                        }
                        readable.as_mut().poll(cx).map(Woken::Fd)
                    })
                    .await
                };
                match woken {
                    Woken::Request(r) => return r.map_err(NotifyWaitError::from),
                    Woken::Fd(Err(e)) => return Err(NotifyWaitError::Io(e)),
                    Woken::Fd(Ok(mut guard)) => {
                        // Draining and processing leave nothing readable behind unless an
                        // event stays queued, in which case the fd was signalled again.
                        let processed = guard.get_inner().process_for_wait();
                        guard.clear_ready();
                        processed?;
                    }
                }
            }
        }
    }
}

/// [`AsyncEvents`] registered with the tokio reactor.
pub struct TokioAsyncEvents<D: Device> {
    fd: AsyncFd<AsyncEvents<D>>,
}

impl<D: Device> fmt::Debug for TokioAsyncEvents<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokioAsyncEvents")
            .field("events", self.fd.get_ref())
            .finish()
    }
}

impl<D: Device> TokioAsyncEvents<D> {
    /// Registers the event fd with the current tokio runtime (for reading).
    ///
    /// # Errors
    /// The registration failed.
    ///
    /// # Panics
    /// When called outside a tokio runtime (as `AsyncFd::new` does).
    pub fn new(events: AsyncEvents<D>) -> io::Result<Self> {
        Ok(Self {
            fd: register_readable(events)?,
        })
    }

    /// The events.
    pub fn get_ref(&self) -> &AsyncEvents<D> {
        self.fd.get_ref()
    }

    /// The registration of the event fd, for waiting on its readiness directly.
    pub fn async_fd(&self) -> &AsyncFd<AsyncEvents<D>> {
        &self.fd
    }

    /// Waits for the next asynchronous event ([`AsyncEvents::get_event`]).
    ///
    /// # Errors
    /// As [`AsyncEvents::get_event`], never `WouldBlock`.
    pub async fn get_event(&self) -> io::Result<AsyncEvent> {
        loop {
            let mut guard = self.fd.readable().await?;
            if let Ok(r) = guard.try_io(|fd| fd.get_ref().get_event()) {
                return r;
            }
        }
    }
}

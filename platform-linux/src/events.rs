//! Asynchronous events through a pollable fd (`ibv_context::async_fd`).

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use portverbs_hal::device::Device;
use portverbs_verbs::{AsyncEvent, Context, EventError};

use crate::error::{bad_event, would_block};
use crate::eventfd::EventFd;
use crate::sinks::LinuxSinks;
use crate::wait::{self, Deadline};

/// What one read took out of the context beyond the event it returned.
#[derive(Debug, Default)]
struct Lookahead {
    event: Option<AsyncEvent>,
    error: Option<EventError>,
}

/// The asynchronous events of a context, read through the eventfd its asynchronous event
/// queue interrupts: readable when an event (port up or down, QP/CQ/SRQ error, device
/// failure …) may be waiting.
///
/// Wait for the fd with poll, epoll (either mode) or tokio's `AsyncFd`, then call
/// [`AsyncEvents::get_event`] until it returns `WouldBlock`. Unlike libibverbs there is
/// nothing to acknowledge: events name objects by number. As with [`crate::CompChannel`],
/// the fd is signalled again whenever an event is left behind, so neither level- nor
/// edge-triggered pollers miss one; a wakeup may be spurious.
///
/// Processing the asynchronous event queue also completes the notify requests of CQs in
/// error or of a failed device ([`portverbs_verbs::NotifyKind::Errors`]), so an application
/// that waits for those reads this fd too.
pub struct AsyncEvents<D: Device> {
    ctx: Context<D>,
    sinks: Arc<LinuxSinks>,
    fd: Arc<EventFd>,
    lookahead: Mutex<Lookahead>,
}

impl<D: Device> fmt::Debug for AsyncEvents<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AsyncEvents")
            .field("ctx", &self.ctx)
            .field("fd", &self.fd.as_raw_fd())
            .finish()
    }
}

impl<D: Device> AsyncEvents<D> {
    /// The asynchronous events of `ctx`, which must have been opened with `sinks`
    /// (`ContextOptions { sinks, .. }`); otherwise the fd is never signalled. [`crate::open`]
    /// does both steps.
    pub fn new(ctx: Context<D>, sinks: Arc<LinuxSinks>) -> Self {
        Self {
            ctx,
            fd: sinks.async_fd().clone(),
            sinks,
            lookahead: Mutex::new(Lookahead::default()),
        }
    }

    /// The context the events come from.
    pub fn context(&self) -> &Context<D> {
        &self.ctx
    }

    /// The context's sinks: the eventfds of its completion vectors
    /// ([`LinuxSinks::vector_fd`]).
    pub fn sinks(&self) -> &Arc<LinuxSinks> {
        &self.sinks
    }

    /// The eventfd behind the events.
    pub fn event_fd(&self) -> &EventFd {
        &self.fd
    }

    fn lookahead(&self) -> MutexGuard<'_, Lookahead> {
        self.lookahead.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the next asynchronous event without blocking (`ibv_get_async_event` on a
    /// nonblocking fd).
    ///
    /// # Errors
    /// `WouldBlock` when none is waiting; `InvalidData` carrying a [`EventError`] when a
    /// malformed event was skipped (call again); other kinds when the fd failed.
    pub fn get_event(&self) -> io::Result<AsyncEvent> {
        self.fd.drain()?;
        let mut ahead = self.lookahead();
        if let Some(e) = ahead.error.take() {
            self.fd.signal()?;
            return Err(bad_event(e));
        }
        let event = match ahead.event.take() {
            Some(ev) => ev,
            None => match self.ctx.get_async_event() {
                Ok(Some(ev)) => ev,
                Ok(None) => return Err(would_block()),
                Err(e) => {
                    self.fd.signal()?;
                    return Err(bad_event(e));
                }
            },
        };
        // The context tells no count of queued events: take the next one now, so that the fd
        // can be signalled again exactly when one is left.
        match self.ctx.get_async_event() {
            Ok(next) => ahead.event = next,
            Err(e) => ahead.error = Some(e),
        }
        if ahead.event.is_some() || ahead.error.is_some() {
            self.fd.signal()?;
        }
        Ok(event)
    }

    /// Blocks (poll(2)) until an asynchronous event arrives and returns it. `None` waits for
    /// ever.
    ///
    /// # Errors
    /// `TimedOut` when the timeout passed first; otherwise as [`AsyncEvents::get_event`].
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<AsyncEvent> {
        let deadline = Deadline::after(timeout);
        loop {
            match self.get_event() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return r,
            }
            if !wait::readable(&*self.fd, deadline)? {
                return self.get_event().map_err(|e| {
                    if e.kind() == io::ErrorKind::WouldBlock {
                        wait::timed_out()
                    } else {
                        e
                    }
                });
            }
        }
    }
}

impl<D: Device> AsFd for AsyncEvents<D> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl<D: Device> AsRawFd for AsyncEvents<D> {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

//! An [`crate::EventFdSink`] in tokio's reactor (feature `tokio`): registered lazily, the
//! first time a task awaits it inside a tokio runtime, and then woken by the kernel's
//! readiness, whoever signalled the eventfd (a raise in process, or a device's MSI-X).

use std::io;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use portverbs_hal::notify::WakerSet;
use tokio::io::unix::AsyncFd;

use crate::eventfd::EventFd;
use crate::sys::{Registered, register_readable};

/// The registration of one eventfd, made on first use.
#[derive(Debug, Default)]
pub(crate) struct Reactor {
    registration: Mutex<Option<Arc<AsyncFd<Registered>>>>,
}

impl Reactor {
    /// The registration, made now if this is the first call inside a tokio runtime; `None`
    /// outside one.
    fn registration(&self, fd: &Arc<EventFd>) -> Option<io::Result<Arc<AsyncFd<Registered>>>> {
        let mut slot = self.registration.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = slot.as_ref() {
            return Some(Ok(r.clone()));
        }
        tokio::runtime::Handle::try_current().ok()?;
        Some(register_readable(fd.clone()).map(|r| {
            let r = Arc::new(r);
            *slot = Some(r.clone());
            r
        }))
    }

    /// Ready when `fd` is signalled; otherwise the reactor wakes every task in `wakers` when
    /// it becomes readable. `None` when not inside a tokio runtime (the caller falls back to
    /// waking on raises). The reactor keeps one waker per registration, so it is given the
    /// set itself, which wakes them all.
    pub(crate) fn poll_readable(
        &self,
        fd: &Arc<EventFd>,
        wakers: &Arc<WakerSet>,
    ) -> Option<Poll<io::Result<()>>> {
        let registration = match self.registration(fd)? {
            Ok(r) => r,
            Err(e) => return Some(Poll::Ready(Err(e))),
        };
        let fanout = Waker::from(wakers.clone());
        let mut cx = Context::from_waker(&fanout);
        loop {
            match registration.poll_read_ready(&mut cx) {
                Poll::Pending => return Some(Poll::Pending),
                Poll::Ready(Err(e)) => return Some(Poll::Ready(Err(e))),
                Poll::Ready(Ok(mut guard)) => {
                    // Tokio caches readiness until cleared; the counter says whether a raise
                    // is still unread.
                    match fd.is_signalled() {
                        Ok(true) => return Some(Poll::Ready(Ok(()))),
                        Ok(false) => guard.clear_ready(),
                        Err(e) => return Some(Poll::Ready(Err(e))),
                    }
                }
            }
        }
    }
}

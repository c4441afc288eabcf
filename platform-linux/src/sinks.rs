//! The sink factory: one eventfd per event queue the core creates.

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use portverbs_hal::device::EqKind;
use portverbs_hal::notify::{InterruptSink, NullSink};
use portverbs_verbs::SinkFactory;

use crate::eventfd::{EventFd, EventFdSink};

/// Gives every event queue of a context its own [`EventFd`] (a [`SinkFactory`] for
/// [`portverbs_verbs::ContextOptions::sinks`]): the asynchronous EQ
/// ([`portverbs_verbs::Context::async_fd`]), each completion channel's
/// ([`portverbs_verbs::CompletionChannel::as_fd`]) and each completion vector's
/// ([`portverbs_verbs::Context::vector_sink`]).
///
/// The asynchronous EQ's eventfd is created by [`LinuxSinks::new`], so that opening a context
/// can not fail for want of a file descriptor afterwards.
pub struct LinuxSinks {
    async_fd: Mutex<Option<Arc<EventFd>>>,
    errors: Mutex<Vec<io::Error>>,
}

impl fmt::Debug for LinuxSinks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinuxSinks")
            .field("errors", &lock(&self.errors).len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LinuxSinks {
    /// Creates the factory and the asynchronous EQ's eventfd.
    ///
    /// # Errors
    /// The eventfd could not be created.
    pub fn new() -> io::Result<Arc<Self>> {
        Ok(Arc::new(Self {
            async_fd: Mutex::new(Some(Arc::new(EventFd::new()?))),
            errors: Mutex::new(Vec::new()),
        }))
    }

    /// Eventfds that could not be created for completion vectors (their EQs fell back to a
    /// sink that does nothing, so their CQs are found only by polling). Taking them clears
    /// the list.
    pub fn take_errors(&self) -> Vec<io::Error> {
        std::mem::take(&mut *lock(&self.errors))
    }

    fn fresh(&self) -> io::Result<Arc<dyn InterruptSink>> {
        Ok(Arc::new(EventFdSink::new(Arc::new(EventFd::new()?))))
    }
}

impl SinkFactory for LinuxSinks {
    fn sink(&self, kind: EqKind) -> Arc<dyn InterruptSink> {
        let made = match kind {
            // The one made up front; a second asynchronous EQ (a second context opened with
            // the same factory) gets a fresh one.
            EqKind::Async => match lock(&self.async_fd).take() {
                Some(fd) => Ok(Arc::new(EventFdSink::new(fd)) as Arc<dyn InterruptSink>),
                None => self.fresh(),
            },
            EqKind::Completion { .. } => self.fresh(),
        };
        made.unwrap_or_else(|e| {
            // The trait can not fail; the error is kept for the application.
            lock(&self.errors).push(e);
            Arc::new(NullSink)
        })
    }

    fn channel_sink(&self) -> io::Result<Arc<dyn InterruptSink>> {
        self.fresh()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_event_queue_gets_its_own_eventfd() {
        let sinks = LinuxSinks::new().unwrap();
        let a = sinks.sink(EqKind::Async);
        let v0 = sinks.sink(EqKind::Completion { vector: 0 });
        let v1 = sinks.sink(EqKind::Completion { vector: 1 });
        let ch = sinks.channel_sink().unwrap();
        let fds: Vec<_> = [&a, &v0, &v1, &ch]
            .iter()
            .map(|s| s.eventfd().expect("an eventfd behind every sink"))
            .collect();
        for (i, fd) in fds.iter().enumerate() {
            assert!(!fds[..i].contains(fd), "eventfd {fd} handed out twice");
        }
        v0.raise();
        assert!(v0.wait(Some(std::time::Instant::now())).unwrap());
        assert!(!a.wait(Some(std::time::Instant::now())).unwrap());
        assert!(sinks.take_errors().is_empty());
    }
}

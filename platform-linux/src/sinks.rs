//! The sink factory: one eventfd per event queue the core creates.

use std::fmt;
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use portverbs_hal::device::EqKind;
use portverbs_hal::notify::{InterruptSink, NullSink};
use portverbs_verbs::SinkFactory;

use crate::eventfd::{EventFd, EventFdSink};

/// Gives every event queue of a context its own [`EventFd`] (a [`SinkFactory`] for
/// [`portverbs_verbs::ContextOptions::sinks`]).
///
/// The asynchronous EQ's eventfd is created up front by [`LinuxSinks::new`], so that opening a
/// context can not fail for want of a file descriptor; [`LinuxSinks::async_fd`] hands it to the
/// application ([`crate::AsyncEvents`] does this for you). Completion-vector EQs (those of CQs
/// created without a channel) get an eventfd when the core creates them; see
/// [`LinuxSinks::vector_fd`]. Completion channels bring their own eventfd
/// ([`crate::CompChannel`]) and never ask the factory.
pub struct LinuxSinks {
    async_fd: Arc<EventFd>,
    vectors: Mutex<Vec<(u32, Arc<EventFd>)>>,
    errors: Mutex<Vec<io::Error>>,
}

impl fmt::Debug for LinuxSinks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let vectors: Vec<u32> = lock(&self.vectors).iter().map(|(v, _)| *v).collect();
        f.debug_struct("LinuxSinks")
            .field("async_fd", &self.async_fd)
            .field("vectors", &vectors)
            .finish()
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
            async_fd: Arc::new(EventFd::new()?),
            vectors: Mutex::new(Vec::new()),
            errors: Mutex::new(Vec::new()),
        }))
    }

    /// The eventfd the asynchronous event queue interrupts: readable when an asynchronous
    /// event (port change, QP/CQ/SRQ error, device failure) may be waiting.
    pub fn async_fd(&self) -> &Arc<EventFd> {
        &self.async_fd
    }

    /// The eventfd of completion vector `vector`, once the core created that vector's EQ (at
    /// the first CQ created on it without a channel). When it is readable, drain it and call
    /// [`portverbs_verbs::Context::process_events`] to complete those CQs' notify requests.
    pub fn vector_fd(&self, vector: u32) -> Option<Arc<EventFd>> {
        lock(&self.vectors)
            .iter()
            .find(|(v, _)| *v == vector)
            .map(|(_, fd)| fd.clone())
    }

    /// Eventfds that could not be created for completion vectors (their EQs fell back to a
    /// sink that does nothing, so their CQs are found only by polling). Taking them clears
    /// the list.
    pub fn take_errors(&self) -> Vec<io::Error> {
        std::mem::take(&mut *lock(&self.errors))
    }
}

impl SinkFactory for LinuxSinks {
    fn sink(&self, kind: EqKind) -> Arc<dyn InterruptSink> {
        match kind {
            EqKind::Async => Arc::new(EventFdSink::new(self.async_fd.clone())),
            EqKind::Completion { vector } => match EventFd::new() {
                Ok(fd) => {
                    let fd = Arc::new(fd);
                    let mut vectors = lock(&self.vectors);
                    vectors.retain(|(v, _)| *v != vector);
                    vectors.push((vector, fd.clone()));
                    Arc::new(EventFdSink::new(fd))
                }
                Err(e) => {
                    // The trait can not fail; the error is kept for the application.
                    lock(&self.errors).push(e);
                    Arc::new(NullSink)
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn each_event_queue_gets_its_own_eventfd() {
        let sinks = LinuxSinks::new().unwrap();
        let a = sinks.sink(EqKind::Async);
        assert_eq!(a.eventfd(), Some(sinks.async_fd().as_raw_fd()));
        let v0 = sinks.sink(EqKind::Completion { vector: 0 });
        let v1 = sinks.sink(EqKind::Completion { vector: 1 });
        let fd0 = sinks.vector_fd(0).unwrap();
        assert_eq!(v0.eventfd(), Some(fd0.as_raw_fd()));
        assert_eq!(v1.eventfd(), Some(sinks.vector_fd(1).unwrap().as_raw_fd()));
        assert_ne!(v0.eventfd(), v1.eventfd());
        assert_ne!(v0.eventfd(), a.eventfd());
        v0.raise();
        assert_eq!(fd0.drain().unwrap(), 1);
        assert_eq!(sinks.async_fd().drain().unwrap(), 0);
        assert!(sinks.take_errors().is_empty());
    }
}

//! Errors of this layer. OS calls report `std::io::Error`; the verbs errors they meet are
//! wrapped, never flattened into strings.

use std::io;

use portverbs_verbs::{CqError, EventError, NotifyError};
use thiserror::Error;

/// Opening a device with eventfd-backed event queues ([`crate::open`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The asynchronous event queue's eventfd could not be created.
    #[error("creating the asynchronous event eventfd: {0}")]
    EventFd(#[source] io::Error),
    /// The device could not be opened.
    #[error(transparent)]
    Open(#[from] portverbs_verbs::OpenError),
}

/// Creating a completion channel ([`crate::CompChannel::new`]).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// The channel's eventfd could not be created.
    #[error("creating the completion channel's eventfd: {0}")]
    EventFd(#[source] io::Error),
    /// The device could not create the channel's event queue.
    #[error(transparent)]
    Create(#[from] CqError),
}

/// Waiting for a CQ notification request through a channel
/// ([`crate::CompChannel::wait_notify`], and the tokio notify future).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NotifyWaitError {
    /// The request completed with an error: the CQ was destroyed
    /// ([`NotifyError::Cancelled`]), is in error, or the device failed.
    #[error(transparent)]
    Notify(#[from] NotifyError),
    /// Processing the channel's event queue met a malformed event (it was skipped; waiting
    /// again is allowed).
    #[error(transparent)]
    BadEvent(#[from] EventError),
    /// The timeout passed before the request completed (blocking waits only).
    #[error("the notification did not arrive before the timeout")]
    TimedOut,
    /// Waiting on the channel's fd failed.
    #[error("waiting on the completion channel: {0}")]
    Io(#[source] io::Error),
}

/// `io::Error` of kind `InvalidData` that carries a malformed-event error; recover it with
/// `err.get_ref().and_then(|e| e.downcast_ref::<EventError>())`.
pub(crate) fn bad_event(e: EventError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// The `WouldBlock` of a get-event call that found nothing.
pub(crate) fn would_block() -> io::Error {
    io::Error::from(io::ErrorKind::WouldBlock)
}

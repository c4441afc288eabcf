//! The crate's only `unsafe` code: registering its own eventfds, its duplicates of a
//! manual-progress device's input, and its timerfds, with tokio's reactor. Since
//! tokio 1.54 `AsyncFd::register*` is `unsafe`, because tokio cannot check that the fd it is
//! handed stays open and unchanged while registered; here that is a property of [`Registered`].
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::eventfd::EventFd;

/// An eventfd as registered with tokio: the `Arc` keeps the `OwnedFd` inside it open for as
/// long as the registration lives, and nothing can replace it (the field is private and
/// `EventFd` has no method that changes its fd).
#[derive(Debug)]
pub(crate) struct Registered(Arc<EventFd>);

impl AsRawFd for Registered {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Registers `fd` with the current tokio runtime for readability.
///
/// # Panics
/// Outside a tokio runtime (callers check first).
pub(crate) fn register_readable(fd: Arc<EventFd>) -> io::Result<AsyncFd<Registered>> {
    // SAFETY: `AsyncFd` takes ownership of the `Registered`, whose `as_raw_fd` is the fd of an
    // `OwnedFd` kept alive by the `Arc` it holds; no code can close or replace that fd while
    // the `Arc` lives, so it stays open and refers to the same eventfd until the `AsyncFd`
    // (and with it the registration) is dropped.
    let fd = unsafe { AsyncFd::register_with_interest(Registered(fd), Interest::READABLE) }?;
    Ok(fd)
}

/// Registers `fd`, a file this crate made for the registration alone (a duplicate of a
/// manual-progress device's input, or a timerfd), with the current tokio runtime for
/// readability.
///
/// # Panics
/// Outside a tokio runtime (callers check first).
pub(crate) fn register_source(
    fd: std::os::fd::OwnedFd,
) -> io::Result<AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: `AsyncFd` takes ownership of the `OwnedFd`, a file made for it alone: nothing
    // else can close or replace it, so it stays open and refers to the same file until the
    // `AsyncFd` (and with it the registration) is dropped.
    let fd = unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }?;
    Ok(fd)
}

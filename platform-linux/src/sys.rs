//! The crate's only `unsafe` code: registering its own fds with tokio's reactor. Since tokio
//! 1.54 `AsyncFd::register*` is `unsafe`, because tokio cannot check that the fd it is handed
//! stays open and unchanged while registered; here that is a property of the registered types.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::AsRawFd;

use portverbs_hal::device::Device;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::channel::CompChannel;
use crate::events::AsyncEvents;

/// Types whose [`AsRawFd::as_raw_fd`] is an fd they own (an `Arc<EventFd>` in a private
/// field, holding an `OwnedFd`), never replace, and keep open for as long as they live.
/// Crate-private: no other type can implement it.
pub(crate) trait StableFd: AsRawFd {}

impl<D: Device> StableFd for CompChannel<D> {}
impl<D: Device> StableFd for AsyncEvents<D> {}

/// Registers `inner`'s fd with the current tokio runtime for readability.
///
/// # Panics
/// Outside a tokio runtime.
pub(crate) fn register_readable<T: StableFd>(inner: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: `AsyncFd` takes ownership of `inner`, and by `StableFd` (crate-private,
    // implemented only above) `inner.as_raw_fd()` is an fd that `inner` owns through a private
    // `Arc<EventFd>` which no method replaces; the fd therefore stays open, refers to the same
    // eventfd, and is returned by every `as_raw_fd` call until `inner` is dropped, which
    // happens only after the `AsyncFd` deregistered it (or after `into_inner`).
    let fd = unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }?;
    Ok(fd)
}

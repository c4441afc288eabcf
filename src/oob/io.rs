//! The byte streams the exchanges run on. Each exchange is written once, as `async` steps over
//! a [`Wire`]; [`Blocking`] makes a `std::io` stream one whose futures are ready at once (its
//! calls block), [`Tokio`] a tokio stream, and [`now`] runs the steps on a blocking one.

use std::future::Future;
use std::io::{self, Read, Write};

/// A stream of bytes: whole messages out, exactly so many bytes in.
pub(super) trait Wire {
    /// Writes all of `bytes` (and flushes them).
    async fn send(&mut self, bytes: &[u8]) -> io::Result<()>;
    /// Reads exactly `buf.len()` bytes.
    async fn recv(&mut self, buf: &mut [u8]) -> io::Result<()>;
}

/// A blocking stream.
#[derive(Debug)]
pub(super) struct Blocking<S>(pub(super) S);

impl<S: Read + Write> Wire for Blocking<S> {
    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all(bytes)?;
        self.0.flush()
    }

    async fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.0.read_exact(buf)
    }
}

/// A tokio stream.
#[cfg(feature = "tokio")]
#[derive(Debug)]
pub(super) struct Tokio<S>(pub(super) S);

#[cfg(feature = "tokio")]
impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> Wire for Tokio<S> {
    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        use tokio::io::AsyncWriteExt as _;
        self.0.write_all(bytes).await?;
        self.0.flush().await
    }

    async fn recv(&mut self, buf: &mut [u8]) -> io::Result<()> {
        use tokio::io::AsyncReadExt as _;
        self.0.read_exact(buf).await.map(|_| ())
    }
}

/// Runs a step on a blocking wire (or a blocking transport of the caller's): every call in it
/// blocks, so it is ready at its first poll.
pub(super) fn now<F: Future>(step: F) -> F::Output {
    portverbs_hal::block_on(step)
}

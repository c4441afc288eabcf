//! A one-future executor whose waker is a completion packet: the calling thread sleeps in
//! `GetQueuedCompletionStatusEx` on a private port until the future's waker posts to it.
//! That is all Rust `async` needs on Windows here: the CQ notify future and the async verbs
//! wake their task from the thread that raised the interrupt or completed the command (the
//! application's own call, or the emulated device's), never from a thread of this crate.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use crate::port::CompletionPort;

struct PortWaker {
    port: CompletionPort,
    /// A packet is queued and not yet taken: wakes in between post nothing more.
    posted: AtomicBool,
    failed: AtomicBool,
}

impl Wake for PortWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.posted.swap(true, Ordering::AcqRel)
            && self.port.post(0, ptr::null_mut(), 0).is_err()
        {
            self.failed.store(true, Ordering::Release);
        }
    }
}

/// Runs `fut` to completion on the calling thread, sleeping on a completion port between
/// polls. Returns how many times the thread slept, with the output.
///
/// # Errors
/// The port could not be created or waited on, or a wake-up packet could not be posted.
pub fn block_on_port<F: Future>(fut: F) -> io::Result<(F::Output, usize)> {
    let state = Arc::new(PortWaker {
        port: CompletionPort::new()?,
        posted: AtomicBool::new(false),
        failed: AtomicBool::new(false),
    });
    let waker = Waker::from(state.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    let mut sleeps = 0;
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return Ok((out, sleeps));
        }
        if state.failed.load(Ordering::Acquire) {
            return Err(io::Error::other("a wake-up packet could not be posted"));
        }
        state.port.get(None)?;
        sleeps += 1;
        // Taken: the next wake posts again.
        state.posted.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    // Wine 8 deviation avoided (§3.2, b2): the executor's port is never closed to end a wait;
    // a wake is a posted packet.
    #[test]
    fn a_wake_from_another_thread_ends_the_sleep() {
        let flag = Arc::new(AtomicBool::new(false));
        let fut = {
            let flag = flag.clone();
            let mut spawned = false;
            std::future::poll_fn(move |cx| {
                if flag.load(Ordering::Acquire) {
                    return Poll::Ready(7);
                }
                if !spawned {
                    spawned = true;
                    let (w, f) = (cx.waker().clone(), flag.clone());
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_millis(10));
                        f.store(true, Ordering::Release);
                        w.wake();
                    });
                }
                Poll::Pending
            })
        };
        let (out, sleeps) = block_on_port(fut).unwrap();
        assert_eq!(out, 7);
        assert!(sleeps >= 1, "the thread slept on the port");
    }
}

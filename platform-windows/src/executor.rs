//! A one-future executor whose waker is a completion packet: the calling thread sleeps in
//! `GetQueuedCompletionStatusEx` on a private port until the future's waker posts to it.
//! That is all Rust `async` needs on Windows here: the CQ notify future and the async verbs
//! wake their task from the thread that raised the interrupt or completed the command (the
//! application's own call, or the emulated device's), never from a thread of this crate.
//! Timers ([`crate::sleep_until`]) need no thread either: the sleep lasts no longer than the
//! earliest deadline on the process's [`TimerList`], and the sleeps that are due are woken
//! when it ends.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use crate::port::CompletionPort;
use crate::timer::TimerList;

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
/// polls, each sleep no longer than the earliest timer deadline ([`crate::sleep_until`]);
/// the timers that are due fire when it ends. Returns how many times the thread slept, with
/// the output.
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
        let timers = TimerList::global();
        // A packet taken: the next wake posts again. A timeout leaves `posted` alone (a
        // packet posted meanwhile is still queued).
        if state.port.get(timers.next_timeout())?.is_some() {
            state.posted.store(false, Ordering::Release);
        }
        sleeps += 1;
        timers.fire_due();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

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

    // Nothing but the deadline wakes these sleeps: the port wait's timeout ends them, in
    // deadline order, and a sleep dropped first (the `select`-style loser) leaves nothing.
    #[test]
    fn sleeps_end_by_the_port_waits_timeout() {
        let start = Instant::now();
        let (order, sleeps) = block_on_port(async {
            let mut order = Vec::new();
            let mut a = pin!(crate::sleep_until(start + Duration::from_millis(60)));
            let mut b = pin!(crate::sleep_until(start + Duration::from_millis(30)));
            // Poll both until both are done, noting which finished first.
            std::future::poll_fn(|cx| {
                if !order.contains(&"a") && a.as_mut().poll(cx).is_ready() {
                    order.push("a");
                }
                if !order.contains(&"b") && b.as_mut().poll(cx).is_ready() {
                    order.push("b");
                }
                if order.len() == 2 {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            // A sleep polled once, then dropped long before its deadline.
            let mut late = Box::pin(crate::sleep_until(Instant::now() + Duration::from_secs(60)));
            let _ = std::future::poll_fn(|cx| Poll::Ready(late.as_mut().poll(cx))).await;
            drop(late);
            order
        })
        .unwrap();
        let took = start.elapsed();
        assert_eq!(order, ["b", "a"]);
        assert!(took >= Duration::from_millis(60), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(
            (2..20).contains(&sleeps),
            "one port sleep per deadline: {sleeps}"
        );
        assert_eq!(
            crate::timer::TimerList::global().next_deadline(),
            None,
            "the dropped sleep left no deadline"
        );
    }
}

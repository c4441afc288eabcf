//! A one-future executor whose waker is an event: the calling thread sleeps in
//! `WaitForMultipleObjects` on that event — and on the input of every manual-progress device
//! the future awaits ([`watch`]) — until the future's waker sets it or input arrives. That is
//! all Rust `async` needs on Windows here: the CQ notify future and the async verbs wake
//! their task from the thread that raised the interrupt or completed the command (the
//! application's own call, or the emulated device's), never from a thread of this crate, and
//! a task awaiting a manual device wakes for the datagram that the device then receives on
//! it. Timers ([`crate::sleep_until`], and a manual device's next timer) need no thread
//! either: the sleep lasts no longer than the earliest deadline on the process's
//! [`TimerList`], and the sleeps that are due are woken when it ends.

use std::cell::RefCell;
use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use windows_sys::Win32::Foundation::HANDLE;

use crate::sys::{self, Handle};
use crate::timer::TimerList;

/// Handles a wait of [`block_on_port`] sleeps on at most (`MAXIMUM_WAIT_OBJECTS`).
const MAX_HANDLES: usize = 64;

struct EventWaker {
    event: Handle,
    failed: AtomicBool,
}

impl Wake for EventWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if sys::set_event(self.event.raw()).is_err() {
            self.failed.store(true, Ordering::Release);
        }
    }
}

thread_local! {
    /// While [`block_on_port`] polls its future on this thread: the input handles the future
    /// asked to be woken for.
    static WATCHED: RefCell<Option<Vec<HANDLE>>> = const { RefCell::new(None) };
}

/// Asks the [`block_on_port`] polling the current task, if any, to sleep on `input` too (a
/// manual-progress device's input event, [`portverbs_hal::InputWait::event`]) until the next
/// poll. Returns false when no such executor polls on this thread: the task then wakes on
/// raises and timers only, and something else must drive the device (a port loop, a poll).
pub(crate) fn watch(input: HANDLE) -> bool {
    WATCHED.with(|w| match &mut *w.borrow_mut() {
        Some(list) => {
            if !list.contains(&input) && list.len() < MAX_HANDLES - 1 {
                list.push(input);
            }
            true
        }
        None => false,
    })
}

/// Runs `fut` to completion on the calling thread, sleeping between polls on the waker's
/// event and the inputs the future watches, each sleep no longer than the earliest timer
/// deadline ([`crate::sleep_until`]); the timers that are due fire when it ends. Returns how
/// many times the thread slept, with the output. (The name is the crate's first model of a
/// Windows wait, a completion port; an event serves since a wait must also cover inputs.)
///
/// # Errors
/// The event could not be created, the wait failed, or the event could not be set.
pub fn block_on_port<F: Future>(fut: F) -> io::Result<(F::Output, usize)> {
    let state = Arc::new(EventWaker {
        event: sys::create_event(false)?,
        failed: AtomicBool::new(false),
    });
    let waker = Waker::from(state.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    let mut sleeps = 0;
    let mut handles = Vec::with_capacity(MAX_HANDLES);
    loop {
        let outer = WATCHED.with(|w| w.borrow_mut().replace(Vec::new()));
        let polled = fut.as_mut().poll(&mut cx);
        let watched = WATCHED.with(|w| std::mem::replace(&mut *w.borrow_mut(), outer));
        if let Poll::Ready(out) = polled {
            return Ok((out, sleeps));
        }
        if state.failed.load(Ordering::Acquire) {
            return Err(io::Error::other(
                "the executor's wake-up event could not be set",
            ));
        }
        handles.clear();
        handles.push(state.event.raw());
        handles.extend(watched.unwrap_or_default());
        let timers = TimerList::global();
        sys::wait_any(&handles, sys::millis(timers.next_timeout()), false)?;
        sleeps += 1;
        timers.fire_due();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    // Wine 8 deviation avoided: nothing is closed to end a wait; a wake sets an event.
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

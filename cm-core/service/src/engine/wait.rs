//! The wait machinery: blocking waits (on QP1's CQ, at most [`MAX_SLEEP`] at a time),
//! async waits (QP1's CQ notification, another waiter's wake, and the next CM deadline
//! through the application's lent timer), and the wakers that let device commands and
//! progress wake async waiters.
//!
//! It must not hold the device lock while sleeping or awaiting, spawn a thread, or name a
//! runtime: the only clock an async wait has is the timer the application lends
//! (`crate::timer`).

use std::future::poll_fn;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::task::{Poll, Wake};
use std::time::{Duration, Instant};

use portverbs_hal::Device;
use portverbs_verbs::{NotifyKind, WaitError};

use super::{CmDevice, Shared, State, lock};
use crate::timer::Sleep;
use crate::{CmTimer, ServiceError};

/// The longest a blocking wait sleeps before driving the device again.
pub const MAX_SLEEP: Duration = Duration::from_millis(5);

impl<D: Device> Shared<D> {
    /// Every async waiter re-drives the device.
    fn wake_all(&self) {
        self.wake_gen.fetch_add(1, Ordering::AcqRel);
        let wakers = std::mem::take(&mut *lock(&self.wakers));
        for w in wakers {
            w.wake();
        }
    }
}

/// What one round of a wait found: the value, or the agent's next timer to sleep toward.
enum Round<T> {
    Done(T),
    Wait(Option<u64>),
}

/// The waker given to device commands the CM starts: their completion wakes the device's
/// async waiters, whose next progress polls the command again. Blocking waiters poll it
/// within [`MAX_SLEEP`].
pub(super) struct WakeWaiters<D: Device>(pub(super) Weak<Shared<D>>);

impl<D: Device> Wake for WakeWaiters<D> {
    fn wake(self: Arc<Self>) {
        if let Some(shared) = self.0.upgrade() {
            shared.wake_all();
        }
    }
}

impl<D: Device> CmDevice<D> {
    pub(crate) fn replace_timer(&self, timer: Option<Arc<dyn CmTimer>>) {
        *lock(&self.shared.timer) = timer;
        // Waits under way pick the timer up (or drop theirs) on their next round.
        self.wake_all();
    }

    /// A sleep until the agent's next deadline, when the application lent a timer.
    fn timer_sleep(&self, next: Option<u64>) -> Option<Sleep> {
        let timer = lock(&self.shared.timer).clone()?;
        Some(timer.sleep_until(self.instant_of(next?)))
    }

    pub(super) fn wake_all(&self) {
        self.shared.wake_all();
    }

    /// One round of a wait: drives the device, then asks `f`; a removed device ends the wait.
    fn round<T>(
        &self,
        f: &mut impl FnMut(&mut State<D>) -> Option<T>,
    ) -> Result<Round<T>, ServiceError> {
        self.progress()?;
        let mut st = self.state();
        if let Some(v) = f(&mut st) {
            return Ok(Round::Done(v));
        }
        if st.removed {
            return Err(ServiceError::Closed);
        }
        Ok(Round::Wait(st.agent.poll_timeout()))
    }

    /// Blocks, driving the device, until `f` finds what it waits for or `timeout` passes.
    pub(crate) fn wait_blocking<T>(
        &self,
        timeout: Option<Duration>,
        mut f: impl FnMut(&mut State<D>) -> Option<T>,
    ) -> Result<T, ServiceError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let mut req = self.shared.cq.notify(NotifyKind::Any);
            let next = match self.round(&mut f)? {
                Round::Done(v) => return Ok(v),
                Round::Wait(next) => next,
            };
            let mut sleep = MAX_SLEEP;
            if let Some(t) = next {
                let left = Duration::from_nanos(t.saturating_sub(self.now()));
                sleep = sleep.min(left);
            }
            if let Some(d) = deadline {
                let now = Instant::now();
                if now >= d {
                    return Err(ServiceError::TimedOut);
                }
                sleep = sleep.min(d - now);
            }
            match self.shared.cq.wait_notify(&mut req, Some(sleep)) {
                Ok(()) | Err(WaitError::TimedOut) | Err(WaitError::BadEvent(_)) => {}
                // Among them a context whose sinks only poll: this layer does not sleep in
                // their place (open the context with blocking sinks).
                Err(e) => return Err(ServiceError::verbs("waiting on QP1's CQ", e)),
            }
        }
    }

    /// Awaits, driving the device on every wake, until `f` finds what it waits for: QP1's CQ
    /// notification, another waiter's wake, or (with a [`CmTimer`] lent) the next CM
    /// deadline.
    pub(crate) async fn wait_async<T>(
        &self,
        mut f: impl FnMut(&mut State<D>) -> Option<T>,
    ) -> Result<T, ServiceError> {
        loop {
            let notified = self.shared.cq.notified(NotifyKind::Any);
            let gen_before = self.shared.wake_gen.load(Ordering::Acquire);
            let next = match self.round(&mut f)? {
                Round::Done(v) => return Ok(v),
                Round::Wait(next) => next,
            };
            // Every timer the agent arms comes with a MAD sent or received on QP1, whose
            // completion wakes this wait again: a deadline armed by another call is slept for
            // from that round on.
            let mut sleep = self.timer_sleep(next);
            let mut notified = pin!(notified);
            let woke = poll_fn(|cx| {
                if self.shared.wake_gen.load(Ordering::Acquire) != gen_before {
                    return Poll::Ready(Ok(()));
                }
                // The next CM timer is due: go round, and progress fires it.
                if let Some(s) = sleep.as_mut() {
                    if s.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Ok(()));
                    }
                }
                {
                    let mut w = lock(&self.shared.wakers);
                    if !w.iter().any(|x| x.will_wake(cx.waker())) {
                        w.push(cx.waker().clone());
                    }
                }
                notified.as_mut().poll(cx)
            })
            .await;
            if let Err(e) = woke {
                return Err(ServiceError::verbs("awaiting QP1's CQ", e));
            }
        }
    }
}

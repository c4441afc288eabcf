//! Timers without a thread or a kernel timer object: a list of deadlines that the waits of
//! this crate apply as their timeout. A [`sleep_until`] future puts its deadline and waker on
//! the list; [`block_on_port`](crate::block_on_port), the [`Completions`](crate::Completions)
//! waits, and the application's own port loop (with [`next_timeout`] and [`fire_due`], or
//! [`Completions::next_timeout`](crate::Completions::next_timeout) and
//! [`Completions::progress`](crate::Completions::progress)) sleep in
//! `GetQueuedCompletionStatus(Ex)` no longer than the earliest deadline, and wake the sleeps
//! whose deadline passed when they return. A port is never closed to end a wait, and no
//! `NtAssociateWaitCompletionPacket` is needed (Wine 8 has none).

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

/// A list of deadlines, each with the waker of the sleep that waits for it, earliest first.
/// The process has one ([`TimerList::global`]), which every wait of this crate applies;
/// other lists serve whoever fires them.
pub struct TimerList {
    inner: Mutex<Inner>,
}

struct Inner {
    next_id: u64,
    /// `(deadline, id)` → the waker of the sleep that registered it (ids break ties, so two
    /// sleeps with one deadline are two entries).
    entries: BTreeMap<(Instant, u64), Waker>,
}

impl fmt::Debug for TimerList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("TimerList")
            .field("armed", &inner.entries.len())
            .field("next", &inner.entries.keys().next().map(|k| k.0))
            .finish()
    }
}

impl Default for TimerList {
    fn default() -> Self {
        Self::new()
    }
}

static GLOBAL: TimerList = TimerList::new();

impl TimerList {
    /// An empty list.
    pub const fn new() -> Self {
        Self {
            inner: Mutex::new(Inner {
                next_id: 0,
                entries: BTreeMap::new(),
            }),
        }
    }

    /// The process's list: the one [`sleep_until`] registers on and the waits of this crate
    /// apply.
    pub fn global() -> &'static Self {
        &GLOBAL
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A future that completes at `deadline` (or later), once a wait on this list returned
    /// after it and fired it ([`fire_due`](Self::fire_due)).
    pub fn sleep_until(&'static self, deadline: Instant) -> SleepUntil {
        SleepUntil {
            list: self,
            deadline,
            id: None,
        }
    }

    /// The earliest deadline armed, if any.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.lock().entries.keys().next().map(|k| k.0)
    }

    /// How long a wait may sleep before the earliest deadline passes: `None` when nothing is
    /// armed (wait for ever), zero when one is due. Rounded up to whole milliseconds, the
    /// unit of a Win32 wait, so that the wait does not end just before the deadline.
    pub fn next_timeout(&self) -> Option<Duration> {
        let left = self
            .next_deadline()?
            .saturating_duration_since(Instant::now());
        let ms = left.as_nanos().div_ceil(1_000_000);
        Some(Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX)))
    }

    /// `timeout` (`None`: for ever), shortened to [`next_timeout`](Self::next_timeout).
    pub fn cap(&self, timeout: Option<Duration>) -> Option<Duration> {
        match (timeout, self.next_timeout()) {
            (Some(t), Some(n)) => Some(t.min(n)),
            (t, n) => t.or(n),
        }
    }

    /// Wakes every sleep whose deadline passed (earliest first) and takes it off the list.
    /// Returns how many were woken.
    pub fn fire_due(&self) -> usize {
        let now = Instant::now();
        let due: Vec<Waker> = {
            let mut inner = self.lock();
            let mut due = Vec::new();
            while let Some(entry) = inner.entries.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                due.push(entry.remove());
            }
            due
        };
        // Outside the lock: a waker may poll, and a poll may register again.
        let n = due.len();
        for w in due {
            w.wake();
        }
        n
    }

    fn register(&self, deadline: Instant, id: &mut Option<u64>, waker: &Waker) {
        let mut inner = self.lock();
        let id = *id.get_or_insert_with(|| {
            inner.next_id += 1;
            inner.next_id
        });
        match inner.entries.get_mut(&(deadline, id)) {
            Some(w) => w.clone_from(waker),
            None => {
                inner.entries.insert((deadline, id), waker.clone());
            }
        }
    }

    fn unregister(&self, deadline: Instant, id: u64) {
        self.lock().entries.remove(&(deadline, id));
    }
}

/// One deadline of its owner's on the process's [`TimerList`], moved as the owner's next
/// deadline moves — a manual-progress device's next timer (a retransmission, the connection
/// manager's timers): it shortens every wait that applies the list, so the loop that follows
/// the wait makes the device progress in time, and firing it wakes the waker last given.
#[derive(Debug, Default)]
pub(crate) struct Alarm {
    armed: Mutex<Option<(Instant, u64)>>,
}

impl Alarm {
    /// Arms it for `deadline` (a deadline already past makes the next wait return at once),
    /// or disarms it (`None`).
    pub(crate) fn set(&self, deadline: Option<Instant>, waker: &Waker) {
        let list = TimerList::global();
        let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((d, id)) = *armed {
            if Some(d) == deadline {
                // Fired meanwhile or not, it is (again) on the list with this waker.
                list.register(d, &mut Some(id), waker);
                return;
            }
            list.unregister(d, id);
            *armed = None;
        }
        if let Some(d) = deadline {
            let mut id = None;
            list.register(d, &mut id, waker);
            *armed = id.map(|id| (d, id));
        }
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        let armed = self.armed.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some((d, id)) = armed.take() {
            TimerList::global().unregister(d, id);
        }
    }
}

/// Sleeps until the deadline on the process's [`TimerList`]: completes once a wait of this
/// crate (or the application's port loop, with [`next_timeout`] and [`fire_due`]) returned
/// after `deadline`. This is the timer to lend the connection manager on Windows
/// (`portverbs::cm::PortTimer`).
pub fn sleep_until(deadline: Instant) -> SleepUntil {
    TimerList::global().sleep_until(deadline)
}

/// [`TimerList::next_timeout`] of the process's list: the timeout for the application's
/// `GetQueuedCompletionStatus(Ex)` ([`crate::CompletionPort::get`]).
pub fn next_timeout() -> Option<Duration> {
    TimerList::global().next_timeout()
}

/// [`TimerList::fire_due`] of the process's list: call it when a wait returns (with a packet
/// or timed out).
pub fn fire_due() -> usize {
    TimerList::global().fire_due()
}

/// The future of [`sleep_until`]. Dropping it before its deadline takes its entry off the
/// list: nothing is woken for it later.
#[must_use = "a sleep does nothing unless polled"]
pub struct SleepUntil {
    list: &'static TimerList,
    deadline: Instant,
    /// Its entry on the list, once polled.
    id: Option<u64>,
}

impl fmt::Debug for SleepUntil {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SleepUntil")
            .field("deadline", &self.deadline)
            .field("armed", &self.id.is_some())
            .finish()
    }
}

impl SleepUntil {
    /// The instant it completes at.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }
}

impl Future for SleepUntil {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if Instant::now() >= this.deadline {
            if let Some(id) = this.id.take() {
                this.list.unregister(this.deadline, id);
            }
            return Poll::Ready(());
        }
        this.list.register(this.deadline, &mut this.id, cx.waker());
        Poll::Pending
    }
}

impl Drop for SleepUntil {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            self.list.unregister(self.deadline, id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// Records the order in which sleeps were woken: each waker pushes its tag.
    struct Tagged {
        tag: usize,
        log: Arc<Mutex<Vec<usize>>>,
        wakes: AtomicUsize,
    }

    impl Wake for Tagged {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.wakes.fetch_add(1, Ordering::Relaxed);
            self.log.lock().unwrap().push(self.tag);
        }
    }

    fn private_list() -> &'static TimerList {
        Box::leak(Box::new(TimerList::new()))
    }

    fn poll_with(s: &mut SleepUntil, w: &Arc<Tagged>) -> Poll<()> {
        let waker = Waker::from(w.clone());
        Pin::new(s).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn due_sleeps_wake_earliest_first_and_a_dropped_one_never() {
        let list = private_list();
        let log = Arc::new(Mutex::new(Vec::new()));
        let base = Instant::now() + Duration::from_millis(40);
        // Registered out of order: tags 0..4 with offsets 30, 10, 20 (dropped), 0 ms.
        let offsets = [30, 10, 20, 0];
        let wakers: Vec<_> = (0..offsets.len())
            .map(|tag| {
                Arc::new(Tagged {
                    tag,
                    log: log.clone(),
                    wakes: AtomicUsize::new(0),
                })
            })
            .collect();
        let mut sleeps: Vec<_> = offsets
            .iter()
            .map(|ms| list.sleep_until(base + Duration::from_millis(*ms)))
            .collect();
        for (s, w) in sleeps.iter_mut().zip(&wakers) {
            assert!(poll_with(s, w).is_pending());
        }
        assert_eq!(list.next_deadline(), Some(base));
        assert_eq!(list.fire_due(), 0, "nothing is due yet");
        // Tag 2 goes away before its deadline.
        let dropped = sleeps.remove(2);
        drop(dropped);
        let t = list.next_timeout().unwrap();
        assert!(
            t <= Duration::from_millis(40) && t > Duration::ZERO,
            "{t:?}"
        );
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(list.fire_due(), 3);
        assert_eq!(*log.lock().unwrap(), [3, 1, 0], "earliest first");
        assert_eq!(wakers[2].wakes.load(Ordering::Relaxed), 0, "no stale wake");
        assert_eq!(list.next_deadline(), None, "the list is empty");
        for (s, w) in sleeps.iter_mut().zip([&wakers[0], &wakers[1], &wakers[3]]) {
            assert!(poll_with(s, w).is_ready());
        }
    }

    #[test]
    fn a_repolled_sleep_keeps_one_entry_and_the_newest_waker() {
        let list = private_list();
        let log = Arc::new(Mutex::new(Vec::new()));
        let mk = |tag| {
            Arc::new(Tagged {
                tag,
                log: log.clone(),
                wakes: AtomicUsize::new(0),
            })
        };
        let (old, new) = (mk(1), mk(2));
        let mut s = list.sleep_until(Instant::now() + Duration::from_millis(5));
        assert!(poll_with(&mut s, &old).is_pending());
        assert!(poll_with(&mut s, &new).is_pending());
        assert_eq!(list.lock().entries.len(), 1);
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(list.fire_due(), 1);
        assert_eq!(*log.lock().unwrap(), [2]);
        assert!(poll_with(&mut s, &new).is_ready());
    }

    #[test]
    fn cap_shortens_a_timeout_to_the_next_deadline() {
        let list = private_list();
        assert_eq!(list.cap(None), None);
        assert_eq!(
            list.cap(Some(Duration::from_secs(3))),
            Some(Duration::from_secs(3))
        );
        let w = Arc::new(Tagged {
            tag: 0,
            log: Arc::new(Mutex::new(Vec::new())),
            wakes: AtomicUsize::new(0),
        });
        let mut s = list.sleep_until(Instant::now() + Duration::from_millis(500));
        assert!(poll_with(&mut s, &w).is_pending());
        let capped = list.cap(None).unwrap();
        assert!(capped <= Duration::from_millis(500), "{capped:?}");
        assert_eq!(
            list.cap(Some(Duration::from_millis(1))),
            Some(Duration::from_millis(1))
        );
        drop(s);
        assert_eq!(list.cap(None), None, "a dropped sleep leaves no deadline");
    }
}

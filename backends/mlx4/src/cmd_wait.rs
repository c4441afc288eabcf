//! Event-mode command waits: the command EQ's interrupt sink and the wakers of the commands
//! that wait for their command-completion EQE (Linux `mlx4/cmd.c` event mode, EQE type 0x0a).
//!
//! A command posted in event mode registers its task's waker under its token *before* it
//! looks at the command EQ, so a completion that lands between the look and the `Pending`
//! still wakes it. Three things wake a waiting command, and nothing else polls it:
//!
//! * the command EQ's interrupt ([`CmdEqSink::raise`], MSI-X vector 0): every waiting command
//!   is woken — there is usually one — and the first to run drains the EQ;
//! * whoever drains the command EQ wakes the owner of each completion it took off
//!   ([`Waiters::wake`]), so a completion drained by another command's task reaches exactly
//!   the command it belongs to;
//! * its deadline: a command whose EQE never comes (a hung HCA) must still end with
//!   `Timeout`, so a timer thread, started when the first command waits and stopped with the
//!   command interface, wakes a command when its deadline passes. It sleeps on a condition
//!   variable until the earliest deadline or a new, earlier one.
//!
//! [`CmdEqSink::raise`] only takes the waiter table's lock and wakes wakers: it may be called
//! by a device model with its own locks held, also while a command task drains the EQ (arming
//! the EQ writes a doorbell), so it never touches the EQ or the command interface's locks.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::Waker;
use std::time::Instant;

use portverbs_hal::notify::InterruptSink;

/// One waiting command.
#[derive(Debug)]
struct Entry {
    waker: Waker,
    deadline: Instant,
}

/// Whether the deadline timer runs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Timer {
    #[default]
    NotStarted,
    Running,
    /// The thread could not be spawned: waiting commands must look for themselves.
    Failed,
}

#[derive(Debug, Default)]
struct State {
    /// By token.
    entries: HashMap<u16, Entry>,
    timer: Timer,
    stop: bool,
}

/// The commands waiting for their completion EQE, and their deadline timer.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    state: Mutex<State>,
    /// Tells the timer thread about an earlier deadline or the stop.
    changed: Condvar,
}

impl Waiters {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the waker of the command with `token`, to be woken by its completion EQE or
    /// at `deadline`. False when no deadline timer can be had (the thread could not be
    /// spawned): the caller must then wake itself to look again.
    pub(crate) fn register(self: &Arc<Self>, token: u16, waker: &Waker, deadline: Instant) -> bool {
        let mut s = self.lock();
        if s.timer == Timer::NotStarted {
            let me = self.clone();
            s.timer = match std::thread::Builder::new()
                .name("mlx4-cmd-timer".into())
                .spawn(move || me.run_timer())
            {
                Ok(_) => Timer::Running,
                Err(e) => {
                    tracing::warn!(%e, "no command timer thread; event-mode commands poll");
                    Timer::Failed
                }
            };
        }
        if s.timer == Timer::Failed {
            return false;
        }
        let earliest = s.entries.values().map(|e| e.deadline).min();
        match s.entries.get_mut(&token) {
            Some(e) if e.waker.will_wake(waker) => e.deadline = deadline,
            _ => {
                s.entries.insert(
                    token,
                    Entry {
                        waker: waker.clone(),
                        deadline,
                    },
                );
            }
        }
        if earliest.is_none_or(|t| deadline < t) {
            self.changed.notify_one();
        }
        true
    }

    /// The command with `token` no longer waits (it completed, failed or was dropped).
    pub(crate) fn forget(&self, token: u16) {
        self.lock().entries.remove(&token);
    }

    /// Wakes the command with `token` (its completion was drained by someone else).
    pub(crate) fn wake(&self, token: u16) {
        let entry = self.lock().entries.remove(&token);
        if let Some(e) = entry {
            e.waker.wake();
        }
    }

    /// Wakes every waiting command (the command EQ's interrupt).
    pub(crate) fn wake_all(&self) {
        let entries = std::mem::take(&mut self.lock().entries);
        for e in entries.into_values() {
            e.waker.wake();
        }
    }

    /// Stops the timer thread (the command interface is gone).
    pub(crate) fn stop(&self) {
        self.lock().stop = true;
        self.changed.notify_all();
    }

    /// How many commands wait (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().entries.len()
    }

    /// The timer thread: wakes each command whose deadline passed, then sleeps until the
    /// earliest deadline left (or until told about an earlier one).
    fn run_timer(self: Arc<Self>) {
        let mut s = self.lock();
        loop {
            if s.stop {
                return;
            }
            let now = Instant::now();
            let expired: Vec<u16> = s
                .entries
                .iter()
                .filter(|(_, e)| e.deadline <= now)
                .map(|(t, _)| *t)
                .collect();
            if !expired.is_empty() {
                let wakers: Vec<Waker> = expired
                    .iter()
                    .filter_map(|t| s.entries.remove(t))
                    .map(|e| e.waker)
                    .collect();
                drop(s);
                for w in wakers {
                    w.wake();
                }
                s = self.lock();
                continue;
            }
            s = match s.entries.values().map(|e| e.deadline).min() {
                None => self.changed.wait(s).unwrap_or_else(|e| e.into_inner()),
                Some(t) => {
                    self.changed
                        .wait_timeout(s, t.saturating_duration_since(now))
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }
}

/// The command EQ's interrupt sink: a raise wakes the waiting commands.
#[derive(Debug)]
pub(crate) struct CmdEqSink(pub(crate) Arc<Waiters>);

impl InterruptSink for CmdEqSink {
    fn raise(&self) {
        self.0.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::time::Duration;

    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counted() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count::default());
        (c.clone(), Waker::from(c))
    }

    #[test]
    fn a_raise_wakes_every_waiter_once_and_forgets_them() {
        let w = Waiters::new();
        let far = Instant::now() + Duration::from_secs(60);
        let (a, wa) = counted();
        let (b, wb) = counted();
        assert!(w.register(1, &wa, far));
        assert!(w.register(1, &wa, far), "re-registering keeps one entry");
        assert!(w.register(2, &wb, far));
        assert_eq!(w.len(), 2);
        CmdEqSink(w.clone()).raise();
        assert_eq!(a.0.load(Ordering::SeqCst), 1);
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
        assert_eq!(w.len(), 0);
        w.stop();
    }

    #[test]
    fn a_drained_completion_wakes_exactly_its_command() {
        let w = Waiters::new();
        let far = Instant::now() + Duration::from_secs(60);
        let (a, wa) = counted();
        let (b, wb) = counted();
        w.register(1, &wa, far);
        w.register(2, &wb, far);
        w.wake(2);
        assert_eq!(a.0.load(Ordering::SeqCst), 0);
        assert_eq!(b.0.load(Ordering::SeqCst), 1);
        w.forget(1);
        assert_eq!(w.len(), 0);
        w.stop();
    }

    #[test]
    fn the_timer_wakes_a_command_at_its_deadline() {
        let w = Waiters::new();
        let (a, wa) = counted();
        let (b, wb) = counted();
        let start = Instant::now();
        w.register(1, &wb, start + Duration::from_secs(60));
        w.register(2, &wa, start + Duration::from_millis(30));
        let limit = start + Duration::from_secs(10);
        while a.0.load(Ordering::SeqCst) == 0 && Instant::now() < limit {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(a.0.load(Ordering::SeqCst), 1, "woken at its deadline");
        assert!(start.elapsed() >= Duration::from_millis(30));
        assert_eq!(
            b.0.load(Ordering::SeqCst),
            0,
            "the later deadline still waits"
        );
        w.stop();
    }
}

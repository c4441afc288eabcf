//! Timers as data: a heap of deadlines with lazy cancellation (each QP keeps a generation number
//! per timer kind; a fired entry whose generation is stale is ignored). The engine reports its
//! earliest deadline through `Engine::poll_timeout` and is driven by `Engine::handle_timeout`,
//! so the same code runs on virtual time (deterministic simulation) and on the real clock.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// What a timer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TimerKind {
    /// Local ACK timeout: retransmit from the oldest unacknowledged PSN.
    Retransmit,
    /// RNR back-off: resume sending after an RNR NAK.
    Rnr,
    /// Probe timeout: no ACK for a few round trips of the path; go back N early
    /// (`congestion`), without charging a retry.
    Probe,
}

/// A per-QP timer whose deadline moves often (every ACK) but fires rarely: moving it later
/// costs no heap operation. The queued heap entry, when it comes due before the deadline,
/// queues itself again for it ([`Lazy::due`]); only an earlier deadline pushes a new entry.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Lazy {
    pub(crate) armed: bool,
    pub(crate) deadline: u64,
    queued: Option<u64>,
    generation: u64,
}

impl Lazy {
    /// Arms (or moves) the timer to `at`.
    pub(crate) fn arm(
        &mut self,
        heap: &mut TimerHeap,
        generation: &mut u64,
        qpn: u32,
        kind: TimerKind,
        at: u64,
    ) {
        self.deadline = at;
        self.armed = true;
        if self.queued.is_none_or(|q| q > at) {
            *generation += 1;
            self.generation = *generation;
            heap.push(TimerEntry {
                at,
                qpn,
                kind,
                generation: self.generation,
            });
            self.queued = Some(at);
        }
    }

    /// Whether heap entry `e` (of this timer's kind) fires it now: false for a stale entry,
    /// a disarmed timer, or a deadline moved later (the entry is queued again for it).
    pub(crate) fn due(
        &mut self,
        heap: &mut TimerHeap,
        generation: &mut u64,
        e: &TimerEntry,
        now: u64,
    ) -> bool {
        if e.generation != self.generation {
            return false;
        }
        self.queued = None;
        if !self.armed {
            return false;
        }
        if self.deadline > now {
            let at = self.deadline;
            self.arm(heap, generation, e.qpn, e.kind, at);
            return false;
        }
        self.armed = false;
        true
    }
}

/// One armed timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimerEntry {
    /// Deadline in nanoseconds of engine time.
    pub at: u64,
    /// QP it belongs to.
    pub qpn: u32,
    /// Kind.
    pub kind: TimerKind,
    /// Generation when armed.
    pub generation: u64,
}

/// The timer heap of one engine.
#[derive(Debug, Default)]
pub struct TimerHeap {
    heap: BinaryHeap<Reverse<TimerEntry>>,
}

impl TimerHeap {
    /// Arms a timer.
    pub fn push(&mut self, entry: TimerEntry) {
        self.heap.push(Reverse(entry));
    }

    /// Earliest deadline, including stale entries (harmless: firing a stale one is a no-op).
    pub fn next_deadline(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse(e)| e.at)
    }

    /// Removes and returns the earliest entry if it is due at `now`.
    pub fn pop_due(&mut self, now: u64) -> Option<TimerEntry> {
        if self.heap.peek().is_some_and(|Reverse(e)| e.at <= now) {
            self.heap.pop().map(|Reverse(e)| e)
        } else {
            None
        }
    }

    /// Entries queued, stale ones included.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// True when no entry is queued.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Drops every entry of a QP (destroy).
    pub fn forget_qp(&mut self, qpn: u32) {
        self.heap.retain(|Reverse(e)| e.qpn != qpn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_deadline_order_only_when_due() {
        let mut h = TimerHeap::default();
        for (at, qpn) in [(30, 1), (10, 2), (20, 3)] {
            h.push(TimerEntry {
                at,
                qpn,
                kind: TimerKind::Retransmit,
                generation: 0,
            });
        }
        assert_eq!(h.next_deadline(), Some(10));
        assert!(h.pop_due(9).is_none());
        assert_eq!(h.pop_due(25).unwrap().qpn, 2);
        assert_eq!(h.pop_due(25).unwrap().qpn, 3);
        assert!(h.pop_due(25).is_none());
        h.forget_qp(1);
        assert_eq!(h.next_deadline(), None);
    }
}

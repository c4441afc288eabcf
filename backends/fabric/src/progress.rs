//! Progress: the agents a fabric runs for the layers above its devices, the I/O a port
//! lends the fabric to sleep on, and the inline driving of a fabric in manual mode.
//!
//! * **Agents** ([`portverbs_hal::ProgressAgent`], attached with [`Fabric::attach_agent`]):
//!   run by whoever progresses the fabric — the engine thread of a free-running fabric, the
//!   callers' dispatches on a manual one — after rounds with work (at most every
//!   200 µs while work goes on, and once when it stops) and when an agent's deadline
//!   passes; always without the fabric's lock, one run at a time (a run that starts while
//!   another is under way, on another thread or inside an agent, skips the agents).
//! * **Port I/O** ([`PortIo`], lent with [`Fabric::set_port_io`]): a node whose packets arrive
//!   on a socket lets the engine thread sleep on that socket and its own wake-up together,
//!   and manual waits sleep on it ([`Fabric::wait_source`]).
//! * **Inline driving** (manual mode): a kick, a device command and a dispatch each step the
//!   fabric on the caller's thread, at the real clock, until it is idle or a budget of
//!   steps is spent. Only one thread steps at a time (the fabric's lock, taken with
//!   `try_lock`); a thread that finds it taken leaves its kick to the holder, which looks for
//!   kicks again after it unlocks (the fences make that look see every kick whose sender
//!   saw the lock taken), so no kick is lost.

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Mutex, TryLockError, Weak};
use std::time::{Duration, Instant};

use portverbs_hal::{ProgressAgent, WaitSource};

use crate::{Fabric, Mode, Shared};

/// While work goes on, agents run at most this often (and once more when it stops).
pub(crate) const AGENT_EVERY: Duration = Duration::from_micros(200);

/// Most steps one inline drive takes before it returns (the rest is the next call's).
const INLINE_STEPS: u32 = 64;

/// What a node with I/O of its own (a UDP port's socket) lends its fabric: a sleep on that
/// I/O and a wake-up together, for the engine thread (auto), and the source manual waits
/// sleep on. Implemented by the port; the fabric never touches the socket.
pub trait PortIo: Send + Sync + Debug {
    /// Sleeps until input may be ready, [`PortIo::wake`] is called (before or during the
    /// sleep), or `timeout` passes. Returns whether input may be ready.
    fn wait(&self, timeout: Duration) -> bool;

    /// Ends a sleep in [`PortIo::wait`], or makes the next one return at once. Cheap; called
    /// from any thread.
    fn wake(&self);

    /// Whether input may be ready now, without sleeping (the engine's spin looks at it).
    fn ready(&self) -> bool;

    /// What the input arrives on, for the waits of a manual fabric's users.
    fn wait_source(&self) -> WaitSource<'_>;
}

/// The agents attached to a fabric, and when they last ran.
#[derive(Default)]
pub(crate) struct Agents {
    list: Mutex<Vec<Weak<dyn ProgressAgent>>>,
    count: AtomicUsize,
    /// One run at a time; also the re-entrancy guard.
    running: AtomicBool,
    /// Work happened since the last run.
    dirty: AtomicBool,
    /// Fabric time (ns) of the last run.
    last_run: AtomicU64,
    /// Fabric time (ns) the agents next want to run; `u64::MAX`: never.
    deadline: AtomicU64,
}

impl Debug for Agents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agents")
            .field("count", &self.count.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Agents {
    pub(crate) fn new() -> Self {
        let a = Self::default();
        a.deadline.store(u64::MAX, Ordering::Relaxed);
        a
    }

    fn attach(&self, agent: Weak<dyn ProgressAgent>) {
        let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
        list.retain(|a| a.strong_count() > 0);
        list.push(agent);
        self.count.store(list.len(), Ordering::Release);
        // Run it at the next opportunity: it may have work already.
        self.deadline.store(0, Ordering::Release);
    }

    /// Whether any agent is attached (no clock is read for them otherwise).
    #[inline]
    pub(crate) fn attached(&self) -> bool {
        self.count.load(Ordering::Acquire) != 0
    }

    /// When the agents next want to run (fabric ns), if any are attached.
    pub(crate) fn deadline(&self) -> Option<u64> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        let d = self.deadline.load(Ordering::Acquire);
        (d != u64::MAX).then_some(d)
    }

    /// Work happened after the agents' turn in a round (the flush that ends a manual dispatch
    /// stepped the fabric and received, say, a CM request for QP1): the agents run at the next
    /// round that finds nothing to do (or [`AGENT_EVERY`] on), and the caller's next deadline
    /// is `now`, so a wait goes round once more before it sleeps. Returns that deadline, or
    /// `None` without agents.
    pub(crate) fn work_after_turn(&self, now: u64) -> Option<u64> {
        if !self.attached() {
            return None;
        }
        self.dirty.store(true, Ordering::Release);
        Some(now)
    }

    /// After a round of progress that did work (`did`) or not, at fabric time `now`: runs the
    /// agents if they are due (see the module docs). Returns their next deadline.
    pub(crate) fn after_round(&self, shared: &Shared, did: bool, now: u64) -> Option<u64> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        if did {
            self.dirty.store(true, Ordering::Release);
        }
        let deadline = self.deadline.load(Ordering::Acquire);
        let dirty = self.dirty.load(Ordering::Acquire);
        let since = now.saturating_sub(self.last_run.load(Ordering::Acquire));
        let due = deadline <= now || (dirty && (!did || since >= AGENT_EVERY.as_nanos() as u64));
        if due {
            self.run(shared, now);
        }
        self.deadline()
    }

    /// Runs every live agent once, outside the fabric's lock; skipped when a run is under way.
    fn run(&self, shared: &Shared, now: u64) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        self.dirty.store(false, Ordering::Release);
        self.last_run.store(now, Ordering::Release);
        let agents: Vec<_> = {
            let mut list = self.list.lock().unwrap_or_else(|e| e.into_inner());
            list.retain(|a| a.strong_count() > 0);
            self.count.store(list.len(), Ordering::Release);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        let instant = shared.epoch + Duration::from_nanos(now);
        let mut next = u64::MAX;
        for a in &agents {
            if let Some(t) = a.run(instant) {
                let ns = t.saturating_duration_since(shared.epoch).as_nanos();
                next = next.min(u64::try_from(ns).unwrap_or(u64::MAX - 1));
            }
        }
        self.deadline.store(next, Ordering::Release);
        // The agents go (an agent's last handle may be the one upgraded here) before the
        // guard is released.
        drop(agents);
        self.running.store(false, Ordering::Release);
    }
}

impl Shared {
    /// Work waits to be stepped: a kick, a kick overflow, or a flush a dispatch asked for.
    pub(crate) fn pending(&self) -> bool {
        !self.kicks_rx.is_empty()
            || self.overflow.load(Ordering::Acquire)
            || self.flush_wanted.load(Ordering::Acquire)
    }

    /// Manual mode: steps the fabric on this thread at the real clock until it is idle (or
    /// [`INLINE_STEPS`] are spent), unless another thread is stepping it (then that thread
    /// takes the work: it looks for kicks again after unlocking). With `flush`, or when a
    /// dispatch asked for it meanwhile, the nodes then send what they batched
    /// ([`crate::Node::flush`]); a kick does too unless they sent less than 20 µs ago (a
    /// burst of posts then leaves with the next dispatch, in one batch). Returns
    /// whether anything was done, and, with `flush` (a dispatch, which sleeps until it), the
    /// next deadline of the fabric's nodes — a millisecond from now when another thread held
    /// the lock, so that a waiter looks again soon.
    pub(crate) fn drive_inline(&self, flush: bool) -> (bool, Option<u64>) {
        if flush {
            self.flush_wanted.store(true, Ordering::Release);
        }
        let mut did_any = false;
        loop {
            fence(Ordering::SeqCst);
            let mut sim = match self.sim.try_lock() {
                Ok(s) => s,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) => {
                    let soon = self.real_now() + BUSY_LOOK.as_nanos() as u64;
                    return (did_any, flush.then_some(soon));
                }
            };
            let mut steps = 0;
            while steps < INLINE_STEPS {
                sim.now = self.real_now();
                if !sim.step(&self.kicks_rx, &self.overflow) {
                    break;
                }
                did_any = true;
                steps += 1;
            }
            // A kick sends at once unless the wire was flushed a moment ago: then what it
            // produced waits for the next dispatch (or a kick past the gap), so that a burst
            // of posts between two polls leaves in one batch.
            let gap = sim
                .now
                .saturating_sub(self.last_flush.load(Ordering::Acquire));
            if self.flush_wanted.swap(false, Ordering::AcqRel) || gap >= KICK_FLUSH_GAP_NS {
                sim.flush();
                self.last_flush.store(sim.now, Ordering::Release);
            }
            let next = if flush { sim.next_deadline() } else { None };
            drop(sim);
            // A kick whose sender found the lock taken is seen here.
            fence(Ordering::SeqCst);
            if steps >= INLINE_STEPS || !self.pending() {
                return (did_any, next);
            }
        }
    }
}

/// A kick flushes the nodes' wires when they were last flushed at least this long ago (ns).
const KICK_FLUSH_GAP_NS: u64 = 20_000;

/// How soon a dispatch that found another thread stepping the fabric asks to be called again.
const BUSY_LOOK: Duration = Duration::from_millis(1);

impl Fabric {
    /// Runs `agent` whenever this fabric progresses (see the module docs): on the engine
    /// thread of a free-running fabric, in the callers' dispatches of a manual one. The
    /// fabric holds it weakly: dropping it detaches it. False on a stepped fabric, which
    /// progresses only when a test steps it.
    pub fn attach_agent(&self, agent: Weak<dyn ProgressAgent>) -> bool {
        if self.shared.mode == Mode::Stepped {
            return false;
        }
        self.shared.agents.attach(agent);
        if let Some(io) = self.shared.wake.io.get() {
            io.wake();
        }
        if let Some(t) = self.shared.wake.thread.get() {
            t.unpark();
        }
        true
    }

    /// Lends the fabric a port's I/O (see [`PortIo`]); the first one lent stays.
    pub fn set_port_io(&self, io: std::sync::Arc<dyn PortIo>) {
        if self.shared.wake.io.set(io).is_ok() {
            // A sleeping engine thread goes back to sleep on the port.
            if let Some(t) = self.shared.wake.thread.get() {
                t.unpark();
            }
        }
    }

    /// What a manual fabric's users sleep on besides their event queues: the input of its
    /// port, when one lent its I/O; [`WaitSource::none`] otherwise and in the other modes.
    pub fn wait_source(&self) -> WaitSource<'_> {
        match (self.shared.mode, self.shared.wake.io.get()) {
            (Mode::Manual, Some(io)) => io.wait_source(),
            _ => WaitSource::none(),
        }
    }

    /// Sends what the nodes owe the wire now: steps the fabric on the calling thread, at the
    /// real clock, until no work is left that is due (at most as many steps as a dispatch
    /// takes), then flushes every node's batched packets. For a device going away: the ACK a responder
    /// coalesced behind its last burst, and packets a manual fabric batched for the next
    /// dispatch, would otherwise never leave if the process ended next (a peer that waits
    /// for them retries until it gives up). Waits for an engine thread's round in progress.
    /// Nothing on a stepped fabric, whose clock only a test moves.
    pub fn flush_owed(&self) {
        let shared = &self.shared;
        if shared.mode == Mode::Stepped {
            return;
        }
        let mut sim = shared.lock();
        for _ in 0..INLINE_STEPS {
            sim.now = shared.real_now();
            if !sim.step(&shared.kicks_rx, &shared.overflow) {
                break;
            }
        }
        sim.flush();
        shared.last_flush.store(sim.now, Ordering::Release);
    }

    /// Manual mode: does on the calling thread what is due — the nodes' work and input,
    /// packet delivery, timers, and (unless a run is already under way) the attached agents
    /// — and returns when the fabric next has timed work. Other modes: nothing, `None`.
    pub fn dispatch(&self) -> Option<Instant> {
        let shared = &self.shared;
        if shared.mode != Mode::Manual {
            return None;
        }
        let agents = if shared.agents.attached() {
            let (did, _) = shared.drive_inline(false);
            shared.agents.after_round(shared, did, shared.real_now())
        } else {
            None
        };
        // What the agents' calls (sends, commands) left is stepped with the flush that sends
        // everything batched since the last dispatch. What that step received is the agents'
        // business too: without this a CM request delivered here would wait in QP1's queue
        // until some later round did work (a peer's retransmission, seconds on).
        let (flushed, next) = shared.drive_inline(true);
        let soon = if flushed {
            shared.agents.work_after_turn(shared.real_now())
        } else {
            None
        };
        [next, agents, soon]
            .into_iter()
            .flatten()
            .min()
            .map(|ns| shared.epoch + Duration::from_nanos(ns))
    }
}

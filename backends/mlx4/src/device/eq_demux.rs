//! Event queues as Linux's `mlx4_core` shares them (`mlx4/eq.c`, `mlx4_assign_eq`): the device
//! has one asynchronous EQ and a fixed pool of completion EQs, made once at open, each on an
//! MSI-X vector of its own. The event queues the HAL hands out ([`Device::create_eq`]) are
//! software queues on top: a completion one is bound to one of the pool's EQs (by its
//! completion vector, or round robin for a completion channel), an asynchronous one to the
//! asynchronous EQ. Whoever processes a virtual queue drains its hardware EQ and sorts what it
//! finds: a completion EQE (a CQ number) goes to the queue of the CQ's owner, any other event
//! (QP, CQ error, SRQ, port, fatal) to every asynchronous queue — each context keeps those of
//! its own objects. The number of contexts is then bounded by memory, not by vectors.
//!
//! Interrupts: each pool EQ's vector ends in a fan-out sink that raises the sink of every
//! virtual queue on that EQ (cheap, lock-free of the device; a raise may be spurious). A queue
//! that sorts an event into another queue raises that queue's sink, so an event drained by one
//! context still wakes the context that waits for it. How the vector reaches the fan-out
//! depends on the function:
//!
//! * one that calls [`InterruptSink::raise`] itself (the emulated HCA) is routed the fan-out
//!   sink directly;
//! * one whose interrupts reach only eventfds (a real function under VFIO: the kernel's MSI-X
//!   handler signals the eventfd, no code of ours runs) is routed an eventfd per vector, owned
//!   by the driver, and one thread per device ([`super::eq_waiter`]) sleeps in epoll over
//!   those eventfds and runs the fan-out on each wake-up. The thread starts with the first
//!   virtual queue whose sink has an eventfd (a polling application never gets one) and is
//!   joined when the device closes.
//!
//! Both paths share everything above the routing, so a VFIO function too serves as many
//! contexts and completion channels as memory allows, not one per MSI-X vector.
//!
//! [`Device::create_eq`]: portverbs_hal::Device::create_eq

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use portverbs_hal::device::EqKind;
use portverbs_hal::error::{CommandError, EqeError};
use portverbs_hal::event::DeviceEvent;
use portverbs_hal::notify::InterruptSink;
use portverbs_hal::queue::EventQueue;

use crate::alloc::Numbers;
use crate::queues::eq::Mlx4Eq;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Most virtual event queues a device hands out (numbers only; each costs a little memory).
const MAX_VIRTUAL_EQS: u32 = 1 << 16;

/// One hardware EQ of the device's pool.
#[derive(Debug)]
pub(crate) struct HwEq {
    pub(crate) eqn: u32,
    pub(crate) vector: u32,
    ring: Mutex<Mlx4Eq>,
    /// The sinks of the virtual queues on this EQ, by virtual EQ number.
    sinks: Mutex<Vec<(u32, Arc<dyn InterruptSink>)>>,
}

impl HwEq {
    pub(crate) fn new(eq: Mlx4Eq, vector: u32) -> Arc<Self> {
        Arc::new(Self {
            eqn: eq.eqn,
            vector,
            ring: Mutex::new(eq),
            sinks: Mutex::new(Vec::new()),
        })
    }

    /// The sink to route this EQ's vector to.
    pub(crate) fn fan_out(self: &Arc<Self>) -> Arc<dyn InterruptSink> {
        Arc::new(FanOut(Arc::downgrade(self)))
    }
}

/// Raises every virtual queue's sink of one hardware EQ.
#[derive(Debug)]
struct FanOut(Weak<HwEq>);

impl InterruptSink for FanOut {
    fn raise(&self) {
        if let Some(hw) = self.0.upgrade() {
            for (_, s) in lock(&hw.sinks).iter() {
                s.raise();
            }
        }
    }
}

#[derive(Debug)]
struct Veq {
    /// The hardware EQ it is on.
    hw: Arc<HwEq>,
    /// It receives the asynchronous events.
    is_async: bool,
    events: VecDeque<DeviceEvent>,
    /// Unread events kept at most (its requested entries); older ones are dropped, as an
    /// overrun hardware EQ would.
    cap: usize,
    sink: Arc<dyn InterruptSink>,
}

#[derive(Debug)]
struct State {
    numbers: Numbers,
    veqs: HashMap<u32, Veq>,
    /// The virtual queue each CQ reports to.
    cq_owner: HashMap<u32, u32>,
    /// Next pool EQ for a completion channel.
    next_comp: usize,
}

/// The device's EQ pool and the virtual queues on it.
#[derive(Debug)]
pub(crate) struct Demux {
    pub(crate) async_eq: Arc<HwEq>,
    /// Never empty.
    pub(crate) comp: Vec<Arc<HwEq>>,
    state: Mutex<State>,
}

impl Demux {
    pub(crate) fn new(async_eq: Arc<HwEq>, comp: Vec<Arc<HwEq>>) -> Arc<Self> {
        debug_assert!(!comp.is_empty());
        Arc::new(Self {
            async_eq,
            comp,
            state: Mutex::new(State {
                numbers: Numbers::new(1, MAX_VIRTUAL_EQS),
                veqs: HashMap::new(),
                cq_owner: HashMap::new(),
                next_comp: 0,
            }),
        })
    }

    /// Every hardware EQ of the pool.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Arc<HwEq>> {
        std::iter::once(&self.async_eq).chain(&self.comp)
    }

    /// A new virtual queue. A completion channel (vector 0, as `verbs-core` makes them) takes
    /// the pool's EQs in turn; a completion vector `v` is the pool's EQ `v mod len`.
    pub(crate) fn create(
        self: &Arc<Self>,
        entries: u32,
        kind: EqKind,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Box<dyn EventQueue>, CommandError> {
        let hw = match kind {
            EqKind::Async => self.async_eq.clone(),
            EqKind::Completion { vector } => {
                let mut st = lock(&self.state);
                let i = if vector == 0 {
                    st.next_comp = (st.next_comp + 1) % self.comp.len();
                    st.next_comp
                } else {
                    vector as usize % self.comp.len()
                };
                self.comp[i].clone()
            }
        };
        self.add(hw, kind == EqKind::Async, entries, sink)
    }

    fn add(
        self: &Arc<Self>,
        hw: Arc<HwEq>,
        is_async: bool,
        entries: u32,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Box<dyn EventQueue>, CommandError> {
        // What the EQ holds happened before this queue existed: sort it to the others first
        // (a context opened after a port came up does not hear of it).
        if let Err(e) = self.pump(&hw, 0) {
            tracing::warn!(eqn = hw.eqn, error = %e, "malformed event skipped");
        }
        let mut st = lock(&self.state);
        let veqn = st.numbers.alloc().ok_or(CommandError::ResourceExhausted {
            resource: "event queues",
        })?;
        st.veqs.insert(
            veqn,
            Veq {
                hw: hw.clone(),
                is_async,
                events: VecDeque::new(),
                cap: entries.max(1) as usize,
                sink: sink.clone(),
            },
        );
        drop(st);
        lock(&hw.sinks).push((veqn, sink));
        // The HAL's queues start armed.
        lock(&hw.ring).arm();
        Ok(Box::new(VirtualEq {
            veqn,
            demux: self.clone(),
        }))
    }

    /// Forgets virtual queue `veqn` (its hardware EQ stays in the pool).
    pub(crate) fn destroy(&self, veqn: u32) -> Result<(), CommandError> {
        let mut st = lock(&self.state);
        let Some(v) = st.veqs.remove(&veqn) else {
            return Err(CommandError::NoSuchObject {
                object: "EQ",
                number: veqn,
            });
        };
        st.numbers.free(veqn);
        st.cq_owner.retain(|_, o| *o != veqn);
        drop(st);
        lock(&v.hw.sinks).retain(|(n, _)| *n != veqn);
        Ok(())
    }

    /// Live virtual queues.
    pub(crate) fn count(&self) -> usize {
        lock(&self.state).veqs.len()
    }

    /// The hardware EQ number a CQ on virtual queue `veqn` reports to.
    pub(crate) fn hw_eqn(&self, veqn: u32) -> Option<u32> {
        Some(lock(&self.state).veqs.get(&veqn)?.hw.eqn)
    }

    pub(crate) fn bind_cq(&self, cqn: u32, veqn: u32) {
        lock(&self.state).cq_owner.insert(cqn, veqn);
    }

    pub(crate) fn unbind_cq(&self, cqn: u32) {
        lock(&self.state).cq_owner.remove(&cqn);
    }

    /// Drains the hardware EQ of `veqn` into the virtual queues, then takes `veqn`'s oldest.
    fn poll(&self, veqn: u32) -> Result<Option<DeviceEvent>, EqeError> {
        let Some(hw) = lock(&self.state).veqs.get(&veqn).map(|v| v.hw.clone()) else {
            return Ok(None);
        };
        let r = self.pump(&hw, veqn);
        let ev = lock(&self.state)
            .veqs
            .get_mut(&veqn)
            .and_then(|v| v.events.pop_front());
        match (ev, r) {
            (Some(ev), _) => Ok(Some(ev)),
            (None, r) => r.map(|()| None),
        }
    }

    /// Drains hardware EQ `on`, sorting each event into its virtual queues and raising those
    /// other than `me`.
    fn pump(&self, hw: &HwEq, me: u32) -> Result<(), EqeError> {
        let mut wake: Vec<Arc<dyn InterruptSink>> = Vec::new();
        let mut ring = lock(&hw.ring);
        let mut n = 0u32;
        let r = loop {
            match ring.poll_one() {
                Ok(Some(ev)) => {
                    n += 1;
                    self.route(ev, me, &mut wake);
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        if n > 0 {
            ring.publish_ci();
        }
        drop(ring);
        for s in wake {
            s.raise();
        }
        r
    }

    fn route(&self, ev: DeviceEvent, me: u32, wake: &mut Vec<Arc<dyn InterruptSink>>) {
        let mut st = lock(&self.state);
        let mut push = |veqn: u32, v: &mut Veq, ev: DeviceEvent| {
            if v.events.len() >= v.cap {
                v.events.pop_front();
                tracing::warn!(eqn = veqn, "event queue full: oldest event dropped");
            }
            v.events.push_back(ev);
            if veqn != me && !wake.iter().any(|s| Arc::ptr_eq(s, &v.sink)) {
                wake.push(v.sink.clone());
            }
        };
        match ev {
            DeviceEvent::Completion { cqn } => {
                let Some(&owner) = st.cq_owner.get(&cqn) else {
                    tracing::debug!(cqn, "completion event of a CQ no queue owns");
                    return;
                };
                if let Some(v) = st.veqs.get_mut(&owner) {
                    push(owner, v, ev);
                }
            }
            DeviceEvent::CommandDone { token, .. } => {
                tracing::debug!(token, "command completion on a shared EQ");
            }
            // Affiliated and unaffiliated events: every context's asynchronous queue; the
            // context keeps those of objects it owns.
            ev => {
                for (&veqn, v) in st.veqs.iter_mut().filter(|(_, v)| v.is_async) {
                    push(veqn, v, ev);
                }
            }
        }
    }

    fn arm(&self, veqn: u32) {
        let Some((hw, pending)) = lock(&self.state).veqs.get(&veqn).map(|v| {
            (
                v.hw.clone(),
                v.events.front().is_some().then(|| v.sink.clone()),
            )
        }) else {
            return;
        };
        lock(&hw.ring).arm();
        // Like an EQ armed with entries beyond its consumer index: interrupt at once.
        if let Some(sink) = pending {
            sink.raise();
        }
    }
}

/// The event queue the HAL hands out: a software queue on one of the pool's EQs.
#[derive(Debug)]
struct VirtualEq {
    veqn: u32,
    demux: Arc<Demux>,
}

impl EventQueue for VirtualEq {
    fn eqn(&self) -> u32 {
        self.veqn
    }

    fn poll_one(&mut self) -> Result<Option<DeviceEvent>, EqeError> {
        self.demux.poll(self.veqn)
    }

    fn publish_ci(&mut self) {
        // The drain publishes the hardware EQ's index itself.
    }

    fn arm(&mut self) {
        self.demux.arm(self.veqn);
    }
}

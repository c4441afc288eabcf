//! # Portverbs in-process fabric
//!
//! The in-process network: any number of devices and ports, addressed RoCEv2-style by GIDs
//! made from IP addresses, joined by links with configurable delay and faults. Every device on
//! it is a [`Node`] — the soft device (`portverbs-soft`) and the emulated mlx4 HCA
//! (`portverbs-mlx4-model`) implement that one trait and attach with [`Fabric::attach`]; they
//! share the transport engine (`portverbs-transport`), the clock and the faults, and neither
//! knows the other. A node reaches its own state again through its typed [`NodeHandle`].
//! What a link does to a packet is decided in one place, [`LinkFaults::decide`], which the
//! UDP port (`portverbs-udp`, a node of this fabric) applies to what it sends too.
//! Both are an [`EngineNode`]: the engine stepped one way, around each device's own
//! [`DeviceSide`] (its queue formats and what its kicks mean).
//!
//! Three ways to run it:
//! * **free-running** ([`Mode::Threaded`], its devices' auto progress): one engine thread
//!   emulates all the hardware, woken by doorbells, timers and (when a port lent it
//!   [`PortIo`]) the port's socket, on the real clock — what applications and benchmarks
//!   use;
//! * **manual** ([`Mode::Manual`], its devices' manual progress): no thread; on the real
//!   clock, its users' calls drive it — a doorbell steps it on the ringing thread, and
//!   [`Fabric::dispatch`] (which the devices' polls and waits call) steps it, fires its timers
//!   and runs the agents;
//! * **stepped** ([`Mode::Stepped`]): no thread at all; the caller drives it with
//!   [`Fabric::step`], [`Fabric::run_until_idle`] or [`Fabric::run_for`] on *virtual* time, with
//!   seeded loss, duplication, reordering, corruption and delay — what tests use, reproducible
//!   from the seed.
//!
//! Bottleneck ([`Bottleneck`], [`FabricConfig::bottleneck`], [`Fabric::set_bottleneck`]): an
//! output queue of bounded size in front of every destination port, drained at a fixed bit
//! rate, that drops what does not fit and may CE-mark ECN-capable packets by its depth (RFC
//! 3168) — the congested switch port that congestion control is tested against, on virtual
//! time in stepped mode and on the real clock when free-running.
//!
//! Agents ([`Fabric::attach_agent`], [`progress`]): work of the layers above a device (the
//! connection manager) that whoever progresses the fabric runs — the engine thread, or the
//! dispatching caller — after rounds with work and at the agents' deadlines, never with the
//! fabric's lock held.
//!
//! Multicast ([`NodeCtx::join_mcast`]): a node's port joins a group GID when the node's first
//! QP attaches to it; a packet to a multicast GID goes to every port that joined (the
//! sender's own node included: its engine gives the copy to its attached QPs) and to the
//! uplink, which the fabric tells when its first port joins a group and its last leaves
//! ([`Node::mcast_membership`]), so that a port onto a real network joins the group there.
//!
//! Device commands (create a QP, register memory …) take the fabric's lock; posting and polling
//! never do on a free-running or stepped fabric (a doorbell is a lock-free [`Kicker`]). On a
//! manual fabric a doorbell and a dispatch step the fabric themselves, taking its lock with
//! `try_lock` only: a thread that finds it taken leaves the work to the holder.
//!
//! ## Packet capture
//! A fabric can write every packet its nodes send to a pcap file that Wireshark and tshark
//! decode as InfiniBand over RoCEv2: set [`FabricConfig::capture`], or call
//! [`Fabric::start_capture`] and [`Fabric::stop_capture`] (the facade's embedded fabric
//! follows `PORTVERBS_PCAP=<path>`). Each packet is written once, as its real RoCEv2 frame
//! (IP, UDP to port 4791, InfiniBand headers, payload, pad, ICRC) behind a synthetic Ethernet
//! header ([`capture`] says how it is made), at routing time: what a node puts on the wire,
//! *before* the link's faults — a packet the link then loses is in the capture, a duplicate
//! is there once, a corrupted one as it was sent. A train (the packets of one message a
//! fault-free link carries as one unit) is written as its individual packets. Timestamps are
//! the fabric's clock: virtual nanoseconds since the start in stepped mode, real ones since the
//! fabric was made when free-running. The file is flushed after every routing pass, so it is
//! whole whenever the fabric is idle. A write error ends the capture, never the fabric:
//! [`Fabric::capture_error`] and [`Fabric::stop_capture`] report it. With no capture running
//! the routing path pays one test of an `Option`.
//!
//! Layering: `wire` → `transport` → `fabric` → devices (`soft`, `mlx4-model`). What this crate
//! must never do: know a device's queue formats or commands (that is behind [`Node`]);
//! downcast a node; depend on `verbs-core` or on a device crate; take a lock or allocate per
//! packet on its step path (a running packet capture excepted: it serialises and writes every
//! packet, and is off unless asked for; and a multicast packet for more than four ports, or
//! over links with faults, whose copies are its own). It may run one thread per fabric (the engine thread
//! emulates hardware and runs the agents); the stepped and manual modes run none. Its only file I/O is the capture file ([`capture`]:
//! frames in, pcap records out, so that a port over real UDP can write the same captures).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod bottleneck;
pub mod capture;
mod engine_node;
mod faults;
mod kick;
mod node;
pub mod progress;
pub mod rng;
mod sim;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use portverbs_hal::types::Gid;
use thiserror::Error;

pub use bottleneck::{Bottleneck, EcnMarking};
pub use capture::{CaptureError, CaptureStats, PcapCapture};
pub use engine_node::{DeviceSide, EngineNode};
pub use faults::{CopyFate, FabricStats, Fate, LinkFaults, corrupt_packet};
pub use kick::Kicker;
pub use node::{Joining, Node, NodeConfig, NodeCtx, NodeHandle};
pub use portverbs_hal::{Progress, ProgressAgent, WaitSource};
pub use progress::PortIo;
pub use rng::SplitMix64;

use kick::{EngineWake, Kick};
use sim::Sim;

/// How the fabric is driven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A background engine thread on the real clock: the devices' auto progress
    /// ([`Progress::Auto`]).
    Threaded,
    /// Driven by the caller on virtual time.
    Stepped,
    /// No thread, on the real clock: the devices' users drive it — every kick steps it on
    /// the kicking thread, and [`Fabric::dispatch`] (what the devices' polls and waits call)
    /// receives, steps, fires timers and runs the agents: manual progress
    /// ([`Progress::Manual`]).
    Manual,
}

impl Mode {
    /// The free-running mode of a progress mode: [`Mode::Threaded`] for auto,
    /// [`Mode::Manual`] for manual.
    pub fn of(progress: Progress) -> Self {
        match progress {
            Progress::Auto => Self::Threaded,
            Progress::Manual => Self::Manual,
        }
    }

    /// The progress mode the fabric's devices have: auto with an engine thread; manual
    /// otherwise (a stepped fabric progresses only when its test steps it).
    pub fn progress(self) -> Progress {
        match self {
            Self::Threaded => Progress::Auto,
            Self::Stepped | Self::Manual => Progress::Manual,
        }
    }
}

/// Fabric settings.
#[derive(Debug, Clone)]
pub struct FabricConfig {
    /// Driving mode.
    pub mode: Mode,
    /// Seed of the fault generator; in stepped mode also the seed every node's identifiers
    /// derive from ([`Joining::seed`]), so that a stepped run repeats exactly.
    pub seed: u64,
    /// Link behaviour.
    pub faults: LinkFaults,
    /// Capture every packet to this pcap file from the start (see the crate docs). A file that
    /// cannot be created leaves the fabric running without a capture; [`Fabric::capture_error`]
    /// says why.
    pub capture: Option<PathBuf>,
    /// An output queue of bounded size and fixed rate in front of every destination port
    /// ([`Bottleneck`]); `None`: packets go as fast as the links' delay lets them.
    pub bottleneck: Option<Bottleneck>,
}

impl Default for FabricConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Threaded,
            seed: 1,
            faults: LinkFaults::NONE,
            capture: None,
            bottleneck: None,
        }
    }
}

/// Fabric-level failures.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FabricError {
    /// Another port already owns an address.
    #[error("address {0} is already on the fabric")]
    DuplicateAddress(IpAddr),
    /// A device needs between 1 and 254 ports.
    #[error("a device needs 1 to 254 ports, got {0}")]
    BadPortCount(usize),
    /// The fabric is full.
    #[error("the fabric holds at most 65535 devices")]
    TooManyDevices,
    /// `run_until_idle` gave up: work was still scheduled when the limit was reached.
    #[error("still busy after {steps} steps at virtual time {now_ns} ns (a QP retrying forever?)")]
    StillBusy {
        /// Steps taken.
        steps: u64,
        /// Virtual time reached.
        now_ns: u64,
    },
    /// The operation needs the other mode.
    #[error("this operation needs a {0:?} fabric")]
    WrongMode(Mode),
    /// The node was detached from the fabric.
    #[error("the device was detached from the fabric")]
    Detached,
    /// Another node already leads off this fabric ([`NodeCtx::claim_uplink`]).
    #[error("another port is already this fabric's uplink")]
    UplinkTaken,
    /// The uplink could not join a multicast group on its network
    /// ([`Node::mcast_membership`]).
    #[error("joining multicast group {group} on the uplink: {reason}")]
    McastJoin {
        /// The group, as the IP address its GID stands for.
        group: IpAddr,
        /// Why.
        reason: String,
    },
}

/// State shared by the fabric handle, its nodes and the engine thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) sim: Mutex<Sim>,
    /// The agents progress runs for the layers above ([`progress`]).
    pub(crate) agents: progress::Agents,
    pub(crate) kicks_tx: Sender<Kick>,
    pub(crate) kicks_rx: Receiver<Kick>,
    pub(crate) overflow: Arc<AtomicBool>,
    pub(crate) wake: Arc<EngineWake>,
    pub(crate) mode: Mode,
    pub(crate) epoch: Instant,
    pub(crate) shutdown: AtomicBool,
    /// Manual mode: a dispatch asked for the nodes' wires to be flushed while another thread
    /// stepped; that thread flushes before it lets go.
    pub(crate) flush_wanted: AtomicBool,
    /// Manual mode: fabric time (ns) the nodes' wires were last flushed.
    pub(crate) last_flush: AtomicU64,
}

impl Shared {
    /// Locks the simulation (a panic on another thread leaves it usable: its state is plain
    /// data that every step re-validates).
    pub(crate) fn lock(&self) -> MutexGuard<'_, Sim> {
        // A panic on another thread leaves the simulation usable: it is plain data that every
        // step re-validates.
        self.sim
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn kicker(self: &Arc<Self>, node: u16) -> Kicker {
        Kicker {
            node,
            tx: self.kicks_tx.clone(),
            wake: self.wake.clone(),
            overflow: self.overflow.clone(),
            inline: (self.mode == Mode::Manual).then(|| Arc::downgrade(self)),
        }
    }

    /// In free-running mode, the real clock in nanoseconds since the fabric started.
    pub(crate) fn real_now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// Stops the engine thread when the last user handle goes away.
#[derive(Debug)]
pub(crate) struct Owner {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.wake.wake_now();
        let handle = self.thread.lock().map(|mut t| t.take()).unwrap_or(None);
        if let Some(h) = handle {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

/// A handle to an in-process fabric. Cheap to clone; nodes' handles keep it alive.
#[derive(Debug, Clone)]
pub struct Fabric {
    pub(crate) shared: Arc<Shared>,
    pub(crate) _owner: Arc<Owner>,
}

/// How long the idle engine thread keeps looking for work before parking (latency vs. CPU).
/// Long, because waking a parked engine is slow and, worse, the scheduler tends to wake it on
/// the core of the thread that rang the doorbell (wake-affine), where the two then share a core
/// until the load balancer separates them; while it looks the engine yields (`HOT_SPIN`), so it
/// costs other threads little.
const SPIN: Duration = Duration::from_millis(5);

/// For this long at the start of an idle spell the engine spins on the CPU; after it, it yields
/// the CPU between looks. A parked or spinning engine must not starve an application thread
/// that shares its core (on a two-core machine the scheduler often leaves them together, and a
/// pure spin then costs the application a whole spin period per doorbell).
const HOT_SPIN: Duration = Duration::from_micros(50);

/// Looks at the kick channel this many times between two readings of the clock while spinning
/// hot.
const SPINS_PER_CLOCK_READ: u32 = 64;

/// How long an idle engine thread sleeps at most between looks at its shutdown flag and
/// deadlines when it sleeps on a port's I/O (which its kicks and shutdown also wake); parked
/// without one, 10 ms.
const IO_SLEEP: Duration = Duration::from_millis(100);

fn engine_thread(shared: Arc<Shared>) {
    let mut idle_since: Option<Instant> = None;
    while !shared.shutdown.load(Ordering::Acquire) {
        let (did, next) = {
            let mut sim = shared.lock();
            sim.now = shared.real_now();
            let did = sim.step(&shared.kicks_rx, &shared.overflow);
            (did, sim.next_deadline())
        };
        // The agents run here, without the fabric lock: after work (bounded while it goes
        // on, once when it stops) and when their deadline passes.
        let agents = if shared.agents.attached() {
            shared.agents.after_round(&shared, did, shared.real_now())
        } else {
            None
        };
        let next = match (next, agents) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if did {
            idle_since = None;
            continue;
        }
        let io = shared.wake.io.get();
        let since = *idle_since.get_or_insert_with(Instant::now);
        if since.elapsed() < SPIN {
            // Look for a kick, input or a deadline without the lock. The clock is read once
            // per round of spins, not per spin: reading it was most of an idle engine's time.
            let deadline = next.unwrap_or(u64::MAX);
            loop {
                let idle = since.elapsed();
                if idle >= SPIN || shared.real_now() >= deadline {
                    break;
                }
                if io.is_some_and(|io| io.ready()) {
                    break;
                }
                let rounds = if idle < HOT_SPIN {
                    SPINS_PER_CLOCK_READ
                } else {
                    1
                };
                let mut woken = false;
                for _ in 0..rounds {
                    if !shared.kicks_rx.is_empty()
                        || shared.overflow.load(Ordering::Relaxed)
                        || shared.shutdown.load(Ordering::Relaxed)
                    {
                        woken = true;
                        break;
                    }
                    std::hint::spin_loop();
                }
                if woken {
                    break;
                }
                if idle >= HOT_SPIN {
                    std::thread::yield_now();
                }
            }
            continue;
        }
        shared.wake.sleeping.store(true, Ordering::SeqCst);
        if shared.kicks_rx.is_empty() && !shared.overflow.load(Ordering::SeqCst) {
            let cap = if io.is_some() {
                IO_SLEEP
            } else {
                Duration::from_millis(10)
            };
            let wait = next.map_or(cap, |t| {
                Duration::from_nanos(t.saturating_sub(shared.real_now()))
            });
            match io {
                // Input wakes it as a kick does: the next round receives it.
                Some(io) => {
                    io.wait(wait.min(cap));
                }
                None => std::thread::park_timeout(wait.min(cap)),
            }
        }
        shared.wake.sleeping.store(false, Ordering::SeqCst);
        // Still idle: the next round parks again at once. Only work (a kick, a packet, a
        // timer that fired) starts another spin; spinning again after every park kept an idle
        // engine busy a third of the time (5 ms of spin per 10 ms park).
    }
}

impl Fabric {
    /// A fabric with the given settings (free-running mode starts the engine thread).
    pub fn new(config: FabricConfig) -> Self {
        let (kicks_tx, kicks_rx) = crossbeam_channel::bounded(1 << 16);
        let mut sim = Sim::new(config.seed, config.faults);
        sim.set_bottleneck(config.bottleneck);
        // Stepped runs are reproducible from their seed, the devices' keys and QP numbers
        // included; free-running devices draw theirs from the OS.
        sim.node_seed = (config.mode == Mode::Stepped).then_some(config.seed);
        sim.flush_each_step = config.mode != Mode::Manual;
        if let Some(path) = &config.capture {
            match PcapCapture::create(path) {
                Ok(c) => sim.capture = Some(c),
                Err(e) => sim.capture_failure = Some(e),
            }
        }
        let shared = Arc::new(Shared {
            sim: Mutex::new(sim),
            agents: progress::Agents::new(),
            flush_wanted: AtomicBool::new(false),
            last_flush: AtomicU64::new(0),
            kicks_tx,
            kicks_rx,
            overflow: Arc::new(AtomicBool::new(false)),
            wake: Arc::new(EngineWake::default()),
            mode: config.mode,
            epoch: Instant::now(),
            shutdown: AtomicBool::new(false),
        });
        let thread = match config.mode {
            Mode::Threaded => {
                let s = shared.clone();
                let handle = std::thread::Builder::new()
                    .name("portverbs-soft-engine".into())
                    .spawn(move || engine_thread(s))
                    .ok();
                if let Some(h) = &handle {
                    let _ = shared.wake.thread.set(h.thread().clone());
                }
                handle
            }
            Mode::Stepped | Mode::Manual => None,
        };
        let owner = Arc::new(Owner {
            shared: shared.clone(),
            thread: Mutex::new(thread),
        });
        Self {
            shared,
            _owner: owner,
        }
    }

    /// A stepped fabric on virtual time with perfect links.
    pub fn stepped(seed: u64) -> Self {
        Self::new(FabricConfig {
            mode: Mode::Stepped,
            seed,
            ..FabricConfig::default()
        })
    }

    /// A free-running fabric with perfect links.
    pub fn threaded() -> Self {
        Self::new(FabricConfig::default())
    }

    /// A manual fabric on the real clock with perfect links: no thread; its devices' users
    /// drive it ([`Mode::Manual`]).
    pub fn manual() -> Self {
        Self::new(FabricConfig {
            mode: Mode::Manual,
            ..FabricConfig::default()
        })
    }

    /// How this fabric is driven.
    pub fn mode(&self) -> Mode {
        self.shared.mode
    }

    /// Changes the link behaviour.
    pub fn set_faults(&self, faults: LinkFaults) {
        self.shared.lock().set_faults(faults);
    }

    /// Puts a bottleneck in front of every destination port, or removes it (`None`); see
    /// [`Bottleneck`]. The ports' queues start empty.
    pub fn set_bottleneck(&self, bottleneck: Option<Bottleneck>) {
        self.shared.lock().set_bottleneck(bottleneck);
    }

    /// The bottleneck in front of the ports, if any.
    pub fn bottleneck(&self) -> Option<Bottleneck> {
        self.shared.lock().bottleneck
    }

    /// Packet statistics.
    pub fn stats(&self) -> FabricStats {
        self.shared.lock().stats
    }

    /// Starts capturing every packet to a new pcap file at `path` (truncating an existing one);
    /// see the crate docs for what is written. Clears the error of an earlier capture.
    ///
    /// # Errors
    /// [`CaptureError::AlreadyRunning`] while a capture runs; [`CaptureError::Create`] or
    /// [`CaptureError::Write`] when the file cannot be created or its header written.
    pub fn start_capture(&self, path: impl AsRef<Path>) -> Result<(), CaptureError> {
        if self.shared.lock().capture.is_some() {
            return Err(CaptureError::AlreadyRunning);
        }
        // The file is made without the fabric's lock, so the engine runs on meanwhile.
        let capture = PcapCapture::create(path.as_ref())?;
        let mut sim = self.shared.lock();
        if sim.capture.is_some() {
            return Err(CaptureError::AlreadyRunning);
        }
        sim.capture = Some(capture);
        sim.capture_failure = None;
        Ok(())
    }

    /// Stops the capture and closes its file: `Ok(Some(counts))` when one was running,
    /// `Ok(None)` when none was.
    ///
    /// # Errors
    /// The error that ended the capture earlier (it is cleared by being returned), or the
    /// failure of the final flush.
    pub fn stop_capture(&self) -> Result<Option<CaptureStats>, CaptureError> {
        let (capture, failure) = {
            let mut sim = self.shared.lock();
            (sim.capture.take(), sim.capture_failure.take())
        };
        match (capture, failure) {
            (Some(c), _) => c.finish().map(|(_, stats)| Some(stats)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(None),
        }
    }

    /// Whether a node leads off this fabric to a real network ([`NodeCtx::claim_uplink`]):
    /// its devices are then reachable from outside the process.
    pub fn has_uplink(&self) -> bool {
        self.shared.lock().uplink.is_some()
    }

    /// Stepped mode: the time of the next scheduled event (a delayed packet or a timer), if
    /// any. With [`Fabric::advance_to`] it lets a caller run several fabrics in lock-step.
    pub fn next_event(&self) -> Option<u64> {
        self.shared.lock().next_deadline()
    }

    /// Stepped mode: moves virtual time forward to `t` (never back) without doing anything
    /// else; the next [`Fabric::step`] runs what is due then.
    ///
    /// # Errors
    /// [`FabricError::WrongMode`] when free-running.
    pub fn advance_to(&self, t: u64) -> Result<(), FabricError> {
        if self.shared.mode != Mode::Stepped {
            return Err(FabricError::WrongMode(Mode::Stepped));
        }
        let mut sim = self.shared.lock();
        sim.now = sim.now.max(t);
        Ok(())
    }

    /// Whether a capture is running.
    pub fn is_capturing(&self) -> bool {
        self.shared.lock().capture.is_some()
    }

    /// What the running capture wrote so far (`None` when none runs).
    pub fn capture_stats(&self) -> Option<CaptureStats> {
        self.shared.lock().capture.as_ref().map(PcapCapture::stats)
    }

    /// Why the last capture ended on its own (a write error), or why the capture of
    /// [`FabricConfig::capture`] never started; `None` otherwise. The fabric keeps running.
    pub fn capture_error(&self) -> Option<CaptureError> {
        self.shared.lock().capture_failure.clone()
    }

    /// Packets still in flight.
    pub fn in_flight(&self) -> usize {
        self.shared.lock().in_flight()
    }

    /// Current time in nanoseconds (virtual in stepped mode).
    pub fn now_ns(&self) -> u64 {
        match self.shared.mode {
            Mode::Stepped => self.shared.lock().now,
            Mode::Threaded | Mode::Manual => self.shared.real_now(),
        }
    }

    /// Stepped mode: does everything due at the current virtual time; false when nothing was.
    pub fn step(&self) -> bool {
        self.shared
            .lock()
            .step(&self.shared.kicks_rx, &self.shared.overflow)
    }

    /// Stepped mode: runs (advancing virtual time) until nothing is left to do. Gives up after
    /// `10_000_000` steps or 10 minutes of virtual time (a QP retrying forever).
    ///
    /// # Errors
    /// [`FabricError::StillBusy`] at the limit; [`FabricError::WrongMode`] when free-running.
    pub fn run_until_idle(&self) -> Result<(), FabricError> {
        self.run_bounded(u64::MAX, 10_000_000, 600_000_000_000)
    }

    /// Stepped mode: runs for `ns` nanoseconds of virtual time (or until idle, whichever is
    /// first), then sets the clock to the end of that interval.
    ///
    /// # Errors
    /// [`FabricError::WrongMode`] when free-running.
    pub fn run_for(&self, ns: u64) -> Result<(), FabricError> {
        let end = self.now_ns().saturating_add(ns);
        match self.run_bounded(end, u64::MAX, u64::MAX) {
            Ok(()) | Err(FabricError::StillBusy { .. }) => {}
            Err(e) => return Err(e),
        }
        let mut sim = self.shared.lock();
        sim.now = sim.now.max(end);
        Ok(())
    }

    fn run_bounded(&self, until: u64, max_steps: u64, max_time: u64) -> Result<(), FabricError> {
        if self.shared.mode != Mode::Stepped {
            return Err(FabricError::WrongMode(Mode::Stepped));
        }
        let start = self.now_ns();
        let mut steps = 0u64;
        loop {
            let mut sim = self.shared.lock();
            if sim.step(&self.shared.kicks_rx, &self.shared.overflow) {
                steps += 1;
            } else {
                let next = sim.next_deadline();
                match next {
                    Some(t) if t <= until => {
                        sim.advance_to_next();
                    }
                    _ => return Ok(()),
                }
            }
            if steps >= max_steps || sim.now.saturating_sub(start) >= max_time {
                return Err(FabricError::StillBusy {
                    steps,
                    now_ns: sim.now,
                });
            }
        }
    }

    /// Every GID on the fabric, with its node's name and port.
    pub fn gids(&self) -> Vec<(String, u8, Gid)> {
        let sim = self.shared.lock();
        let mut v: Vec<_> = sim
            .routes
            .iter()
            .map(|(gid, &(dev, port))| (sim.name(dev).to_string(), port, *gid))
            .collect();
        v.sort();
        v
    }
}

//! Several stepped fabrics whose UDP ports talk to each other over real sockets, run in
//! lock-step on one virtual clock — how tests (the conformance suite's UDP backend) get the
//! stepped fabric's determinism of *time* while every packet crosses the kernel.
//!
//! A round steps every fabric at the current virtual time until none has work left and every
//! datagram any port sent has been received by its peer (a port receives when its fabric is
//! stepped); only then does the clock of every fabric jump to the earliest next event among them. So a
//! retransmission timer never fires because a packet was still in the kernel, and all
//! fabrics' clocks stay equal. The ports must only talk among themselves; a test that also
//! sends datagrams to them from elsewhere (a hostile peer on a raw socket) says how many with
//! [`Lockstep::expect_foreign`], so that they are waited for too and never mistaken for the
//! ports' own traffic.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use portverbs_fabric::{Fabric, FabricError, Mode};

use crate::UdpPort;
use crate::stats::Counters;

/// How long a round waits for datagrams still in the kernel before it counts them lost.
const WIRE_WAIT: Duration = Duration::from_millis(200);

/// Stepped fabrics with UDP ports, driven together (see the module docs).
#[derive(Debug)]
pub struct Lockstep {
    fabrics: Vec<Fabric>,
    probes: Vec<(Arc<Counters>, Arc<AtomicBool>)>,
    /// Datagrams sent to the ports from outside them ([`Lockstep::expect_foreign`]).
    foreign: AtomicU64,
}

impl Lockstep {
    /// Drives `fabrics` (all stepped) whose traffic leaves through `ports`. Sets every
    /// fabric's clock to the latest of them.
    ///
    /// # Errors
    /// [`FabricError::WrongMode`] for a free-running fabric.
    pub fn new(fabrics: Vec<Fabric>, ports: &[&UdpPort]) -> Result<Self, FabricError> {
        if fabrics.iter().any(|f| f.mode() != Mode::Stepped) {
            return Err(FabricError::WrongMode(Mode::Stepped));
        }
        let now = fabrics.iter().map(Fabric::now_ns).max().unwrap_or(0);
        for f in &fabrics {
            f.advance_to(now)?;
        }
        Ok(Self {
            fabrics,
            probes: ports.iter().map(|p| p.probe()).collect(),
            foreign: AtomicU64::new(0),
        })
    }

    /// Runs (advancing virtual time) until nothing is left to do; gives up after 10 minutes
    /// of virtual time.
    ///
    /// # Errors
    /// [`FabricError::StillBusy`] at the limit.
    pub fn run_until_idle(&self) -> Result<(), FabricError> {
        self.run(None)
    }

    /// Runs for `ns` of virtual time (or until idle, whichever is first), then sets every
    /// clock to the end of that interval.
    ///
    /// # Errors
    /// As [`Lockstep::run_until_idle`].
    pub fn run_for(&self, ns: u64) -> Result<(), FabricError> {
        let end = self.now().saturating_add(ns);
        self.run(Some(end))?;
        for f in &self.fabrics {
            f.advance_to(end)?;
        }
        Ok(())
    }

    /// Counts `n` datagrams that something other than the ports sent (or is about to send) to
    /// them: rounds wait for those to be received as they wait for the ports' own.
    pub fn expect_foreign(&self, n: u64) {
        self.foreign.fetch_add(n, Ordering::AcqRel);
    }

    /// The common virtual time.
    pub fn now(&self) -> u64 {
        self.fabrics.iter().map(Fabric::now_ns).max().unwrap_or(0)
    }

    fn run(&self, until: Option<u64>) -> Result<(), FabricError> {
        let start = self.now();
        let mut steps = 0u64;
        loop {
            // Everything due now, on every fabric and on the wire.
            let mut wire_deadline = None;
            loop {
                let mut did = false;
                for f in &self.fabrics {
                    while f.step() {
                        did = true;
                        steps += 1;
                    }
                }
                if did {
                    wire_deadline = None;
                    continue;
                }
                if self.wire_settled() {
                    break;
                }
                // Datagrams still in the kernel: the next steps receive them. Those that do not
                // arrive within `WIRE_WAIT` count as lost.
                let d = *wire_deadline.get_or_insert_with(|| Instant::now() + WIRE_WAIT);
                if Instant::now() >= d {
                    break;
                }
                for (_, hint) in &self.probes {
                    hint.store(true, Ordering::Release);
                }
                std::thread::yield_now();
            }
            let next = self.fabrics.iter().filter_map(Fabric::next_event).min();
            let now = self.now();
            match next {
                Some(t) if until.is_none_or(|u| t <= u) => {
                    for f in &self.fabrics {
                        f.advance_to(t.max(now))?;
                    }
                }
                _ => return Ok(()),
            }
            if self.now().saturating_sub(start) >= 600_000_000_000 {
                return Err(FabricError::StillBusy {
                    steps,
                    now_ns: self.now(),
                });
            }
        }
    }

    /// True when every datagram sent (by the ports, and from outside them) was received.
    fn wire_settled(&self) -> bool {
        let sent: u64 = self
            .probes
            .iter()
            .map(|(c, _)| {
                // A multicast datagram is received once by each other member of the group
                // among the ports of this process.
                (c.tx_packets.load(Ordering::Acquire)
                    + c.tx_mcast_local_copies.load(Ordering::Acquire))
                .saturating_sub(c.tx_mcast.load(Ordering::Acquire))
            })
            .sum::<u64>()
            + self.foreign.load(Ordering::Acquire);
        let settled: u64 = self
            .probes
            .iter()
            .map(|(c, _)| c.rx_settled.load(Ordering::Acquire))
            .sum();
        settled >= sent
    }
}

//! Two soft devices, b opened through `portverbs_windows` (a associated with nothing), and
//! RC queue pairs between them; helpers to drive one completion port.

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use portverbs_soft::Fabric;
use portverbs_test_support::verbs_net;
use portverbs_verbs::{Cq, Qp};
use portverbs_windows::{CompletionPort, Completions, Overlapped, Packet};

pub use verbs_net::{Dev, PATIENCE, send};

/// The completion key of device b on the test's port.
pub const KEY: usize = 0xB0B;

/// Two devices (10.0.0.1, 10.0.0.2) on one fabric, both opened with the Windows layer; each
/// node's `platform` is its [`Completions`].
pub struct Net(verbs_net::Net<Completions<Dev>>);

impl Deref for Net {
    type Target = verbs_net::Net<Completions<Dev>>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Net {
    /// The shared set-up itself, to take it apart by value.
    pub fn into_inner(self) -> verbs_net::Net<Completions<Dev>> {
        self.0
    }

    fn on(fabric: Fabric) -> Self {
        Self(verbs_net::Net::on(fabric, |dev| {
            let win = portverbs_windows::open(dev.clone()).unwrap();
            let ctx = win.context().clone();
            (win, ctx)
        }))
    }

    /// Free running: completions and interrupts come from the engine thread.
    pub fn threaded() -> Self {
        Self::on(Fabric::threaded())
    }

    /// Stepped on virtual time: nothing moves until `settle`.
    pub fn stepped(seed: u64) -> Self {
        Self::on(Fabric::stepped(seed))
    }

    /// A QP on a (own CQ) connected to a QP on b using `cq_b`. Returns `(qa, qb)`.
    pub fn pair(&self, cq_b: &Cq<Dev>) -> (Qp<Dev>, Qp<Dev>) {
        let (qa, qb, _) = self.pair_with_cq(cq_b);
        (qa, qb)
    }

    /// As [`Net::pair`], with a's CQ too (for signaled sends).
    pub fn pair_with_cq(&self, cq_b: &Cq<Dev>) -> (Qp<Dev>, Qp<Dev>, Cq<Dev>) {
        let cq_a = self.a.cq(None);
        let (qa, qb) = (self.a.qp(&cq_a), self.b.qp(cq_b));
        self.connect(&qa, &qb);
        (qa, qb, cq_a)
    }

    /// Associates b with a fresh port under [`KEY`].
    pub fn port_for_b(&self) -> Arc<CompletionPort> {
        let port = Arc::new(CompletionPort::new().unwrap());
        self.b.platform.associate(port.clone(), KEY).unwrap();
        port
    }
}

/// Runs the port loop on this thread until `want` packets that are not the doorbell were
/// dequeued (bounded by [`PATIENCE`]); returns them. Doorbells go to `win.dispatch`.
pub fn collect(port: &CompletionPort, win: &Completions<Dev>, want: usize) -> Vec<Packet> {
    let deadline = Instant::now() + PATIENCE;
    let mut got = Vec::new();
    while got.len() < want {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "{} of {want} packets: {got:?}", got.len());
        let Some(p) = port.get(Some(left)).unwrap() else {
            continue;
        };
        if !win.dispatch(&p).unwrap() {
            got.push(p);
        }
    }
    got
}

/// Dispatches whatever is on the port now and returns the packets that are not doorbells.
pub fn drain(port: &CompletionPort, win: &Completions<Dev>) -> Vec<Packet> {
    let mut got = Vec::new();
    while let Some(p) = port.get(Some(Duration::from_millis(20))).unwrap() {
        if !win.dispatch(&p).unwrap() {
            got.push(p);
        }
    }
    got
}

/// Which of `ovs` each packet completes (their indices).
pub fn which(packets: &[Packet], ovs: &[&Overlapped]) -> Vec<usize> {
    let mut out: Vec<usize> = packets
        .iter()
        .map(|p| {
            ovs.iter()
                .position(|o| o.is(p))
                .unwrap_or_else(|| panic!("a packet for no request: {p:?}"))
        })
        .collect();
    out.sort_unstable();
    out
}

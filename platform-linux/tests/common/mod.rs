//! Two soft devices opened through `portverbs_linux`, and RC queue pairs between them (the
//! shared set-up is `portverbs_test_support::verbs_net`).

#![allow(dead_code, unreachable_pub, unused_imports)]

use std::ops::Deref;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use portverbs_soft::Fabric;
use portverbs_test_support::verbs_net;
use portverbs_verbs::{CompletionChannel, Cq, Qp, WorkCompletion};
use rustix::event::{Timespec, epoll};

pub use verbs_net::{Dev, PATIENCE, send};

/// Two devices (10.0.0.1, 10.0.0.2) on one fabric, both opened with eventfd sinks.
pub struct Net(verbs_net::Net<()>);

impl Deref for Net {
    type Target = verbs_net::Net<()>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Net {
    /// The shared set-up itself, to take it apart by value.
    pub fn into_inner(self) -> verbs_net::Net<()> {
        self.0
    }

    fn on(fabric: Fabric) -> Self {
        Self(verbs_net::Net::on(fabric, |dev| {
            ((), portverbs_linux::open_blocking(dev.clone()).unwrap())
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

    /// A connected RC pair: a CQ and a QP on each side, b's CQ on `chan_b` (if any).
    /// Returns `(cq_a, cq_b, qa, qb)`.
    pub fn link(
        &self,
        chan_b: Option<&CompletionChannel<Dev>>,
    ) -> (Cq<Dev>, Cq<Dev>, Qp<Dev>, Qp<Dev>) {
        let cq_a = self.a.cq(None);
        let cq_b = self.b.cq(chan_b);
        let (qa, qb) = (self.a.qp(&cq_a), self.b.qp(&cq_b));
        self.connect(&qa, &qb);
        (cq_a, cq_b, qa, qb)
    }
}

/// Polls `cq` until `n` completions arrived (bounded by [`PATIENCE`]).
pub fn poll_n(cq: &Cq<Dev>, n: usize) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + PATIENCE;
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 8];
    while out.len() < n {
        let got = cq.poll(&mut wc).unwrap();
        out.extend_from_slice(&wc[..got]);
        if got == 0 {
            assert!(
                Instant::now() < deadline,
                "{} of {n} completions",
                out.len()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    out
}

/// The number of threads of this process.
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

/// An epoll instance watching `fd` for input, edge-triggered or not.
pub fn epoll_on(fd: impl AsFd, edge: bool) -> OwnedFd {
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
    let mut flags = epoll::EventFlags::IN;
    if edge {
        flags |= epoll::EventFlags::ET;
    }
    epoll::add(&ep, fd, epoll::EventData::new_u64(7), flags).unwrap();
    ep
}

/// How many fds epoll reports within `timeout` (each with the token of [`epoll_on`]).
pub fn epoll_ready(ep: &OwnedFd, timeout: Duration) -> usize {
    let mut events = [epoll::Event {
        flags: epoll::EventFlags::empty(),
        data: epoll::EventData::new_u64(0),
    }; 4];
    let t = Timespec::try_from(timeout).unwrap();
    let n = epoll::wait(ep, &mut events[..], Some(&t)).unwrap();
    for e in &events[..n] {
        // Copies: the kernel's struct is packed.
        let (flags, data) = (e.flags, e.data);
        assert_eq!(data.u64(), 7);
        assert!(flags.contains(epoll::EventFlags::IN));
    }
    n
}

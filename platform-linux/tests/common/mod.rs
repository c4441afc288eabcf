//! Two soft devices opened through `portverbs_linux`, and RC queue pairs between them.

#![allow(dead_code, unreachable_pub)]

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use portverbs_soft::{DeviceConfig, Fabric, SoftDevice};
use portverbs_verbs::{
    AccessFlags, Buffer, CompletionChannel, ConnectOptions, Context, Cq, CqInit, Mr, Pd, Qp,
    QpCaps, QpInit, QpType, RecvWr, SendFlags, SendOp, SendWr, WorkCompletion,
};
use rustix::event::{Timespec, epoll};

pub type Dev = SoftDevice;

/// A generous bound for anything that comes from the engine thread.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// One opened device with a PD and 64 KiB registered.
pub struct Node {
    pub ctx: Context<Dev>,
    pub pd: Pd<Dev>,
    pub buf: Buffer,
    pub mr: Mr<Dev>,
}

impl Node {
    fn open(dev: &Dev) -> Self {
        let ctx = portverbs_linux::open_blocking(dev.clone()).unwrap();
        let pd = ctx.alloc_pd_blocking().unwrap();
        let buf = ctx.alloc_buffer(1 << 16).unwrap();
        let mr = pd
            .reg_mr_blocking(&buf, 0..1 << 16, AccessFlags::LOCAL_WRITE)
            .unwrap();
        Self { ctx, pd, buf, mr }
    }

    /// A CQ of 64 entries, on `chan` if given.
    pub fn cq(&self, chan: Option<&CompletionChannel<Dev>>) -> Cq<Dev> {
        self.ctx
            .create_cq_blocking(CqInit {
                entries: 64,
                channel: chan,
                ..CqInit::default()
            })
            .unwrap()
    }

    /// An RC QP in RESET with `cq` for both queues.
    pub fn qp(&self, cq: &Cq<Dev>) -> Qp<Dev> {
        self.pd
            .create_qp_blocking(QpInit {
                qp_type: QpType::Rc,
                send_cq: cq,
                recv_cq: cq,
                srq: None,
                caps: QpCaps {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 64,
                },
                sq_sig_all: false,
                special: None,
            })
            .unwrap()
    }

    /// Posts a 64-byte receive.
    pub fn post_recv(&self, qp: &Qp<Dev>, wr_id: u64) {
        qp.post_recv(&[RecvWr {
            wr_id,
            sges: &[self.mr.sge(0, 64).expect("inside the MR")],
        }])
        .unwrap();
    }
}

/// Two devices (10.0.0.1, 10.0.0.2) on one fabric, both opened with eventfd sinks.
pub struct Net {
    pub a: Node,
    pub b: Node,
    pub devs: [Dev; 2],
    pub fabric: Fabric,
}

impl Net {
    fn on(fabric: Fabric) -> Self {
        let dev = |ip: &str| {
            SoftDevice::attach(&fabric, DeviceConfig::with_ip(ip.parse().unwrap())).unwrap()
        };
        let devs = [dev("10.0.0.1"), dev("10.0.0.2")];
        Self {
            a: Node::open(&devs[0]),
            b: Node::open(&devs[1]),
            devs,
            fabric,
        }
    }

    /// Free running: completions and interrupts come from the engine thread.
    pub fn threaded() -> Self {
        Self::on(Fabric::threaded())
    }

    /// Stepped on virtual time: nothing moves until [`Net::settle`].
    pub fn stepped(seed: u64) -> Self {
        Self::on(Fabric::stepped(seed))
    }

    /// Runs a stepped fabric until nothing is in flight.
    pub fn settle(&self) {
        self.fabric.run_until_idle().unwrap();
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

    /// Brings `qa` (on a) and `qb` (on b) to RTS toward each other.
    pub fn connect(&self, qa: &Qp<Dev>, qb: &Qp<Dev>) {
        let opts = ConnectOptions::default();
        let (ea, eb) = (
            qa.endpoint_blocking(&opts).unwrap(),
            qb.endpoint_blocking(&opts).unwrap(),
        );
        qa.connect_rc_blocking(&eb, &opts).unwrap();
        qb.connect_rc_blocking(&ea, &opts).unwrap();
    }
}

/// Posts a small inline SEND (unsignaled) with extra `flags`.
pub fn send(qp: &Qp<Dev>, wr_id: u64, flags: SendFlags) {
    qp.post_send(&[SendWr::new(wr_id, SendOp::Send)
        .inline(b"portverbs")
        .flags(flags)])
        .unwrap();
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

//! Two soft devices, b opened through `portverbs_windows` (a associated with nothing), and
//! RC queue pairs between them; helpers to drive one completion port.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use portverbs_soft::{DeviceConfig, Fabric, SoftDevice};
use portverbs_verbs::{
    AccessFlags, Buffer, CompletionChannel, ConnectOptions, Context, Cq, CqInit, Mr, Pd, Qp,
    QpCaps, QpInit, QpType, RecvWr, SendFlags, SendOp, SendWr,
};
use portverbs_windows::{CompletionPort, Completions, Overlapped, Packet};

pub type Dev = SoftDevice;

/// A generous bound for anything that comes from the engine thread.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// The completion key of device b on the test's port.
pub const KEY: usize = 0xB0B;

/// One opened device with a PD and 64 KiB registered.
pub struct Node {
    pub win: Completions<Dev>,
    pub pd: Pd<Dev>,
    pub buf: Buffer,
    pub mr: Mr<Dev>,
}

impl Node {
    fn open(dev: &Dev) -> Self {
        let win = portverbs_windows::open(dev.clone()).unwrap();
        let pd = win.context().alloc_pd_blocking().unwrap();
        let buf = win.context().alloc_buffer(1 << 16).unwrap();
        let mr = pd
            .reg_mr_blocking(&buf, 0..1 << 16, AccessFlags::LOCAL_WRITE)
            .unwrap();
        Self { win, pd, buf, mr }
    }

    pub fn ctx(&self) -> &Context<Dev> {
        self.win.context()
    }

    /// A CQ of 64 entries, on `chan` if given.
    pub fn cq(&self, chan: Option<&CompletionChannel<Dev>>) -> Cq<Dev> {
        self.ctx()
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

/// Two devices (10.0.0.1, 10.0.0.2) on one fabric, both opened with the Windows layer.
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

    /// A QP on a (own CQ) connected to a QP on b using `cq_b`. Returns `(qa, qb)`.
    pub fn pair(&self, cq_b: &Cq<Dev>) -> (Qp<Dev>, Qp<Dev>) {
        let (qa, qb, _) = self.pair_with_cq(cq_b);
        (qa, qb)
    }

    /// As [`Net::pair`], with a's CQ too (for signaled sends).
    pub fn pair_with_cq(&self, cq_b: &Cq<Dev>) -> (Qp<Dev>, Qp<Dev>, Cq<Dev>) {
        let cq_a = self.a.cq(None);
        let (qa, qb) = (self.a.qp(&cq_a), self.b.qp(cq_b));
        let opts = ConnectOptions::default();
        let (ea, eb) = (
            qa.endpoint_blocking(&opts).unwrap(),
            qb.endpoint_blocking(&opts).unwrap(),
        );
        qa.connect_rc_blocking(&eb, &opts).unwrap();
        qb.connect_rc_blocking(&ea, &opts).unwrap();
        (qa, qb, cq_a)
    }

    /// Associates b with a fresh port under [`KEY`].
    pub fn port_for_b(&self) -> Arc<CompletionPort> {
        let port = Arc::new(CompletionPort::new().unwrap());
        self.b.win.associate(port.clone(), KEY).unwrap();
        port
    }
}

/// Posts a small inline SEND (unsignaled) with extra `flags`.
pub fn send(qp: &Qp<Dev>, wr_id: u64, flags: SendFlags) {
    qp.post_send(&[SendWr::new(wr_id, SendOp::Send)
        .inline(b"portverbs")
        .flags(flags)])
        .unwrap();
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

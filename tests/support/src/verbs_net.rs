//! Two soft devices on one fabric, each opened through a platform layer, with RC queue pairs
//! between them through verbs-core: the set-up the platform crates' tests share. Each
//! platform passes its own opener; what it returns beside the [`Context`] (an IOCP binding on
//! Windows, nothing on Linux) is kept in [`Node::platform`].

use std::time::Duration;

use portverbs_soft::{DeviceConfig, Fabric, SoftDevice};
use portverbs_verbs::{
    AccessFlags, Buffer, CompletionChannel, ConnectOptions, Context, Cq, CqInit, Mr, Pd, Qp,
    QpCaps, QpInit, QpType, RecvWr, SendFlags, SendOp, SendWr,
};

/// The device type of these tests.
pub type Dev = SoftDevice;

/// A generous bound for anything that comes from the engine thread.
pub const PATIENCE: Duration = Duration::from_secs(20);

/// One opened device with a PD and 64 KiB registered.
#[derive(Debug)]
pub struct Node<P> {
    /// What the platform's opener returned beside the context.
    pub platform: P,
    /// The opened device.
    pub ctx: Context<Dev>,
    /// A protection domain.
    pub pd: Pd<Dev>,
    /// 64 KiB of memory, registered as [`Node::mr`].
    pub buf: Buffer,
    /// `buf` registered for local write.
    pub mr: Mr<Dev>,
}

impl<P> Node<P> {
    fn new(platform: P, ctx: Context<Dev>) -> Self {
        let pd = ctx.alloc_pd_blocking().unwrap();
        let buf = ctx.alloc_buffer(1 << 16).unwrap();
        let mr = pd
            .reg_mr_blocking(&buf, 0..1 << 16, AccessFlags::LOCAL_WRITE)
            .unwrap();
        Self {
            platform,
            ctx,
            pd,
            buf,
            mr,
        }
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

/// Two devices (10.0.0.1, 10.0.0.2) on one fabric, both opened by the platform's opener.
#[derive(Debug)]
pub struct Net<P> {
    /// The device at 10.0.0.1.
    pub a: Node<P>,
    /// The device at 10.0.0.2.
    pub b: Node<P>,
    /// Both devices, in that order.
    pub devs: [Dev; 2],
    /// The fabric they share.
    pub fabric: Fabric,
}

impl<P> Net<P> {
    /// Two devices on `fabric`, each opened with `open`.
    pub fn on(fabric: Fabric, open: impl Fn(&Dev) -> (P, Context<Dev>)) -> Self {
        let dev = |ip: &str| {
            SoftDevice::attach(&fabric, DeviceConfig::with_ip(ip.parse().unwrap())).unwrap()
        };
        let devs = [dev("10.0.0.1"), dev("10.0.0.2")];
        let node = |d: &Dev| {
            let (platform, ctx) = open(d);
            Node::new(platform, ctx)
        };
        Self {
            a: node(&devs[0]),
            b: node(&devs[1]),
            devs,
            fabric,
        }
    }

    /// Runs a stepped fabric until nothing is in flight.
    pub fn settle(&self) {
        self.fabric.run_until_idle().unwrap();
    }

    /// Brings `qa` (on a) and `qb` (on b) to RTS toward each other.
    pub fn connect(&self, qa: &Qp<Dev>, qb: &Qp<Dev>) {
        // A fixed PSN (the default draws a random one), so that a stepped run repeats exactly.
        let opts = ConnectOptions {
            psn: 0,
            ..ConnectOptions::default()
        };
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

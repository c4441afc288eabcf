//! The mlx4 driver's shared event queues on a function whose interrupts reach only eventfds,
//! as a real ConnectX-3 under VFIO: the emulated HCA behind [`VfioLike`], a `PciFunction`
//! that accepts only sinks with an eventfd and whose interrupts write that eventfd, as the
//! kernel's MSI-X handler does, without calling any code of the driver's. Contexts use the
//! Linux platform's sinks (an eventfd per event queue) and are waited on with epoll.
#![cfg(target_os = "linux")]

use std::collections::HashSet;
use std::net::IpAddr;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use portverbs::hal::dma::{DmaError, DmaMemory, HostMemory, MapHostError};
use portverbs::hal::mmio::Mmio;
use portverbs::hal::notify::InterruptSink;
use portverbs::mlx4::{HostMapped, Mlx4Config, Mlx4Device, PciError, PciFunction};
use portverbs::mlx4_model::{Mlx4Model, ModelConfig, ModelFunction};
use portverbs::prelude::*;
use portverbs::soft::Fabric;
use portverbs::verbs::{AsyncEventKind, ConnectOptions, ContextOptions, EventElement, LatchSinks};
use rustix::event::epoll;

/// Generous: completions come from the engine thread of a shared machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// More contexts than the HCA has MSI-X vectors (32).
const CONTEXTS: usize = 120;

/// The device name of the VFIO-like function, hence its interrupt thread's name.
const NAME: &str = "vfl";
const THREAD: &str = "mlx4-eq vfl";

/// What the kernel holds for a vector routed with `VFIO_DEVICE_SET_IRQS`: a reference to the
/// eventfd, which the interrupt signals.
#[derive(Debug)]
struct KernelIrq(OwnedFd);

impl InterruptSink for KernelIrq {
    fn raise(&self) {
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }
}

/// The emulated HCA as a VFIO function: interrupts reach eventfds only.
#[derive(Debug)]
struct VfioLike {
    inner: Arc<ModelFunction>,
    /// Vectors routed to an eventfd.
    routed: AtomicUsize,
}

impl PciFunction for VfioLike {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn ids(&self) -> (u16, u16) {
        self.inner.ids()
    }
    fn bar(&self, index: u8) -> Result<Arc<dyn Mmio>, PciError> {
        self.inner.bar(index)
    }
    fn config_read16(&self, offset: u16) -> Result<u16, PciError> {
        self.inner.config_read16(offset)
    }
    fn alloc_dma(&self, len: usize) -> Result<Arc<dyn HostMapped>, DmaError> {
        self.inner.alloc_dma(len)
    }
    fn map_host(&self, memory: HostMemory) -> Result<Arc<dyn DmaMemory>, MapHostError> {
        self.inner.map_host(memory)
    }
    fn num_vectors(&self) -> u32 {
        self.inner.num_vectors()
    }
    /// As `VfioFunction`: a sink without an eventfd leaves the vector as it was.
    fn route_interrupt(&self, vector: u32, sink: Arc<dyn InterruptSink>) -> Result<(), PciError> {
        let Some(fd) = sink.as_fd() else {
            return Ok(());
        };
        let err = |e: std::io::Error| PciError::Interrupt {
            function: self.name(),
            vector,
            reason: e.to_string(),
        };
        let dup = rustix::io::fcntl_dupfd_cloexec(fd, 0).map_err(|e| err(e.into()))?;
        self.inner
            .route_interrupt(vector, Arc::new(KernelIrq(dup)))?;
        self.routed.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn raises_sinks(&self) -> bool {
        false
    }
    fn reset_settle(&self) -> Duration {
        self.inner.reset_settle()
    }
    fn progress(&self) -> portverbs::hal::Progress {
        self.inner.progress()
    }
    fn attach_agent(&self, agent: std::sync::Weak<dyn portverbs::hal::ProgressAgent>) -> bool {
        self.inner.attach_agent(agent)
    }
}

/// Threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// Waits until `n` threads bear the interrupt thread's name: a new thread names itself
/// once it runs, and an ended one leaves `/proc` a moment after its join.
fn await_threads(n: usize, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = threads_named(THREAD);
        if now == n {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {now} threads, not {n}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A connected RC pair: a QP of `a` (polled) and one of `b` whose CQ is on `chan`.
struct Link {
    qa: Qp,
    qb: Qp,
    cq_b: Cq,
    mr_b: Mr,
    rest: (Cq, Mr, Pd, Pd),
}

impl Link {
    fn between(a: &Context, b: &Context, chan: &CompletionChannel) -> Self {
        let side = |ctx: &Context, chan: Option<&CompletionChannel>| {
            let pd = ctx.alloc_pd_blocking().unwrap();
            let cq = ctx
                .create_cq_blocking(CqInit {
                    entries: 16,
                    channel: chan,
                    ..CqInit::default()
                })
                .unwrap();
            let caps = QpCaps {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            };
            let qp = pd
                .create_qp_blocking(QpInit {
                    qp_type: QpType::Rc,
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: None,
                    caps,
                    sq_sig_all: false,
                    special: None,
                })
                .unwrap();
            let mr = pd
                .reg_vec_blocking(vec![0; 4096], AccessFlags::LOCAL_WRITE)
                .unwrap();
            (pd, cq, qp, mr)
        };
        let (pd_a, cq_a, qa, mr_a) = side(a, None);
        let (pd_b, cq_b, qb, mr_b) = side(b, Some(chan));
        let opts = ConnectOptions::default();
        let ea = qa.endpoint_blocking(&opts).unwrap();
        let eb = qb.endpoint_blocking(&opts).unwrap();
        qa.connect_rc_blocking(&eb, &opts).unwrap();
        qb.connect_rc_blocking(&ea, &opts).unwrap();
        Self {
            qa,
            qb,
            cq_b,
            mr_b,
            rest: (cq_a, mr_a, pd_a, pd_b),
        }
    }

    /// b posts a receive, a sends to it (unsignaled, inline).
    fn message(&self, wr_id: u64) {
        self.qb
            .post_recv(&[RecvWr {
                wr_id,
                sges: &[self.mr_b.sge(0, 64).unwrap()],
            }])
            .unwrap();
        self.qa
            .post_send(&[SendWr::new(wr_id, SendOp::Send).inline(b"vfio")])
            .unwrap();
    }
}

/// Waits with one epoll over `fds` until `take(k)` has returned true for every `k`; `take`
/// is called for each readiness of fd `k` (a readiness may be spurious).
fn epoll_each<'a>(
    fds: impl Iterator<Item = std::os::fd::BorrowedFd<'a>>,
    mut take: impl FnMut(usize) -> bool,
) {
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
    let fds: Vec<_> = fds.collect();
    for (k, fd) in fds.iter().enumerate() {
        epoll::add(
            &ep,
            fd,
            epoll::EventData::new_u64(k as u64),
            epoll::EventFlags::IN,
        )
        .unwrap();
    }
    let mut left: HashSet<usize> = (0..fds.len()).collect();
    let deadline = Instant::now() + PATIENCE;
    let mut events = Vec::with_capacity(64);
    let slice = rustix::event::Timespec {
        tv_sec: 1,
        tv_nsec: 0,
    };
    while !left.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} of {} never became readable",
            left.len(),
            fds.len()
        );
        events.clear();
        epoll::wait(
            &ep,
            rustix::buffer::spare_capacity(&mut events),
            Some(&slice),
        )
        .unwrap();
        for ev in &events {
            let data = ev.data;
            let k = data.u64() as usize;
            if take(k) {
                assert!(left.remove(&k), "fd {k} taken twice");
                epoll::delete(&ep, fds[k]).unwrap();
            }
        }
    }
}

/// 120 contexts on one VFIO-like ConnectX-3 (32 MSI-X vectors), each with a completion
/// channel from the Linux platform's sinks: each channel's fd, in one epoll, becomes readable
/// for its own CQ's completion; an access error at one QP reaches only its context; a port
/// event makes every context's async fd readable; one
/// driver thread serves them all, started with the first context and gone when the device
/// closes.
#[test]
fn vfio_like_function_shares_the_event_queues_among_many_contexts() {
    let fabric = Fabric::threaded();
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let (_model_a, dev_a) = portverbs::emulated_mlx4(&fabric, "mlx4_va", ip("10.9.1.1")).unwrap();
    let (model_b, function) = Mlx4Model::attach(
        &fabric,
        ModelConfig {
            name: Some("vfl_model".into()),
            ..ModelConfig::default()
        },
    )
    .unwrap();
    let vectors = function.num_vectors() as usize;
    assert!(CONTEXTS > vectors);
    let pci = Arc::new(VfioLike {
        inner: function,
        routed: AtomicUsize::new(0),
    });
    let config = Mlx4Config::new(NAME, vec![vec![Gid::from_ip(ip("10.9.1.2"))]]);
    let dev_b = Mlx4Device::open(pci.clone(), config).unwrap();
    let pool = dev_b.completion_eqs();
    assert!(pool >= 1 && pool < vectors, "{pool} completion EQs");
    assert_eq!(
        pci.routed.load(Ordering::SeqCst),
        pool + 1,
        "one eventfd per vector of the pool, routed at open"
    );
    assert_eq!(threads_named(THREAD), 0, "no thread before a queue to wake");

    let a = Context::open_blocking(
        AnyDevice::Mlx4(dev_a),
        ContextOptions {
            sinks: Arc::new(LatchSinks),
            ..ContextOptions::default()
        },
    )
    .unwrap();
    let ctxs: Vec<_> = (0..CONTEXTS)
        .map(|_| {
            let opts = portverbs::context_options().unwrap();
            Context::open_blocking(AnyDevice::Mlx4(dev_b.clone()), opts).unwrap()
        })
        .collect();
    await_threads(1, "one thread for every context");
    let channels: Vec<_> = ctxs
        .iter()
        .map(|c| c.create_comp_channel().unwrap())
        .collect();
    let links: Vec<_> = ctxs
        .iter()
        .zip(&channels)
        .map(|(c, ch)| Link::between(&a, c, ch))
        .collect();
    assert_eq!(
        pci.routed.load(Ordering::SeqCst),
        pool + 1,
        "no vector of its own for any channel"
    );

    // Each channel wakes for its own CQ, through its fd.
    for (k, l) in links.iter().enumerate() {
        l.cq_b.req_notify(false);
        l.message(k as u64);
    }
    epoll_each(
        channels.iter().map(|c| c.as_fd().expect("an eventfd")),
        |k| match channels[k].get_cq_event().unwrap() {
            Some(cq) => {
                assert_eq!(cq.cqn(), links[k].cq_b.cqn(), "channel {k}");
                cq.ack_events(1);
                true
            }
            None => false,
        },
    );
    for (k, l) in links.iter().enumerate() {
        let mut wc = [WorkCompletion::default(); 2];
        assert_eq!(l.cq_b.poll(&mut wc).unwrap(), 1, "context {k}");
        assert_eq!((wc[0].wr_id, wc[0].qp_num), (k as u64, l.qb.qp_num()));
        assert!(channels[k].get_cq_event().unwrap().is_none(), "one event");
    }

    // An RDMA write with a bad key: the responder's QP (context 77's) goes to error, and
    // only that context hears of it.
    let victim = 77;
    let l = &links[victim];
    let bad = RemoteAddr {
        addr: 0,
        rkey: 0x5a5a_5a00,
    };
    l.qa.post_send(&[SendWr::new(1, SendOp::RdmaWrite { remote: bad })
        .sges(&[l.rest.1.sge(0, 16).unwrap()])
        .signaled()])
        .unwrap();
    epoll_each(
        std::iter::once(ctxs[victim].async_fd().expect("an eventfd")),
        |_| match ctxs[victim].get_async_event().unwrap() {
            Some(ev) => {
                assert_eq!(ev.kind, AsyncEventKind::QpAccessErr, "{ev:?}");
                assert_eq!(ev.element, EventElement::Qp(l.qb.qp_num()), "{ev:?}");
                true
            }
            None => false,
        },
    );

    // A port event wakes every context, through its async fd.
    model_b.set_port_active(1, false);
    epoll_each(
        ctxs.iter().map(|c| c.async_fd().expect("an eventfd")),
        |k| match ctxs[k].get_async_event().unwrap() {
            Some(ev) => {
                assert_eq!(ev.kind, AsyncEventKind::PortErr, "context {k}: {ev:?}");
                assert!(
                    !ctxs[k].has_queued_event(AsyncEventKind::QpAccessErr),
                    "context {k}"
                );
                true
            }
            None => false,
        },
    );
    model_b.set_port_active(1, true);
    assert_eq!(threads_named(THREAD), 1);

    // Closing the device (its last user gone) stops the thread.
    drop(links);
    drop(channels);
    drop(ctxs);
    drop(dev_b);
    await_threads(0, "the interrupt thread ends with the device");
}

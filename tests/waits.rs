//! Blocking and awaiting without a platform layer: contexts opened with [`LatchSinks`] on
//! both backends (software device, emulated ConnectX-3 under the mlx4 driver), on a threaded
//! fabric whose engine raises the interrupts. This is the path every OS has, Windows included;
//! the eventfd path is tested in `platform-linux`.

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use portverbs::hal::block_on;
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric};
use portverbs::verbs::{
    AsyncEventKind, ConnectOptions, ContextOptions, LatchSinks, NotifyError, PollingSinks,
    SinkFactory, WaitError,
};

/// Generous: completions come from the engine thread of a shared machine.
const PATIENCE: Duration = Duration::from_secs(20);

#[derive(Clone, Copy, Debug)]
enum Backend {
    Soft,
    Mlx4,
}

/// One fabric with two devices of `backend`, opened with `sinks`.
struct Pair {
    a: Context,
    b: Context,
    ports: Vec<Box<dyn Fn(bool) + Send + Sync>>,
    _models: Vec<portverbs::mlx4_model::Mlx4Model>,
    _fabric: Fabric,
}

impl Pair {
    fn new(backend: Backend, sinks: Arc<dyn SinkFactory>) -> Self {
        let fabric = Fabric::threaded();
        let ips: [IpAddr; 2] = ["10.9.0.1".parse().unwrap(), "10.9.0.2".parse().unwrap()];
        let mut devs = Vec::new();
        let mut ports: Vec<Box<dyn Fn(bool) + Send + Sync>> = Vec::new();
        let mut models = Vec::new();
        for (i, ip) in ips.into_iter().enumerate() {
            match backend {
                Backend::Soft => {
                    let d = portverbs::soft::SoftDevice::attach(&fabric, DeviceConfig::with_ip(ip))
                        .unwrap();
                    let port = d.clone();
                    ports.push(Box::new(move |up| port.set_port_active(1, up)));
                    devs.push(AnyDevice::Soft(d));
                }
                Backend::Mlx4 => {
                    let (model, dev) =
                        portverbs::emulated_mlx4(&fabric, &format!("mlx4_w{i}"), ip).unwrap();
                    let port = model.clone();
                    ports.push(Box::new(move |up| port.set_port_active(1, up)));
                    models.push(model);
                    devs.push(AnyDevice::Mlx4(dev));
                }
            }
        }
        let open = |d: AnyDevice| {
            let opts = ContextOptions {
                sinks: sinks.clone(),
                ..ContextOptions::default()
            };
            Context::open_blocking(d, opts).unwrap()
        };
        let b = open(devs.pop().unwrap());
        let a = open(devs.pop().unwrap());
        Self {
            a,
            b,
            ports,
            _models: models,
            _fabric: fabric,
        }
    }
}

/// A connected RC pair with 4 KiB registered on each side; b's CQ is on `chan` if given.
struct Link {
    qa: Qp,
    qb: Qp,
    cq_b: Cq,
    mr_b: Mr,
    _rest: (Cq, Mr, Pd, Pd),
}

impl Link {
    fn new(p: &Pair, chan: Option<&CompletionChannel>) -> Self {
        Self::between(&p.a, &p.b, chan)
    }

    /// A link from a QP of `a` to one of `b`, whose CQ is on `chan` if given.
    fn between(a: &Context, b: &Context, chan: Option<&CompletionChannel>) -> Self {
        let side = |ctx: &Context, chan: Option<&CompletionChannel>| {
            let pd = ctx.alloc_pd_blocking().unwrap();
            let cq = ctx
                .create_cq_blocking(CqInit {
                    entries: 64,
                    channel: chan,
                    ..CqInit::default()
                })
                .unwrap();
            let qp = pd
                .create_qp_blocking(QpInit {
                    qp_type: QpType::Rc,
                    send_cq: &cq,
                    recv_cq: &cq,
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
                .unwrap();
            let mr = pd
                .reg_vec_blocking(vec![0; 4096], AccessFlags::LOCAL_WRITE)
                .unwrap();
            (pd, cq, qp, mr)
        };
        let (pd_a, cq_a, qa, mr_a) = side(a, None);
        let (pd_b, cq_b, qb, mr_b) = side(b, chan);
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
            _rest: (cq_a, mr_a, pd_a, pd_b),
        }
    }

    /// b posts a receive, a sends to it (unsignaled, inline).
    fn message(&self, wr_id: u64, flags: SendFlags) {
        self.qb
            .post_recv(&[RecvWr {
                wr_id,
                sges: &[self.mr_b.sge(0, 64).unwrap()],
            }])
            .unwrap();
        self.qa
            .post_send(&[SendWr::new(wr_id, SendOp::Send)
                .inline(b"latch")
                .flags(flags)])
            .unwrap();
    }

    fn poll_b(&self, n: usize) -> Vec<WorkCompletion> {
        let deadline = Instant::now() + PATIENCE;
        let mut out = Vec::new();
        let mut wc = [WorkCompletion::default(); 8];
        while out.len() < n {
            let got = self.cq_b.poll(&mut wc).unwrap();
            out.extend_from_slice(&wc[..got]);
            assert!(got > 0 || Instant::now() < deadline, "{} of {n}", out.len());
        }
        out
    }
}

const BACKENDS: [Backend; 2] = [Backend::Soft, Backend::Mlx4];

fn latched(backend: Backend) -> Pair {
    Pair::new(backend, Arc::new(LatchSinks))
}

#[test]
fn channel_wait_returns_the_event_and_times_out_when_idle() {
    for backend in BACKENDS {
        let p = latched(backend);
        let chan = p.b.create_comp_channel().unwrap();
        let l = Link::new(&p, Some(&chan));
        let idle = chan.wait_cq_event(Some(Duration::from_millis(20)));
        assert!(
            matches!(idle, Err(WaitError::TimedOut)),
            "{backend:?}: {idle:?}"
        );
        l.cq_b.req_notify(false);
        l.message(1, SendFlags::empty());
        let got = chan.wait_cq_event(Some(PATIENCE)).unwrap();
        assert_eq!(got.cqn(), l.cq_b.cqn(), "{backend:?}");
        got.ack_events(1);
        assert_eq!(l.poll_b(1)[0].wr_id, 1);
        assert!(
            chan.get_cq_event().unwrap().is_none(),
            "{backend:?}: one arming, one event"
        );
    }
}

/// `next_cq_event` on an executor that knows nothing of the device (the HAL's `block_on`):
/// the latch's wakers are all it has.
#[test]
fn channel_event_awaited_on_any_executor() {
    for backend in BACKENDS {
        let p = latched(backend);
        let chan = p.b.create_comp_channel().unwrap();
        let l = Link::new(&p, Some(&chan));
        l.cq_b.req_notify(false);
        std::thread::scope(|s| {
            let waiter = s.spawn(|| block_on(chan.next_cq_event()));
            std::thread::sleep(Duration::from_millis(5));
            l.message(1, SendFlags::empty());
            let got = waiter.join().unwrap().unwrap();
            assert_eq!(got.cqn(), l.cq_b.cqn(), "{backend:?}");
            got.ack_events(1);
        });
    }
}

/// Two threads sleep on one channel; two CQ events arrive; each thread gets exactly one.
#[test]
fn two_readers_of_one_channel_each_get_one_event() {
    for backend in BACKENDS {
        let p = latched(backend);
        let chan = p.b.create_comp_channel().unwrap();
        let (l1, l2) = (Link::new(&p, Some(&chan)), Link::new(&p, Some(&chan)));
        l1.cq_b.req_notify(false);
        l2.cq_b.req_notify(false);
        let got: HashSet<u32> = std::thread::scope(|s| {
            let readers: Vec<_> = (0..2)
                .map(|_| s.spawn(|| chan.wait_cq_event(Some(PATIENCE)).unwrap()))
                .collect();
            l1.message(1, SendFlags::empty());
            l2.message(2, SendFlags::empty());
            readers
                .into_iter()
                .map(|r| {
                    let cq = r.join().unwrap();
                    cq.ack_events(1);
                    cq.cqn()
                })
                .collect()
        });
        assert_eq!(got, [l1.cq_b.cqn(), l2.cq_b.cqn()].into(), "{backend:?}");
    }
}

#[test]
fn notify_requests_block_and_await_on_channel_and_vector_cqs() {
    for backend in BACKENDS {
        let p = latched(backend);
        let chan = p.b.create_comp_channel().unwrap();
        for l in [Link::new(&p, Some(&chan)), Link::new(&p, None)] {
            let mut req = l.cq_b.notify(NotifyKind::Any);
            let idle = l
                .cq_b
                .wait_notify(&mut req, Some(Duration::from_millis(20)));
            assert!(
                matches!(idle, Err(WaitError::TimedOut)),
                "{backend:?}: {idle:?}"
            );
            l.message(1, SendFlags::empty());
            l.cq_b.wait_notify(&mut req, Some(PATIENCE)).unwrap();
            assert_eq!(l.poll_b(1)[0].wr_id, 1);
            let notified = l.cq_b.notified(NotifyKind::Solicited);
            l.message(2, SendFlags::SOLICITED);
            block_on(notified).unwrap();
            assert_eq!(l.poll_b(1)[0].wr_id, 2, "{backend:?}");
            assert_eq!(
                l.cq_b.unacked_events(),
                0,
                "a notify request is no channel event"
            );
        }
    }
}

#[test]
fn notified_cq_destroyed_is_cancelled() {
    let p = latched(Backend::Soft);
    let cq =
        p.b.create_cq_blocking(CqInit {
            entries: 8,
            ..CqInit::default()
        })
        .unwrap();
    let cqn = cq.cqn();
    let notified = cq.notified(NotifyKind::Any);
    cq.destroy().expect("the future holds no CQ");
    let r = block_on(notified);
    assert!(
        matches!(r, Err(WaitError::Notify(NotifyError::Cancelled { cqn: n })) if n == cqn),
        "{r:?}"
    );
}

#[test]
fn async_events_block_and_await() {
    for backend in BACKENDS {
        let p = latched(backend);
        let idle = p.a.wait_async_event(Some(Duration::from_millis(20)));
        assert!(
            matches!(idle, Err(WaitError::TimedOut)),
            "{backend:?}: {idle:?}"
        );
        (p.ports[0])(false);
        let ev = p.a.wait_async_event(Some(PATIENCE)).unwrap();
        assert_eq!(ev.kind, AsyncEventKind::PortErr, "{backend:?}");
        (p.ports[0])(true);
        let ev = block_on(p.a.next_async_event()).unwrap();
        assert_eq!(ev.kind, AsyncEventKind::PortActive, "{backend:?}");
        assert!(
            p.b.get_async_event().unwrap().is_none(),
            "the other device saw nothing"
        );
    }
}

/// A context opened for polling refuses to block, with a typed error, and never hangs.
#[test]
fn polling_sinks_refuse_to_wait() {
    let p = Pair::new(Backend::Soft, Arc::new(PollingSinks));
    let chan = p.b.create_comp_channel().unwrap();
    let l = Link::new(&p, Some(&chan));
    let unsupported = |r: Result<_, WaitError>| matches!(r, Err(WaitError::Sink(e)) if e.kind() == std::io::ErrorKind::Unsupported);
    assert!(unsupported(chan.wait_cq_event(None).map(drop)));
    assert!(unsupported(block_on(chan.next_cq_event()).map(drop)));
    assert!(unsupported(p.a.wait_async_event(None).map(drop)));
    let mut req = l.cq_b.notify(NotifyKind::Any);
    assert!(unsupported(l.cq_b.wait_notify(&mut req, None)));
    // Reading without waiting still works.
    l.cq_b.req_notify(false);
    l.message(1, SendFlags::empty());
    assert_eq!(l.poll_b(1)[0].wr_id, 1);
    let deadline = Instant::now() + PATIENCE;
    let got = loop {
        if let Some(cq) = chan.get_cq_event().unwrap() {
            break cq;
        }
        assert!(Instant::now() < deadline, "the event never came");
        std::thread::yield_now();
    };
    got.ack_events(1);
}

/// The mlx4 driver shares a fixed pool of completion EQs (one per MSI-X vector) among every
/// context and channel of the device, as Linux's `mlx4_core` does: many more completion
/// channels than vectors each get their own CQ's events, and only those.
#[test]
fn mlx4_completion_channels_outnumber_the_vectors() {
    let p = latched(Backend::Mlx4);
    let vectors = portverbs::mlx4_model::ModelConfig::default().num_vectors as usize;
    let count = vectors * 3;
    let channels: Vec<_> = (0..count)
        .map(|_| p.b.create_comp_channel().unwrap())
        .collect();
    let links: Vec<_> = channels.iter().map(|c| Link::new(&p, Some(c))).collect();
    for (k, l) in links.iter().enumerate().rev() {
        l.cq_b.req_notify(false);
        l.message(k as u64, SendFlags::empty());
    }
    for (k, (chan, l)) in channels.iter().zip(&links).enumerate() {
        let got = chan.wait_cq_event(Some(PATIENCE)).unwrap();
        assert_eq!(got.cqn(), l.cq_b.cqn(), "channel {k}");
        got.ack_events(1);
        assert_eq!(l.poll_b(1)[0].wr_id, k as u64);
    }
    for (k, chan) in channels.iter().enumerate() {
        assert!(
            chan.get_cq_event().unwrap().is_none(),
            "channel {k}: one event"
        );
    }
}

/// 200 contexts on one emulated ConnectX-3 (the HCA has 32 MSI-X vectors): each with a
/// channel, a CQ and an RC QP. Every context's completion reaches its own channel and CQ, an
/// access error at one QP reaches only the context that owns it, and a port event reaches
/// every context.
#[test]
fn mlx4_two_hundred_contexts_share_the_event_queues() {
    const CONTEXTS: usize = 200;
    let p = latched(Backend::Mlx4);
    let opts = || ContextOptions {
        sinks: Arc::new(LatchSinks),
        ..ContextOptions::default()
    };
    let ctxs: Vec<_> = (0..CONTEXTS)
        .map(|_| Context::open_blocking(p.b.device().clone(), opts()).unwrap())
        .collect();
    let channels: Vec<_> = ctxs
        .iter()
        .map(|c| c.create_comp_channel().unwrap())
        .collect();
    let links: Vec<_> = ctxs
        .iter()
        .zip(&channels)
        .map(|(c, ch)| Link::between(&p.a, c, Some(ch)))
        .collect();
    for (k, l) in links.iter().enumerate() {
        l.cq_b.req_notify(false);
        l.message(k as u64, SendFlags::empty());
    }
    for (k, (chan, l)) in channels.iter().zip(&links).enumerate() {
        let got = chan.wait_cq_event(Some(PATIENCE)).unwrap();
        assert_eq!(got.cqn(), l.cq_b.cqn(), "context {k}");
        got.ack_events(1);
        let wcs = l.poll_b(1);
        assert_eq!((wcs[0].wr_id, wcs[0].qp_num), (k as u64, l.qb.qp_num()));
    }
    // An RDMA write with a bad key: the responder's QP (context 137's) goes to error.
    let victim = 137;
    let l = &links[victim];
    let mr_a = &l._rest.1;
    let bad = RemoteAddr {
        addr: 0,
        rkey: 0x5a5a_5a00,
    };
    l.qa.post_send(&[SendWr::new(1, SendOp::RdmaWrite { remote: bad })
        .sges(&[mr_a.sge(0, 16).unwrap()])
        .signaled()])
        .unwrap();
    let ev = ctxs[victim].wait_async_event(Some(PATIENCE)).unwrap();
    assert_eq!(ev.kind, AsyncEventKind::QpAccessErr, "{ev:?}");
    assert_eq!(
        ev.element,
        portverbs::verbs::EventElement::Qp(l.qb.qp_num()),
        "{ev:?}"
    );
    // A port event goes to every context; none but the victim's saw the access error.
    (p.ports[1])(false);
    for (k, c) in ctxs.iter().enumerate() {
        let ev = c.wait_async_event(Some(PATIENCE)).unwrap();
        assert_eq!(ev.kind, AsyncEventKind::PortErr, "context {k}: {ev:?}");
        assert!(
            !c.has_queued_event(AsyncEventKind::QpAccessErr),
            "context {k}"
        );
    }
    (p.ports[1])(true);
    drop(links);
    drop(channels);
    drop(ctxs);
}

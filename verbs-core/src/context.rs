//! An opened device: its cached attributes, its event queues, and the registry that routes
//! device events to the objects they concern.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::future::poll_fn;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use portverbs_hal::caps::{DeviceAttr, GidEntry, PortAttr};
use portverbs_hal::device::{Device, EqKind, EqParams};
use portverbs_hal::event::DeviceEvent;
use portverbs_hal::notify::InterruptSink;
use portverbs_hal::queue::EventQueue;
use portverbs_hal::{BlockingDevice, ObjectCounts, Progress, ProgressAgent, block_on};

use crate::buffer::Buffer;
use crate::cq::CqInner;
use crate::error::WaitError;
use crate::error::{BufferError, EventError, OpenError, PdError, QueryError};
use crate::events::{AsyncEvent, AsyncEventKind};
use crate::pd::Pd;
use crate::sink::{PollingSinks, SinkFactory};
use crate::srq::SrqInner;
use crate::wait::{block_until, manual, poll_until};

/// Locks a mutex, recovering the data if another thread panicked while holding it (every
/// structure here stays consistent between statements that could panic).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How to open a device.
#[derive(Debug, Clone)]
pub struct ContextOptions {
    /// Interrupt sinks for every event queue: the asynchronous one, the completion vectors'
    /// and the completion channels'. [`PollingSinks`] (the default) only polls; blocking and
    /// awaiting need [`crate::LatchSinks`] or the platform's sinks (the `portverbs` facade's
    /// `open` picks them).
    pub sinks: Arc<dyn SinkFactory>,
    /// Entries of each event queue.
    pub eq_entries: u32,
}

impl Default for ContextOptions {
    fn default() -> Self {
        Self {
            sinks: Arc::new(PollingSinks),
            eq_entries: 1024,
        }
    }
}

/// Live objects created through a context (the device keeps its own counts too).
#[derive(Debug, Default)]
pub(crate) struct Counts {
    pub(crate) pds: AtomicUsize,
    pub(crate) mrs: AtomicUsize,
    pub(crate) mws: AtomicUsize,
    pub(crate) cqs: AtomicUsize,
    pub(crate) qps: AtomicUsize,
    pub(crate) srqs: AtomicUsize,
    pub(crate) ahs: AtomicUsize,
    pub(crate) channels: AtomicUsize,
}

/// An event queue and the routing of what comes out of it.
pub(crate) struct EqShared<D: Device> {
    pub(crate) ctx: Weak<ContextInner<D>>,
    pub(crate) dev: Arc<DevHolder<D>>,
    pub(crate) eqn: u32,
    pub(crate) eq: Mutex<Box<dyn EventQueue>>,
    /// Where the EQ's interrupts go, and what its waiters wait on.
    pub(crate) sink: Arc<dyn InterruptSink>,
}

impl<D: Device> fmt::Debug for EqShared<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EqShared").field("eqn", &self.eqn).finish()
    }
}

/// The device, shared by the context and the event queues (which must outlive neither).
pub(crate) struct DevHolder<D: Device> {
    pub(crate) dev: D,
}

impl<D: Device> EqShared<D> {
    pub(crate) fn create(
        ctx: &Arc<ContextInner<D>>,
        kind: EqKind,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Arc<Self>, portverbs_hal::CommandError> {
        Self::create_with(
            Arc::downgrade(ctx),
            &ctx.dev,
            ctx.opts.eq_entries,
            kind,
            sink,
        )
    }

    fn create_with(
        ctx: Weak<ContextInner<D>>,
        dev: &Arc<DevHolder<D>>,
        entries: u32,
        kind: EqKind,
        sink: Arc<dyn InterruptSink>,
    ) -> Result<Arc<Self>, portverbs_hal::CommandError> {
        let eq = dev
            .dev
            .create_eq_blocking(EqParams { entries, kind }, sink.clone())?;
        Ok(Arc::new(Self {
            ctx,
            dev: dev.clone(),
            eqn: eq.eqn(),
            eq: Mutex::new(eq),
            sink,
        }))
    }

    /// Drains the EQ (at most `budget` entries), routes every event, and re-arms it.
    ///
    /// # Errors
    /// The first malformed entry (every other entry was still processed).
    pub(crate) fn process(&self, budget: usize) -> Result<usize, EventError> {
        let ctx = self.ctx.upgrade();
        let mut eq = lock(&self.eq);
        let mut n = 0;
        let mut first_error = None;
        while n < budget {
            match eq.poll_one() {
                Ok(Some(ev)) => {
                    n += 1;
                    if let Some(ctx) = &ctx {
                        ctx.dispatch(ev);
                    }
                    if n % 128 == 0 {
                        eq.publish_ci();
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(eqn = self.eqn, error = %e, "malformed event");
                    first_error.get_or_insert(EventError::BadEvent(e));
                }
            }
        }
        eq.arm();
        match first_error {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }
}

impl<D: Device> Drop for EqShared<D> {
    fn drop(&mut self) {
        if let Err(e) = self.dev.dev.destroy_eq_blocking(self.eqn) {
            tracing::warn!(eqn = self.eqn, error = %e, "destroying an event queue failed");
        }
    }
}

/// Objects events are routed to.
pub(crate) struct Registry<D: Device> {
    pub(crate) cqs: Mutex<HashMap<u32, Weak<CqInner<D>>>>,
    pub(crate) srqs: Mutex<HashMap<u32, Weak<SrqInner<D>>>>,
    /// Numbers of the QPs this context created and has not destroyed.
    pub(crate) qps: Mutex<HashSet<u32>>,
}

/// Shared state of an opened device.
pub(crate) struct ContextInner<D: Device> {
    pub(crate) dev: Arc<DevHolder<D>>,
    pub(crate) name: String,
    pub(crate) attr: DeviceAttr,
    pub(crate) port_attrs: Vec<PortAttr>,
    pub(crate) opts: ContextOptions,
    pub(crate) async_eq: Mutex<Option<Arc<EqShared<D>>>>,
    /// The asynchronous event queue's sink (kept outside `async_eq`, which is emptied first
    /// at drop).
    pub(crate) async_sink: Arc<dyn InterruptSink>,
    pub(crate) vectors: Mutex<Vec<Option<Arc<EqShared<D>>>>>,
    pub(crate) registry: Registry<D>,
    pub(crate) async_events: Mutex<VecDeque<AsyncEvent>>,
    pub(crate) fatal: AtomicBool,
    pub(crate) counts: Counts,
}

/// Oldest events are dropped beyond this many unread ones.
const MAX_QUEUED_EVENTS: usize = 4096;

impl<D: Device> ContextInner<D> {
    pub(crate) fn device(&self) -> &D {
        &self.dev.dev
    }

    /// False for an event about a QP, CQ or SRQ of another context: a device may hand every
    /// context's asynchronous queue all of its events (the mlx4 driver's one asynchronous EQ
    /// does), and each context reports only those of its own objects, as each
    /// `ibv_context` does.
    fn owns(&self, ev: &DeviceEvent) -> bool {
        match *ev {
            DeviceEvent::Qp { qpn, .. } => lock(&self.registry.qps).contains(&qpn),
            DeviceEvent::CqError { cqn, .. } => lock(&self.registry.cqs).contains_key(&cqn),
            DeviceEvent::Srq { srqn, .. } => lock(&self.registry.srqs).contains_key(&srqn),
            _ => true,
        }
    }

    fn dispatch(&self, ev: DeviceEvent) {
        if !self.owns(&ev) {
            return;
        }
        match ev {
            DeviceEvent::Completion { cqn } => {
                if let Some(cq) = self.cq(cqn) {
                    cq.on_completion_event();
                }
            }
            DeviceEvent::CqError { cqn, .. } => {
                if let Some(cq) = self.cq(cqn) {
                    cq.on_error();
                }
            }
            DeviceEvent::Srq { srqn, .. } => {
                if let Some(srq) = lock(&self.registry.srqs).get(&srqn).and_then(Weak::upgrade) {
                    srq.limit_fired();
                }
            }
            DeviceEvent::DeviceFatal => {
                self.fatal.store(true, Ordering::SeqCst);
                let cqs: Vec<_> = lock(&self.registry.cqs)
                    .values()
                    .filter_map(Weak::upgrade)
                    .collect();
                for cq in cqs {
                    cq.on_device_fatal();
                }
            }
            DeviceEvent::CommandDone { token, status, .. } => {
                tracing::debug!(token, status, "command completion event");
            }
            DeviceEvent::Unknown {
                event_type,
                subtype,
            } => {
                tracing::warn!(event_type, subtype, "unknown device event");
            }
            _ => {}
        }
        if let Some(ae) = AsyncEvent::from_device(&ev) {
            let mut q = lock(&self.async_events);
            if q.len() >= MAX_QUEUED_EVENTS {
                q.pop_front();
                tracing::warn!("asynchronous event queue full: oldest event dropped");
            }
            q.push_back(ae);
        }
    }

    pub(crate) fn cq(&self, cqn: u32) -> Option<Arc<CqInner<D>>> {
        lock(&self.registry.cqs).get(&cqn).and_then(Weak::upgrade)
    }

    /// The EQ of completion vector `v`, created on first use.
    pub(crate) fn vector_eq(
        self: &Arc<Self>,
        v: u32,
    ) -> Result<Arc<EqShared<D>>, portverbs_hal::CommandError> {
        let mut vectors = lock(&self.vectors);
        let i = v as usize;
        if vectors.len() <= i {
            vectors.resize(i + 1, None);
        }
        if let Some(eq) = &vectors[i] {
            return Ok(eq.clone());
        }
        let kind = EqKind::Completion { vector: v };
        let eq = EqShared::create(self, kind, self.opts.sinks.sink(kind))?;
        vectors[i] = Some(eq.clone());
        Ok(eq)
    }

    pub(crate) fn ptr_eq(a: &Arc<Self>, b: &Arc<Self>) -> bool {
        Arc::ptr_eq(a, b)
    }
}

/// An opened RDMA device (`struct ibv_context`). Cheap to clone.
pub struct Context<D: Device> {
    pub(crate) inner: Arc<ContextInner<D>>,
}

impl<D: Device> Clone for Context<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for Context<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Context")
            .field("device", &self.inner.name)
            .finish()
    }
}

impl<D: Device> Context<D> {
    /// Opens a device: caches its attributes and creates its asynchronous event queue.
    ///
    /// # Errors
    /// A device command failed.
    pub async fn open(dev: D, opts: ContextOptions) -> Result<Self, OpenError> {
        let name = dev.info().name.clone();
        let wrap = |source| OpenError::Device {
            device: name.clone(),
            source,
        };
        let attr = dev.query_device().await.map_err(wrap)?;
        let mut port_attrs = Vec::new();
        for p in 1..=attr.phys_port_cnt {
            port_attrs.push(dev.query_port(p).await.map_err(wrap)?);
        }
        let sink = opts.sinks.sink(EqKind::Async);
        let inner = Arc::new(ContextInner {
            dev: Arc::new(DevHolder { dev }),
            name: name.clone(),
            attr,
            port_attrs,
            opts,
            async_eq: Mutex::new(None),
            async_sink: sink.clone(),
            vectors: Mutex::new(Vec::new()),
            registry: Registry {
                cqs: Mutex::new(HashMap::new()),
                srqs: Mutex::new(HashMap::new()),
                qps: Mutex::new(HashSet::new()),
            },
            async_events: Mutex::new(VecDeque::new()),
            fatal: AtomicBool::new(false),
            counts: Counts::default(),
        });
        let eq = EqShared::create(&inner, EqKind::Async, sink).map_err(wrap)?;
        *lock(&inner.async_eq) = Some(eq);
        Ok(Self { inner })
    }

    /// Blocking form of [`Context::open`].
    ///
    /// # Errors
    /// As [`Context::open`].
    pub fn open_blocking(dev: D, opts: ContextOptions) -> Result<Self, OpenError> {
        block_on(Self::open(dev, opts))
    }

    /// The device, for the layers above this crate (the CM service, platform crates, tests).
    /// Hidden from the documentation: the device's HAL commands (`modify_qp` …) bypass this
    /// crate's checks and bookkeeping, so an application never calls them on an opened
    /// device; [`Context::name`], [`Context::attr`] and the `query_*` verbs say what it
    /// needs to know.
    #[doc(hidden)]
    pub fn device(&self) -> &D {
        self.inner.device()
    }

    /// Device name (`hca_id`).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Device attributes as read at open.
    pub fn attr(&self) -> &DeviceAttr {
        &self.inner.attr
    }

    /// Queries the device attributes now.
    ///
    /// # Errors
    /// The device refused.
    pub async fn query_device(&self) -> Result<DeviceAttr, QueryError> {
        Ok(self.device().query_device().await?)
    }

    /// Blocking form of [`Context::query_device`].
    ///
    /// # Errors
    /// As [`Context::query_device`].
    pub fn query_device_blocking(&self) -> Result<DeviceAttr, QueryError> {
        block_on(self.query_device())
    }

    fn check_port(&self, port: u8) -> Result<(), QueryError> {
        let count = self.inner.attr.phys_port_cnt;
        if port == 0 || port > count {
            return Err(QueryError::NoSuchPort { port, count });
        }
        Ok(())
    }

    /// Queries a port (numbered from 1).
    ///
    /// # Errors
    /// No such port, or the device refused.
    pub async fn query_port(&self, port: u8) -> Result<PortAttr, QueryError> {
        self.check_port(port)?;
        Ok(self.device().query_port(port).await?)
    }

    /// Blocking form of [`Context::query_port`].
    ///
    /// # Errors
    /// As [`Context::query_port`].
    pub fn query_port_blocking(&self, port: u8) -> Result<PortAttr, QueryError> {
        block_on(self.query_port(port))
    }

    /// Reads one GID-table entry.
    ///
    /// # Errors
    /// No such port, an index beyond the table, an empty entry.
    pub async fn query_gid(&self, port: u8, index: u32) -> Result<GidEntry, QueryError> {
        self.check_port(port)?;
        let len = self.inner.port_attrs[usize::from(port) - 1].gid_tbl_len;
        if index >= len {
            return Err(QueryError::IndexOutOfRange {
                table: "GID",
                index,
                len,
            });
        }
        match self.device().query_gid(port, index).await {
            Ok(e) if !e.gid.is_zero() => Ok(e),
            Ok(_) | Err(portverbs_hal::CommandError::NoSuchObject { .. }) => {
                Err(QueryError::EmptyGid { port, index })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Blocking form of [`Context::query_gid`].
    ///
    /// # Errors
    /// As [`Context::query_gid`].
    pub fn query_gid_blocking(&self, port: u8, index: u32) -> Result<GidEntry, QueryError> {
        block_on(self.query_gid(port, index))
    }

    /// Every non-empty GID-table entry of a port, with its index.
    ///
    /// # Errors
    /// No such port, or the device refused.
    pub async fn gid_table(&self, port: u8) -> Result<Vec<(u32, GidEntry)>, QueryError> {
        self.check_port(port)?;
        let len = self.inner.port_attrs[usize::from(port) - 1].gid_tbl_len;
        let mut out = Vec::new();
        for i in 0..len {
            match self.query_gid(port, i).await {
                Ok(e) => out.push((i, e)),
                Err(QueryError::EmptyGid { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// Blocking form of [`Context::gid_table`].
    ///
    /// # Errors
    /// As [`Context::gid_table`].
    pub fn gid_table_blocking(&self, port: u8) -> Result<Vec<(u32, GidEntry)>, QueryError> {
        block_on(self.gid_table(port))
    }

    /// The IP addresses of a port: those its RoCEv2 GIDs stand for (`Gid::to_ip`), in
    /// GID-table order, without repeats. What `rdma_cm` would bind to on this port; empty
    /// on a port whose table holds only InfiniBand (RoCEv1) GIDs.
    ///
    /// # Errors
    /// As [`Context::gid_table`].
    pub async fn port_ips(&self, port: u8) -> Result<Vec<std::net::IpAddr>, QueryError> {
        let mut ips = Vec::new();
        for (_, e) in self.gid_table(port).await? {
            let ip = e.gid.to_ip();
            if e.gid_type == portverbs_hal::caps::GidType::RoceV2 && !ips.contains(&ip) {
                ips.push(ip);
            }
        }
        Ok(ips)
    }

    /// Blocking form of [`Context::port_ips`].
    ///
    /// # Errors
    /// As [`Context::gid_table`].
    pub fn port_ips_blocking(&self, port: u8) -> Result<Vec<std::net::IpAddr>, QueryError> {
        block_on(self.port_ips(port))
    }

    /// Reads a P_Key-table entry.
    ///
    /// # Errors
    /// No such port or index.
    pub async fn query_pkey(&self, port: u8, index: u16) -> Result<u16, QueryError> {
        self.check_port(port)?;
        let len = u32::from(self.inner.port_attrs[usize::from(port) - 1].pkey_tbl_len);
        if u32::from(index) >= len {
            return Err(QueryError::IndexOutOfRange {
                table: "P_Key",
                index: u32::from(index),
                len,
            });
        }
        Ok(self.device().query_pkey(port, index).await?)
    }

    /// Blocking form of [`Context::query_pkey`].
    ///
    /// # Errors
    /// As [`Context::query_pkey`].
    pub fn query_pkey_blocking(&self, port: u8, index: u16) -> Result<u16, QueryError> {
        block_on(self.query_pkey(port, index))
    }

    /// Allocates a protection domain.
    ///
    /// # Errors
    /// The device refused.
    pub async fn alloc_pd(&self) -> Result<Pd<D>, PdError> {
        Pd::alloc(&self.inner).await
    }

    /// Blocking form of [`Context::alloc_pd`].
    ///
    /// # Errors
    /// As [`Context::alloc_pd`].
    pub fn alloc_pd_blocking(&self) -> Result<Pd<D>, PdError> {
        block_on(self.alloc_pd())
    }

    /// Allocates `len` bytes of memory the device can reach (to register as MRs). The memory is
    /// reached only by copying in and out ([`Buffer::write`], [`Buffer::read`]): the device may
    /// write it at any time, so no Rust reference to it is ever handed out.
    ///
    /// # Errors
    /// Zero length, or the device could not provide it.
    pub fn alloc_buffer(&self, len: usize) -> Result<Buffer, BufferError> {
        if len == 0 {
            return Err(BufferError::Empty);
        }
        let mem = self.device().alloc_dma(len)?;
        Ok(Buffer::new(
            mem,
            Arc::as_ptr(&self.inner) as *const () as usize,
        ))
    }

    /// Processes the asynchronous and completion-vector event queues: routes completion
    /// events to CQ notify requests and queues asynchronous events. Returns how many events
    /// were handled. A device in manual progress is dispatched first ([`Context::dispatch`]).
    ///
    /// # Errors
    /// A malformed event was skipped.
    pub fn process_events(&self) -> Result<usize, EventError> {
        self.process_events_timed().map(|(n, _)| n)
    }

    /// [`Context::process_events`], also returning when a manual-progress device next has
    /// timed work (what its dispatch returned: a wait of the caller's should end then).
    ///
    /// # Errors
    /// As [`Context::process_events`].
    pub fn process_events_timed(&self) -> Result<(usize, Option<Instant>), EventError> {
        let next = manual(self.device()).and_then(|dev| dev.dispatch());
        let mut n = 0;
        let async_eq = lock(&self.inner.async_eq).clone();
        if let Some(eq) = async_eq {
            n += eq.process(usize::MAX)?;
        }
        let vectors: Vec<_> = lock(&self.inner.vectors)
            .iter()
            .flatten()
            .cloned()
            .collect();
        for eq in vectors {
            n += eq.process(usize::MAX)?;
        }
        Ok((n, next))
    }

    /// The next asynchronous event, if any (`ibv_get_async_event` on a nonblocking fd): clears
    /// the asynchronous event queue's sink, processes the queue, and takes the oldest event.
    /// Unlike libibverbs there is nothing to acknowledge: events name objects by number.
    /// Processing it also completes the notify requests of CQs in error and of a failed device
    /// ([`crate::NotifyKind::Errors`]), so an application waiting for those reads these
    /// events too (or calls [`Context::process_events`]).
    ///
    /// # Errors
    /// A malformed event was skipped (call again), or the sink failed.
    pub fn get_async_event(&self) -> Result<Option<AsyncEvent>, WaitError> {
        let sink = self.async_sink();
        sink.clear().map_err(WaitError::Sink)?;
        if let Some(dev) = manual(self.device()) {
            dev.dispatch();
        }
        self.look_async_event()
    }

    /// Blocks until an asynchronous event arrives (`ibv_get_async_event` on a blocking fd).
    /// `None` waits for ever.
    ///
    /// # Errors
    /// [`WaitError::TimedOut`]; [`WaitError::Sink`] when the context's sinks cannot block;
    /// otherwise as [`Context::get_async_event`].
    pub fn wait_async_event(&self, timeout: Option<Duration>) -> Result<AsyncEvent, WaitError> {
        let dev = manual(self.device());
        block_until(dev, &*self.async_sink(), timeout, || {
            self.look_async_event()
        })
    }

    /// Waits for the next asynchronous event without blocking the thread.
    ///
    /// # Errors
    /// [`WaitError::Sink`] when the context's sinks cannot be awaited; otherwise as
    /// [`Context::get_async_event`].
    pub async fn next_async_event(&self) -> Result<AsyncEvent, WaitError> {
        let sink = self.async_sink();
        let dev = manual(self.device());
        poll_fn(|cx| poll_until(dev, &*sink, cx, |_| self.look_async_event())).await
    }

    /// The pollable fd of the asynchronous event queue (`ibv_context::async_fd`), when the
    /// context's sinks have one: readable when an event may be waiting. Read it with
    /// [`Context::get_async_event`] until `None`; the fd is signalled again whenever an event
    /// is left behind, so edge-triggered pollers miss nothing.
    #[cfg(unix)]
    pub fn async_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.inner.async_sink.as_fd()
    }

    /// The sink of completion vector `vector`'s event queue, once a CQ created without a
    /// channel made it. With the Linux platform's sinks its fd
    /// ([`InterruptSink::as_fd`]) polls readable when one of those CQs may have completed a
    /// notify request; [`Context::process_events`] then delivers it.
    pub fn vector_sink(&self, vector: u32) -> Option<Arc<dyn InterruptSink>> {
        lock(&self.inner.vectors)
            .get(vector as usize)
            .and_then(Option::as_ref)
            .map(|eq| eq.sink.clone())
    }

    fn async_sink(&self) -> Arc<dyn InterruptSink> {
        self.inner.async_sink.clone()
    }

    /// Processes the asynchronous event queue and takes one event; raises the sink again when
    /// more are queued or the queue held a malformed event.
    fn look_async_event(&self) -> Result<Option<AsyncEvent>, WaitError> {
        let async_eq = lock(&self.inner.async_eq).clone();
        if let Some(eq) = async_eq {
            if let Err(e) = eq.process(usize::MAX) {
                self.inner.async_sink.raise();
                return Err(e.into());
            }
        }
        let mut q = lock(&self.inner.async_events);
        let ev = q.pop_front();
        if !q.is_empty() {
            self.inner.async_sink.raise();
        }
        Ok(ev)
    }

    /// Who makes the device progress ([`Progress`]): its own thread or hardware (auto), or
    /// this application's calls (manual: every poll, wait, await and [`Context::dispatch`]
    /// drives it).
    pub fn progress(&self) -> Progress {
        self.device().info().progress
    }

    /// Manual progress: does on this thread what the device has due — receives, runs the
    /// transport and its timers, sends, runs the attached agents — and returns when it next
    /// has timed work (call again then, or wait: waits do this themselves). For an
    /// application that has nothing to poll or wait for but must keep a device's peers
    /// answered. Auto: nothing to do, `None`.
    pub fn dispatch(&self) -> Option<Instant> {
        self.device().dispatch()
    }

    /// Asks the device to run `agent` whenever it progresses: on its progress thread (auto),
    /// inside this application's calls (manual). The device holds it weakly — dropping the
    /// last `Arc` detaches it. False when the device cannot (no progress of its own: a
    /// stepped test fabric, hardware behind VFIO); the caller then drives its work itself.
    pub fn attach_agent(&self, agent: &Arc<dyn ProgressAgent>) -> bool {
        self.device().attach_agent(Arc::downgrade(agent))
    }

    /// True after the device reported a fatal error.
    pub fn is_fatal(&self) -> bool {
        self.inner.fatal.load(Ordering::Acquire)
    }

    /// Live objects created through this context.
    pub fn object_counts(&self) -> ObjectCounts {
        let c = &self.inner.counts;
        let l = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        ObjectCounts {
            pds: l(&c.pds),
            mrs: l(&c.mrs),
            mws: l(&c.mws),
            cqs: l(&c.cqs),
            qps: l(&c.qps),
            srqs: l(&c.srqs),
            ahs: l(&c.ahs),
            channels: l(&c.channels),
            ..ObjectCounts::default()
        }
    }

    /// True when an asynchronous event of `kind` is queued (for tests and diagnostics).
    pub fn has_queued_event(&self, kind: AsyncEventKind) -> bool {
        lock(&self.inner.async_events)
            .iter()
            .any(|e| e.kind == kind)
    }
}

impl<D: Device> Drop for ContextInner<D> {
    fn drop(&mut self) {
        // Event queues go before the device (their Drop issues destroy_eq).
        lock(&self.vectors).clear();
        lock(&self.async_eq).take();
        // Every object of the context is gone; what its QPs owe their peers leaves now.
        self.dev.dev.flush_owed();
    }
}

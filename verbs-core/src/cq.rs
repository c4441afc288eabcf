//! Completion queues: create, resize, destroy, batched poll, and notification (NetworkDirect
//! requests and libibverbs `req_notify_cq` with completion channels).
//!
//! Polling takes only this CQ's own lock (plus, for SRQ receives, the SRQ's). Every field of a
//! device CQE that the core uses is checked: the QP must be attached to this CQ and the WQE index
//! must name an outstanding work request. A poll stops at an entry that fails (it is consumed);
//! the completions before it are returned and the error comes with the next poll (or at once
//! when there were none), after which polling carries on with the next entry.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use portverbs_hal::device::{CqParams, Device};
use portverbs_hal::error::CqeError;
use portverbs_hal::queue::{CompletionQueue, SharedRecvQueue};
use portverbs_hal::wc::{Cqe, WqeRef};
use portverbs_hal::{BlockingDevice, block_on};

use crate::channel::{ChannelInner, CompletionChannel};
use crate::context::{Context, ContextInner, EqShared, lock};
use crate::error::{CqError, EventError, NotifyError, PollError, Refused};
use crate::notify::{NotifyKind, NotifyRequest, Request};
use crate::shared::QpShared;
use crate::wc::WorkCompletion;

/// How to create a CQ.
#[derive(Debug)]
pub struct CqInit<'a, D: Device> {
    /// Minimum entries.
    pub entries: u32,
    /// Completion vector (event queue) for its events.
    pub comp_vector: u32,
    /// Channel that receives its completion events (`ibv_create_cq`'s channel).
    pub channel: Option<&'a CompletionChannel<D>>,
}

impl<D: Device> Default for CqInit<'_, D> {
    fn default() -> Self {
        Self {
            entries: 0,
            comp_vector: 0,
            channel: None,
        }
    }
}

pub(crate) struct PollState<C, S> {
    pub(crate) hw: C,
    pub(crate) qps: QpTable<S>,
    /// Completions taken out of the ring while cleaning up after a destroyed or reset QP.
    backlog: VecDeque<WorkCompletion>,
    pending_error: Option<PollError>,
}

/// The QPs attached to a CQ, by number, with the last one looked up.
pub(crate) struct QpTable<S> {
    by_qpn: HashMap<u32, Arc<QpShared<S>>>,
    last: Option<Arc<QpShared<S>>>,
}

impl<S: SharedRecvQueue> QpTable<S> {
    fn new() -> Self {
        Self {
            by_qpn: HashMap::new(),
            last: None,
        }
    }

    pub(crate) fn insert(&mut self, qp: Arc<QpShared<S>>) {
        self.by_qpn.insert(qp.qpn, qp);
    }

    pub(crate) fn remove(&mut self, qpn: u32) {
        self.by_qpn.remove(&qpn);
        if self.last.as_ref().is_some_and(|q| q.qpn == qpn) {
            self.last = None;
        }
    }

    #[inline(always)]
    fn lookup(&mut self, qpn: u32) -> Option<&QpShared<S>> {
        // Completions come in runs of one QP: remember the last one (no reference count is
        // touched on a hit).
        match &self.last {
            Some(q) if q.qpn == qpn => self.last.as_deref(),
            _ => self.lookup_slow(qpn),
        }
    }

    #[cold]
    fn lookup_slow(&mut self, qpn: u32) -> Option<&QpShared<S>> {
        self.last = Some(self.by_qpn.get(&qpn)?.clone());
        self.last.as_deref()
    }

    /// Resolves a completion the device decoded in place: checks that its QP is attached to
    /// this CQ and that `r` names an outstanding work request, retires it (and, for a send,
    /// the unsignaled ones before it) and fills in `wr_id`. False when it is refused;
    /// [`QpTable::refusal`] then names the reason, off the hot path.
    #[inline(always)]
    fn resolve(&mut self, w: &mut WorkCompletion, r: WqeRef) -> bool {
        let Some(qp) = self.lookup(w.qp_num) else {
            return false;
        };
        let wr_id = if r.is_send {
            qp.sq.retire_through(r.index)
        } else if let Some(srq) = &qp.srq {
            srq.complete(u32::from(r.index))
        } else {
            qp.rq.as_ref().and_then(|rq| rq.retire_next())
        };
        match wr_id {
            Some(id) => {
                w.wr_id = id;
                true
            }
            None => false,
        }
    }

    /// Why [`QpTable::resolve`] refused a completion of `qpn` referring to `r`: its QP is
    /// unknown, or `r` names no outstanding work request.
    #[cold]
    fn refusal(&mut self, qpn: u32, r: WqeRef, cqn: u32) -> CqeError {
        if self.lookup(qpn).is_none() {
            CqeError::UnknownQp { cqn, index: 0, qpn }
        } else {
            CqeError::BadWqeIndex {
                cqn,
                index: 0,
                qpn,
                wqe_index: u32::from(r.index),
            }
        }
    }

    /// Maps a device CQE to a work completion, retiring the WQEs it covers.
    fn complete(&mut self, cqe: Cqe, cqn: u32) -> Result<WorkCompletion, CqeError> {
        let Cqe { wc: mut w, wqe: r } = cqe;
        if self.resolve(&mut w, r) {
            Ok(w)
        } else {
            Err(self.refusal(w.qp_num, r, cqn))
        }
    }
}

impl<C: CompletionQueue, S: SharedRecvQueue> PollState<C, S> {
    /// Moves every unpolled completion into the backlog, dropping those of `qpn`, whose QP is
    /// being destroyed or reset (mlx4's "CQ clean").
    pub(crate) fn clean(&mut self, qpn: u32, cqn: u32) {
        loop {
            match self.hw.poll_one() {
                Ok(Some(cqe)) if cqe.wc.qp_num == qpn => {}
                Ok(Some(cqe)) => match self.qps.complete(cqe, cqn) {
                    Ok(w) => self.backlog.push_back(w),
                    Err(e) => {
                        self.pending_error.get_or_insert(e.into());
                    }
                },
                Ok(None) => break,
                Err(e) => {
                    self.pending_error.get_or_insert(e.into());
                    break;
                }
            }
        }
        self.hw.publish_ci();
        self.backlog.retain(|w| w.qp_num != qpn);
    }
}

#[derive(Debug, Default)]
struct NotifyState {
    waiters: Vec<Arc<Request>>,
    /// The hardware is armed (`Some(solicited_only)`).
    armed: Option<bool>,
    /// `req_notify` was called: the next event goes to the channel.
    channel_armed: bool,
    error: bool,
    fatal: bool,
}

pub(crate) struct CqInner<D: Device> {
    pub(crate) ctx: Arc<ContextInner<D>>,
    pub(crate) cqn: u32,
    pub(crate) eq: Arc<EqShared<D>>,
    pub(crate) poll: parking_lot::Mutex<PollState<D::Cq, D::Srq>>,
    notify: Mutex<NotifyState>,
    pub(crate) channel: Option<Weak<ChannelInner<D>>>,
    reported: AtomicU64,
    acked: AtomicU64,
    depth: AtomicU32,
    /// The device reported this CQ in error (CQ_ERR event): once its ring is drained, polls
    /// fail. Devices that stop writing a CQ without marking the ring itself rely on this.
    overrun: std::sync::atomic::AtomicBool,
    /// The device progresses only inside calls: every poll dispatches it first.
    manual: bool,
}

/// A completion queue (`struct ibv_cq`). Cheap to clone; QPs using it hold a reference.
pub struct Cq<D: Device> {
    pub(crate) inner: Arc<CqInner<D>>,
}

impl<D: Device> Clone for Cq<D> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<D: Device> fmt::Debug for Cq<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cq")
            .field("cqn", &self.inner.cqn)
            .field("depth", &self.depth())
            .finish()
    }
}

impl<D: Device> Context<D> {
    /// Creates a completion queue (`ibv_create_cq`).
    ///
    /// # Errors
    /// Size outside `1..=max_cqe`, a vector beyond `num_comp_vectors`, a channel of another
    /// device, or the device refused.
    pub async fn create_cq(&self, init: CqInit<'_, D>) -> Result<Cq<D>, CqError> {
        let ctx = &self.inner;
        let max = ctx.attr.max_cqe;
        if init.entries == 0 || init.entries > max {
            return Err(CqError::BadSize {
                requested: init.entries,
                max,
            });
        }
        let count = ctx.attr.num_comp_vectors;
        if init.comp_vector >= count {
            return Err(CqError::BadVector {
                vector: init.comp_vector,
                count,
            });
        }
        let eq = match init.channel {
            Some(ch) => {
                if !ContextInner::ptr_eq(&ch.inner.ctx, ctx) {
                    return Err(CqError::ForeignChannel);
                }
                ch.inner.eq.clone()
            }
            None => ctx.vector_eq(init.comp_vector)?,
        };
        let hw = ctx
            .device()
            .create_cq(CqParams {
                entries: init.entries,
                eqn: eq.eqn,
            })
            .await?;
        let cqn = hw.cqn();
        let depth = hw.depth();
        let inner = Arc::new(CqInner {
            ctx: ctx.clone(),
            cqn,
            eq,
            poll: parking_lot::Mutex::new(PollState {
                hw,
                qps: QpTable::new(),
                backlog: VecDeque::new(),
                pending_error: None,
            }),
            notify: Mutex::new(NotifyState::default()),
            channel: init.channel.map(|c| Arc::downgrade(&c.inner)),
            reported: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            depth: AtomicU32::new(depth),
            overrun: std::sync::atomic::AtomicBool::new(false),
            manual: crate::wait::manual(ctx.device()).is_some(),
        });
        lock(&ctx.registry.cqs).insert(cqn, Arc::downgrade(&inner));
        ctx.counts.cqs.fetch_add(1, Ordering::Relaxed);
        Ok(Cq { inner })
    }

    /// Blocking form of [`Context::create_cq`].
    ///
    /// # Errors
    /// As [`Context::create_cq`].
    pub fn create_cq_blocking(&self, init: CqInit<'_, D>) -> Result<Cq<D>, CqError> {
        block_on(self.create_cq(init))
    }
}

impl<D: Device> Cq<D> {
    /// The device's CQ number.
    pub fn cqn(&self) -> u32 {
        self.inner.cqn
    }

    /// The event queue this CQ reports its completion events to.
    pub fn eqn(&self) -> u32 {
        self.inner.eq.eqn
    }

    /// Usable entries (≥ what was asked for).
    pub fn depth(&self) -> u32 {
        self.inner.depth.load(Ordering::Relaxed)
    }

    /// Polls up to `wc.len()` completions (`ibv_poll_cq`); returns how many were written. On a
    /// device in manual progress it first dispatches the device ([`Context::dispatch`]):
    /// polling any CQ of a device makes the whole device progress.
    ///
    /// # Errors
    /// A malformed device entry (reported once, after the good completions before it were
    /// returned; polling may continue), or the CQ is in error.
    pub fn poll(&self, wc: &mut [WorkCompletion]) -> Result<usize, PollError> {
        if self.inner.manual {
            // Polling any CQ of a manual device makes the whole device progress, before this
            // CQ's lock is taken (the agents the dispatch runs poll CQs of their own).
            self.dispatch();
        }
        let mut g = self.inner.poll.lock();
        if let Some(e) = g.pending_error.take() {
            return Err(e);
        }
        let mut n = 0;
        while n < wc.len() {
            let Some(w) = g.backlog.pop_front() else {
                break;
            };
            wc[n] = w;
            n += 1;
        }
        // One loop over the ring, in the backend: it decodes each entry into its slot of `wc`
        // and this closure resolves it to its `wr_id` (both inline for a known backend).
        let g = &mut *g;
        let mut refused = None;
        let (got, bad) = g.hw.poll_with(
            &mut wc[n..],
            #[cfg_attr(not(portverbs_split), inline(always))]
            #[cfg_attr(portverbs_split, inline(never))]
            |w, r| {
                g.qps.resolve(w, r) || {
                    refused = Some(g.qps.refusal(w.qp_num, r, self.inner.cqn));
                    false
                }
            },
        );
        n += got;
        if let Some(e) = refused.or(bad) {
            g.pending_error = Some(e.into());
        }
        if n == 0 {
            if let Some(e) = g.pending_error.take() {
                return Err(e);
            }
            if self.inner.overrun.load(Ordering::Acquire) {
                return Err(PollError::BadCompletion(CqeError::CqInError {
                    cqn: self.inner.cqn,
                }));
            }
        }
        Ok(n)
    }

    #[cold]
    #[inline(never)]
    fn dispatch(&self) {
        self.inner.ctx.device().dispatch();
    }

    /// Arms the CQ so that its next completion (or, with `solicited_only`, its next solicited
    /// or error completion) delivers one event to its completion channel
    /// (`ibv_req_notify_cq`).
    pub fn req_notify(&self, solicited_only: bool) {
        let mut n = lock(&self.inner.notify);
        n.channel_armed = true;
        self.arm_locked(&mut n, solicited_only);
    }

    /// Requests a notification with NetworkDirect semantics (see [`crate::notify`]).
    pub fn notify(&self, kind: NotifyKind) -> NotifyRequest {
        let mut n = lock(&self.inner.notify);
        let cqn = self.inner.cqn;
        if n.fatal {
            return NotifyRequest {
                req: Request::done(kind, Err(NotifyError::DeviceFatal)),
            };
        }
        if n.error {
            return NotifyRequest {
                req: Request::done(kind, Err(NotifyError::CqError { cqn })),
            };
        }
        // Forget requests nobody waits for any more.
        n.waiters.retain(|r| Arc::strong_count(r) > 1);
        let req = Request::new(kind);
        n.waiters.push(req.clone());
        match kind {
            NotifyKind::Any => self.arm_locked(&mut n, false),
            NotifyKind::Solicited => self.arm_locked(&mut n, true),
            NotifyKind::Errors => {}
        }
        NotifyRequest { req }
    }

    /// Arms the hardware, upgrading a solicited-only arming to "any" if asked.
    fn arm_locked(&self, n: &mut NotifyState, solicited_only: bool) {
        let want = match n.armed {
            Some(cur) => cur && solicited_only,
            None => solicited_only,
        };
        if n.armed == Some(want) {
            return;
        }
        n.armed = Some(want);
        self.inner.poll.lock().hw.arm(want);
    }

    /// Processes the event queue this CQ reports to (completes notify requests, queues channel
    /// events). Useful when no platform layer drives the interrupts.
    ///
    /// # Errors
    /// A malformed event was skipped.
    pub fn process_events(&self) -> Result<usize, EventError> {
        self.inner.eq.process(usize::MAX)
    }

    /// An event for this CQ was handed to the application (`ibv_get_cq_event`).
    pub(crate) fn event_read(&self) {
        self.inner.reported.fetch_add(1, Ordering::AcqRel);
    }

    /// Acknowledges `n` completion events read from the channel (`ibv_ack_cq_events`).
    pub fn ack_events(&self, n: u32) {
        self.inner.acked.fetch_add(u64::from(n), Ordering::AcqRel);
    }

    /// Events read from the channel and not acknowledged.
    pub fn unacked_events(&self) -> u64 {
        self.inner
            .reported
            .load(Ordering::Acquire)
            .saturating_sub(self.inner.acked.load(Ordering::Acquire))
    }

    /// Resizes the CQ, keeping unpolled completions (`ibv_resize_cq`).
    ///
    /// # Errors
    /// Size outside `1..=max_cqe`, fewer entries than unpolled completions, or the device
    /// refused.
    pub async fn resize(&self, entries: u32) -> Result<(), CqError> {
        let max = self.inner.ctx.attr.max_cqe;
        if entries == 0 || entries > max {
            return Err(CqError::BadSize {
                requested: entries,
                max,
            });
        }
        let ctx = self.inner.ctx.clone();
        let mut g = self.inner.poll.lock();
        let pending = g.backlog.len() as u32 + g.hw.pending();
        if pending > entries {
            return Err(CqError::ResizeBelowPending {
                cqn: self.inner.cqn,
                pending,
                requested: entries,
            });
        }
        // The command runs with the poll lock held: nobody may poll a ring being replaced.
        ctx.device()
            .resize_cq_blocking(&mut g.hw, entries)
            .map_err(CqError::Device)?;
        self.inner.depth.store(g.hw.depth(), Ordering::Relaxed);
        Ok(())
    }

    /// Blocking form of [`Cq::resize`].
    ///
    /// # Errors
    /// As [`Cq::resize`].
    pub fn resize_blocking(&self, entries: u32) -> Result<(), CqError> {
        block_on(self.resize(entries))
    }

    /// Destroys the CQ now (`ibv_destroy_cq`). Refused while QPs or other handles use it, or
    /// while channel events are unacknowledged; the handle is given back.
    ///
    /// # Errors
    /// [`CqError::Busy`] or [`CqError::UnackedEvents`], with the CQ handed back.
    pub fn destroy(self) -> Result<(), Refused<Self, CqError>> {
        let unacked = self.unacked_events();
        if unacked > 0 {
            let cqn = self.inner.cqn;
            return Err(Refused::new(CqError::UnackedEvents { cqn, unacked }, self));
        }
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => {
                drop(inner);
                Ok(())
            }
            Err(inner) => {
                let users = Arc::strong_count(&inner) - 1;
                let cqn = inner.cqn;
                Err(Refused::new(CqError::Busy { cqn, users }, Self { inner }))
            }
        }
    }

    pub(crate) fn ctx(&self) -> &Arc<ContextInner<D>> {
        &self.inner.ctx
    }
}

impl<D: Device> CqInner<D> {
    /// The device reported a completion event for this CQ.
    pub(crate) fn on_completion_event(self: &Arc<Self>) {
        let (done, to_channel) = {
            let mut n = lock(&self.notify);
            self.poll.lock().hw.event_delivered();
            n.armed = None;
            let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut n.waiters)
                .into_iter()
                .partition(|r| r.kind != NotifyKind::Errors);
            n.waiters = keep;
            (done, std::mem::take(&mut n.channel_armed))
        };
        for r in done {
            r.complete(Ok(()));
        }
        if to_channel {
            if let Some(ch) = self.channel.as_ref().and_then(Weak::upgrade) {
                ch.push(Arc::downgrade(self));
            }
        }
    }

    /// The CQ overflowed or failed: every request completes with an error.
    pub(crate) fn on_error(&self) {
        self.overrun.store(true, Ordering::Release);
        let waiters = {
            let mut n = lock(&self.notify);
            n.error = true;
            std::mem::take(&mut n.waiters)
        };
        for r in waiters {
            r.complete(Err(NotifyError::CqError { cqn: self.cqn }));
        }
    }

    /// The device failed.
    pub(crate) fn on_device_fatal(&self) {
        let waiters = {
            let mut n = lock(&self.notify);
            n.fatal = true;
            std::mem::take(&mut n.waiters)
        };
        for r in waiters {
            r.complete(Err(NotifyError::DeviceFatal));
        }
    }
}

impl<D: Device> Drop for CqInner<D> {
    fn drop(&mut self) {
        let waiters = std::mem::take(&mut lock(&self.notify).waiters);
        for r in waiters {
            r.complete(Err(NotifyError::Cancelled { cqn: self.cqn }));
        }
        lock(&self.ctx.registry.cqs).remove(&self.cqn);
        self.ctx.counts.cqs.fetch_sub(1, Ordering::Relaxed);
        if let Err(e) = self.ctx.device().destroy_cq_blocking(self.cqn) {
            tracing::warn!(cqn = self.cqn, error = %e, "destroying a CQ failed");
        }
    }
}

//! The requests in flight on one opened device, and how each completes: its OVERLAPPED gets
//! the final status, then its event is signalled and its packet queued on the device's
//! completion port, or an APC is queued to the thread that made it. Everything happens on
//! the thread that makes progress (the application's own call), never on a thread of ours.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context as TaskContext, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use portverbs_hal::device::Device;
use portverbs_verbs::{Context, Cq, EventQueueRef, NotifyKind, NotifyRequest};

use crate::error::RequestError;
use crate::event::WaitOutcome;
use crate::overlapped::{Overlapped, notify_status, status};
use crate::port::{CompletionPort, Packet};
use crate::sinks::{Doorbell, WindowsSinks};
use crate::sys::{self, Handle};
use crate::timer::{Alarm, TimerList};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

type ApcFn = Box<dyn FnOnce(Result<(), RequestError>) + Send>;

/// Where a finished request is announced, besides its OVERLAPPED.
enum Route {
    /// The OVERLAPPED's event (if any) and, unless its low bit is set, the device's port.
    Standard,
    /// An APC to the requesting thread (the OVERLAPPED's event is signalled too).
    Apc { thread: Handle, f: ApcFn },
}

type OpFuture = Pin<Box<dyn Future<Output = i32> + Send>>;

/// What a request waits for.
enum Work {
    /// A CQ notify request.
    Notify(NotifyRequest),
    /// An asynchronous operation: its future resolves to the final NTSTATUS.
    Op(OpFuture),
    Done,
}

struct Pending<D: Device> {
    ov: Overlapped,
    route: Mutex<Option<Route>>,
    work: Mutex<Work>,
    /// The event queue that completes a notify request (`None` for an operation).
    eq: Option<EventQueueRef<D>>,
    /// An operation's waker fired: poll it at the next dispatch.
    ready: AtomicBool,
    shared: Weak<Shared<D>>,
}

struct Shared<D: Device> {
    doorbell: Arc<Doorbell>,
    pending: Mutex<HashMap<usize, Arc<Pending<D>>>>,
    removed: AtomicBool,
    /// A manual-progress device's next timer, as the last progress learnt it.
    alarm: Alarm,
}

impl<D: Device> Shared<D> {
    /// Completes `p` with `nt` (first completion wins): status into the OVERLAPPED, then its
    /// event, then its packet or APC.
    fn deliver(&self, p: &Arc<Pending<D>>, nt: i32) {
        let Some(route) = lock(&p.route).take() else {
            return;
        };
        let key = p.ov.as_ptr() as usize;
        {
            let mut table = lock(&self.pending);
            if table.get(&key).is_some_and(|q| Arc::ptr_eq(q, p)) {
                table.remove(&key);
            }
        }
        // Drop the future or the notify request (and the event queue) outside any lock.
        let work = std::mem::replace(&mut *lock(&p.work), Work::Done);
        drop(work);
        p.ov.finish(nt, 0);
        match route {
            Route::Standard => {
                if !p.ov.is_event_only() {
                    if let Some((port, key)) = self.doorbell.port.get() {
                        self.doorbell.keep(port.post(*key, p.ov.as_ptr(), 0));
                    }
                }
            }
            Route::Apc { thread, f } => {
                let r = RequestError::check(nt);
                self.doorbell
                    .keep(sys::queue_apc(&thread, Box::new(move || f(r))));
            }
        }
    }
}

/// Wakes a pending request: a notify request is delivered at once (the waker runs on the
/// thread that processed its event queue); an operation is marked ready and the doorbell rung,
/// so that the next dispatch polls it on the application's thread.
struct PendingWaker<D: Device>(Weak<Pending<D>>);

impl<D: Device> Wake for PendingWaker<D> {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let Some(p) = self.0.upgrade() else { return };
        let Some(shared) = p.shared.upgrade() else {
            return;
        };
        if p.eq.is_none() {
            // An operation: its future may wake it while being polled (with its lock held),
            // so only mark it; the next dispatch polls it.
            p.ready.store(true, Ordering::Release);
            shared.doorbell.ring();
            return;
        }
        let done = match &*lock(&p.work) {
            Work::Notify(req) => req.try_result(),
            Work::Op(_) | Work::Done => None,
        };
        if let Some(r) = done {
            shared.deliver(&p, notify_status(r));
        }
    }
}

impl<D: Device> Pending<D> {
    /// Polls the work once with the request's own waker; delivers it when finished.
    fn poll(self: &Arc<Self>, shared: &Shared<D>) {
        let waker = Waker::from(Arc::new(PendingWaker(Arc::downgrade(self))));
        let mut cx = TaskContext::from_waker(&waker);
        self.ready.store(false, Ordering::Release);
        let nt = match &mut *lock(&self.work) {
            Work::Notify(req) => match Pin::new(req).poll(&mut cx) {
                Poll::Ready(r) => Some(notify_status(r)),
                Poll::Pending => None,
            },
            Work::Op(fut) => match fut.as_mut().poll(&mut cx) {
                Poll::Ready(nt) => Some(nt),
                Poll::Pending => None,
            },
            Work::Done => None,
        };
        if let Some(nt) = nt {
            shared.deliver(self, nt);
        }
    }
}

/// The handle of an asynchronous operation started with [`Completions::start`]: its
/// OVERLAPPED says when it finished and whether it succeeded; [`take`](Self::take) gives
/// its typed result.
pub struct Operation<T, E> {
    ov: Overlapped,
    slot: Arc<Mutex<Option<Result<T, E>>>>,
}

impl<T, E> fmt::Debug for Operation<T, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operation").field("ov", &self.ov).finish()
    }
}

impl<T, E> Operation<T, E> {
    /// The OVERLAPPED the operation completes.
    pub fn overlapped(&self) -> &Overlapped {
        &self.ov
    }

    /// The operation's result, once it finished (once: later calls return `None`); `None`
    /// too when it was cancelled or the device removed before it finished.
    pub fn take(&self) -> Option<Result<T, E>> {
        lock(&self.slot).take()
    }
}

/// The Windows completion side of one opened device: OVERLAPPED-based CQ notify requests and
/// asynchronous operations, completed to the device's completion port (under the one key
/// given to [`associate`](Self::associate)), to the OVERLAPPED's event, or to an APC.
///
/// No thread is involved: the device rings a doorbell when an event queue wants
/// processing — a packet `(key, null OVERLAPPED)` on the associated port, and the
/// [`doorbell`](Self::doorbell_event) event — and the application's thread that dequeues it
/// hands it to [`dispatch`](Self::dispatch) (or calls [`progress`](Self::progress) or one of
/// the `wait` methods), which completes what can be completed.
///
/// Dropping it completes every request still in flight with [`RequestError::Cancelled`], as
/// closing a Windows handle cancels its I/O.
pub struct Completions<D: Device> {
    ctx: Context<D>,
    shared: Arc<Shared<D>>,
}

impl<D: Device> fmt::Debug for Completions<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completions")
            .field("device", &self.ctx.name())
            .field("in_flight", &self.in_flight())
            .field("key", &self.key())
            .finish()
    }
}

impl<D: Device> Completions<D> {
    /// The completion side of `ctx`, which must have been opened with `sinks` (as
    /// [`crate::open`] does), so that its event queues ring the doorbell.
    pub fn new(ctx: Context<D>, sinks: &WindowsSinks) -> Self {
        Self {
            ctx,
            shared: Arc::new(Shared {
                doorbell: sinks.doorbell.clone(),
                pending: Mutex::new(HashMap::new()),
                removed: AtomicBool::new(false),
                alarm: Alarm::default(),
            }),
        }
    }

    /// The opened device.
    pub fn context(&self) -> &Context<D> {
        &self.ctx
    }

    /// Associates the device with `port` under `key` (`CreateIoCompletionPort` on a device
    /// handle): from now on completions of OVERLAPPEDs without the low bit, and the
    /// doorbell, are queued there. Once per device, like a Windows handle.
    ///
    /// A device in manual progress whose input is a socket (a UDP-bound device) joins its
    /// receive requests to the port too ([`portverbs_hal::InputWait::join_port`]): a
    /// datagram queues a packet under `key` that wakes the application's loop, which hands
    /// it to [`dispatch`](Self::dispatch) like the doorbell's, so one thread sleeping on one
    /// port serves the device's wire with no thread of ours.
    ///
    /// # Errors
    /// [`RequestError::AlreadyAssociated`]; the input could not join the port.
    pub fn associate(&self, port: Arc<CompletionPort>, key: usize) -> Result<(), RequestError> {
        if self.shared.doorbell.port.get().is_some() {
            return Err(RequestError::AlreadyAssociated);
        }
        if let Some(input) = self.ctx.device().wait_source().input() {
            match input.join_port(port.raw(), key) {
                Err(e) if e.kind() != std::io::ErrorKind::Unsupported => return Err(e.into()),
                _ => {}
            }
        }
        self.shared
            .doorbell
            .port
            .set((port, key))
            .map_err(|_| RequestError::AlreadyAssociated)?;
        // Whatever rang before the association is announced on the port too.
        self.shared.doorbell.ring();
        Ok(())
    }

    /// The completion key of the association, if any.
    pub fn key(&self) -> Option<usize> {
        self.shared.doorbell.port.get().map(|(_, k)| *k)
    }

    /// The doorbell event: signalled whenever an event queue or operation of the device wants
    /// processing; wait on it (with the application's own events, if it likes) and then call
    /// [`progress`](Self::progress).
    pub fn doorbell_event(&self) -> &crate::Event {
        &self.shared.doorbell.event
    }

    /// How many requests are in flight.
    pub fn in_flight(&self) -> usize {
        lock(&self.shared.pending).len()
    }

    fn submit(
        &self,
        ov: &Overlapped,
        route: Route,
        work: Work,
        eq: Option<EventQueueRef<D>>,
    ) -> Result<(), RequestError> {
        if self.shared.removed.load(Ordering::Acquire) {
            // As a call on a removed device fails at once: never submitted, never announced.
            return Err(RequestError::DeviceRemoved);
        }
        ov.begin()?;
        let p = Arc::new(Pending {
            ov: ov.clone(),
            route: Mutex::new(Some(route)),
            work: Mutex::new(work),
            eq,
            ready: AtomicBool::new(false),
            shared: Arc::downgrade(&self.shared),
        });
        lock(&self.shared.pending).insert(ov.as_ptr() as usize, p.clone());
        p.poll(&self.shared);
        Ok(())
    }

    /// A CQ notify request (ND `Notify`, with its semantics: all pending requests complete at
    /// the CQ's next event, an error satisfies every kind, destroying the CQ completes them
    /// as cancelled) that completes `ov`. Arm first, then poll the CQ dry, then wait: a
    /// completion after the last poll completes the request.
    ///
    /// # Errors
    /// [`RequestError::InFlight`] when `ov` is busy; [`RequestError::DeviceRemoved`] after
    /// [`remove_device`](Self::remove_device) (the request is not made, nothing is announced).
    pub fn notify(
        &self,
        cq: &Cq<D>,
        kind: NotifyKind,
        ov: &Overlapped,
    ) -> Result<(), RequestError> {
        let work = Work::Notify(cq.notify(kind));
        self.submit(ov, Route::Standard, work, Some(cq.event_queue()))
    }

    /// As [`notify`](Self::notify), but announced by an APC queued to the calling thread,
    /// which runs `f` with the outcome at the thread's next alertable wait
    /// ([`crate::sleep_alertable`], [`crate::Event::wait_alertable`],
    /// [`wait`](Self::wait) with `alertable`). The OVERLAPPED gets the status and its event
    /// is signalled too; no packet is queued.
    ///
    /// # Errors
    /// As [`notify`](Self::notify); [`RequestError::Os`] when the thread handle could not be
    /// made.
    pub fn notify_apc(
        &self,
        cq: &Cq<D>,
        kind: NotifyKind,
        ov: &Overlapped,
        f: impl FnOnce(Result<(), RequestError>) + Send + 'static,
    ) -> Result<(), RequestError> {
        let thread = sys::current_thread()?;
        let work = Work::Notify(cq.notify(kind));
        let route = Route::Apc {
            thread,
            f: Box::new(f),
        };
        self.submit(ov, route, work, Some(cq.event_queue()))
    }

    /// Starts an asynchronous operation of `portverbs-verbs` (any `async` verb: create a CQ,
    /// register memory, modify a QP, …) as an OVERLAPPED request: it is polled now, and again
    /// on the application's thread whenever its waker rang the doorbell; when it finishes,
    /// `ov` completes with ND_SUCCESS or ND_UNSUCCESSFUL and the typed result waits in the
    /// returned [`Operation`].
    ///
    /// # Errors
    /// As [`notify`](Self::notify).
    pub fn start<T, E, F>(&self, ov: &Overlapped, fut: F) -> Result<Operation<T, E>, RequestError>
    where
        T: Send + 'static,
        E: Send + 'static,
        F: Future<Output = Result<T, E>> + Send + 'static,
    {
        let slot = Arc::new(Mutex::new(None));
        let out = slot.clone();
        let fut: OpFuture = Box::pin(async move {
            let r = fut.await;
            let nt = if r.is_ok() {
                status::SUCCESS
            } else {
                status::UNSUCCESSFUL
            };
            *lock(&out) = Some(r);
            nt
        });
        self.submit(ov, Route::Standard, Work::Op(fut), None)?;
        Ok(Operation {
            ov: ov.clone(),
            slot,
        })
    }

    /// Cancels the request in flight on `ov` (`CancelIoEx` on one OVERLAPPED): it completes
    /// now, through its usual route, with ND_CANCELED.
    ///
    /// # Errors
    /// [`RequestError::NotFound`] when nothing is in flight on `ov`.
    pub fn cancel(&self, ov: &Overlapped) -> Result<(), RequestError> {
        let p = lock(&self.shared.pending)
            .get(&(ov.as_ptr() as usize))
            .cloned()
            .ok_or(RequestError::NotFound)?;
        self.shared.deliver(&p, status::CANCELLED);
        Ok(())
    }

    /// The device is gone: every request in flight completes with ND_DEVICE_REMOVED, and
    /// later ones are refused.
    pub fn remove_device(&self) {
        self.shared.removed.store(true, Ordering::Release);
        self.complete_all(status::DEVICE_REMOVED);
    }

    fn complete_all(&self, nt: i32) {
        let all: Vec<_> = lock(&self.shared.pending).values().cloned().collect();
        for p in all {
            self.shared.deliver(&p, nt);
        }
    }

    /// Handles a packet dequeued from the associated port: true when it was the device's
    /// doorbell or one of a manual device's receives (then [`progress`](Self::progress) ran
    /// and the packet is consumed), false when it belongs to the application (a completed
    /// OVERLAPPED, or anything else).
    ///
    /// # Errors
    /// As [`progress`](Self::progress).
    pub fn dispatch(&self, packet: &Packet) -> Result<bool, RequestError> {
        if Some(packet.key) != self.key() {
            return Ok(false);
        }
        if !packet.overlapped.is_null() {
            let ov = packet.overlapped.cast_const().cast();
            let input = self.ctx.device().wait_source().input();
            if !input.is_some_and(|i| i.owns(ov)) {
                return Ok(false);
            }
        }
        self.progress()?;
        Ok(true)
    }

    /// How long the application's port loop may sleep before a timer is due: the timeout to
    /// give [`CompletionPort::get`](crate::CompletionPort::get) (`None`: nothing armed, wait for ever). Timers are the
    /// [`crate::sleep_until`] futures of the process — among them those of the connection
    /// manager's retransmissions when it was lent `portverbs::cm::PortTimer` — and the
    /// [`progress`](Self::progress) that follows a wait fires those that are due, so a loop
    /// ```text
    /// match port.get(win.next_timeout())? {
    ///     Some(packet) => { win.dispatch(&packet)?; /* or the application's packet */ }
    ///     None => { win.progress()?; } // a timer is due
    /// }
    /// ```
    /// runs the operations' timers with no thread and no other traffic. A manual-progress
    /// device's own next timer (a retransmission, the connection manager's) is on that list
    /// too, from the last progress on.
    pub fn next_timeout(&self) -> Option<Duration> {
        TimerList::global().next_timeout()
    }

    /// Makes progress now, on the calling thread: fires the timers that are due (see
    /// [`next_timeout`](Self::next_timeout)), processes the device's event queues (the
    /// asynchronous and completion-vector ones, and those of the CQs with requests in flight),
    /// which completes notify requests, and polls the operations whose wakers fired. Returns
    /// how many device events were handled.
    ///
    /// # Errors
    /// A malformed event was skipped ([`RequestError::Event`]); the doorbell event failed.
    pub fn progress(&self) -> Result<usize, RequestError> {
        // Clear first: a ring from now on is announced again.
        self.shared.doorbell.clear()?;
        // A due timer wakes its operation: marked ready, polled below.
        TimerList::global().fire_due();
        let mut first_error = None;
        let mut handled = match self.ctx.process_events_timed() {
            Ok((n, next)) => {
                self.shared.alarm.set(next, Waker::noop());
                n
            }
            Err(e) => {
                first_error = Some(e);
                0
            }
        };
        let (queues, ready) = {
            let table = lock(&self.shared.pending);
            let mut queues: Vec<EventQueueRef<D>> = Vec::new();
            let mut ready = Vec::new();
            for p in table.values() {
                if let Some(eq) = &p.eq {
                    if !queues.iter().any(|q| q.eqn() == eq.eqn()) {
                        queues.push(eq.clone());
                    }
                }
                if p.ready.load(Ordering::Acquire) {
                    ready.push(p.clone());
                }
            }
            (queues, ready)
        };
        for q in queues {
            match q.process() {
                Ok(n) => handled += n,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        for p in ready {
            p.poll(&self.shared);
        }
        match first_error {
            Some(e) => Err(RequestError::Event(e)),
            None => Ok(handled),
        }
    }

    /// Waits on the doorbell event (and a manual-progress device's input event) up to `timeout`
    /// (`None`: for ever), then makes progress.
    /// An `alertable` wait also returns, with [`WaitOutcome::Alerted`], once APCs queued to
    /// this thread ran (those of [`notify_apc`](Self::notify_apc) among them). The wait ends
    /// early when a timer is due ([`next_timeout`](Self::next_timeout)): it fires, and the
    /// outcome is [`WaitOutcome::TimedOut`] unless the doorbell rang meanwhile.
    ///
    /// # Errors
    /// As [`progress`](Self::progress), or the wait failed.
    pub fn wait(
        &self,
        timeout: Option<Duration>,
        alertable: bool,
    ) -> Result<WaitOutcome, RequestError> {
        let timers = TimerList::global();
        let got = self.sleep(timers.cap(timeout), alertable)?;
        // `progress` fires the due timers, and polls the operations they woke.
        let due = timers.next_timeout() == Some(Duration::ZERO);
        if got == WaitOutcome::Signalled || due {
            self.progress()?;
        }
        Ok(got)
    }

    /// Blocks until the request on `ov` completed, making progress on this thread meanwhile
    /// (timers included), and returns its result as `GetOverlappedResult` reads it (`None`:
    /// no timeout).
    ///
    /// # Errors
    /// The request's own error; [`RequestError::Incomplete`] when `timeout` passed first.
    pub fn wait_for(
        &self,
        ov: &Overlapped,
        timeout: Option<Duration>,
    ) -> Result<u32, RequestError> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        loop {
            self.progress()?;
            if !ov.is_pending() {
                return ov.get_overlapped_result(false);
            }
            let left = match deadline {
                None => None,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(RequestError::Incomplete);
                    }
                    Some(left)
                }
            };
            self.sleep(TimerList::global().cap(left), false)?;
        }
    }

    /// Sleeps on the doorbell event and, for a manual-progress device, on its input
    /// ([`portverbs_hal::InputWait::event`]): signalled when either is.
    fn sleep(&self, timeout: Option<Duration>, alertable: bool) -> std::io::Result<WaitOutcome> {
        let mut handles = vec![self.shared.doorbell.event.raw()];
        handles.extend(
            self.ctx
                .device()
                .wait_source()
                .input()
                .and_then(|i| i.event()),
        );
        sys::wait_any(&handles, sys::millis(timeout), alertable).map(Into::into)
    }
}

impl<D: Device> Drop for Completions<D> {
    fn drop(&mut self) {
        self.complete_all(status::CANCELLED);
    }
}

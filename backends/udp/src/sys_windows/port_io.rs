//! What the port lends its fabric to sleep on ([`portverbs_fabric::PortIo`]), on Windows: the
//! I/O completion port its receive requests complete to ([`RxPort`]), which also carries the
//! fabric's wake-ups, and — in manual progress — an event every completed receive signals.
//!
//! * **Auto progress** (the fabric's one engine thread): the thread sleeps in
//!   `GetQueuedCompletionStatusEx` on the port, with the timeout of the fabric's next
//!   deadline. A completed receive wakes it, and the packets it dequeued are kept (their
//!   OVERLAPPED addresses, at most one per receive slot) for the receive of its next step; a
//!   kick wakes it with a packet of its own, `PostQueuedCompletionStatus` under
//!   [`WAKE_KEY`], at most one queued at a time. So one wait does what poll(2) on the socket
//!   and an eventfd does on Linux, and takes the completions in the same call.
//! * **Manual progress** (no thread of ours): the ring's socket belongs to no port of ours.
//!   A receive learns which requests completed from their OVERLAPPEDs' status words, in the
//!   order they were issued (a datagram socket fills its pending receives in that order),
//!   so any thread that drives the device receives, and none needs a port. Every request
//!   also carries a manual-reset event; a blocking wait sleeps in `WaitForMultipleObjects` on
//!   that event and on a per-thread event that its sink's raise signals (through a waker,
//!   [`portverbs_hal::InputWait`]), and an application may sleep on it beside its own
//!   handles ([`InputWait::event`]). Issuing a request resets the event, so a receive clears
//!   it only after its last repost, then looks at the statuses once more and sets it again
//!   when something is done (or when it took a full batch): after a receive the event is
//!   signalled exactly when input may wait, and a completion after it signals it, the
//!   discipline of clear, look, wait.
//!
//!   An application that runs its own completion port hands it to the device
//!   ([`InputWait::join_port`], which `portverbs::windows::Completions::associate` calls): the
//!   socket is associated with that port under the application's key for the device, so
//!   every completed receive also queues a packet there, and a thread sleeping in
//!   `GetQueuedCompletionStatus(Ex)` on it wakes for a datagram as for its own I/O. The
//!   packet is only a wake-up: the application passes it back
//!   (`Completions::dispatch`, which asks [`InputWait::owns`]), and the device receives by
//!   status as before — so a receive a poll took already leaves a packet that does nothing.
//!   One packet is queued per completed receive; an application that joins its port and
//!   then only polls for a long time lets them pile up there until its loop runs.
//!
//! Microsoft Learn pages these calls follow: "GetQueuedCompletionStatusEx function",
//! "PostQueuedCompletionStatus function", "OVERLAPPED structure" (`hEvent`), "CreateEventW
//! function", "WaitForMultipleObjects function".

use std::cell::RefCell;
use std::ffi::c_void;
use std::io;
use std::net::UdpSocket;
use std::os::windows::io::RawHandle;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Wake, Waker};
use std::time::{Duration, Instant};

use portverbs_fabric::{Mode, PortIo, WaitSource};
use portverbs_hal::InputWait;
use windows_sys::Win32::Foundation::{
    CloseHandle, HANDLE, WAIT_FAILED, WAIT_OBJECT_0, WAIT_TIMEOUT,
};
use windows_sys::Win32::Networking::WinSock as ws;
use windows_sys::Win32::System::IO::{CreateIoCompletionPort, OVERLAPPED_ENTRY};
use windows_sys::Win32::System::Threading::{
    CreateEventW, INFINITE, ResetEvent, SetEvent, WaitForMultipleObjects, WaitForSingleObject,
};

use super::recv::{Port, RecvBufs, RecvRing};

/// The key of the ring's receive completions on the port.
pub(crate) const RING_KEY: usize = 0;
/// The key of the fabric's wake-ups on the port.
pub(crate) const WAKE_KEY: usize = 1;

/// Packets one dequeue takes at most (the ring has at most this many requests).
const DEQUEUE_MAX: usize = 64;

/// An event object, closed on drop.
#[derive(Debug)]
pub(crate) struct Event(HANDLE);

// SAFETY: an event handle may be used from any thread, by several at once.
unsafe impl Send for Event {}
// SAFETY: as above; no method mutates the `Event` itself.
unsafe impl Sync for Event {}

impl Event {
    fn new(manual_reset: bool) -> io::Result<Self> {
        // SAFETY: no security attributes and no name (null pointers are allowed for both).
        let h = unsafe {
            CreateEventW(
                std::ptr::null(),
                i32::from(manual_reset),
                0,
                std::ptr::null(),
            )
        };
        if h.is_null() {
            Err(io::Error::last_os_error())
        } else {
            Ok(Self(h))
        }
    }

    fn set(&self) {
        // SAFETY: the handle is this event's, live while `self` is; no memory is passed. A
        // failure (none is expected for a live event) only costs a wake-up the next look
        // makes up for.
        unsafe { SetEvent(self.0) };
    }

    fn reset(&self) {
        // SAFETY: as in `set`.
        unsafe { ResetEvent(self.0) };
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the handle is this event's, closed once; whoever signals or waits on it
        // holds the owner of this `Event`.
        unsafe { CloseHandle(self.0) };
    }
}

/// Sleeps until one of `handles` is signalled or `deadline` passes; returns whether one was.
fn wait_any(handles: &[HANDLE], deadline: Option<Instant>) -> io::Result<bool> {
    let ms = match deadline {
        None => INFINITE,
        Some(d) => millis(d.saturating_duration_since(Instant::now())),
    };
    // SAFETY: `handles` is a live array of live handles of the length given; wait for any.
    let rc = unsafe {
        WaitForMultipleObjects(
            u32::try_from(handles.len()).unwrap_or(0),
            handles.as_ptr(),
            0,
            ms,
        )
    };
    match rc {
        WAIT_TIMEOUT => Ok(false),
        WAIT_FAILED => Err(io::Error::last_os_error()),
        _ => Ok(true),
    }
}

/// A timeout in whole milliseconds, rounded up (a wait never ends before its deadline), below
/// `INFINITE`.
fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_micros().div_ceil(1000)).unwrap_or(INFINITE - 1)
}

/// The port the ring's requests complete to, shared by the node's receive
/// ([`super::recv::recv_batch`]) and the sleeps of the port's I/O ([`UdpIo`], and the manual
/// waits through [`InputWait`]).
#[derive(Debug)]
pub(crate) struct RxPort {
    pub(crate) port: Port,
    /// The OVERLAPPED addresses of receive completions a sleep dequeued, for the next
    /// harvest (at most one per receive slot).
    taken: Mutex<Vec<usize>>,
    /// A wake-up packet is queued and not yet dequeued.
    wake_queued: AtomicBool,
    /// Manual progress: the event every receive request signals when it completes.
    input: Option<Event>,
    /// Manual progress: the ring's socket and its OVERLAPPEDs' addresses, while the ring
    /// lives, for [`InputWait::join_port`] and [`InputWait::owns`].
    ring: Mutex<Option<RingIds>>,
}

/// What identifies a ring's requests to the outside (see [`RxPort::ring`]).
#[derive(Debug)]
struct RingIds {
    socket: ws::SOCKET,
    addresses: Vec<usize>,
    joined: bool,
}

impl RxPort {
    /// A port; with `manual`, the event manual waits sleep on.
    pub(crate) fn new(manual: bool) -> io::Result<Self> {
        Ok(Self {
            port: Port::new()?,
            taken: Mutex::new(Vec::new()),
            wake_queued: AtomicBool::new(false),
            input: if manual {
                Some(Event::new(true)?)
            } else {
                None
            },
            ring: Mutex::new(None),
        })
    }

    /// Whether this is a manual-progress port (its ring belongs to no port of ours).
    pub(crate) fn is_manual(&self) -> bool {
        self.input.is_some()
    }

    /// Manual progress: the ring whose requests this input is (see the module docs).
    pub(crate) fn adopt_ring(&self, ring: &RecvRing) {
        *self.ring_ids() = Some(RingIds {
            socket: ring.socket(),
            addresses: ring.addresses(),
            joined: false,
        });
    }

    /// The ring is going: nothing joins its socket from now on.
    pub(crate) fn forget_ring(&self) {
        *self.ring_ids() = None;
    }

    fn ring_ids(&self) -> std::sync::MutexGuard<'_, Option<RingIds>> {
        self.ring.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Manual progress: waits up to `timeout_ms` for the input event; whether it is
    /// signalled. With 0 a look, and on Wine the system call in which receives whose data
    /// arrived are completed.
    pub(crate) fn wait_input(&self, timeout_ms: u32) -> bool {
        let Some(e) = &self.input else {
            return false;
        };
        // SAFETY: the event handle is live while `self` is; no memory is passed.
        unsafe { WaitForSingleObject(e.0, timeout_ms) == WAIT_OBJECT_0 }
    }

    /// The event receive requests must carry, in manual progress.
    pub(crate) fn input_event(&self) -> Option<HANDLE> {
        self.input.as_ref().map(|e| e.0)
    }

    /// After a receive looked and reposted its requests (manual progress): leaves the input
    /// signalled exactly when something may be waiting. Issuing a request resets the event
    /// its OVERLAPPED names (the I/O manager does, and so does Wine's server), so a repost can
    /// wipe the signal of another request that completed since the look; the event is
    /// therefore cleared only after the last repost, and then `look` runs (the ring's
    /// statuses, and whether the receive took a full batch): a completion before the clear is
    /// found there, one after it signals the event itself.
    pub(crate) fn rearm_input(&self, look: impl FnOnce() -> bool) {
        let Some(e) = &self.input else {
            return;
        };
        e.reset();
        if look() {
            e.set();
        }
    }

    fn taken(&self) -> std::sync::MutexGuard<'_, Vec<usize>> {
        self.taken.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sorts dequeued packets: receive completions into `list` (their OVERLAPPED addresses),
    /// wake-ups forgotten. Returns how many receive completions there were.
    fn sort(&self, entries: &[OVERLAPPED_ENTRY], list: &mut Vec<usize>) -> usize {
        let mut n = 0;
        for e in entries {
            if e.lpCompletionKey == WAKE_KEY && e.lpOverlapped.is_null() {
                self.wake_queued.store(false, Ordering::Release);
            } else if e.lpCompletionKey == RING_KEY && !e.lpOverlapped.is_null() {
                list.push(e.lpOverlapped.addr());
                n += 1;
            }
        }
        n
    }

    /// Moves up to `max` receive completions into `done` (OVERLAPPED addresses): first those
    /// a sleep dequeued, then packets from the port, waiting up to `timeout_ms` for one when
    /// none was kept. Returns how many packets were looked at (wake-ups included): `max` or
    /// more means more may be queued.
    pub(crate) fn harvest(
        &self,
        done: &mut Vec<usize>,
        max: usize,
        timeout_ms: u32,
    ) -> io::Result<usize> {
        let mut seen = {
            let mut taken = self.taken();
            let n = taken.len().min(max);
            done.extend(taken.drain(..n));
            n
        };
        if seen < max {
            let mut entries = [OVERLAPPED_ENTRY::default(); DEQUEUE_MAX];
            let room = (max - seen).min(DEQUEUE_MAX);
            let timeout = if seen > 0 { 0 } else { timeout_ms };
            let got = self.port.dequeue(&mut entries[..room], timeout)?;
            self.sort(&entries[..got], done);
            seen += got;
        }
        Ok(seen)
    }

    /// Dequeues what is queued, waiting up to `timeout` for a packet (none: a look), and keeps
    /// the receive completions for the next harvest. Returns whether receives are kept.
    fn sleep(&self, timeout: Duration) -> bool {
        if !self.taken().is_empty() {
            return true;
        }
        let mut entries = [OVERLAPPED_ENTRY::default(); DEQUEUE_MAX];
        let ms = if timeout.is_zero() {
            0
        } else {
            millis(timeout)
        };
        let got = self.port.dequeue(&mut entries, ms).unwrap_or(0);
        self.sort(&entries[..got], &mut self.taken()) > 0
    }

    /// Queues a wake-up packet unless one is queued already.
    fn wake(&self) {
        if !self.wake_queued.swap(true, Ordering::AcqRel) && self.port.post(WAKE_KEY).is_err() {
            // Not queued: the next wake tries again.
            self.wake_queued.store(false, Ordering::Release);
        }
    }
}

/// The event a thread's manual waits sleep on besides the input, and the waker that signals
/// it (one per thread, so that a sink's set of wakers keeps one entry per waiting thread).
struct Waiter {
    event: Event,
}

impl Wake for Waiter {
    fn wake(self: Arc<Self>) {
        self.event.set();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.event.set();
    }
}

thread_local! {
    static WAITER: RefCell<Option<(Arc<Waiter>, Waker)>> = const { RefCell::new(None) };
}

impl InputWait for RxPort {
    /// Sleeps on the receive event and this thread's waiter event together (see the module
    /// docs). A waiter event left signalled by an earlier wait's waker ends this one early,
    /// which the caller's next look absorbs.
    fn wait(
        &self,
        deadline: Option<Instant>,
        arm: &mut dyn FnMut(&Waker) -> bool,
    ) -> io::Result<bool> {
        let Some(input) = &self.input else {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        };
        let (waiter, waker) = WAITER.with(|w| -> io::Result<(Arc<Waiter>, Waker)> {
            let mut w = w.borrow_mut();
            if let Some(pair) = &*w {
                return Ok(pair.clone());
            }
            let waiter = Arc::new(Waiter {
                event: Event::new(false)?,
            });
            let waker = Waker::from(waiter.clone());
            *w = Some((waiter.clone(), waker.clone()));
            Ok((waiter, waker))
        })?;
        if arm(&waker) {
            return Ok(true);
        }
        wait_any(&[input.0, waiter.event.0], deadline)
    }

    fn event(&self) -> Option<RawHandle> {
        self.input.as_ref().map(|e| e.0)
    }

    fn join_port(&self, port: RawHandle, key: usize) -> io::Result<()> {
        let mut ids = self.ring_ids();
        let Some(ids) = ids.as_mut() else {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the port has no receive requests (auto progress, or closing)",
            ));
        };
        if ids.joined {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                "the port's socket has joined a completion port already",
            ));
        }
        // SAFETY: the socket is the live ring's (the lock keeps `forget_ring` out), the port
        // the caller's; the call only links them.
        let h = unsafe { CreateIoCompletionPort(ids.socket as HANDLE, port, key, 0) };
        if h.is_null() {
            return Err(io::Error::last_os_error());
        }
        ids.joined = true;
        Ok(())
    }

    fn owns(&self, overlapped: *const c_void) -> bool {
        self.ring_ids()
            .as_ref()
            .is_some_and(|ids| ids.addresses.contains(&overlapped.addr()))
    }
}

/// The port's I/O as the fabric sees it.
#[derive(Debug)]
pub(crate) struct UdpIo {
    rx: Arc<RxPort>,
    /// Set when input may be waiting; the node receives when it is (or every
    /// [`crate::rx::RX_LOOK`]), and clears it when a receive took less than a batch.
    pub(crate) hint: Arc<AtomicBool>,
}

impl UdpIo {
    /// The port and, on a manual fabric, the input event (the socket joins at
    /// [`UdpIo::recv_bufs`]).
    pub(crate) fn new(_sock: &UdpSocket, mode: Mode) -> io::Result<Self> {
        Ok(Self {
            rx: Arc::new(RxPort::new(mode == Mode::Manual)?),
            hint: Arc::new(AtomicBool::new(true)),
        })
    }

    /// The receive buffers and the ring of requests on `sock`, completing to this port.
    pub(crate) fn recv_bufs(
        &self,
        sock: &UdpSocket,
        count: usize,
        size: usize,
    ) -> io::Result<RecvBufs> {
        RecvBufs::new(sock, self.rx.clone(), count, size)
    }
}

impl PortIo for UdpIo {
    fn wait(&self, timeout: Duration) -> bool {
        let input = if self.rx.is_manual() {
            self.rx.wait_input(millis(timeout))
        } else {
            self.rx.sleep(timeout)
        };
        if input {
            self.hint.store(true, Ordering::Release);
        }
        input
    }

    fn wake(&self) {
        self.rx.wake();
    }

    fn ready(&self) -> bool {
        self.wait(Duration::ZERO)
    }

    fn wait_source(&self) -> WaitSource<'_> {
        if self.rx.input.is_some() {
            WaitSource::from_input(&*self.rx)
        } else {
            WaitSource::none()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::sys::recv::{Completion, RecvRing};
    use crate::sys::{IpFields, Outgoing, recv_batch, send_batch};

    fn socket(ip: &str) -> UdpSocket {
        let s = UdpSocket::bind(format!("{ip}:0")).unwrap();
        crate::sys::enable_ip_fields(&s, false).unwrap();
        s
    }

    fn send(from: &UdpSocket, to: &UdpSocket) {
        let msg = Outgoing {
            dst: to.local_addr().unwrap(),
            bytes: b"input",
            segment: None,
            ip: IpFields::default(),
        };
        assert_eq!(send_batch(from, &[msg]).unwrap(), 1);
    }

    // Wine 8 deviation avoided: nothing here closes a port to wake a sleeper (a posted packet
    // or a signalled event does).
    #[test]
    fn the_engine_sleep_ends_for_a_kick_or_a_datagram_and_keeps_what_it_dequeued() {
        let (tx, rx) = (socket("127.0.0.1"), socket("127.0.0.1"));
        let io = Arc::new(UdpIo::new(&rx, Mode::Threaded).unwrap());
        let mut bufs = io.recv_bufs(&rx, 4, 2048).unwrap();
        assert!(io.wait_source().is_none(), "auto: nothing for manual waits");
        assert!(!io.wait(Duration::from_millis(20)), "nothing yet");
        // Two kicks queue one packet; it ends the sleep at once, and is gone after.
        io.wake();
        io.wake();
        let t = Instant::now();
        assert!(!io.wait(Duration::from_secs(20)), "a kick is not input");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the kick ended the sleep"
        );
        assert!(
            !io.wait(Duration::from_millis(20)),
            "one packet for two kicks"
        );
        // A kick from another thread wakes a sleeper.
        let waker = {
            let io = io.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                io.wake();
            })
        };
        let t = Instant::now();
        io.wait(Duration::from_secs(20));
        assert!(t.elapsed() < Duration::from_secs(10));
        waker.join().unwrap();
        // A datagram ends it as input; the completion it dequeued is the next receive's.
        io.hint.store(false, Ordering::Release);
        send(&tx, &rx);
        assert!(io.wait(Duration::from_secs(20)), "a datagram is input");
        assert!(io.hint.load(Ordering::Acquire));
        assert_eq!(recv_batch(&rx, &mut bufs).unwrap(), 1);
        assert_eq!(&bufs.bufs[0][..bufs.got[0].len], b"input");
        assert_eq!(recv_batch(&rx, &mut bufs).unwrap(), 0, "never waits");
    }

    #[test]
    fn a_manual_wait_sleeps_on_the_input_and_on_its_waker() {
        let (tx, rx) = (socket("127.0.0.1"), socket("127.0.0.1"));
        let io = UdpIo::new(&rx, Mode::Manual).unwrap();
        let mut bufs = io.recv_bufs(&rx, 4, 2048).unwrap();
        let input = io
            .wait_source()
            .input()
            .expect("manual: an input to sleep on");
        let soon = || Some(Instant::now() + Duration::from_millis(20));
        let mut never = |_: &Waker| false;
        // A look clears the signal; nothing arrived, so the wait runs out.
        assert_eq!(recv_batch(&rx, &mut bufs).unwrap(), 0);
        assert!(!input.wait(soon(), &mut never).unwrap());
        // A datagram signals it, and stays signalled until a receive takes it.
        send(&tx, &rx);
        assert!(
            input
                .wait(Some(Instant::now() + Duration::from_secs(20)), &mut never)
                .unwrap()
        );
        assert!(input.wait(soon(), &mut never).unwrap(), "not taken yet");
        assert_eq!(recv_batch(&rx, &mut bufs).unwrap(), 1);
        assert!(!input.wait(soon(), &mut never).unwrap(), "taken");
        // The waker handed to `arm` ends the sleep, from another thread.
        let mut kept = None;
        let mut arm = |w: &Waker| {
            let w = w.clone();
            kept = Some(std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                w.wake();
            }));
            false
        };
        let t = Instant::now();
        assert!(
            input
                .wait(Some(Instant::now() + Duration::from_secs(20)), &mut arm)
                .unwrap()
        );
        assert!(t.elapsed() < Duration::from_secs(10));
        kept.take().unwrap().join().unwrap();
        // `arm` finding the condition met: no sleep at all.
        assert!(input.wait(None, &mut |_| true).unwrap());
    }

    /// Takes every request of `ring` that completes from now on (cancelling them first).
    fn drain(port: &RxPort, ring: &mut RecvRing) {
        ring.cancel();
        for _ in 0..200 {
            if ring.in_flight() == 0 {
                return;
            }
            port.wait_input(100);
            let mut done = Vec::new();
            ring.done_in_order(&mut done, usize::MAX);
            for addr in done {
                if let Some(i) = ring.slot_at(addr) {
                    let _ = ring.complete(i);
                }
            }
        }
        panic!("the cancelled requests never completed");
    }

    fn datagram_len(ring: &mut RecvRing, i: usize) -> usize {
        match ring.complete(i) {
            Completion::Datagram(r) => r.len,
            Completion::Failed(e) => panic!("{e}"),
        }
    }

    /// Why a receive rearms the signal after its reposts rather than clearing it before its
    /// look: issuing a request resets the event its OVERLAPPED names, even while another
    /// request has completed.
    #[test]
    fn a_repost_wipes_the_signal_and_the_rearm_finds_what_is_done() {
        let (tx, rx) = (socket("127.0.0.1"), socket("127.0.0.1"));
        let port = RxPort::new(true).unwrap();
        let mut ring = RecvRing::new(&rx, 2, 2048).unwrap();
        ring.set_event(port.input_event().unwrap());
        let soon = || Some(Instant::now() + Duration::from_millis(20));
        let mut never = |_: &Waker| false;
        ring.post(0).unwrap();
        send(&tx, &rx);
        assert!(
            port.wait(Some(Instant::now() + Duration::from_secs(20)), &mut never)
                .unwrap(),
            "the completion signals"
        );
        ring.post(1).unwrap();
        assert!(
            !port.wait(soon(), &mut never).unwrap(),
            "issuing a request reset the event; slot 0 is done all the same"
        );
        port.rearm_input(|| ring.any_done());
        assert!(
            port.wait(soon(), &mut never).unwrap(),
            "the rearm found it by its status"
        );
        let mut done = Vec::new();
        assert_eq!(ring.done_in_order(&mut done, 2), 1);
        assert_eq!(ring.slot_at(done[0]), Some(0));
        assert_eq!(datagram_len(&mut ring, 0), b"input".len());
        port.rearm_input(|| ring.any_done());
        assert!(!port.wait(soon(), &mut never).unwrap(), "nothing left");
        port.rearm_input(|| true);
        assert!(
            port.wait(soon(), &mut never).unwrap(),
            "a full batch leaves it set"
        );
        drain(&port, &mut ring);
    }

    /// Receives are taken in the order they were issued, whichever slot they use, and a
    /// ring that belongs to no port of ours joins the application's: its completions queue
    /// packets there under the application's key, which the input recognises.
    #[test]
    fn completions_come_in_issue_order_and_reach_a_joined_port() {
        let (tx, rx) = (socket("127.0.0.1"), socket("127.0.0.1"));
        let io = UdpIo::new(&rx, Mode::Manual).unwrap();
        let mut ring = RecvRing::new(&rx, 3, 2048).unwrap();
        ring.set_event(io.rx.input_event().unwrap());
        io.rx.adopt_ring(&ring);
        let input = io.wait_source().input().expect("manual: an input");
        assert!(input.event().is_some());
        let app = Port::new().unwrap();
        input.join_port(app.handle(), 0x5eed).unwrap();
        let again = input.join_port(app.handle(), 0x5eed).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
        // Issued 2, 0, 1: two datagrams fill 2 then 0.
        for i in [2, 0, 1] {
            ring.post(i).unwrap();
        }
        send(&tx, &rx);
        let mut entries = [OVERLAPPED_ENTRY::default(); 4];
        assert_eq!(app.dequeue(&mut entries[..1], 20_000).unwrap(), 1);
        assert_eq!(entries[0].lpCompletionKey, 0x5eed);
        assert!(input.owns(entries[0].lpOverlapped.cast()));
        assert!(!input.owns(std::ptr::null()));
        tx.send_to(b"second", rx.local_addr().unwrap()).unwrap();
        assert_eq!(app.dequeue(&mut entries[..1], 20_000).unwrap(), 1);
        let mut done = Vec::new();
        assert_eq!(ring.done_in_order(&mut done, 8), 2);
        let slots: Vec<_> = done.iter().map(|&a| ring.slot_at(a)).collect();
        assert_eq!(slots, [Some(2), Some(0)]);
        assert_eq!(datagram_len(&mut ring, 2), b"input".len());
        assert_eq!(datagram_len(&mut ring, 0), b"second".len());
        drain(&io.rx, &mut ring);
        io.rx.forget_ring();
        assert!(!input.owns(entries[0].lpOverlapped.cast()), "forgotten");
    }
}

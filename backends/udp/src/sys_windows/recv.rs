//! Receiving on Windows: `WSARecvMsg` requests with OVERLAPPED blocks that complete to an
//! I/O completion port.
//!
//! Two layers, so that who waits on the port is a choice:
//! * [`RecvRing`] is the requests themselves — a fixed set of receive slots on a socket handle
//!   of its own, each with its OVERLAPPED, buffer, address and control buffer — and three
//!   calls that do not care which thread makes them or which port the handle is associated
//!   with: [`RecvRing::post`] (issue a receive), [`RecvRing::complete`] (a packet for one of
//!   its OVERLAPPEDs was dequeued: the bytes, the sender and what the control messages say)
//!   and `post` again to repost. [`RecvRing::slot_of`] tells whether a dequeued OVERLAPPED
//!   is one of the ring's by comparing addresses only, so a ring can share a port with other
//!   packets (the fabric's wake-ups, or an application's own I/O).
//! * [`RecvBufs`] and [`recv_batch`] drive a ring with the same shape as the Linux
//!   nonblocking `recvmmsg`: take the completions already there without waiting, up to the
//!   number of buffers, hand the datagrams over in `bufs` and `got`, and repost at once (the
//!   buffer just filled is swapped with the one the caller read last time, so the caller
//!   reads without a copy and the request goes back out). In auto progress the completions
//!   are the packets on the port of the port's I/O ([`super::port_io::RxPort`]: those a sleep
//!   already dequeued, then those queued); in manual progress the ring belongs to no port of
//!   ours and the completed requests are found by their status ([`RecvRing::done_in_order`]),
//!   so an application's port may carry their packets (`port_io.rs` beside this file says who
//!   sleeps where).
//!
//! Each request completes exactly once — through the port when the socket has one (it never
//! gets `FILE_SKIP_COMPLETION_PORT_ON_SUCCESS`, so a receive that finishes at once still
//! queues its packet), and by its status word either way; a request the call refuses is never
//! announced and its slot stays idle until the next [`RecvRing::post_idle`]. A slot's memory
//! is touched only while no request is in flight on it. Closing down cancels what is in
//! flight (`CancelIoEx`) and waits for the cancelled requests to complete before the memory
//! goes; a ring that cannot wait leaks its slots rather than free memory the system may
//! still write.

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use windows_sys::Win32::Foundation::{CloseHandle, HANDLE, INVALID_HANDLE_VALUE, WAIT_TIMEOUT};
use windows_sys::Win32::Networking::WinSock::{
    self as ws, LPFN_WSARECVMSG, MSG_TRUNC, SIO_GET_EXTENSION_FUNCTION_POINTER, SOCKADDR,
    WSA_IO_PENDING, WSABUF, WSAID_WSARECVMSG, WSAMSG,
};
use windows_sys::Win32::System::IO::{
    CancelIoEx, CreateIoCompletionPort, GetQueuedCompletionStatusEx, OVERLAPPED, OVERLAPPED_ENTRY,
    PostQueuedCompletionStatus,
};

use super::cmsg::{self, Control};
use super::port_io::{RING_KEY, RxPort};
use super::{IpFields, RawAddr, last_error, raw};

/// Bytes of each slot's control buffer: room for a destination (`IN6_PKTINFO`, 40 bytes with
/// its header), a traffic class, a hop limit and a URO segment size (24 each), with margin.
const CONTROL: usize = 256;

/// What one completed receive holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Received {
    /// Who sent it.
    pub(crate) src: Option<SocketAddr>,
    /// The address it was sent to (`IP_PKTINFO` / `IPV6_PKTINFO`), where reported.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) dst: Option<IpAddr>,
    /// Bytes in the buffer.
    pub(crate) len: usize,
    /// With URO: the buffer holds datagrams of this size back to back (the last may be
    /// shorter).
    pub(crate) segment: Option<usize>,
    /// The IP header's traffic class and hop limit, as Winsock reported them.
    pub(crate) ip: IpFields,
}

/// One receive request. `#[repr(C)]` with the OVERLAPPED first: the address Winsock hands
/// back in a completion packet is the slot's.
#[repr(C)]
struct Slot {
    ov: OVERLAPPED,
    msg: WSAMSG,
    data: WSABUF,
    name: RawAddr,
    control: Control<CONTROL>,
    buf: Vec<u8>,
}

/// How a receive ended.
#[derive(Debug)]
pub(crate) enum Completion {
    /// A datagram (or, with URO, several) is in the slot's buffer.
    Datagram(Received),
    /// The request failed (cancelled, truncated datagram, a network error): nothing to read.
    /// The error is for a caller that reports it; the port's own loop only reposts.
    Failed(#[cfg_attr(not(test), allow(dead_code))] io::Error),
}

/// A fixed set of receive requests on a socket (see the module docs).
pub(crate) struct RecvRing {
    /// The ring's own handle to the socket, so that its requests can be cancelled and waited
    /// for whatever happens to the handle it was made from.
    sock: UdpSocket,
    recv_msg: unsafe extern "system" fn(
        ws::SOCKET,
        *mut WSAMSG,
        *mut u32,
        *mut OVERLAPPED,
        ws::LPWSAOVERLAPPED_COMPLETION_ROUTINE,
    ) -> i32,
    /// The slots, from `Box::into_raw`: freed in `Drop`, never moved.
    slots: Vec<NonNull<Slot>>,
    /// Whether a request is in flight on each slot (kept apart from the slots, which the
    /// system may be writing).
    in_flight: Vec<bool>,
    /// The slots in flight, in the order their requests were issued: the order a datagram
    /// socket satisfies its pending receives in.
    order: VecDeque<usize>,
    /// The event every request's OVERLAPPED carries (reset when a request is issued,
    /// signalled when one completes, as well as its packet queued), or null.
    event: HANDLE,
}

// SAFETY: the ring owns its slots (heap blocks nothing else points to but the system's
// requests, which it tracks); moving the ring to another thread moves that ownership.
// Completion packets name the slots by address, and a request completes the same way on any
// thread.
unsafe impl Send for RecvRing {}

impl std::fmt::Debug for RecvRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvRing")
            .field("slots", &self.slots.len())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

impl RecvRing {
    /// `count` receive slots of `size` bytes on a new handle to `sock`'s socket. Nothing is
    /// posted yet.
    ///
    /// # Errors
    /// The handle cannot be duplicated, or Winsock has no `WSARecvMsg`.
    pub(crate) fn new(sock: &UdpSocket, count: usize, size: usize) -> io::Result<Self> {
        let sock = sock.try_clone()?;
        let recv_msg = wsa_recv_msg(&sock)?;
        let slots = (0..count)
            .map(|_| {
                let slot = Box::new(Slot {
                    ov: OVERLAPPED::default(),
                    msg: WSAMSG::default(),
                    data: WSABUF::default(),
                    name: RawAddr::default(),
                    control: Control::default(),
                    buf: vec![0u8; size],
                });
                NonNull::from(Box::leak(slot))
            })
            .collect();
        Ok(Self {
            sock,
            recv_msg,
            slots,
            in_flight: vec![false; count],
            order: VecDeque::with_capacity(count),
            event: std::ptr::null_mut(),
        })
    }

    /// Gives every request posted from now on `event` in its OVERLAPPED: a completion then
    /// signals it too (its packet is still queued: the handle has no low bit set), and, as
    /// for any OVERLAPPED event, issuing a request resets it. The event must outlive the
    /// requests.
    pub(crate) fn set_event(&mut self, event: HANDLE) {
        self.event = event;
    }

    /// Associates the ring's socket with `port` under `key`: every receive completes there
    /// (once per socket; a handle belongs to one port for its life).
    ///
    /// # Errors
    /// The system refused (the socket already belongs to another port).
    pub(crate) fn associate(&self, port: HANDLE, key: usize) -> io::Result<()> {
        // SAFETY: both handles are live (the socket is the ring's, the port the caller's);
        // the call only links them.
        let h = unsafe { CreateIoCompletionPort(raw(&self.sock) as HANDLE, port, key, 0) };
        if h.is_null() {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// How many requests are in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.iter().filter(|&&b| b).count()
    }

    /// Issues a receive on slot `i` (idle). It completes through the port, even when Winsock
    /// finishes it at once.
    ///
    /// # Errors
    /// Winsock refused the request (then it is never announced; the slot stays idle).
    pub(crate) fn post(&mut self, i: usize) -> io::Result<()> {
        let (Some(&slot), Some(false)) = (self.slots.get(i), self.in_flight.get(i).copied()) else {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        };
        let p = slot.as_ptr();
        // SAFETY: no request is in flight on the slot, so nothing but this ring touches its
        // memory; every pointer stored points into the slot's own heap block (or its buffer's
        // heap), which does not move or go away while the request is in flight (the slot is
        // freed only in `Drop`, after the request completed, and `buf` is replaced only
        // between requests).
        let rc = unsafe {
            (*p).ov = OVERLAPPED {
                hEvent: self.event,
                ..OVERLAPPED::default()
            };
            (*p).name = RawAddr::default();
            (*p).data = WSABUF {
                len: u32::try_from((*p).buf.len()).unwrap_or(u32::MAX),
                buf: (*p).buf.as_mut_ptr(),
            };
            (*p).msg = WSAMSG {
                name: (&raw mut (*p).name.0).cast::<SOCKADDR>(),
                namelen: size_of::<RawAddr>() as i32,
                lpBuffers: &raw mut (*p).data,
                dwBufferCount: 1,
                Control: WSABUF {
                    len: CONTROL as u32,
                    buf: (&raw mut (*p).control.0).cast::<u8>(),
                },
                dwFlags: 0,
            };
            (self.recv_msg)(
                raw(&self.sock),
                &raw mut (*p).msg,
                std::ptr::null_mut(),
                &raw mut (*p).ov,
                None,
            )
        };
        let e = (rc != 0).then(last_error);
        match e {
            Some(e) if e.raw_os_error() != Some(WSA_IO_PENDING) => Err(e),
            _ => {
                self.in_flight[i] = true;
                self.order.push_back(i);
                Ok(())
            }
        }
    }

    /// Whether the request on slot `i` (in flight) has completed, as the system left it in
    /// the OVERLAPPED's status word (what `HasOverlappedIoCompleted` reads): anything but
    /// `STATUS_PENDING`. Needs no port: a ring that belongs to none learns of its
    /// completions this way.
    fn is_done(&self, i: usize) -> bool {
        const STATUS_PENDING: usize = 0x103;
        let p = self.slots[i].as_ptr();
        // SAFETY: the slot is live (freed only in `Drop`) and its status word is aligned; the
        // system writes it when the request completes, so it is read atomically, and with
        // acquire ordering so that what the system wrote before it (the byte count, the
        // buffers) is seen by the `complete` that follows.
        let status = unsafe { AtomicUsize::from_ptr(&raw mut (*p).ov.Internal) };
        status.load(Ordering::Acquire) != STATUS_PENDING
    }

    /// Appends the addresses of completed requests, in the order they were issued, up to
    /// `max` in all in `out`; returns how many were appended.
    pub(crate) fn done_in_order(&self, out: &mut Vec<usize>, max: usize) -> usize {
        let before = out.len();
        for &i in &self.order {
            if out.len() - before >= max {
                break;
            }
            if self.is_done(i) {
                out.push(self.slots[i].as_ptr().addr());
            }
        }
        out.len() - before
    }

    /// Whether any request in flight has completed.
    pub(crate) fn any_done(&self) -> bool {
        self.order.iter().any(|&i| self.is_done(i))
    }

    /// The ring's socket handle (for a later association with a port).
    pub(crate) fn socket(&self) -> ws::SOCKET {
        raw(&self.sock)
    }

    /// The addresses of the ring's OVERLAPPEDs (what its completion packets carry).
    pub(crate) fn addresses(&self) -> Vec<usize> {
        self.slots.iter().map(|s| s.as_ptr().addr()).collect()
    }

    /// Posts every idle slot; returns how many Winsock refused (they stay idle).
    pub(crate) fn post_idle(&mut self) -> usize {
        let mut refused = 0;
        for i in 0..self.slots.len() {
            if !self.in_flight[i] && self.post(i).is_err() {
                refused += 1;
            }
        }
        refused
    }

    /// The slot whose request `ov` (from a dequeued packet) is, if it is one of the ring's
    /// in flight. Compares addresses only: `ov` may be anything the port carries.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn slot_of(&self, ov: *const OVERLAPPED) -> Option<usize> {
        self.slot_at(ov.addr())
    }

    /// [`Self::slot_of`] for an OVERLAPPED's address kept as a number.
    pub(crate) fn slot_at(&self, addr: usize) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.as_ptr().addr() == addr)
            .filter(|&i| self.in_flight[i])
    }

    /// The request on slot `i` completed (its packet was dequeued): reads how it ended. The
    /// slot is idle afterwards; its data stays in [`Self::buffer_mut`] until the next post.
    pub(crate) fn complete(&mut self, i: usize) -> Completion {
        let Some(&slot) = self.slots.get(i).filter(|_| self.in_flight[i]) else {
            return Completion::Failed(io::Error::from(io::ErrorKind::InvalidInput));
        };
        let p = slot.as_ptr();
        let (mut bytes, mut flags) = (0u32, 0u32);
        // SAFETY: the request's packet was dequeued, so the system is done with the
        // OVERLAPPED; the call only reads it and writes `bytes` and `flags`.
        let ok = unsafe {
            ws::WSAGetOverlappedResult(
                raw(&self.sock),
                &raw const (*p).ov,
                &raw mut bytes,
                0,
                &raw mut flags,
            )
        };
        self.in_flight[i] = false;
        if let Some(at) = self.order.iter().position(|&j| j == i) {
            self.order.remove(at);
        }
        if ok == 0 {
            return Completion::Failed(last_error());
        }
        if flags & MSG_TRUNC != 0 {
            return Completion::Failed(io::Error::from_raw_os_error(ws::WSAEMSGSIZE));
        }
        // SAFETY: the request completed, so nothing writes the slot any more and this ring
        // is its only owner; the lengths the system wrote are clamped to the buffers.
        let slot = unsafe { &*p };
        let name_len = usize::try_from(slot.msg.namelen).unwrap_or(0);
        let control_len = (slot.msg.Control.len as usize).min(CONTROL);
        let parsed = cmsg::parse(slot.control.0.get(..control_len).unwrap_or(&[]));
        Completion::Datagram(Received {
            src: slot.name.get(name_len),
            dst: parsed.dst,
            len: (bytes as usize).min(slot.buf.len()),
            segment: parsed.segment,
            ip: parsed.ip,
        })
    }

    /// The buffer of idle slot `i` (its last datagram), to read or to swap with another
    /// buffer of the same size; `None` while a request is in flight on it.
    pub(crate) fn buffer_mut(&mut self, i: usize) -> Option<&mut Vec<u8>> {
        let &slot = self.slots.get(i).filter(|_| !self.in_flight[i])?;
        // SAFETY: no request is in flight on the slot, so the ring is its only user, and the
        // borrow of `self` keeps it so while the reference lives.
        Some(unsafe { &mut (*slot.as_ptr()).buf })
    }

    /// Cancels every request in flight; each still completes, through the port, with
    /// `WSA_OPERATION_ABORTED` (or with its datagram, if that won the race).
    pub(crate) fn cancel(&self) {
        // SAFETY: the socket handle is live; a null OVERLAPPED means all of its requests.
        unsafe { CancelIoEx(raw(&self.sock) as HANDLE, std::ptr::null()) };
    }
}

impl Drop for RecvRing {
    fn drop(&mut self) {
        if self.in_flight() > 0 {
            // Nobody waits for the cancelled packets here (the port may be the
            // application's): the slots are left to the system rather than freed under it.
            self.cancel();
            self.slots.clear();
            return;
        }
        for slot in self.slots.drain(..) {
            // SAFETY: the slot came from `Box::leak` in `new` and no request is in flight on
            // it, so this is its only owner.
            drop(unsafe { Box::from_raw(slot.as_ptr()) });
        }
    }
}

/// `WSARecvMsg`, which Winsock hands out as an extension function pointer.
fn wsa_recv_msg(
    sock: &UdpSocket,
) -> io::Result<
    unsafe extern "system" fn(
        ws::SOCKET,
        *mut WSAMSG,
        *mut u32,
        *mut OVERLAPPED,
        ws::LPWSAOVERLAPPED_COMPLETION_ROUTINE,
    ) -> i32,
> {
    let guid = WSAID_WSARECVMSG;
    let mut f: LPFN_WSARECVMSG = None;
    let mut returned = 0u32;
    // SAFETY: the input is the GUID, the output a function pointer slot of the size given;
    // both are alive for the synchronous call.
    let rc = unsafe {
        ws::WSAIoctl(
            raw(sock),
            SIO_GET_EXTENSION_FUNCTION_POINTER,
            (&raw const guid).cast(),
            size_of_val(&guid) as u32,
            (&raw mut f).cast(),
            size_of::<LPFN_WSARECVMSG>() as u32,
            &raw mut returned,
            std::ptr::null_mut(),
            None,
        )
    };
    if rc != 0 {
        return Err(last_error());
    }
    f.ok_or_else(|| io::Error::from(io::ErrorKind::Unsupported))
}

/// A completion port of the crate's own.
#[derive(Debug)]
pub(crate) struct Port(HANDLE);

// SAFETY: a completion port handle may be used from any thread, by several at once (the
// system serialises the queue).
unsafe impl Send for Port {}
// SAFETY: as above; no method mutates the `Port` itself.
unsafe impl Sync for Port {}

impl Port {
    /// A new, empty port.
    ///
    /// # Errors
    /// The system refused.
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: INVALID_HANDLE_VALUE with no existing port creates a new one.
        let h = unsafe { CreateIoCompletionPort(INVALID_HANDLE_VALUE, std::ptr::null_mut(), 0, 0) };
        if h.is_null() {
            Err(io::Error::last_os_error())
        } else {
            Ok(Self(h))
        }
    }

    pub(crate) fn handle(&self) -> HANDLE {
        self.0
    }

    /// Queues a packet `(key, null OVERLAPPED)` (`PostQueuedCompletionStatus`): a wake-up.
    ///
    /// # Errors
    /// The system refused (out of memory).
    pub(crate) fn post(&self, key: usize) -> io::Result<()> {
        // SAFETY: the port handle is live; the packet carries no pointer anyone dereferences.
        let ok = unsafe { PostQueuedCompletionStatus(self.0, 0, key, std::ptr::null()) };
        if ok == 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// Dequeues up to `entries.len()` packets, waiting up to `timeout_ms` for the first
    /// (`u32::MAX`: for ever); 0 when the timeout passed.
    ///
    /// # Errors
    /// The dequeue failed.
    pub(crate) fn dequeue(
        &self,
        entries: &mut [OVERLAPPED_ENTRY],
        timeout_ms: u32,
    ) -> io::Result<usize> {
        let mut removed = 0u32;
        // SAFETY: `entries` is a live, writable array of the length given; not alertable.
        let ok = unsafe {
            GetQueuedCompletionStatusEx(
                self.0,
                entries.as_mut_ptr(),
                u32::try_from(entries.len()).unwrap_or(u32::MAX),
                &raw mut removed,
                timeout_ms,
                0,
            )
        };
        if ok != 0 {
            return Ok(removed as usize);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(WAIT_TIMEOUT as i32) {
            Ok(0)
        } else {
            Err(e)
        }
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: the handle is this port's, closed once. Nothing waits on it (its one user
        // is the owner being dropped).
        unsafe { CloseHandle(self.0) };
    }
}

/// A ring driven on the port of the port's I/O (auto progress), or by the status of its
/// requests (manual progress: see [`RxPort`]).
struct Driver {
    ring: RecvRing,
    rx: Arc<RxPort>,
    /// Scratch for the harvest: the OVERLAPPED addresses of completed requests.
    done: Vec<usize>,
}

impl Driver {
    /// Moves up to `max` completed receives into `done`, waiting up to `timeout_ms` for one
    /// when none is there; returns how many packets or requests were looked at (`max` or
    /// more: more may wait).
    fn harvest(&mut self, max: usize, timeout_ms: u32) -> io::Result<usize> {
        if !self.rx.is_manual() {
            return self.rx.harvest(&mut self.done, max, timeout_ms);
        }
        let n = self.ring.done_in_order(&mut self.done, max);
        if n > 0 {
            return Ok(n);
        }
        // Nothing done by its status: a wait on the input (a zero one for a look) is also
        // the system call in which Wine completes receives whose data arrived.
        if self.rx.wait_input(timeout_ms) {
            return Ok(self.ring.done_in_order(&mut self.done, max));
        }
        Ok(0)
    }
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("ring", &self.ring)
            .finish_non_exhaustive()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if self.ring.in_flight() == 0 {
            return;
        }
        self.rx.forget_ring();
        self.ring.cancel();
        // Cancelled requests complete promptly, through the port (a sleep of the port's I/O
        // may take their packets: they are then in its list) or, in manual progress, by their
        // status; wait for each (for at most about 5 s, after which the ring leaks its slots
        // rather than free them under the system).
        for _ in 0..50 {
            self.done.clear();
            let _ = self.harvest(usize::MAX, 100);
            for &addr in &self.done {
                if let Some(i) = self.ring.slot_at(addr) {
                    let _ = self.ring.complete(i);
                }
            }
            if self.ring.in_flight() == 0 {
                return;
            }
        }
    }
}

/// Buffers for [`recv_batch`], reused across calls, and the ring of receive requests that
/// fills them.
#[derive(Debug)]
pub(crate) struct RecvBufs {
    /// The datagrams of the last call, `got[i]` in `bufs[i]`.
    pub(crate) bufs: Vec<Vec<u8>>,
    pub(crate) got: Vec<Received>,
    driver: Driver,
}

impl RecvBufs {
    /// `count` buffers of `size` bytes, and as many receive requests on a handle of their own
    /// to `sock`, posted: associated with `rx`'s port in auto progress; in manual progress
    /// with no port yet (the application's may join, [`RxPort`]), each request carrying the
    /// input event.
    ///
    /// # Errors
    /// The handle cannot be made or associated, or Winsock has no `WSARecvMsg`.
    pub(crate) fn new(
        sock: &UdpSocket,
        rx: Arc<RxPort>,
        count: usize,
        size: usize,
    ) -> io::Result<Self> {
        let mut ring = RecvRing::new(sock, count, size)?;
        match rx.input_event() {
            Some(event) => {
                ring.set_event(event);
                rx.adopt_ring(&ring);
            }
            None => ring.associate(rx.port.handle(), RING_KEY)?,
        }
        // A request Winsock refuses now goes out again at the next harvest.
        ring.post_idle();
        Ok(Self {
            bufs: vec![vec![0u8; size]; count],
            got: Vec::with_capacity(count),
            driver: Driver {
                ring,
                rx,
                done: Vec::with_capacity(count),
            },
        })
    }
}

/// Takes the receives already completed — those a sleep of the port's I/O dequeued, then
/// those queued on the port; in manual progress those whose status says so — without
/// waiting, up to the number of buffers, and reposts each request at once. The results are
/// in `bufs.got`; none completed is `Ok(0)`. In manual progress the input signal is then
/// rearmed ([`RxPort::rearm_input`]): a wait after this call sleeps only while nothing is
/// there.
///
/// # Errors
/// The port failed.
pub(crate) fn recv_batch(_sock: &UdpSocket, bufs: &mut RecvBufs) -> io::Result<usize> {
    bufs.got.clear();
    let d = &mut bufs.driver;
    // Requests Winsock refused last time (an error it reported at once) go out again.
    d.ring.post_idle();
    d.done.clear();
    let want = bufs.bufs.len();
    let seen = d.harvest(want, 0)?;
    for &addr in &d.done {
        let Some(i) = d.ring.slot_at(addr) else {
            continue;
        };
        if let Completion::Datagram(r) = d.ring.complete(i) {
            let k = bufs.got.len();
            if let (Some(out), Some(filled)) = (bufs.bufs.get_mut(k), d.ring.buffer_mut(i)) {
                std::mem::swap(out, filled);
                bufs.got.push(r);
            }
        }
        // A failed post leaves the slot idle for the next call's `post_idle`.
        let _ = d.ring.post(i);
    }
    let ring = &d.ring;
    d.rx.rearm_input(|| seen >= want || ring.any_done());
    Ok(bufs.got.len())
}

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
//! * **Manual progress** (no thread of ours): whoever calls drives the device, and its
//!   receive takes what completed with a zero timeout. Nothing yet lets a manual wait sleep
//!   on the input: such a wait sleeps on its event queue alone, until its deadline or the
//!   device's next timer.
//!
//! Microsoft Learn pages these calls follow: "GetQueuedCompletionStatusEx function",
//! "PostQueuedCompletionStatus function".

use std::io;
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use portverbs_fabric::{Mode, PortIo, WaitSource};
use windows_sys::Win32::System::IO::OVERLAPPED_ENTRY;
use windows_sys::Win32::System::Threading::INFINITE;

use super::recv::{Port, RecvBufs};

/// The key of the ring's receive completions on the port.
pub(crate) const RING_KEY: usize = 0;
/// The key of the fabric's wake-ups on the port.
pub(crate) const WAKE_KEY: usize = 1;

/// Packets one dequeue takes at most (the ring has at most this many requests).
const DEQUEUE_MAX: usize = 64;

/// A timeout in whole milliseconds, rounded up (a wait never ends before its deadline), below
/// `INFINITE`.
fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_micros().div_ceil(1000)).unwrap_or(INFINITE - 1)
}

/// The port the ring's requests complete to, shared by the node's receive
/// ([`super::recv::recv_batch`]) and the sleeps of the port's I/O ([`UdpIo`]).
#[derive(Debug)]
pub(crate) struct RxPort {
    pub(crate) port: Port,
    /// The OVERLAPPED addresses of receive completions a sleep dequeued, for the next
    /// harvest (at most one per receive slot).
    taken: Mutex<Vec<usize>>,
    /// A wake-up packet is queued and not yet dequeued.
    wake_queued: AtomicBool,
}

impl RxPort {
    /// A port.
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            port: Port::new()?,
            taken: Mutex::new(Vec::new()),
            wake_queued: AtomicBool::new(false),
        })
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

    /// Dequeues what is queued, waiting up to `timeout` for a packet, and keeps the receive
    /// completions for the next harvest. Returns whether receives are kept.
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

/// The port's I/O as the fabric sees it.
#[derive(Debug)]
pub(crate) struct UdpIo {
    rx: Arc<RxPort>,
    /// Set when input may be waiting; the node receives when it is (or every
    /// [`crate::rx::RX_LOOK`]), and clears it when a receive took less than a batch.
    pub(crate) hint: Arc<AtomicBool>,
}

impl UdpIo {
    /// The port, the same in every mode of the fabric (the socket joins at
    /// [`UdpIo::recv_bufs`]).
    pub(crate) fn new(_sock: &UdpSocket, _mode: Mode) -> io::Result<Self> {
        Ok(Self {
            rx: Arc::new(RxPort::new()?),
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
        let input = self.rx.sleep(timeout);
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
        WaitSource::none()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
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
}

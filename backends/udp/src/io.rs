//! What the port lends its fabric to sleep on ([`portverbs_fabric::PortIo`]): an epoll set
//! holding the port's receiving socket, and an eventfd that wakes a sleep.
//!
//! The engine thread of a free-running fabric (auto progress) sleeps in poll(2) on both: a
//! datagram or a doorbell wakes it, and it receives on its own next step. The waits of a
//! manual fabric's users sleep on the epoll set (it is itself pollable: readable while a
//! socket in it is) together with their event queue's sink. The set holds the socket without
//! owning it: when the port closes its socket, the kernel takes it out of the set, so the
//! fabric keeping this lent object does not keep the address bound.

use std::io;
use std::net::UdpSocket;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use portverbs_fabric::{Mode, PortIo, WaitSource};
use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec, epoll, eventfd, poll};
use rustix::io::Errno;

use crate::sys::RecvBufs;

/// The port's I/O as the fabric sees it.
#[derive(Debug)]
pub(crate) struct UdpIo {
    /// An epoll set with the receiving socket in it.
    rx_set: OwnedFd,
    /// Written to wake a sleep.
    wake: OwnedFd,
    /// Set when input may be waiting; the node receives when it is (or every
    /// [`crate::rx::RX_LOOK`]), and clears it when a receive drained the socket.
    pub(crate) hint: Arc<AtomicBool>,
}

impl UdpIo {
    /// The set for `sock`, and a wake-up (the same in every mode of the fabric).
    pub(crate) fn new(sock: &UdpSocket, _mode: Mode) -> io::Result<Self> {
        let rx_set = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        epoll::add(
            &rx_set,
            sock,
            epoll::EventData::new_u64(0),
            epoll::EventFlags::IN,
        )?;
        let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Self {
            rx_set,
            wake,
            hint: Arc::new(AtomicBool::new(true)),
        })
    }

    /// Adds another receiving socket (a multicast group's) to the set: its datagrams wake a
    /// sleep too. It leaves the set when it is closed.
    pub(crate) fn watch(&self, sock: &UdpSocket) -> io::Result<()> {
        epoll::add(
            &self.rx_set,
            sock,
            epoll::EventData::new_u64(1),
            epoll::EventFlags::IN,
        )?;
        Ok(())
    }

    /// The receive buffers: `count` of `size` bytes, for `recvmmsg` on `sock`.
    pub(crate) fn recv_bufs(
        &self,
        _sock: &UdpSocket,
        count: usize,
        size: usize,
    ) -> io::Result<RecvBufs> {
        Ok(RecvBufs::new(count, size))
    }

    fn drain_wake(&self) {
        let mut buf = [0u8; 8];
        loop {
            match rustix::io::read(&self.wake, &mut buf) {
                Err(Errno::INTR) => {}
                _ => return,
            }
        }
    }
}

/// Polls `fds` for input for at most `timeout` (a signal ends the poll early, harmlessly).
fn poll_in(fds: &mut [PollFd<'_>], timeout: Duration) -> usize {
    let t = Timespec::try_from(timeout).unwrap_or(Timespec {
        tv_sec: i64::MAX,
        tv_nsec: 0,
    });
    poll(fds, Some(&t)).unwrap_or(0)
}

impl PortIo for UdpIo {
    fn wait(&self, timeout: Duration) -> bool {
        let mut fds = [
            PollFd::new(&self.rx_set, PollFlags::IN),
            PollFd::new(&self.wake, PollFlags::IN),
        ];
        poll_in(&mut fds, timeout);
        let input = !fds[0].revents().is_empty();
        if !fds[1].revents().is_empty() {
            self.drain_wake();
        }
        if input {
            self.hint.store(true, Ordering::Release);
        }
        input
    }

    fn wake(&self) {
        loop {
            match rustix::io::write(&self.wake, &1u64.to_ne_bytes()) {
                Err(Errno::INTR) => {}
                _ => return,
            }
        }
    }

    fn ready(&self) -> bool {
        let mut fds = [PollFd::new(&self.rx_set, PollFlags::IN)];
        let input = poll_in(&mut fds, Duration::ZERO) > 0;
        if input {
            self.hint.store(true, Ordering::Release);
        }
        input
    }

    fn wait_source(&self) -> WaitSource<'_> {
        WaitSource::from_fd(self.rx_set.as_fd())
    }
}

//! I/O completion ports: a queue of packets `(bytes, key, OVERLAPPED address)` that threads
//! sleep on. This crate posts to them (`PostQueuedCompletionStatus`) from the thread that makes
//! progress; it never closes one to wake a waiter (Wine 8 does not wake waiters on close).

use std::io;
use std::time::Duration;

use windows_sys::Win32::Foundation::HANDLE;
use windows_sys::Win32::System::IO::{OVERLAPPED, OVERLAPPED_ENTRY};

use crate::sys::{self, Handle, Woke};

/// An I/O completion port of the application's (or one of this crate's private ones).
#[derive(Debug)]
pub struct CompletionPort {
    handle: Handle,
}

/// One dequeued packet. The OVERLAPPED address is only an identity: compare it with
/// [`crate::Overlapped::is`] (nothing dereferences it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet {
    /// The completion key it was queued under.
    pub key: usize,
    /// The OVERLAPPED it completes (null for a posted wake-up).
    pub overlapped: *mut OVERLAPPED,
    /// The byte count.
    pub bytes: u32,
}

/// How a dequeue ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dequeued {
    /// This many packets were appended to the output.
    Packets(usize),
    /// The timeout passed with the port empty.
    TimedOut,
    /// An alertable dequeue ran APCs queued to this thread (WAIT_IO_COMPLETION).
    Alerted,
}

impl CompletionPort {
    /// Creates an empty port.
    ///
    /// # Errors
    /// The system refused.
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            handle: sys::create_port()?,
        })
    }

    /// Queues a packet (`PostQueuedCompletionStatus`).
    ///
    /// # Errors
    /// The system refused (out of memory).
    pub fn post(&self, key: usize, overlapped: *mut OVERLAPPED, bytes: u32) -> io::Result<()> {
        sys::post(&self.handle, bytes, key, overlapped)
    }

    /// Removes one packet, waiting up to `timeout` (`None`: for ever); `None` when the
    /// timeout passed.
    ///
    /// # Errors
    /// The dequeue failed.
    pub fn get(&self, timeout: Option<Duration>) -> io::Result<Option<Packet>> {
        let mut out = Vec::with_capacity(1);
        match self.get_many(&mut out, 1, timeout, false)? {
            Dequeued::Packets(_) => Ok(out.pop()),
            Dequeued::TimedOut | Dequeued::Alerted => Ok(None),
        }
    }

    /// Removes up to `max` packets in one call (`GetQueuedCompletionStatusEx`), appending
    /// them to `out`; an `alertable` dequeue also returns after APCs ran.
    ///
    /// # Errors
    /// The dequeue failed.
    pub fn get_many(
        &self,
        out: &mut Vec<Packet>,
        max: usize,
        timeout: Option<Duration>,
        alertable: bool,
    ) -> io::Result<Dequeued> {
        let mut entries = vec![OVERLAPPED_ENTRY::default(); max.max(1)];
        match sys::dequeue(&self.handle, &mut entries, sys::millis(timeout), alertable)? {
            Woke::Got(n) => {
                out.extend(entries[..n].iter().map(|e| Packet {
                    key: e.lpCompletionKey,
                    overlapped: e.lpOverlapped,
                    bytes: e.dwNumberOfBytesTransferred,
                }));
                Ok(Dequeued::Packets(n))
            }
            Woke::TimedOut => Ok(Dequeued::TimedOut),
            Woke::Alerted => Ok(Dequeued::Alerted),
        }
    }

    /// The raw handle, valid while `self` lives.
    pub fn raw(&self) -> HANDLE {
        self.handle.raw()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packets_come_back_in_order_with_their_values() {
        let port = CompletionPort::new().unwrap();
        assert_eq!(port.get(Some(Duration::ZERO)).unwrap(), None);
        for k in 1..=3 {
            port.post(k, std::ptr::null_mut(), k as u32 * 10).unwrap();
        }
        let mut out = Vec::new();
        assert_eq!(
            port.get_many(&mut out, 8, Some(Duration::ZERO), false)
                .unwrap(),
            Dequeued::Packets(3)
        );
        let keys: Vec<_> = out.iter().map(|p| (p.key, p.bytes)).collect();
        assert_eq!(keys, [(1, 10), (2, 20), (3, 30)]);
    }
}

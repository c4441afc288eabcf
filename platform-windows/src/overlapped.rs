//! The caller's side of a request: an OVERLAPPED block, and how its final status reads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use portverbs_verbs::NotifyError;
use windows_sys::Win32::Foundation::HANDLE;
use windows_sys::Win32::System::IO::OVERLAPPED;

use crate::error::RequestError;
use crate::event::Event;
use crate::port::Packet;
use crate::sys::OverlappedCell;

/// NTSTATUS values a request completes with (the ND status of the same name).
pub mod status {
    /// ND_SUCCESS.
    pub const SUCCESS: i32 = 0;
    /// ND_PENDING: still in flight.
    pub const PENDING: i32 = 0x103;
    /// ND_UNSUCCESSFUL: an async operation failed (its typed error is in its handle).
    pub const UNSUCCESSFUL: i32 = 0xC000_0001_u32 as i32;
    /// ND_INTERNAL_ERROR: the CQ is in error (overrun or catastrophic).
    pub const INTERNAL_ERROR: i32 = 0xC000_00E5_u32 as i32;
    /// ND_CANCELED: cancelled, or the CQ was destroyed.
    pub const CANCELLED: i32 = 0xC000_0120_u32 as i32;
    /// ND_DEVICE_REMOVED: the device failed or was removed.
    pub const DEVICE_REMOVED: i32 = 0xC000_02B6_u32 as i32;
}

/// The NTSTATUS a finished notify request completes with.
pub(crate) fn notify_status(r: Result<(), NotifyError>) -> i32 {
    match r {
        Ok(()) => status::SUCCESS,
        Err(NotifyError::Cancelled { .. }) => status::CANCELLED,
        Err(NotifyError::CqError { .. }) => status::INTERNAL_ERROR,
        Err(_) => status::DEVICE_REMOVED,
    }
}

pub(crate) struct OverlappedInner {
    cell: OverlappedCell,
    /// Keeps the event named by `hEvent` open while the block may be completed.
    event: Option<Arc<Event>>,
    in_flight: AtomicBool,
}

/// An OVERLAPPED block owned by the application and shared with this crate while a request
/// on it is in flight. Cheap to clone; the block's address ([`as_ptr`](Self::as_ptr)) never
/// changes, and the crate keeps the block alive until the request completed, so the Windows
/// rule "the OVERLAPPED must stay valid until the I/O completes" holds by construction.
///
/// How a completion is delivered depends on how the block was made:
/// * [`new`](Self::new): a packet on the completion port the device is associated with
///   ([`crate::Completions::associate`]), if any;
/// * [`with_event`](Self::with_event): the event is signalled *and* the packet is queued;
/// * [`event_only`](Self::event_only): `hEvent` has its low bit set, so the event is
///   signalled and no packet is ever queued, whatever the port.
///
/// In every case `Internal` holds the final NTSTATUS and `InternalHigh` the byte count
/// before anything is signalled, as Win32 `GetOverlappedResult` expects.
#[derive(Clone)]
pub struct Overlapped {
    pub(crate) inner: Arc<OverlappedInner>,
}

impl std::fmt::Debug for Overlapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overlapped")
            .field("cell", &self.inner.cell)
            .field("event_only", &self.is_event_only())
            .finish()
    }
}

impl Overlapped {
    fn make(event: Option<Arc<Event>>, low_bit: bool) -> Self {
        let raw = event
            .as_ref()
            .map_or(0, |e| e.raw() as usize | usize::from(low_bit));
        Self {
            inner: Arc::new(OverlappedInner {
                cell: OverlappedCell::new(raw as HANDLE),
                event,
                in_flight: AtomicBool::new(false),
            }),
        }
    }

    /// A block without an event: its completions go to the port only.
    pub fn new() -> Self {
        Self::make(None, false)
    }

    /// A block whose completion signals `event` (and is also queued on the port).
    pub fn with_event(event: Arc<Event>) -> Self {
        Self::make(Some(event), false)
    }

    /// A block whose `hEvent` is `event` with the low bit set: completions signal the event
    /// and never reach the port.
    pub fn event_only(event: Arc<Event>) -> Self {
        Self::make(Some(event), true)
    }

    /// The block's address, as completion packets carry it and as Win32 calls take it.
    pub fn as_ptr(&self) -> *mut OVERLAPPED {
        self.inner.cell.as_ptr()
    }

    /// True when `packet` completes this block.
    pub fn is(&self, packet: &Packet) -> bool {
        std::ptr::eq(packet.overlapped, self.as_ptr())
    }

    /// The event behind `hEvent`, if any.
    pub fn event(&self) -> Option<&Arc<Event>> {
        self.inner.event.as_ref()
    }

    /// True when `hEvent` carries the low bit (completions never reach a port).
    pub fn is_event_only(&self) -> bool {
        self.inner.cell.event() as usize & 1 == 1
    }

    /// True while a request on this block is in flight.
    pub fn is_pending(&self) -> bool {
        self.inner.in_flight.load(Ordering::Acquire)
    }

    /// The raw NTSTATUS in `Internal`.
    pub fn raw_status(&self) -> i32 {
        self.inner.cell.status()
    }

    /// The outcome, once the request completed (read from `Internal`).
    pub fn result(&self) -> Option<Result<u32, RequestError>> {
        match self.raw_status() {
            status::PENDING => None,
            s => Some(RequestError::check(s).map(|()| self.bytes())),
        }
    }

    fn bytes(&self) -> u32 {
        self.inner.cell.overlapped_result(false).unwrap_or(0)
    }

    /// Win32 `GetOverlappedResult` on the block: with `wait`, blocks on the block's event
    /// until the request completes (refused without an event: there is no file handle to
    /// wait on). Errors come back typed, from the Win32 error the system derived.
    ///
    /// # Errors
    /// [`RequestError::Incomplete`] when still pending and `wait` is false; the request's
    /// own error otherwise.
    pub fn get_overlapped_result(&self, wait: bool) -> Result<u32, RequestError> {
        if wait && self.inner.event.is_none() && self.is_pending() {
            return Err(RequestError::NoEvent);
        }
        self.inner
            .cell
            .overlapped_result(wait)
            .map_err(RequestError::from_win32)
    }

    /// Starts a request: refused while another is in flight; sets `Internal` to
    /// STATUS_PENDING and resets the event, as the system does when an I/O starts.
    pub(crate) fn begin(&self) -> Result<(), RequestError> {
        if self.inner.in_flight.swap(true, Ordering::AcqRel) {
            return Err(RequestError::InFlight);
        }
        self.inner.cell.write_result(status::PENDING, 0);
        if let Some(e) = &self.inner.event {
            e.reset().map_err(RequestError::Os)?;
        }
        Ok(())
    }

    /// Writes the final status and signals the event (low bit cleared), as a driver
    /// completing an I/O does. The port packet is the caller's business.
    pub(crate) fn finish(&self, status: i32, bytes: usize) {
        self.inner.cell.write_result(status, bytes);
        self.inner.in_flight.store(false, Ordering::Release);
        if let Some(e) = &self.inner.event {
            if let Err(err) = e.set() {
                // Our own open event: only a broken process could fail here.
                debug_assert!(false, "SetEvent on our own event failed: {err}");
            }
        }
    }
}

impl Default for Overlapped {
    fn default() -> Self {
        Self::new()
    }
}

//! Every call into Win32 the crate makes, and so all of its `unsafe` code. Each wrapper takes
//! and returns safe Rust values: owned handles close themselves, OVERLAPPED blocks live in
//! boxes of their own whose address never changes, and the fields the system reads
//! concurrently (`Internal`, `InternalHigh`) are only touched through atomics.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::fmt;
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use windows_sys::Win32::Foundation::{
    CloseHandle, DUPLICATE_SAME_ACCESS, DuplicateHandle, GetLastError, HANDLE,
    INVALID_HANDLE_VALUE, WAIT_IO_COMPLETION, WAIT_OBJECT_0, WAIT_TIMEOUT,
};
use windows_sys::Win32::System::Diagnostics::ToolHelp::{
    CreateToolhelp32Snapshot, TH32CS_SNAPTHREAD, THREADENTRY32, Thread32First, Thread32Next,
};
use windows_sys::Win32::System::IO::{
    CreateIoCompletionPort, GetOverlappedResult, GetQueuedCompletionStatusEx, OVERLAPPED,
    OVERLAPPED_ENTRY, PostQueuedCompletionStatus,
};
use windows_sys::Win32::System::Threading::{
    CreateEventW, GetCurrentProcess, GetCurrentProcessId, GetCurrentThread, QueueUserAPC,
    ResetEvent, SetEvent, SleepEx, WaitForMultipleObjectsEx, WaitForSingleObjectEx,
};

/// An owned kernel handle, closed on drop.
pub(crate) struct Handle(HANDLE);

// SAFETY: a kernel handle is a process-wide index into the handle table; any thread may use
// it, and `Handle` only hands it to Win32 calls that are thread-safe.
unsafe impl Send for Handle {}
// SAFETY: as above; no method mutates the `Handle` itself.
unsafe impl Sync for Handle {}

impl Handle {
    fn from_result(h: HANDLE) -> io::Result<Self> {
        if h.is_null() || h == INVALID_HANDLE_VALUE {
            Err(io::Error::last_os_error())
        } else {
            Ok(Self(h))
        }
    }

    /// The raw value, for the application's own Win32 calls. Valid while `self` lives.
    pub(crate) fn raw(&self) -> HANDLE {
        self.0
    }
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Handle({:#x})", self.0 as usize)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: `self.0` is a handle this process opened and that only this `Handle` owns;
        // it is closed exactly once, here.
        unsafe { CloseHandle(self.0) };
    }
}

fn check(ok: i32) -> io::Result<()> {
    if ok == 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Milliseconds for a Win32 wait: `None` is INFINITE, and anything longer than 49 days is
/// cut to just under INFINITE.
pub(crate) fn millis(timeout: Option<std::time::Duration>) -> u32 {
    match timeout {
        None => u32::MAX,
        Some(t) => u32::try_from(t.as_millis()).map_or(u32::MAX - 1, |ms| ms.min(u32::MAX - 1)),
    }
}

/// Creates a new, empty I/O completion port (concurrency 0: as many threads as CPUs; Wine
/// ignores the value, and nothing here relies on it).
pub(crate) fn create_port() -> io::Result<Handle> {
    // SAFETY: INVALID_HANDLE_VALUE with no existing port creates a fresh port; no pointer
    // is passed.
    Handle::from_result(unsafe {
        CreateIoCompletionPort(INVALID_HANDLE_VALUE, ptr::null_mut(), 0, 0)
    })
}

/// Queues a packet on `port`. `ov` is passed through as a number: the port never
/// dereferences it, and neither does this crate when it is dequeued.
pub(crate) fn post(port: &Handle, bytes: u32, key: usize, ov: *mut OVERLAPPED) -> io::Result<()> {
    // SAFETY: `port` is a live completion port; the system stores `ov` without reading it.
    check(unsafe { PostQueuedCompletionStatus(port.raw(), bytes, key, ov) })
}

/// The outcome of a dequeue or a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woke {
    /// Packets were removed (their number), or the handle was signalled.
    Got(usize),
    /// The timeout passed.
    TimedOut,
    /// An alertable wait ran queued APCs (WAIT_IO_COMPLETION).
    Alerted,
}

/// Removes up to `entries.len()` packets from `port`, waiting up to `ms`.
pub(crate) fn dequeue(
    port: &Handle,
    entries: &mut [OVERLAPPED_ENTRY],
    ms: u32,
    alertable: bool,
) -> io::Result<Woke> {
    let n = u32::try_from(entries.len()).unwrap_or(u32::MAX);
    let mut removed = 0u32;
    // SAFETY: `entries` is a valid, writable array of at least `n` entries and `removed` a
    // valid u32; `port` is a live completion port.
    let ok = unsafe {
        GetQueuedCompletionStatusEx(
            port.raw(),
            entries.as_mut_ptr(),
            n,
            &mut removed,
            ms,
            i32::from(alertable),
        )
    };
    if ok != 0 {
        return Ok(Woke::Got(removed as usize));
    }
    // SAFETY: reads this thread's last-error value; no arguments.
    match unsafe { GetLastError() } {
        WAIT_TIMEOUT => Ok(Woke::TimedOut),
        WAIT_IO_COMPLETION => Ok(Woke::Alerted),
        e => Err(io::Error::from_raw_os_error(e as i32)),
    }
}

/// Creates an unnamed event, manual-reset or auto-reset, initially not signalled.
pub(crate) fn create_event(manual_reset: bool) -> io::Result<Handle> {
    // SAFETY: no security attributes and no name (null pointers are allowed for both).
    Handle::from_result(unsafe {
        CreateEventW(ptr::null(), i32::from(manual_reset), 0, ptr::null())
    })
}

/// Signals the event `h` (a raw value: it may be an event the application owns, taken from
/// an OVERLAPPED's `hEvent` with its low bit cleared).
pub(crate) fn set_event(h: HANDLE) -> io::Result<()> {
    // SAFETY: SetEvent validates the handle itself and fails on a bad one; no memory is
    // passed.
    check(unsafe { SetEvent(h) })
}

/// Resets the event `h`.
pub(crate) fn reset_event(h: HANDLE) -> io::Result<()> {
    // SAFETY: as `set_event`.
    check(unsafe { ResetEvent(h) })
}

/// Waits for `h` to be signalled, up to `ms`; alertable waits also end for queued APCs.
pub(crate) fn wait_one(h: HANDLE, ms: u32, alertable: bool) -> io::Result<Woke> {
    // SAFETY: the wait validates the handle itself; no memory is passed.
    match unsafe { WaitForSingleObjectEx(h, ms, i32::from(alertable)) } {
        WAIT_OBJECT_0 => Ok(Woke::Got(1)),
        WAIT_TIMEOUT => Ok(Woke::TimedOut),
        WAIT_IO_COMPLETION => Ok(Woke::Alerted),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Waits for any of `handles` (at most 64) to be signalled, up to `ms`; alertable waits also
/// end for queued APCs.
pub(crate) fn wait_any(handles: &[HANDLE], ms: u32, alertable: bool) -> io::Result<Woke> {
    let n = u32::try_from(handles.len()).unwrap_or(u32::MAX);
    // SAFETY: `handles` is a live array of the length given; the wait validates each handle
    // itself and fails on a bad one.
    match unsafe { WaitForMultipleObjectsEx(n, handles.as_ptr(), 0, ms, i32::from(alertable)) } {
        WAIT_TIMEOUT => Ok(Woke::TimedOut),
        WAIT_IO_COMPLETION => Ok(Woke::Alerted),
        r if r.wrapping_sub(WAIT_OBJECT_0) < n => Ok(Woke::Got(1)),
        _ => Err(io::Error::last_os_error()),
    }
}

/// An alertable sleep of up to `ms`: true when it ended because APCs ran.
pub(crate) fn sleep_alertable(ms: u32) -> bool {
    // SAFETY: no arguments besides numbers.
    unsafe { SleepEx(ms, 1) == WAIT_IO_COMPLETION }
}

/// A real handle (not the pseudo-handle) to the calling thread, for queueing APCs to it.
pub(crate) fn current_thread() -> io::Result<Handle> {
    let mut out: HANDLE = ptr::null_mut();
    // SAFETY: duplicates the calling thread's pseudo-handle into a real one in this process;
    // `out` is a valid place for the result.
    let ok = unsafe {
        DuplicateHandle(
            GetCurrentProcess(),
            GetCurrentThread(),
            GetCurrentProcess(),
            &mut out,
            0,
            0,
            DUPLICATE_SAME_ACCESS,
        )
    };
    check(ok)?;
    Handle::from_result(out)
}

type Apc = Box<dyn FnOnce() + Send>;

unsafe extern "system" fn run_apc(data: usize) {
    // SAFETY: `data` is the pointer `queue_apc` made with `Box::into_raw` of a `Box<Apc>`,
    // and the system runs each queued APC exactly once.
    let f = unsafe { Box::from_raw(data as *mut Apc) };
    f();
}

/// Queues `f` to run on `thread` at its next alertable wait. If the thread ends before
/// waiting alertably, `f` never runs (and is leaked), as with any APC.
pub(crate) fn queue_apc(thread: &Handle, f: Apc) -> io::Result<()> {
    let data = Box::into_raw(Box::new(f));
    // SAFETY: `run_apc` takes back exactly the box made here; `thread` is a live thread
    // handle with THREAD_SET_CONTEXT (the same access as the thread's own pseudo-handle).
    let ok = unsafe { QueueUserAPC(Some(run_apc), thread.raw(), data as usize) };
    if ok == 0 {
        let e = io::Error::last_os_error();
        // SAFETY: the APC was not queued, so the box is still ours to free.
        drop(unsafe { Box::from_raw(data) });
        return Err(e);
    }
    Ok(())
}

/// One OVERLAPPED block at a fixed address (boxed), shared between this crate (which
/// completes it) and the system calls the application makes on it (`GetOverlappedResult`).
pub(crate) struct OverlappedCell(Box<UnsafeCell<OVERLAPPED>>);

// SAFETY: the block is only read and written through atomics (`Internal`, `InternalHigh`)
// once shared; `hEvent` is written only by `new`, before the cell is shared.
unsafe impl Send for OverlappedCell {}
// SAFETY: as above.
unsafe impl Sync for OverlappedCell {}

impl fmt::Debug for OverlappedCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OverlappedCell")
            .field("at", &self.as_ptr())
            .field("status", &format_args!("{:#x}", self.status()))
            .finish()
    }
}

impl OverlappedCell {
    /// A zeroed block whose `hEvent` is `event` (null for none; the low bit may be set).
    pub(crate) fn new(event: HANDLE) -> Self {
        let ov = OVERLAPPED {
            hEvent: event,
            ..OVERLAPPED::default()
        };
        Self(Box::new(UnsafeCell::new(ov)))
    }

    /// The address the application hands to Win32 and finds in completion packets.
    pub(crate) fn as_ptr(&self) -> *mut OVERLAPPED {
        self.0.get()
    }

    fn internal(&self) -> &AtomicUsize {
        // SAFETY: the field is a properly aligned usize inside a live box; all concurrent
        // accesses from Rust go through atomics, and the system only reads it.
        unsafe { AtomicUsize::from_ptr(ptr::addr_of_mut!((*self.as_ptr()).Internal)) }
    }

    fn internal_high(&self) -> &AtomicUsize {
        // SAFETY: as `internal`, for the byte count.
        unsafe { AtomicUsize::from_ptr(ptr::addr_of_mut!((*self.as_ptr()).InternalHigh)) }
    }

    /// The `hEvent` field as given to `new`.
    pub(crate) fn event(&self) -> HANDLE {
        // SAFETY: `hEvent` is written only in `new`, before the cell could be shared.
        unsafe { (*self.as_ptr()).hEvent }
    }

    /// Writes the final NTSTATUS and byte count, as a driver does before signalling.
    pub(crate) fn write_result(&self, status: i32, bytes: usize) {
        self.internal_high().store(bytes, Ordering::Relaxed);
        // Release: whoever reads the status sees the byte count.
        self.internal()
            .store(status as u32 as usize, Ordering::Release);
    }

    /// The NTSTATUS in `Internal` (STATUS_PENDING while in flight).
    pub(crate) fn status(&self) -> i32 {
        self.internal().load(Ordering::Acquire) as u32 as i32
    }

    /// Win32 `GetOverlappedResult` on this block: the byte count, or the Win32 error the
    /// system derived from the status (ERROR_IO_INCOMPLETE while pending and `wait` is
    /// false). With `wait` it blocks on `hEvent`, which must then be a real event.
    pub(crate) fn overlapped_result(&self, wait: bool) -> Result<u32, u32> {
        let mut bytes = 0u32;
        // SAFETY: the block is live and at a fixed address; no file handle is needed because
        // either the status is final or the wait is on `hEvent` (the application's event).
        let ok = unsafe {
            GetOverlappedResult(ptr::null_mut(), self.as_ptr(), &mut bytes, i32::from(wait))
        };
        if ok != 0 {
            Ok(bytes)
        } else {
            // SAFETY: reads this thread's last-error value.
            Err(unsafe { GetLastError() })
        }
    }
}

/// How many threads this process has now (a Toolhelp snapshot).
///
/// # Errors
/// The snapshot could not be taken.
pub(crate) fn thread_count() -> io::Result<usize> {
    // SAFETY: a snapshot of all threads; no pointer arguments.
    let snap = Handle::from_result(unsafe { CreateToolhelp32Snapshot(TH32CS_SNAPTHREAD, 0) })?;
    // SAFETY: no arguments.
    let me = unsafe { GetCurrentProcessId() };
    let mut entry = THREADENTRY32 {
        dwSize: size_of::<THREADENTRY32>() as u32,
        ..THREADENTRY32::default()
    };
    let mut n = 0;
    // SAFETY: `entry` is a valid THREADENTRY32 with `dwSize` set, as the call requires.
    let mut more = unsafe { Thread32First(snap.raw(), &mut entry) } != 0;
    while more {
        if entry.th32OwnerProcessID == me {
            n += 1;
        }
        // SAFETY: as above.
        more = unsafe { Thread32Next(snap.raw(), &mut entry) } != 0;
    }
    Ok(n)
}

//! # Portverbs on Windows: completions through I/O completion ports, events and APCs
//!
//! This layer lets a Windows program wait for what the device tells the host — "CQ n has a
//! completion", "the command finished", "the device failed" — the way Windows programs wait
//! for any I/O: an OVERLAPPED request that completes to an **I/O completion port**, to an
//! **event** (`GetOverlappedResult`), or to an **APC** on the requesting thread, as the caller
//! chooses, with no thread of its own and no callbacks into the application. NetworkDirect's
//! `Notify(type, ov)` and WinVerbs' `IWVCompletionQueue::Notify` are the models.
//!
//! On any other OS the crate is empty, as `portverbs-linux` is on Windows.
//!
//! ## What a Windows user gets
//! | Windows idiom | Portverbs | Notes |
//! |---|---|---|
//! | open an adapter | [`open`] → [`Completions`] (with [`Completions::context`]) | a private completion port per event queue ([`WindowsSinks`]) |
//! | `CreateIoCompletionPort(device, port, key, 0)` | [`Completions::associate`] | one key per opened device; a second association is refused; a manual-progress UDP device's socket joins the port too, so its datagrams wake the loop |
//! | ND `IND2CompletionQueue::Notify(type, ov)` | [`Completions::notify`] with an [`Overlapped`] | any / solicited / errors ([`NotifyKind`](portverbs_verbs::NotifyKind)); all pending requests complete at the next event |
//! | `GetQueuedCompletionStatus(Ex)` | [`CompletionPort::get`], [`CompletionPort::get_many`] | pass each packet to [`Completions::dispatch`]: `true` means it was the device's doorbell |
//! | `hEvent` + `GetOverlappedResult` | [`Overlapped::with_event`], [`Overlapped::get_overlapped_result`] | `Internal` holds the NTSTATUS, as Win32 reads it |
//! | `hEvent` with the low bit set | [`Overlapped::event_only`] | signals the event, never queues a packet |
//! | `ReadFileEx`-style APC | [`Completions::notify_apc`] | runs at the requesting thread's next alertable wait |
//! | `CancelIoEx(h, ov)` | [`Completions::cancel`] | completes the request with ND_CANCELED through its usual route |
//! | destroy the CQ | `Cq::destroy` | pending requests complete with ND_CANCELED |
//! | device removal | [`Completions::remove_device`], or a device failure | every request in flight completes with ND_DEVICE_REMOVED |
//! | an async verb with an OVERLAPPED | [`Completions::start`] | ND_SUCCESS / ND_UNSUCCESSFUL; the typed result in [`Operation`] |
//! | ND `IND2Connector::Connect` / `Accept` / `NotifyDisconnect`, `IND2Listener::GetConnectionRequest` | [`Completions::start`] with the connection manager's async calls (`portverbs::cm::service`: `Connector::connect`, `ConnectionRequest::accept`, `Connector::notify_disconnect`, `Listener::get_request`) moved into the future | the CM's progress rides on QP1's CQ events, which ring the device's doorbell like any other; `Connector::disconnect` returns at once (ND's `Disconnect` completes when the DREQ is sent) |
//! | Rust `async` | [`block_on_port`], or any executor | wakers come from the raise itself; no reactor thread; under [`block_on_port`] a task awaiting a manual-progress device also wakes for its input and at its next timer |
//! | a timer (`SetWaitableTimer`, a wait's timeout) | [`sleep_until`] | the deadline is the timeout of the next port wait of this crate ([`block_on_port`], [`Completions::wait`], [`Completions::wait_for`]) or of the application's loop ([`Completions::next_timeout`], then [`Completions::progress`]); the facade's `cm::PortTimer` lends it to the CM |
//!
//! Statuses map to typed errors with [`RequestError::check`] (from `OVERLAPPED.Internal`)
//! and [`RequestError::from_win32`] (from `GetOverlappedResult`'s error).
//!
//! ## How completions travel, without a thread
//! There is no kernel driver behind the software and emulated devices, so nothing completes
//! an OVERLAPPED "by itself". Every event queue's sink ([`PortSink`]) rings the device's
//! **doorbell** when the device raises it: one packet `(key, null OVERLAPPED)` on the
//! associated port (at most one queued at a time) and the [`Completions::doorbell_event`].
//! The application thread that dequeues the doorbell hands it to
//! [`Completions::dispatch`], which processes the event queues on that thread; the notify
//! requests that completes write their OVERLAPPEDs and queue *their* packets, which the same
//! loop dequeues next. A single thread can so keep requests outstanding on many CQs and
//! sleep on one port. Applications that wait on events or APCs wait on the doorbell event
//! instead ([`Completions::wait`], [`Completions::wait_for`]), or let another of their
//! threads run the port loop. In the soft device's stepped mode no thread exists at all;
//! with its engine thread, that thread only raises (it plays the hardware).
//!
//! Blocking waits of the portable API (`CompletionChannel::wait_cq_event`,
//! `Cq::wait_notify`, `Context::wait_async_event`) sleep on the event queue's private
//! completion port: `portverbs pingpong -e` sleeps in `GetQueuedCompletionStatusEx`.
//!
//! ## Caller's contract
//! An OVERLAPPED must stay valid until its request completes, as for any Windows I/O.
//! [`Overlapped`] makes that hold by construction: it is reference-counted, its block never
//! moves, and the crate holds a reference while a request is in flight. The addresses in
//! packets are only compared ([`Overlapped::is`]), never dereferenced. A request completes
//! exactly once: completed, cancelled or failed, whichever comes first, and always through
//! its route — a request that finishes at once still queues its packet, as on a handle
//! without `FILE_SKIP_COMPLETION_PORT_ON_SUCCESS`; only a refused request (an error
//! returned by the call) is never announced.
//!
//! ## Timers without a thread
//! A [`sleep_until`] future puts its deadline on the process's [`TimerList`]; every wait of
//! this crate sleeps in `GetQueuedCompletionStatus(Ex)` (or on the doorbell event) no longer
//! than the earliest deadline, and wakes the sleeps that are due when it returns. An
//! application's own port loop does the same with two calls:
//! ```text
//! match port.get(win.next_timeout())? {        // no longer than the next timer
//!     Some(packet) => { win.dispatch(&packet)?; /* … or the application's packet */ }
//!     None => { win.progress()?; }             // a timer is due: fire it, poll its request
//! }
//! ```
//! The list is process-wide: any loop that applies it fires every due sleep, whichever
//! device's request it belongs to (the woken request rings its own device's doorbell). A
//! loop that waits with its own timeout, or not at all, delays the timers accordingly; that
//! is the whole contract, and no kernel timer object, APC or thread is involved.
//!
//! ## Wine 8
//! CI runs every test under Wine 8.0, which differs from Windows in three ways the code does
//! not depend on: closing a port does not wake its waiters (no wait here relies on a close; a
//! waiter holds the port it sleeps on), the
//! concurrency value is ignored (every port is created with 0 and nothing relies on how many
//! threads are released), and `NtAssociateWaitCompletionPacket` does not exist (events are
//! turned into port packets by the doorbell, not by the kernel).
//!
//! ## What is missing
//! * **A CM-specific OVERLAPPED surface.** The connection manager's calls become OVERLAPPED
//!   requests through the generic [`Completions::start`] (tested in the facade's
//!   `tests/windows.rs`: connect, accept, disconnect and notify-disconnect on one port and one
//!   thread); there are no ND-named wrappers. CM timers (retransmissions, TIMEWAIT) run on
//!   the port loop's timeout when the CM device was lent the facade's `cm::PortTimer`
//!   (`tests/windows.rs`: a lost REQ is retransmitted while the application only runs its
//!   loop); a loop that ignores [`Completions::next_timeout`] (waits for ever) runs them only
//!   when something else wakes it.
//! * **Hardware.** Only in-process devices (the soft device, the emulated ConnectX-3) run on
//!   Windows; there is no VFIO on Windows. A Windows bring-up path for real hardware would
//!   need, on paper:
//!   1. a kernel driver (KMDF) that binds the PCI function, maps its BARs and allocates
//!      DMA-able, pinned memory (a common-buffer DMA adapter) for the queues, and exposes
//!      them to this process (`MmMapLockedPagesSpecifyCache` into user space, or a section);
//!   2. MSI-X interrupts handled in that driver: the ISR/DPC completes pending IOCTLs
//!      (one "EQ notify" IRP per event queue, issued with the same OVERLAPPEDs), which turns
//!      an interrupt into exactly the completion this crate delivers by hand today — the
//!      doorbell packet would then come from the kernel, with no application call;
//!   3. memory registration through the driver (`MmProbeAndLockPages`, IOMMU/DMA-remapping
//!      aware), so that an MR's pages stay resident and their bus addresses reach the HCA;
//!   4. `FILE_SKIP_COMPLETION_PORT_ON_SUCCESS` and `FILE_SKIP_SET_EVENT_ON_HANDLE` on the
//!      device handle (ND2's rule) and the ND status mapping kept here;
//!   5. a signed driver (test-signing for development), and a NetworkDirect provider DLL on
//!      top if existing ND applications should find it.
//!
//! ## What this layer must never do
//! * Spawn a thread or sleep, except in a wait the application asked for, on its thread.
//! * Hold portable logic: notify-request semantics, event routing and the clear-look-wait
//!   discipline live in `portverbs-verbs`.
//! * Name a backend: it works with any [`portverbs_hal::Device`].
//! * Use `unsafe` outside `sys`, where each block says why it is sound.
//!
//! ## Example: one thread, one port, notify requests
//! ```no_run
//! # #[cfg(windows)]
//! # fn demo<D: portverbs_hal::Device>(dev: D) -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use portverbs_verbs::{CqInit, NotifyKind, WorkCompletion};
//! use portverbs_windows::{CompletionPort, Overlapped};
//!
//! let win = portverbs_windows::open(dev)?;
//! let cq = win.context().create_cq_blocking(CqInit { entries: 64, ..CqInit::default() })?;
//! let port = Arc::new(CompletionPort::new()?);
//! win.associate(port.clone(), 0x5057)?;
//! let ov = Overlapped::new();
//! win.notify(&cq, NotifyKind::Any, &ov)?; // arm first …
//! let mut wc = [WorkCompletion::default(); 16];
//! while cq.poll(&mut wc)? > 0 { /* … then drain, so nothing slips between */ }
//! loop {
//!     let Some(packet) = port.get(None)? else { continue };
//!     if win.dispatch(&packet)? {
//!         continue; // the device's doorbell: event queues processed
//!     }
//!     if ov.is(&packet) {
//!         ov.result().expect("completed")?; // typed: Cancelled, CqError, DeviceRemoved
//!         break; // poll the CQ, notify again
//!     }
//! }
//! # Ok(()) }
//! ```
#![deny(unsafe_code)]
#![warn(missing_docs)]
// On other systems the crate is empty, and the links above name nothing.
#![cfg_attr(not(windows), allow(rustdoc::broken_intra_doc_links))]

#[cfg(windows)]
mod completions;
#[cfg(windows)]
mod error;
#[cfg(windows)]
mod event;
#[cfg(windows)]
mod executor;
#[cfg(windows)]
mod overlapped;
#[cfg(windows)]
mod port;
#[cfg(windows)]
mod sinks;
#[cfg(windows)]
mod sys;
#[cfg(windows)]
mod timer;

#[cfg(windows)]
pub use windows_impl::*;

#[cfg(windows)]
mod windows_impl {
    pub use crate::completions::{Completions, Operation};
    pub use crate::error::RequestError;
    pub use crate::event::{Event, WaitOutcome, sleep_alertable};
    pub use crate::executor::block_on_port;
    pub use crate::overlapped::{Overlapped, status};
    pub use crate::port::{CompletionPort, Dequeued, Packet};
    pub use crate::sinks::{PortSink, WindowsSinks, port_sleeps};
    pub use crate::timer::{SleepUntil, TimerList, fire_due, next_timeout, sleep_until};

    use portverbs_hal::device::Device;
    use portverbs_verbs::{Context, ContextOptions, OpenError};

    /// How many threads this process has now (a Toolhelp snapshot): for tests that check
    /// the layer adds none.
    ///
    /// # Errors
    /// The snapshot could not be taken.
    pub fn thread_count() -> std::io::Result<usize> {
        crate::sys::thread_count()
    }

    /// Opens `dev` with a [`PortSink`] behind every event queue (one [`WindowsSinks`] for the
    /// device), and returns its [`Completions`]. `eq_entries` as in
    /// [`ContextOptions::eq_entries`].
    ///
    /// # Errors
    /// The doorbell event could not be created, or the device could not be opened.
    pub async fn open_with<D: Device>(
        dev: D,
        eq_entries: u32,
    ) -> Result<Completions<D>, OpenError> {
        let sinks = WindowsSinks::new().map_err(OpenError::Sinks)?;
        let opts = ContextOptions {
            sinks: sinks.clone(),
            eq_entries,
        };
        let ctx = Context::open(dev, opts).await?;
        Ok(Completions::new(ctx, &sinks))
    }

    /// [`open_with`] with the default event-queue size, blocking.
    ///
    /// # Errors
    /// As [`open_with`].
    pub fn open<D: Device>(dev: D) -> Result<Completions<D>, OpenError> {
        portverbs_hal::block_on(open_with(dev, ContextOptions::default().eq_entries))
    }
}

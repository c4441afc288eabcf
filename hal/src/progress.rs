//! Who makes a device progress: the two progress modes, and the agents a device runs.
//!
//! A device whose port is a real network (a software device bound to a UDP socket) needs
//! something to receive what arrives, run the transport, fire timers and send; so does the
//! connection manager above it, whose peers expect answers. The application chooses, per
//! device when it is made, who does that work, as libfabric's data-progress modes do
//! (`FI_PROGRESS_MANUAL` and `FI_PROGRESS_AUTO`, fi_domain(3)):
//!
//! * [`Progress::Auto`] — exactly one progress thread per device, owned by the device, does
//!   it all: peers are answered whatever the application is doing. A device with no thread of
//!   its own because its hardware progresses by itself (an HCA behind VFIO) is `Auto` too.
//! * [`Progress::Manual`] — nothing of the device's runs unless the application calls:
//!   posting transmits on the caller's thread, and every poll, wait, await or dispatch
//!   ([`crate::device::Device::dispatch`]) receives, runs the transport and the timers, and
//!   runs the attached agents, on the caller's thread.
//!
//! An [`ProgressAgent`] is work a layer above the device needs done whenever the device
//! progresses — the connection manager's agent polls QP1's CQ, answers and retransmits. The
//! layer attaches it through verbs-core's context ([`crate::device::Device::attach_agent`]);
//! the device holds it weakly (dropping the agent detaches it) and calls it from whichever
//! thread progresses the device, never with a lock of the device held, so the agent may call
//! verbs (poll, post, device commands) freely. A device that cannot serve agents (no progress
//! of its own to run them in) refuses, and the layer above drives itself as before.
//!
//! Waiting in manual mode: a blocking wait must sleep on the event queue's sink *and* on what
//! the device's input arrives on, or a thread waiting for a completion would never receive the
//! packet that makes it. [`WaitSource`] is that second thing, opaque here; the sinks read it
//! in [`crate::notify::InterruptSink::wait_with`] and
//! [`crate::notify::InterruptSink::poll_raised_with`]: a pollable fd on Unix (a UDP socket,
//! polled together with the sink's own fd), or an [`InputWait`] elsewhere (on Windows, the
//! signal of a UDP port's completed receive requests), which sleeps on the input and on a
//! waker the sink wakes when it is raised.

use std::fmt;
use std::io;
use std::task::Waker;
use std::time::Instant;

/// Who makes a device progress (see the module docs). Chosen when the device is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Progress {
    /// Nothing of the device's runs unless the application calls (post, poll, wait, await,
    /// dispatch); a single-threaded application runs everything on its own thread.
    Manual,
    /// One progress thread per device answers peers whatever the application does (the
    /// default: what a librdmacm user expects).
    #[default]
    Auto,
}

impl Progress {
    /// The mode's name as the environment variable and the CLI spell it: `manual` or `auto`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Manual => "manual",
            Self::Auto => "auto",
        }
    }

    /// Parses `manual` or `auto` (any case, surrounding blanks ignored).
    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "manual" => Some(Self::Manual),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }
}

impl fmt::Display for Progress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Work a layer above a device needs done whenever the device progresses (the connection
/// manager's agent on QP1). See the module docs for when it is called and what it may do.
pub trait ProgressAgent: Send + Sync {
    /// Does what is due at `now` (answers what arrived, fires expired timers) and returns when
    /// it next has timed work, if ever. Called after rounds in which the device did work, and
    /// when the instant returned last time passes. Must not block for long: it runs on the
    /// device's progress thread (auto) or inside an application's call (manual); an agent
    /// whose state another thread holds skips the round and asks to be called again soon.
    fn run(&self, now: Instant) -> Option<Instant>;
}

/// A device's input that a wait cannot poll as a file descriptor — on Windows, the signal of
/// a UDP port's completed receive requests — as something to sleep on that a waker ends, so
/// that a sink can sleep on it and on its own raises together: the sink hands
/// [`InputWait::wait`] a registration that keeps the waker where its raise wakes it.
pub trait InputWait: Send + Sync {
    /// Calls `arm` with a waker that ends this sleep, and, unless `arm` returns true (what the
    /// caller waits for is there already), sleeps until the input may be ready, the waker is
    /// woken (during or after `arm`), or `deadline` passes (`None`: never). Returns false
    /// only when the deadline passed; a spurious `true` is allowed (the caller looks again).
    ///
    /// # Errors
    /// The OS wait failed.
    fn wait(
        &self,
        deadline: Option<Instant>,
        arm: &mut dyn FnMut(&Waker) -> bool,
    ) -> io::Result<bool>;

    /// Windows: a manual-reset event that is signalled while input may be waiting, for a
    /// wait of the caller's own to sleep on beside its other handles (`WaitForMultipleObjects`
    /// in an executor, say). Only the device resets it, when it receives. `None` by default.
    #[cfg(windows)]
    fn event(&self) -> Option<std::os::windows::io::RawHandle> {
        None
    }

    /// Windows: makes the input's receive requests complete to `port` (an I/O completion
    /// port of the application's) under `key` as well, so that a thread sleeping on that port
    /// wakes for input, as for any OVERLAPPED I/O of its own. A handle joins one port for its
    /// life, so this succeeds once. The packets name the input's OVERLAPPEDs
    /// ([`InputWait::owns`]); each is a wake-up — the device takes the receives themselves
    /// when it next progresses, and a packet whose receive was taken already is harmless.
    ///
    /// # Errors
    /// [`io::ErrorKind::Unsupported`] by default; the input joined a port already; the
    /// system refused.
    #[cfg(windows)]
    fn join_port(&self, port: std::os::windows::io::RawHandle, key: usize) -> io::Result<()> {
        let _ = (port, key);
        Err(io::ErrorKind::Unsupported.into())
    }

    /// Windows: whether a packet dequeued from the port this input joined
    /// ([`InputWait::join_port`]) is one of its receives (compares the OVERLAPPED's address
    /// with the input's own; nothing is dereferenced). False by default.
    #[cfg(windows)]
    fn owns(&self, overlapped: *const std::ffi::c_void) -> bool {
        let _ = overlapped;
        false
    }
}

/// What a manual-progress device's input arrives on, for a wait to sleep on together with an
/// event queue's sink ([`crate::device::Device::wait_source`]). Opaque: a sink reads it — on
/// Unix a pollable file descriptor (a UDP socket) that is readable when a datagram waits,
/// elsewhere an [`InputWait`]. [`WaitSource::none`] for devices whose input needs no waiting
/// (auto progress, stepped test fabrics, hardware).
#[derive(Clone, Copy, Default)]
pub struct WaitSource<'a> {
    #[cfg(unix)]
    fd: Option<std::os::fd::BorrowedFd<'a>>,
    input: Option<&'a dyn InputWait>,
}

impl<'a> WaitSource<'a> {
    /// Nothing to wait on besides the sinks.
    pub fn none() -> Self {
        Self::default()
    }

    /// A pollable fd: readable when the device has input to receive.
    #[cfg(unix)]
    pub fn from_fd(fd: std::os::fd::BorrowedFd<'a>) -> Self {
        Self {
            fd: Some(fd),
            input: None,
        }
    }

    /// An input to sleep on through [`InputWait::wait`].
    pub fn from_input(input: &'a dyn InputWait) -> Self {
        Self {
            #[cfg(unix)]
            fd: None,
            input: Some(input),
        }
    }

    /// The fd, if this source is one.
    #[cfg(unix)]
    pub fn fd(&self) -> Option<std::os::fd::BorrowedFd<'a>> {
        self.fd
    }

    /// The [`InputWait`], if this source is one.
    pub fn input(&self) -> Option<&'a dyn InputWait> {
        self.input
    }

    /// True when there is nothing to wait on.
    pub fn is_none(&self) -> bool {
        #[cfg(unix)]
        if self.fd.is_some() {
            return false;
        }
        self.input.is_none()
    }
}

impl fmt::Debug for WaitSource<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("WaitSource");
        #[cfg(unix)]
        d.field("fd", &self.fd);
        d.field("input", &self.input.is_some());
        d.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_auto_is_the_default() {
        for p in [Progress::Manual, Progress::Auto] {
            assert_eq!(Progress::parse(p.name()), Some(p));
            assert_eq!(p.to_string(), p.name());
        }
        assert_eq!(Progress::parse(" MANUAL "), Some(Progress::Manual));
        assert_eq!(Progress::parse("threaded"), None);
        assert_eq!(Progress::default(), Progress::Auto);
        assert!(WaitSource::none().is_none());
    }
}

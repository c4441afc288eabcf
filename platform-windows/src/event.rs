//! Win32 event objects: what an OVERLAPPED's `hEvent` names, and what a thread waits on.

use std::io;
use std::time::Duration;

use windows_sys::Win32::Foundation::HANDLE;

use crate::sys::{self, Handle, Woke};

/// An unnamed manual-reset event, not signalled when created. Give it to
/// [`crate::Overlapped::with_event`] (or [`crate::Overlapped::event_only`]) and wait on it, or
/// hand [`raw`](Self::raw) to `WaitForMultipleObjects` with other handles.
#[derive(Debug)]
pub struct Event {
    handle: Handle,
}

/// How a wait on an [`Event`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The event is signalled.
    Signalled,
    /// The timeout passed.
    TimedOut,
    /// The wait was alertable and APCs queued to this thread ran (WAIT_IO_COMPLETION).
    Alerted,
}

impl From<Woke> for WaitOutcome {
    fn from(w: Woke) -> Self {
        match w {
            Woke::Got(_) => Self::Signalled,
            Woke::TimedOut => Self::TimedOut,
            Woke::Alerted => Self::Alerted,
        }
    }
}

impl Event {
    /// Creates the event.
    ///
    /// # Errors
    /// The system refused (out of handles or memory).
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            handle: sys::create_event(true)?,
        })
    }

    /// Signals it (`SetEvent`).
    ///
    /// # Errors
    /// The system refused.
    pub fn set(&self) -> io::Result<()> {
        sys::set_event(self.handle.raw())
    }

    /// Resets it (`ResetEvent`).
    ///
    /// # Errors
    /// The system refused.
    pub fn reset(&self) -> io::Result<()> {
        sys::reset_event(self.handle.raw())
    }

    /// Waits until it is signalled (`WaitForSingleObject`); `None` waits for ever.
    ///
    /// # Errors
    /// The wait failed.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<WaitOutcome> {
        sys::wait_one(self.handle.raw(), sys::millis(timeout), false).map(Into::into)
    }

    /// An alertable wait (`WaitForSingleObjectEx(.., TRUE)`): also ends, with
    /// [`WaitOutcome::Alerted`], once APCs queued to this thread have run.
    ///
    /// # Errors
    /// The wait failed.
    pub fn wait_alertable(&self, timeout: Option<Duration>) -> io::Result<WaitOutcome> {
        sys::wait_one(self.handle.raw(), sys::millis(timeout), true).map(Into::into)
    }

    /// True when signalled now (a wait of zero).
    ///
    /// # Errors
    /// The wait failed.
    pub fn is_set(&self) -> io::Result<bool> {
        Ok(self.wait(Some(Duration::ZERO))? == WaitOutcome::Signalled)
    }

    /// The raw handle, valid while `self` lives.
    pub fn raw(&self) -> HANDLE {
        self.handle.raw()
    }
}

/// An alertable sleep (`SleepEx(ms, TRUE)`) of up to `timeout` on the calling thread:
/// returns true when it ended because APCs queued to the thread ran.
pub fn sleep_alertable(timeout: Option<Duration>) -> bool {
    sys::sleep_alertable(sys::millis(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_stays_set_until_reset() {
        let e = Event::new().unwrap();
        assert!(!e.is_set().unwrap());
        assert_eq!(
            e.wait(Some(Duration::from_millis(1))).unwrap(),
            WaitOutcome::TimedOut
        );
        e.set().unwrap();
        assert_eq!(e.wait(None).unwrap(), WaitOutcome::Signalled);
        assert!(
            e.is_set().unwrap(),
            "manual reset: a wait does not consume it"
        );
        e.reset().unwrap();
        assert!(!e.is_set().unwrap());
    }
}

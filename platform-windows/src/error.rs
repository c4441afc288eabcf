//! The typed outcome of a request, from the NTSTATUS in its OVERLAPPED or the Win32 error
//! `GetOverlappedResult` derived from it.

use std::io;

use thiserror::Error;

use crate::overlapped::status;

/// Why a request failed (or could not be made).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum RequestError {
    /// Cancelled ([`crate::Completions::cancel`]), or its CQ was destroyed: ND_CANCELED,
    /// ERROR_OPERATION_ABORTED.
    #[error("the request was cancelled (or its CQ destroyed)")]
    Cancelled,
    /// The CQ is in error: ND_INTERNAL_ERROR.
    #[error("the CQ is in error")]
    CqError,
    /// The device failed or was removed: ND_DEVICE_REMOVED.
    #[error("the device failed or was removed")]
    DeviceRemoved,
    /// An asynchronous operation failed; its typed error is in its [`crate::Operation`].
    #[error("the operation failed (its typed error is in its handle)")]
    Failed,
    /// Still pending (ERROR_IO_INCOMPLETE).
    #[error("the request is still pending")]
    Incomplete,
    /// A request is already in flight on this OVERLAPPED.
    #[error("a request is already in flight on this OVERLAPPED")]
    InFlight,
    /// A blocking `GetOverlappedResult` needs an event in the OVERLAPPED.
    #[error("waiting needs an event in the OVERLAPPED")]
    NoEvent,
    /// Nothing in flight matched (ERROR_NOT_FOUND, as `CancelIoEx` says).
    #[error("no request in flight on this OVERLAPPED")]
    NotFound,
    /// The device is already associated with a completion port.
    #[error("the device is already associated with a completion port")]
    AlreadyAssociated,
    /// An NTSTATUS this crate never writes.
    #[error("unexpected status {0:#x}")]
    Status(i32),
    /// Processing an event queue met a malformed event (skipped; call again).
    #[error(transparent)]
    Event(#[from] portverbs_verbs::EventError),
    /// A system call failed.
    #[error(transparent)]
    Os(#[from] io::Error),
}

impl RequestError {
    /// `Ok` for ND_SUCCESS, the typed error for the NTSTATUS values requests complete with.
    pub fn check(nt: i32) -> Result<(), Self> {
        match nt {
            status::SUCCESS => Ok(()),
            status::PENDING => Err(Self::Incomplete),
            status::CANCELLED => Err(Self::Cancelled),
            status::INTERNAL_ERROR => Err(Self::CqError),
            status::DEVICE_REMOVED => Err(Self::DeviceRemoved),
            status::UNSUCCESSFUL => Err(Self::Failed),
            other => Err(Self::Status(other)),
        }
    }

    /// The typed error for a Win32 error code (from `GetOverlappedResult`).
    pub fn from_win32(code: u32) -> Self {
        use windows_sys::Win32::Foundation as F;
        match code {
            F::ERROR_OPERATION_ABORTED => Self::Cancelled,
            F::ERROR_IO_INCOMPLETE => Self::Incomplete,
            F::ERROR_DEVICE_REMOVED => Self::DeviceRemoved,
            F::ERROR_INTERNAL_ERROR => Self::CqError,
            F::ERROR_GEN_FAILURE => Self::Failed,
            F::ERROR_NOT_FOUND => Self::NotFound,
            other => Self::Os(io::Error::from_raw_os_error(other as i32)),
        }
    }
}

//! The CLI's error type: every failure ends as a message on stderr and a non-zero exit code.

use std::error::Error as StdError;
use std::fmt;

/// Exit code for bad usage (unknown device, invalid flag values or combinations), as clap
/// uses for its own parse errors.
pub(crate) const EXIT_USAGE: i32 = 2;

/// Exit code for failures while running (a verbs call or an I/O operation failed).
pub(crate) const EXIT_FAILURE: i32 = 1;

/// Why a subcommand failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// Bad flag values or a combination the tool (or the C tool it imitates) rejects.
    #[error("{0}")]
    Usage(String),
    /// No device of that name (`ibv_devinfo`'s wording).
    #[error("IB device '{0}' wasn't found")]
    NoDevice(String),
    /// A library call failed.
    #[error("{context}: {source}")]
    Verbs {
        /// What the tool was doing.
        context: String,
        /// The library's error.
        source: Box<dyn StdError + Send + Sync>,
    },
    /// An I/O operation (TCP exchange, output file) failed.
    #[error("{context}: {source}")]
    Io {
        /// What the tool was doing.
        context: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The test itself failed (error completion, timeout, bad data).
    #[error("{0}")]
    Failed(String),
    /// A wait ended because the other side of an in-process test had ended; the other
    /// side's own result says whether that was an error.
    #[error("stopped while {0}: the other side ended")]
    PeerStopped(&'static str),
}

impl CliError {
    /// A usage error from anything printable.
    pub(crate) fn usage(msg: impl fmt::Display) -> Self {
        Self::Usage(msg.to_string())
    }

    /// Picks the error to report from the two sides of an in-process run: a real error wins
    /// over [`CliError::PeerStopped`], and the first side's error over the second's.
    pub(crate) fn merge<T, U>(first: Result<T, Self>, second: Result<U, Self>) -> Result<T, Self> {
        match (first, second) {
            (Err(Self::PeerStopped(_)), Err(e)) => Err(e),
            (Ok(_), Err(e)) if !matches!(e, Self::PeerStopped(_)) => Err(e),
            (first, _) => first,
        }
    }

    /// Names the peer the failure concerns (`127.0.0.2`, `10.0.0.1:7174` …), unless the
    /// message names it already; usage errors stay as they are.
    pub(crate) fn with_peer(self, peer: &str) -> Self {
        match self {
            Self::Usage(_) | Self::NoDevice(_) | Self::PeerStopped(_) => self,
            e if e.to_string().contains(peer) => e,
            e => Self::Failed(format!("{e} (peer {peer})")),
        }
    }

    /// The process exit code for this error.
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            Self::Usage(_) | Self::NoDevice(_) => EXIT_USAGE,
            _ => EXIT_FAILURE,
        }
    }
}

/// A device the library could not find or make: no such name (`ibv_devinfo`'s wording, a usage
/// error), no such address (usage), or one that exists but would not come up, with the reason
/// (a `PORTVERBS_UDP` address whose UDP port 4791 another process holds …).
impl From<portverbs::DeviceError> for CliError {
    fn from(e: portverbs::DeviceError) -> Self {
        match e {
            portverbs::DeviceError::NotFound { name } => Self::NoDevice(name),
            e @ portverbs::DeviceError::NoAddress { .. } => Self::Usage(e.to_string()),
            e => Self::Failed(e.to_string()),
        }
    }
}

impl From<std::convert::Infallible> for CliError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

/// Adds what the tool was doing to a library error.
pub(crate) trait Context<T> {
    /// Wraps the error as [`CliError::Verbs`] with `context`.
    fn ctx(self, context: impl fmt::Display) -> Result<T, CliError>;
}

impl<T, E: StdError + Send + Sync + 'static> Context<T> for Result<T, E> {
    fn ctx(self, context: impl fmt::Display) -> Result<T, CliError> {
        self.map_err(|e| CliError::Verbs {
            context: context.to_string(),
            source: Box::new(e),
        })
    }
}

/// Adds what the tool was doing to an I/O error.
pub(crate) trait IoContext<T> {
    /// Wraps the error as [`CliError::Io`] with `context`.
    fn io_ctx(self, context: impl fmt::Display) -> Result<T, CliError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn io_ctx(self, context: impl fmt::Display) -> Result<T, CliError> {
        self.map_err(|source| CliError::Io {
            context: context.to_string(),
            source,
        })
    }
}

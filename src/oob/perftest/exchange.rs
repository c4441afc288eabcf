//! The exchanges of perftest's side channel, on any transport.

use std::fmt;
use std::io::{self, Read, Write};

use super::params::{int_msg, mtu_msg, parse_int, parse_mtu, parse_version, version_msg};
use super::{
    BwReport, CACHE_LINE_SIZE, DONE, DecodeError, Dest, MIN_PEER_VERSION, PAGE_SIZE,
    PROTOCOL_VERSION, PeerParams, TEXT_LEN_GID, VERSION_LEN,
};
use crate::oob::Role;
use crate::oob::io::{Blocking, Wire, now};

/// Which message an exchange carries (for a transport's errors; `Display` names it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// The protocol versions.
    Version,
    /// The cycle buffer sizes.
    CycleBuffer,
    /// The cache line sizes.
    CacheLine,
    /// The MTUs.
    Mtu,
    /// A destination (a hand shake).
    Destination,
    /// One of the five messages of a bandwidth report.
    BwReport,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Version => "perftest version",
            Self::CycleBuffer => "cycle buffer size",
            Self::CacheLine => "cache line size",
            Self::Mtu => "MTU",
            Self::Destination => "destination",
            Self::BwReport => "BW report",
        })
    }
}

/// A transport of perftest's side channel: one message each way per call, in the order of the
/// side's role (the client sends first). [`StreamExchange`] is one for a byte stream; a
/// transport of the caller's (an RC QP, as perftest's `-R` uses) implements it to run
/// [`negotiate`], [`hand_shake`] and [`bw_reports`].
pub trait Exchange {
    /// What the transport fails with.
    type Error;

    /// Sends `mine` and reads the peer's message of `step` into `theirs`, whose length is
    /// the message's. A transport that carries whole messages (SENDs) copies the first
    /// `theirs.len()` bytes of a longer one, as perftest does; a shorter one is an error of
    /// the transport's.
    ///
    /// # Errors
    /// The transport's.
    fn exchange(&mut self, step: Step, mine: &[u8], theirs: &mut [u8]) -> Result<(), Self::Error>;
}

/// Why an exchange failed; `E` is the transport's error.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError<E> {
    /// The transport failed.
    #[error("{0}")]
    Transport(E),
    /// The peer's version message is not a version.
    #[error("the peer's version message is not perftest's: {0}")]
    NotPerftest(#[source] DecodeError),
    /// The peer's version is older than [`MIN_PEER_VERSION`].
    #[error(
        "the peer speaks perftest version {0}; versions older than {MIN_PEER_VERSION} are not \
         supported"
    )]
    TooOld(f64),
    /// The peer's destination is not one.
    #[error("couldn't parse the peer's destination '{text}': {error}")]
    Destination {
        /// The message as text, up to its NULs.
        text: String,
        /// What is wrong with it.
        #[source]
        error: DecodeError,
    },
}

/// Versions, system data and MTU (perftest's `exchange_versions`, `check_sys_data` and
/// `check_mtu`); `mtu_enum` is this side's MTU as an `ibv_mtu` value (1 ..= 5).
///
/// # Errors
/// The transport's, or a peer that is not perftest or is too old; an MTU message that is not
/// one is not an error (perftest keeps its own MTU then).
pub fn negotiate<X: Exchange + ?Sized>(
    x: &mut X,
    mtu_enum: u8,
) -> Result<PeerParams, ExchangeError<X::Error>> {
    now(negotiate_on(&mut Now(x), mtu_enum))
}

/// One hand shake (perftest's `ctx_hand_shake`): sends `mine` as text and returns the peer's
/// destination, read in the GID form when `mine` has a GID.
///
/// # Errors
/// The transport's, or a peer's message that is not a destination.
pub fn hand_shake<X: Exchange + ?Sized>(
    x: &mut X,
    mine: &Dest,
) -> Result<Dest, ExchangeError<X::Error>> {
    now(hand_shake_on(&mut Now(x), mine))
}

/// The bandwidth reports (`xchg_bw_reports`): sends `mine`, returns the peer's.
///
/// # Errors
/// The transport's.
pub fn bw_reports<X: Exchange + ?Sized>(
    x: &mut X,
    mine: &BwReport,
) -> Result<BwReport, ExchangeError<X::Error>> {
    now(bw_reports_on(&mut Now(x), mine))
}

/// perftest's side channel on a blocking byte stream (a `TcpStream`, or `&TcpStream`).
/// Bounding the waits is the stream's business (a socket's read timeout, say).
#[derive(Debug)]
pub struct StreamExchange<S> {
    inner: Ordered<Blocking<S>>,
}

impl<S: Read + Write> StreamExchange<S> {
    /// The side channel of `role` on `stream`.
    pub fn new(stream: S, role: Role) -> Self {
        Self {
            inner: Ordered {
                wire: Blocking(stream),
                role,
            },
        }
    }

    /// Closes the exchange as `ctx_close_connection` does: a last hand shake, then
    /// [`DONE`]. Returns the stream.
    ///
    /// # Errors
    /// As [`hand_shake`]; a peer that closed after its own `done` may make the last write
    /// fail, which perftest ignores.
    pub fn close(mut self, mine: &Dest) -> Result<S, ExchangeError<io::Error>> {
        now(close_on(&mut self.inner, mine))?;
        Ok(self.into_inner())
    }

    /// The stream.
    pub fn into_inner(self) -> S {
        self.inner.wire.0
    }
}

impl<S: Read + Write> Exchange for StreamExchange<S> {
    type Error = io::Error;

    fn exchange(&mut self, step: Step, mine: &[u8], theirs: &mut [u8]) -> io::Result<()> {
        now(self.inner.exchange(step, mine, theirs))
    }
}

/// perftest's side channel on a tokio byte stream (feature `tokio`): the exchanges of
/// [`StreamExchange`], awaited.
#[cfg(feature = "tokio")]
#[derive(Debug)]
pub struct AsyncStreamExchange<S> {
    inner: Ordered<crate::oob::io::Tokio<S>>,
}

#[cfg(feature = "tokio")]
impl<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin> AsyncStreamExchange<S> {
    /// The side channel of `role` on `stream`.
    pub fn new(stream: S, role: Role) -> Self {
        Self {
            inner: Ordered {
                wire: crate::oob::io::Tokio(stream),
                role,
            },
        }
    }

    /// [`negotiate`].
    ///
    /// # Errors
    /// As [`negotiate`].
    pub async fn negotiate(
        &mut self,
        mtu_enum: u8,
    ) -> Result<PeerParams, ExchangeError<io::Error>> {
        negotiate_on(&mut self.inner, mtu_enum).await
    }

    /// [`hand_shake`].
    ///
    /// # Errors
    /// As [`hand_shake`].
    pub async fn hand_shake(&mut self, mine: &Dest) -> Result<Dest, ExchangeError<io::Error>> {
        hand_shake_on(&mut self.inner, mine).await
    }

    /// [`bw_reports`].
    ///
    /// # Errors
    /// As [`bw_reports`].
    pub async fn bw_reports(
        &mut self,
        mine: &BwReport,
    ) -> Result<BwReport, ExchangeError<io::Error>> {
        bw_reports_on(&mut self.inner, mine).await
    }

    /// [`StreamExchange::close`].
    ///
    /// # Errors
    /// As [`StreamExchange::close`].
    pub async fn close(mut self, mine: &Dest) -> Result<S, ExchangeError<io::Error>> {
        close_on(&mut self.inner, mine).await?;
        Ok(self.inner.wire.0)
    }
}

/// The exchange steps are written once, over this: a blocking [`Exchange`] ([`Now`]) or a
/// byte stream ([`Ordered`]).
trait Exchanger {
    type Error;

    async fn exchange(
        &mut self,
        step: Step,
        mine: &[u8],
        theirs: &mut [u8],
    ) -> Result<(), Self::Error>;
}

/// A blocking [`Exchange`]: its steps are ready at once.
struct Now<'a, X: ?Sized>(&'a mut X);

impl<X: Exchange + ?Sized> Exchanger for Now<'_, X> {
    type Error = X::Error;

    async fn exchange(
        &mut self,
        step: Step,
        mine: &[u8],
        theirs: &mut [u8],
    ) -> Result<(), X::Error> {
        self.0.exchange(step, mine, theirs)
    }
}

/// A byte stream, each message written first by the client.
#[derive(Debug)]
struct Ordered<W> {
    wire: W,
    role: Role,
}

impl<W: Wire> Exchanger for Ordered<W> {
    type Error = io::Error;

    async fn exchange(&mut self, _: Step, mine: &[u8], theirs: &mut [u8]) -> io::Result<()> {
        if self.role == Role::Client {
            self.wire.send(mine).await?;
        }
        self.wire.recv(theirs).await?;
        if self.role == Role::Server {
            self.wire.send(mine).await?;
        }
        Ok(())
    }
}

async fn negotiate_on<X: Exchanger>(
    x: &mut X,
    mtu_enum: u8,
) -> Result<PeerParams, ExchangeError<X::Error>> {
    let t = ExchangeError::Transport;
    let mut v = [0u8; VERSION_LEN];
    let mine = version_msg(PROTOCOL_VERSION);
    x.exchange(Step::Version, &mine, &mut v).await.map_err(t)?;
    let version = parse_version(&v).map_err(ExchangeError::NotPerftest)?;
    if version < MIN_PEER_VERSION {
        return Err(ExchangeError::TooOld(version));
    }
    let mut cycle = [0u8; 4];
    let mine = int_msg(PAGE_SIZE);
    x.exchange(Step::CycleBuffer, &mine, &mut cycle)
        .await
        .map_err(t)?;
    // perftest reads the peer's cache line size and uses it for nothing.
    let mut line = [0u8; 4];
    let mine = int_msg(CACHE_LINE_SIZE);
    x.exchange(Step::CacheLine, &mine, &mut line)
        .await
        .map_err(t)?;
    let mut mtu = [0u8; 2];
    x.exchange(Step::Mtu, &mtu_msg(mtu_enum), &mut mtu)
        .await
        .map_err(t)?;
    let theirs = parse_mtu(mtu).unwrap_or(mtu_enum);
    let cycle = parse_int(cycle).clamp(PAGE_SIZE, 1 << 24);
    Ok(PeerParams {
        version,
        cycle_buffer: cycle.unsigned_abs(), // PAGE_SIZE ..= 16 MiB
        mtu_enum: theirs.min(mtu_enum),
    })
}

async fn hand_shake_on<X: Exchanger>(
    x: &mut X,
    mine: &Dest,
) -> Result<Dest, ExchangeError<X::Error>> {
    let with_gid = mine.gid.is_some();
    let mut buf = [0u8; TEXT_LEN_GID];
    let theirs = &mut buf[..Dest::text_len(with_gid)];
    x.exchange(Step::Destination, &mine.encode_text(), theirs)
        .await
        .map_err(ExchangeError::Transport)?;
    Dest::decode_text(theirs, with_gid).map_err(|error| ExchangeError::Destination {
        text: String::from_utf8_lossy(theirs)
            .trim_end_matches('\0')
            .to_owned(),
        error,
    })
}

async fn bw_reports_on<X: Exchanger>(
    x: &mut X,
    mine: &BwReport,
) -> Result<BwReport, ExchangeError<X::Error>> {
    let mut theirs = [[0u8; 8]; 5];
    for (m, t) in mine.messages().iter().zip(theirs.iter_mut()) {
        x.exchange(Step::BwReport, m, t)
            .await
            .map_err(ExchangeError::Transport)?;
    }
    Ok(BwReport::from_messages(&theirs))
}

async fn close_on<W: Wire>(
    x: &mut Ordered<W>,
    mine: &Dest,
) -> Result<(), ExchangeError<io::Error>> {
    hand_shake_on(x, mine).await?;
    x.wire.send(DONE).await.map_err(ExchangeError::Transport)
}

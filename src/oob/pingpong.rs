//! The exchange of rdma-core's pingpong examples (`libibverbs/examples/rc_pingpong.c`, and
//! `uc_pingpong.c` and `ud_pingpong.c`, which send the same message): over one TCP connection,
//! the client sends its endpoint, the server answers with its own, and the client ends with
//! `done`. `srq_pingpong.c` sends [`SRQ_MESSAGES`] such messages each way instead of one (its
//! QPs' endpoints, then all-zero ones), then the same `done`: [`client_many`] and
//! [`serve_many`].
//!
//! An endpoint travels as the ASCII text `LLLL:QQQQQQ:PPPPPP:GGGG…` — the LID as 4 hex digits,
//! QPN and PSN as 6 each, the GID as 32 ([`Gid::wire_hex`]) — followed by a NUL: [`MSG_LEN`]
//! bytes, what the C tools write and read. The endpoint is a [`QpEndpoint`], what
//! [`Qp::endpoint`](crate::verbs::Qp::endpoint) gives and
//! [`Qp::connect_rc`](crate::verbs::Qp::connect_rc) takes.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::io::{self, Read, Write};

use portverbs_hal::{Gid, GidParseError};
use portverbs_verbs::QpEndpoint;

use super::hex_field;
use super::io::{Blocking, Wire, now};

/// Bytes of one endpoint message: 51 characters and a NUL.
pub const MSG_LEN: usize = 52;

/// The client's last message: the C string `done`, NUL included.
pub const DONE: &[u8; 5] = b"done\0";

/// How many endpoint messages `srq_pingpong` sends each way, whatever its QP count (`-q`): the
/// endpoints of its QPs first, then all-zero endpoints (`0000:000000:000000:000…0`) up to this
/// number (its `MAX_QP`).
pub const SRQ_MESSAGES: usize = 256;

/// QPNs and PSNs are 24-bit numbers.
const MASK_24: u32 = 0xff_ffff;

/// Why an endpoint message could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// More bytes than a message has ([`MSG_LEN`]); holds the number.
    #[error("a message has at most {MSG_LEN} bytes, found {0}")]
    TooLong(usize),
    /// Not four `:`-separated fields; holds the number found.
    #[error("expected 4 ':'-separated fields, found {0}")]
    FieldCount(usize),
    /// A field is empty or holds something other than hex digits; holds its name.
    #[error("{0} is not a hex number")]
    NotHex(&'static str),
    /// A number does not fit its field (LID 16 bits, QPN and PSN 24 bits); holds its name.
    #[error("{0} is out of range")]
    OutOfRange(&'static str),
    /// The GID field is not 32 characters; holds its length in bytes.
    #[error("GID must be 32 hex digits, found {0} characters")]
    GidLength(usize),
}

/// `ep` as the message the C tools send: its text, NUL-padded to [`MSG_LEN`] bytes. QPN and
/// PSN are taken modulo 2^24 (their width on the wire).
pub fn encode(ep: &QpEndpoint) -> [u8; MSG_LEN] {
    let mut msg = [0u8; MSG_LEN];
    let text = format(ep);
    msg[..text.len()].copy_from_slice(text.as_bytes());
    msg
}

/// The message text of `ep` without the NUL: `format!("{lid:04x}:{qpn:06x}:{psn:06x}:{gid}")`
/// with the GID's wire form; always 51 characters.
pub fn format(ep: &QpEndpoint) -> String {
    format!(
        "{:04x}:{:06x}:{:06x}:{}",
        ep.lid,
        ep.qpn & MASK_24,
        ep.psn & MASK_24,
        ep.gid.wire_hex()
    )
}

/// Reads a message as it came from the socket: at most [`MSG_LEN`] bytes, the text as
/// [`parse`] reads it (bytes that are not UTF-8 read as U+FFFD and fail its checks).
///
/// # Errors
/// [`ParseError::TooLong`], or what [`parse`] finds.
pub fn decode(msg: &[u8]) -> Result<QpEndpoint, ParseError> {
    if msg.len() > MSG_LEN {
        return Err(ParseError::TooLong(msg.len()));
    }
    parse(&String::from_utf8_lossy(msg))
}

/// Reads the message text. Trailing NULs and ASCII white space are ignored (the C tools send a
/// NUL-terminated buffer); the LID, QPN and PSN are 1 to 8 hex digits of either case whose
/// value fits 16, 24 and 24 bits, as `sscanf("%x")` would read them, but with nothing else in
/// the field; the GID is exactly 32 hex digits.
///
/// # Errors
/// The first field that is missing or malformed.
pub fn parse(text: &str) -> Result<QpEndpoint, ParseError> {
    let text = text.trim_end_matches(|c: char| c == '\0' || c.is_ascii_whitespace());
    let mut fields = text.split(':');
    let (Some(lid), Some(qpn), Some(psn), Some(gid), None) = (
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
        fields.next(),
    ) else {
        return Err(ParseError::FieldCount(text.split(':').count()));
    };
    let lid = number(lid, "LID", u16::MAX.into())?;
    let qpn = number(qpn, "QPN", MASK_24)?;
    let psn = number(psn, "PSN", MASK_24)?;
    let gid = Gid::from_wire_hex(gid).map_err(|e| match e {
        GidParseError::WireLength(n) => ParseError::GidLength(n),
        GidParseError::WireNotHex | GidParseError::Unrecognized => ParseError::NotHex("GID"),
    })?;
    Ok(QpEndpoint {
        lid: lid as u16, // at most u16::MAX: checked above
        qpn,
        psn,
        gid,
    })
}

/// A field of 1 to 8 hex digits whose value is at most `max`.
fn number(text: &str, name: &'static str, max: u32) -> Result<u32, ParseError> {
    if text.len() > 8 {
        return Err(ParseError::OutOfRange(name));
    }
    let value = hex_field(text).ok_or(ParseError::NotHex(name))?;
    u32::try_from(value)
        .ok()
        .filter(|&v| v <= max)
        .ok_or(ParseError::OutOfRange(name))
}

/// A step of the exchange, for errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Writing this side's endpoint.
    SendEndpoint,
    /// Reading the peer's endpoint.
    ReceiveEndpoint,
    /// The client writing `done`.
    SendDone,
    /// The server reading the client's `done`.
    ReceiveDone,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::SendEndpoint => "sending the local address",
            Self::ReceiveEndpoint => "reading the remote address",
            Self::SendDone => "sending \"done\" to the server",
            Self::ReceiveDone => "waiting for the client's \"done\"",
        })
    }
}

/// Why an exchange failed. `E` is the error of the server's connect step ([`serve`]).
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError<E = Infallible> {
    /// The stream failed (a read timeout of the caller's socket included) at `stage`.
    #[error("{stage}: {source}")]
    Io {
        /// Where.
        stage: Stage,
        /// What the stream said.
        source: io::Error,
    },
    /// The peer's message is not an endpoint.
    #[error("couldn't read the remote address '{text}': {error}")]
    Malformed {
        /// The message as text, up to its NULs.
        text: String,
        /// What is wrong with it.
        #[source]
        error: ParseError,
    },
    /// The server's connect step failed.
    #[error("{0}")]
    Connect(E),
}

impl<E> ExchangeError<E> {
    fn at(stage: Stage) -> impl FnOnce(io::Error) -> Self {
        move |source| Self::Io { stage, source }
    }
}

/// Client side on a connected stream: sends `mine`, returns the server's endpoint, then tells
/// the server `done`. Bounding the waits is the stream's business (a `TcpStream`'s read
/// timeout, say).
///
/// # Errors
/// The stream failed, or the server's message is not an endpoint.
pub fn client<S: Read + Write>(stream: S, mine: &QpEndpoint) -> Result<QpEndpoint, ExchangeError> {
    now(client_on(&mut Blocking(stream), mine))
}

/// Server side on an accepted stream: reads the client's endpoint, lets `connect` bring this
/// side's QP up toward it and return this side's endpoint, sends that, and waits for the
/// client's `done`. Returns the client's endpoint.
///
/// # Errors
/// The stream failed, the client's message is not an endpoint, or `connect` failed
/// ([`ExchangeError::Connect`]).
pub fn serve<S: Read + Write, E>(
    stream: S,
    connect: impl FnOnce(&QpEndpoint) -> Result<QpEndpoint, E>,
) -> Result<QpEndpoint, ExchangeError<E>> {
    now(serve_on(&mut Blocking(stream), |theirs| {
        std::future::ready(connect(&theirs))
    }))
}

/// [`client`] on a tokio stream.
///
/// # Errors
/// As [`client`].
#[cfg(feature = "tokio")]
pub async fn client_async<S>(stream: S, mine: &QpEndpoint) -> Result<QpEndpoint, ExchangeError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    client_on(&mut super::io::Tokio(stream), mine).await
}

/// [`serve`] on a tokio stream, with an async connect step.
///
/// # Errors
/// As [`serve`].
#[cfg(feature = "tokio")]
pub async fn serve_async<S, E, F>(
    stream: S,
    connect: impl FnOnce(QpEndpoint) -> F,
) -> Result<QpEndpoint, ExchangeError<E>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    F: Future<Output = Result<QpEndpoint, E>>,
{
    serve_on(&mut super::io::Tokio(stream), connect).await
}

/// Client side of an exchange of several endpoints each way (`srq_pingpong`: [`SRQ_MESSAGES`]
/// of them): sends every endpoint of `mine`, reads as many of the server's, then tells the
/// server `done`. Both sides must send the same number of messages; the read is bounded by
/// `mine.len()` messages.
///
/// # Errors
/// The stream failed, or one of the server's messages is not an endpoint.
pub fn client_many<S: Read + Write>(
    stream: S,
    mine: &[QpEndpoint],
) -> Result<Vec<QpEndpoint>, ExchangeError> {
    now(client_many_on(&mut Blocking(stream), mine))
}

/// Server side of an exchange of `count` endpoints each way: reads the client's `count`
/// endpoints, lets `connect` bring this side's QPs up toward them and return this side's
/// endpoints, sends those, and waits for the client's `done`. Returns the client's endpoints.
///
/// # Errors
/// The stream failed, a message of the client's is not an endpoint, or `connect` failed
/// ([`ExchangeError::Connect`]).
pub fn serve_many<S: Read + Write, E>(
    stream: S,
    count: usize,
    connect: impl FnOnce(&[QpEndpoint]) -> Result<Vec<QpEndpoint>, E>,
) -> Result<Vec<QpEndpoint>, ExchangeError<E>> {
    now(serve_many_on(&mut Blocking(stream), count, |theirs| {
        std::future::ready(connect(&theirs))
    }))
}

/// [`client_many`] on a tokio stream.
///
/// # Errors
/// As [`client_many`].
#[cfg(feature = "tokio")]
pub async fn client_many_async<S>(
    stream: S,
    mine: &[QpEndpoint],
) -> Result<Vec<QpEndpoint>, ExchangeError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    client_many_on(&mut super::io::Tokio(stream), mine).await
}

/// [`serve_many`] on a tokio stream, with an async connect step.
///
/// # Errors
/// As [`serve_many`].
#[cfg(feature = "tokio")]
pub async fn serve_many_async<S, E, F>(
    stream: S,
    count: usize,
    connect: impl FnOnce(Vec<QpEndpoint>) -> F,
) -> Result<Vec<QpEndpoint>, ExchangeError<E>>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    F: Future<Output = Result<Vec<QpEndpoint>, E>>,
{
    serve_many_on(&mut super::io::Tokio(stream), count, connect).await
}

/// The messages of `eps`, back to back.
fn encode_all(eps: &[QpEndpoint]) -> Vec<u8> {
    eps.iter().flat_map(encode).collect()
}

async fn client_many_on<W: Wire>(
    wire: &mut W,
    mine: &[QpEndpoint],
) -> Result<Vec<QpEndpoint>, ExchangeError> {
    let at = ExchangeError::at;
    wire.send(&encode_all(mine))
        .await
        .map_err(at(Stage::SendEndpoint))?;
    let mut theirs = Vec::with_capacity(mine.len());
    for _ in mine {
        theirs.push(receive(wire).await?);
    }
    wire.send(DONE).await.map_err(at(Stage::SendDone))?;
    Ok(theirs)
}

async fn serve_many_on<W: Wire, E, F>(
    wire: &mut W,
    count: usize,
    connect: impl FnOnce(Vec<QpEndpoint>) -> F,
) -> Result<Vec<QpEndpoint>, ExchangeError<E>>
where
    F: Future<Output = Result<Vec<QpEndpoint>, E>>,
{
    let at = ExchangeError::at;
    let mut theirs = Vec::with_capacity(count.min(SRQ_MESSAGES));
    for _ in 0..count {
        theirs.push(receive(wire).await?);
    }
    let mine = connect(theirs.clone())
        .await
        .map_err(ExchangeError::Connect)?;
    wire.send(&encode_all(&mine))
        .await
        .map_err(at(Stage::SendEndpoint))?;
    let mut done = [0u8; DONE.len()];
    wire.recv(&mut done).await.map_err(at(Stage::ReceiveDone))?;
    Ok(theirs)
}

async fn client_on<W: Wire>(wire: &mut W, mine: &QpEndpoint) -> Result<QpEndpoint, ExchangeError> {
    let at = ExchangeError::at;
    wire.send(&encode(mine))
        .await
        .map_err(at(Stage::SendEndpoint))?;
    let theirs = receive(wire).await?;
    wire.send(DONE).await.map_err(at(Stage::SendDone))?;
    Ok(theirs)
}

async fn serve_on<W: Wire, E, F>(
    wire: &mut W,
    connect: impl FnOnce(QpEndpoint) -> F,
) -> Result<QpEndpoint, ExchangeError<E>>
where
    F: Future<Output = Result<QpEndpoint, E>>,
{
    let at = ExchangeError::at;
    let theirs = receive(wire).await?;
    let mine = connect(theirs).await.map_err(ExchangeError::Connect)?;
    wire.send(&encode(&mine))
        .await
        .map_err(at(Stage::SendEndpoint))?;
    // The C server reads whatever comes (up to a message); `done` is what its client sends.
    let mut done = [0u8; DONE.len()];
    wire.recv(&mut done).await.map_err(at(Stage::ReceiveDone))?;
    Ok(theirs)
}

/// Reads the peer's endpoint message.
async fn receive<W: Wire, E>(wire: &mut W) -> Result<QpEndpoint, ExchangeError<E>> {
    let mut msg = [0u8; MSG_LEN];
    wire.recv(&mut msg)
        .await
        .map_err(ExchangeError::at(Stage::ReceiveEndpoint))?;
    decode(&msg).map_err(|error| ExchangeError::Malformed {
        text: String::from_utf8_lossy(&msg)
            .trim_end_matches('\0')
            .to_owned(),
        error,
    })
}

#[cfg(test)]
#[path = "pingpong_tests.rs"]
mod tests;

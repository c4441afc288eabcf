//! Out-of-band endpoint exchange: the formats in which the common RDMA test programs tell each
//! other their QPs before any RDMA traffic flows, so that a Portverbs program can be the peer
//! of the C tools (or of another Portverbs program speaking them).
//!
//! | module | format | spoken by |
//! |---|---|---|
//! | [`pingpong`] | one ASCII `LID:QPN:PSN:GID` message each way over TCP, then the client's `done`; 256 of them each way for `ibv_srq_pingpong` | `ibv_rc_pingpong`, and `ibv_uc_pingpong` and `ibv_ud_pingpong` with the same message; `ibv_srq_pingpong` (rdma-core's `libibverbs/examples/rc_pingpong.c`, `uc_pingpong.c`, `ud_pingpong.c`, `srq_pingpong.c`) |
//! | [`perftest`] | versions, system data, MTU, then `struct pingpong_dest` per QP as text over TCP or, with `-R`, in binary over an RC QP the CM connected; bandwidth reports as big-endian numbers | perftest's `ib_write_bw`, `ib_read_lat`, … (its `src/perftest_communication.c`) |
//! | [`channel`] | whole messages as SENDs over a connected RC QP, a ring of receives kept posted | perftest's `-R` side channel; any small exchange over a reliable connection |
//! | [`rping`] | a 16-byte advertisement of a buffer (address, rkey, length) SENT over the connected QP; the ping text | `rping` (librdmacm's `librdmacm/examples/rping.c`) |
//!
//! GIDs travel in these messages in their text forms, which are methods of
//! [`Gid`](crate::verbs::Gid): [`inet6`](crate::verbs::Gid::inet6) (also its `Display`),
//! [`wire_hex`](crate::verbs::Gid::wire_hex), [`hex_groups`](crate::verbs::Gid::hex_groups) and
//! [`decimal_bytes`](crate::verbs::Gid::decimal_bytes); `FromStr` reads IP text and the wire
//! form.
//!
//! Every decoder takes bytes from the network: it checks lengths and fields and answers bad or
//! short input with a typed error, never a panic. The exchanges come in two forms:
//!
//! * **blocking**, over any [`std::io::Read`] + [`std::io::Write`] stream (a `TcpStream`):
//!   [`pingpong::client`], [`pingpong::serve`] (and `_many` for several endpoints),
//!   [`perftest::StreamExchange`] with
//!   [`perftest::negotiate`], [`perftest::hand_shake`] and [`perftest::bw_reports`]; a
//!   transport of your own (an RC QP, as perftest's `-R`) implements [`perftest::Exchange`];
//! * **async**, with feature `tokio`, over any `tokio::io::AsyncRead` + `AsyncWrite` stream:
//!   `pingpong::client_async`, `pingpong::serve_async`, `perftest::AsyncStreamExchange`.
//!
//! Both run the same code: the steps of each exchange are written once, as `async` functions
//! over a byte stream, and the blocking forms run them on a stream whose calls block (and so
//! never leave a step pending). Without `tokio`, the codecs ([`pingpong::encode`],
//! [`perftest::Dest::encode_text`], …) are all an async caller needs: the messages have fixed
//! sizes.
//!
//! # Example
//! An `ibv_rc_pingpong` endpoint on the wire and back, then the whole exchange over TCP:
//!
//! ```
//! use portverbs::oob::pingpong;
//! use portverbs::prelude::{Gid, QpEndpoint};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let gid: Gid = "::ffff:10.0.0.1".parse()?;
//! let mine = QpEndpoint { lid: 0, qpn: 0x11, psn: 0x12_3456, gid };
//! let msg = pingpong::encode(&mine); // 51 characters and a NUL, as the C tool sends them
//! assert_eq!(&msg[..], b"0000:000011:123456:00000000000000000000ffff0a000001\0");
//! assert_eq!(pingpong::decode(&msg)?, mine);
//! assert!(pingpong::decode(b"0000:000011").is_err()); // short input: a typed error
//!
//! // The exchange itself: the client writes first, the server connects its QP and answers.
//! let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! let server = std::thread::spawn(move || {
//!     let (mut stream, _) = listener.accept()?;
//!     let theirs = QpEndpoint { qpn: 0x22, ..mine };
//!     // Here a server moves its QP to RTR and RTS toward the client's endpoint.
//!     pingpong::serve(&mut stream, |_client| Ok::<_, std::io::Error>(theirs))
//!         .map_err(std::io::Error::other)
//! });
//! let server_ep = pingpong::client(&mut std::net::TcpStream::connect(addr)?, &mine)?;
//! assert_eq!(server_ep.qpn, 0x22);
//! assert_eq!(server.join().expect("server thread")?, mine);
//! # Ok(()) }
//! ```

pub mod channel;
mod io;
pub mod perftest;
pub mod pingpong;
pub mod rping;

/// Which end of an exchange this side is. In every exchange here the client writes its
/// message first and the server reads first, then answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Connects, and writes each message first.
    Client,
    /// Accepts, and answers each message.
    Server,
}

/// A field of hex digits as the C tools' `sscanf("%x")` reads it, but strict: 1 to 16 hex
/// digits, nothing else (no sign, prefix or space).
fn hex_field(text: &str) -> Option<u64> {
    if text.is_empty() || text.len() > 16 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(text, 16).ok()
}

/// A connected pair of loopback sockets: the client's end and the server's.
#[cfg(test)]
fn socket_pair() -> (std::net::TcpStream, std::net::TcpStream) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let client = std::net::TcpStream::connect(listener.local_addr().expect("bound"))
        .expect("connect to the listener");
    let (server, _) = listener.accept().expect("accept the client");
    (client, server)
}

/// The text before the first NUL of a C string buffer (all of it without one), read as UTF-8
/// with every invalid sequence replaced.
fn c_text(msg: &[u8]) -> std::borrow::Cow<'_, str> {
    let end = msg.iter().position(|&b| b == 0).unwrap_or(msg.len());
    String::from_utf8_lossy(&msg[..end])
}

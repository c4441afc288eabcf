//! The TCP side channel of rdma-core's pingpong examples (`portverbs::oob::pingpong` speaks
//! it): the sockets, their timeouts, and the tool's words for what fails. Each side sends as
//! many endpoint messages as its tool does (one, or `srq_pingpong`'s 256).

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use portverbs::oob::pingpong::{self, ExchangeError, Stage};
use portverbs::prelude::QpEndpoint;

use crate::error::{CliError, IoContext as _};

/// Listens on `port` of the loopback interface; when that port is taken, on an ephemeral
/// port instead (said on stderr). Returns the listener and the port it listens on.
pub(crate) fn listen(port: u16) -> Result<(TcpListener, u16), CliError> {
    let listener = match TcpListener::bind(("127.0.0.1", port)) {
        Ok(l) => l,
        Err(e) if e.kind() == ErrorKind::AddrInUse => {
            let l = TcpListener::bind(("127.0.0.1", 0)).io_ctx("listening on localhost")?;
            let actual = l.local_addr().io_ctx("reading the listening port")?.port();
            eprintln!("port {port} is in use; the in-process server listens on port {actual}");
            l
        }
        Err(e) => return Err(e).io_ctx(format_args!("listening on localhost:{port}")),
    };
    let actual = listener
        .local_addr()
        .io_ctx("reading the listening port")?
        .port();
    Ok((listener, actual))
}

/// Listens on `port` of every address, as `ibv_rc_pingpong`'s server does.
pub(crate) fn listen_all(port: u16) -> Result<TcpListener, CliError> {
    TcpListener::bind(("0.0.0.0", port)).io_ctx(format_args!("couldn't listen to port {port}"))
}

/// Server side: accepts one client (giving up when `abort` is set, or after `accept_timeout`
/// when there is one), reads its `count` messages, then lets `connect` bring the QPs up and
/// answers with the endpoints it returns; returns the client's endpoints after its `done`.
/// Each wait on the client's messages is bounded by `timeout`.
pub(crate) fn serve(
    listener: &TcpListener,
    abort: &AtomicBool,
    accept_timeout: Option<Duration>,
    timeout: Duration,
    count: usize,
    connect: impl FnOnce(&[QpEndpoint]) -> Result<Vec<QpEndpoint>, CliError>,
) -> Result<Vec<QpEndpoint>, CliError> {
    listener
        .set_nonblocking(true)
        .io_ctx("configuring the listening socket")?;
    let deadline = accept_timeout.map(|t| (Instant::now() + t, t));
    let (stream, peer) = loop {
        match listener.accept() {
            Ok(accepted) => break accepted,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if abort.load(Ordering::Acquire) {
                    return Err(CliError::PeerStopped("waiting for the client to connect"));
                }
                if let Some((deadline, t)) = deadline {
                    if Instant::now() >= deadline {
                        return Err(CliError::Failed(format!(
                            "no client connected within {}",
                            secs(t)
                        )));
                    }
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e).io_ctx("accepting the client"),
        }
    };
    let peer = peer.ip().to_string();
    configure(&stream, timeout)?;
    pingpong::serve_many(&stream, count, connect).map_err(|e| exchange_error(e, &peer, timeout))
}

/// Client side: connects to `host:port`, sends `mine` and returns as many endpoints of the
/// server's (after telling the server `done`). Connecting and each wait on the server are bounded by
/// `timeout`; a server that does not answer in time fails with `no reply from <host> within
/// <N> s`.
pub(crate) fn client(
    host: &str,
    port: u16,
    mine: &[QpEndpoint],
    timeout: Duration,
) -> Result<Vec<QpEndpoint>, CliError> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .io_ctx(format_args!("resolving {host}"))?
        .collect();
    let mut last = None;
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some(stream) = stream else {
        let e = last.unwrap_or_else(|| ErrorKind::NotFound.into());
        if timed_out(&e) {
            return Err(no_reply(e, host, timeout, ""));
        }
        return Err(e).io_ctx(format_args!("couldn't connect to {host}:{port}"));
    };
    configure(&stream, timeout)?;
    pingpong::client_many(&stream, mine).map_err(|e| exchange_error(e, host, timeout))
}

/// The tool's words for a failed exchange with `peer`: a wait for the peer that timed out is
/// `no reply from <peer> within <N> s`.
fn exchange_error<E: Into<CliError> + std::fmt::Display>(
    e: ExchangeError<E>,
    peer: &str,
    timeout: Duration,
) -> CliError {
    match e {
        ExchangeError::Io {
            stage: stage @ (Stage::ReceiveEndpoint | Stage::ReceiveDone),
            source,
        } => no_reply(source, peer, timeout, &stage.to_string()),
        ExchangeError::Io { stage, source } => CliError::Io {
            context: stage.to_string(),
            source,
        },
        ExchangeError::Connect(e) => e.into(),
        e @ ExchangeError::Malformed { .. } => CliError::Failed(e.to_string()),
    }
}

/// `N s` for a timeout of whole seconds, `N ms` otherwise.
fn secs(timeout: Duration) -> String {
    if timeout.subsec_nanos() == 0 {
        format!("{} s", timeout.as_secs())
    } else {
        format!("{} ms", timeout.as_millis())
    }
}

/// Whether an I/O error is a socket timeout (`EAGAIN`/`EWOULDBLOCK` from `SO_RCVTIMEO` on
/// Unix, `WSAETIMEDOUT` on Windows, `ETIMEDOUT` from a connect).
fn timed_out(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// A timeout while waiting on `peer` becomes `no reply from <peer> within <N> s`; any other
/// error keeps the I/O error, with `context`.
fn no_reply(e: std::io::Error, peer: &str, timeout: Duration, context: &str) -> CliError {
    if timed_out(&e) {
        CliError::Failed(format!("no reply from {peer} within {}", secs(timeout)))
    } else {
        CliError::Io {
            context: context.to_owned(),
            source: e,
        }
    }
}

fn configure(stream: &TcpStream, timeout: Duration) -> Result<(), CliError> {
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(timeout)))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .and_then(|()| stream.set_nodelay(true))
        .io_ctx("configuring the exchange socket")
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    fn dest() -> QpEndpoint {
        QpEndpoint {
            lid: 0,
            qpn: 0x11,
            psn: 0x22,
            gid: portverbs::hal::Gid::ZERO,
        }
    }

    /// A server that accepts the connection but never answers: the client gives up after the
    /// timeout with `no reply from <host> within <N> s`, not with `EAGAIN`.
    #[test]
    fn silent_server_means_no_reply_within_the_timeout() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let silent = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            // Swallow the client's message; answer nothing until the client hangs up.
            let mut sink = [0u8; 256];
            while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
        });
        let err = client("127.0.0.1", port, &[dest()], Duration::from_millis(300)).unwrap_err();
        assert_eq!(err.to_string(), "no reply from 127.0.0.1 within 300 ms");
        silent.join().unwrap();
        let err = no_reply(
            ErrorKind::WouldBlock.into(),
            "server",
            Duration::from_secs(2),
            "x",
        );
        assert_eq!(err.to_string(), "no reply from server within 2 s");
        // Other errors keep their cause.
        let err = no_reply(
            ErrorKind::ConnectionReset.into(),
            "h",
            Duration::from_secs(1),
            "reading",
        );
        assert!(err.to_string().starts_with("reading: "), "{err}");
    }

    /// The in-process server stops waiting for a client after the timeout.
    #[test]
    fn no_client_within_the_timeout() {
        let (listener, _) = listen(0).unwrap();
        let never = AtomicBool::new(false);
        let fifty = Duration::from_millis(50);
        let err = serve(&listener, &never, Some(fifty), fifty, 1, |_| {
            Ok(vec![dest()])
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "no client connected within 50 ms");
    }
}

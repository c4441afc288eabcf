//! The TCP side channel of `ibv_rc_pingpong`: one `LID:QPN:PSN:GID` message each way (NUL
//! terminated, [`WIRE_MSG_LEN`] bytes), the client first, then the client's `done`.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::{CliError, IoContext as _};
use crate::report::pingpong::{Dest, WIRE_MSG_LEN, format_dest, parse_dest};

/// How long the exchange may take before the run is abandoned.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// The client's last message, telling the server its QP is ready.
const DONE: &[u8] = b"done\0";

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

/// Server side: accepts one client (giving up when `abort` is set or after the timeout),
/// reads its message, then lets `connect` bring the QP up and answers with `mine`; returns
/// after the client's `done`.
pub(crate) fn serve(
    listener: &TcpListener,
    abort: &AtomicBool,
    connect: impl FnOnce(&Dest) -> Result<Dest, CliError>,
) -> Result<Dest, CliError> {
    listener
        .set_nonblocking(true)
        .io_ctx("configuring the listening socket")?;
    let deadline = Instant::now() + EXCHANGE_TIMEOUT;
    let mut stream = loop {
        match listener.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if abort.load(Ordering::Acquire) {
                    return Err(CliError::PeerStopped("waiting for the client to connect"));
                }
                if Instant::now() >= deadline {
                    return Err(CliError::Failed(
                        "no client connected within 10 s".to_owned(),
                    ));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => return Err(e).io_ctx("accepting the client"),
        }
    };
    configure(&stream)?;
    let remote = read_dest(&mut stream)?;
    let mine = connect(&remote)?;
    write_dest(&mut stream, &mine)?;
    let mut done = [0u8; 5];
    stream
        .read_exact(&mut done)
        .io_ctx("waiting for the client's \"done\"")?;
    Ok(remote)
}

/// Client side: connects to `host:port`, sends `mine` and returns the server's message (after
/// telling the server `done`).
pub(crate) fn client(host: &str, port: u16, mine: &Dest) -> Result<Dest, CliError> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .io_ctx(format_args!("resolving {host}"))?
        .collect();
    let mut last = None;
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, EXCHANGE_TIMEOUT) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let Some(mut stream) = stream else {
        let e = last.unwrap_or_else(|| ErrorKind::NotFound.into());
        return Err(e).io_ctx(format_args!("couldn't connect to {host}:{port}"));
    };
    configure(&stream)?;
    write_dest(&mut stream, mine)?;
    let remote = read_dest(&mut stream)?;
    stream
        .write_all(DONE)
        .io_ctx("sending \"done\" to the server")?;
    Ok(remote)
}

fn configure(stream: &TcpStream) -> Result<(), CliError> {
    stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_read_timeout(Some(EXCHANGE_TIMEOUT)))
        .and_then(|()| stream.set_write_timeout(Some(EXCHANGE_TIMEOUT)))
        .and_then(|()| stream.set_nodelay(true))
        .io_ctx("configuring the exchange socket")
}

fn write_dest(stream: &mut TcpStream, dest: &Dest) -> Result<(), CliError> {
    let mut msg = format_dest(dest).into_bytes();
    msg.resize(WIRE_MSG_LEN, 0);
    stream.write_all(&msg).io_ctx("sending the local address")
}

fn read_dest(stream: &mut TcpStream) -> Result<Dest, CliError> {
    let mut msg = [0u8; WIRE_MSG_LEN];
    stream
        .read_exact(&mut msg)
        .io_ctx("reading the remote address")?;
    let text = String::from_utf8_lossy(&msg);
    parse_dest(&text).map_err(|e| {
        CliError::Failed(format!(
            "couldn't read the remote address '{}': {e}",
            text.trim_end_matches('\0')
        ))
    })
}

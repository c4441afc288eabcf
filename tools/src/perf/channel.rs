//! The side channel of a cross-process `perf` run, speaking perftest's exchange
//! (`portverbs::oob::perftest` has the formats and the exchanges): over TCP (connecting or
//! accepting), or with `-R` over an RC QP connected by the CM ([`super::cm`], where the
//! destinations are binary); the client writing first in each exchange.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use portverbs::oob::perftest::{
    self, BinaryForm, BwReport, Dest, Exchange, ExchangeError, PeerParams, Step,
};

use super::cm::CommQp;
use crate::error::{CliError, IoContext as _};
use crate::wait::PeerWatch;

/// What carries the side channel.
#[derive(Debug)]
enum Transport {
    /// perftest's default: a TCP connection, destinations as text.
    Tcp(TcpStream),
    /// `-R`: SENDs on an RC QP, destinations in binary of `form`, announcing `gid_index`.
    Cm {
        comm: CommQp,
        form: BinaryForm,
        gid_index: u32,
    },
}

/// One side of the side channel.
///
/// Every wait on the peer has a deadline ([`PeerWatch`], the tool's `--timeout`): a read
/// fails when the peer shows no sign of life for that long. The one wait through the peer's
/// own run (a BW server waiting for its client's result, [`Channel::peer_runs`]) counts the
/// packets this side's device receives as signs of life; over TCP it also ends, as perftest's
/// does, when the peer's kernel closes the connection of a process that died.
#[derive(Debug)]
pub(crate) struct Channel {
    transport: Transport,
    client: bool,
    peer: String,
    watch: PeerWatch,
    /// The next read waits through the peer's run.
    long: bool,
    /// The device of a side in manual progress: TCP reads keep it progressing (its peer's
    /// packets are answered only while something drives it).
    manual: Option<portverbs::Context>,
}

/// How often a TCP read waiting through the peer's run looks at the peer's signs of life.
const TCP_SLICE: Duration = Duration::from_millis(200);

impl Channel {
    /// Connects to `host:port` (the client role), watching the peer with `watch`.
    pub(crate) fn connect(
        host: &str,
        port: u16,
        timeout: Duration,
        watch: PeerWatch,
    ) -> Result<Self, CliError> {
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .io_ctx(format_args!("resolving {host}"))?
            .collect();
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(stream) => {
                    stream
                        .set_nodelay(true)
                        .io_ctx("configuring the exchange socket")?;
                    let chan = Self {
                        transport: Transport::Tcp(stream),
                        client: true,
                        peer: host.to_owned(),
                        watch,
                        long: false,
                        manual: None,
                    };
                    chan.prompt()?;
                    return Ok(chan);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| ErrorKind::NotFound.into()))
            .io_ctx(format_args!("couldn't connect to {host}:{port}"))
    }

    /// Accepts one client on `listener` (the server role), waiting until one connects or
    /// `abort` is set, then watches it with `watch`.
    pub(crate) fn accept(
        listener: &TcpListener,
        abort: &AtomicBool,
        watch: PeerWatch,
    ) -> Result<Self, CliError> {
        listener
            .set_nonblocking(true)
            .io_ctx("configuring the listening socket")?;
        loop {
            match listener.accept() {
                Ok((stream, addr)) => {
                    stream
                        .set_nonblocking(false)
                        .and_then(|()| stream.set_nodelay(true))
                        .io_ctx("configuring the exchange socket")?;
                    // The TCP source of a client is not always its address (on loopback
                    // it is 127.0.0.1 whatever the client's device is): the client is named
                    // by the address its destination announces once it has come.
                    let chan = Self {
                        transport: Transport::Tcp(stream),
                        client: false,
                        peer: addr.to_string(),
                        watch,
                        long: false,
                        manual: None,
                    };
                    chan.prompt()?;
                    return Ok(chan);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if abort.load(Ordering::Acquire) {
                        return Err(CliError::PeerStopped("waiting for a client to connect"));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(e).io_ctx("accepting the client"),
            }
        }
    }

    /// The side channel over `comm` (`-R`), connected by the CM to `peer`; `gid_index` is
    /// the one this side's destinations announce.
    pub(crate) fn over_cm(
        comm: CommQp,
        client: bool,
        peer: String,
        gid_index: u32,
        watch: PeerWatch,
    ) -> Self {
        Self {
            transport: Transport::Cm {
                comm,
                form: BinaryForm::Plain,
                gid_index,
            },
            client,
            peer,
            watch,
            long: false,
            manual: None,
        }
    }

    /// The peer as the messages name it: its address (a server's client: the one its
    /// destination announced, once it has come).
    pub(crate) fn peer(&self) -> &str {
        &self.peer
    }

    /// Makes every TCP read of this channel drive `ctx` while it waits, when the device
    /// progresses only inside calls (manual): a BW server waiting for its client's result
    /// must keep receiving and acknowledging the client's packets meanwhile.
    pub(crate) fn drive(&mut self, ctx: &portverbs::Context) {
        if ctx.progress() == portverbs::hal::Progress::Manual {
            self.manual = Some(ctx.clone());
        }
    }

    /// The next read waits through the peer's run (a BW server waiting for its client's
    /// result): the peer's signs of life are the packets this side's device receives.
    pub(crate) fn peer_runs(&mut self) {
        self.long = true;
    }

    /// TCP reads and writes that block give up after the watch's limit (its restarts come
    /// from [`Channel::recv`]'s own loop).
    fn prompt(&self) -> Result<(), CliError> {
        if let Transport::Tcp(stream) = &self.transport {
            let limit = self.watch_limit();
            stream
                .set_read_timeout(limit)
                .and_then(|()| stream.set_write_timeout(limit))
                .io_ctx("configuring the exchange socket")?;
        }
        Ok(())
    }

    fn watch_limit(&self) -> Option<Duration> {
        self.watch.limit()
    }

    /// Ends the channel: over the CM, disconnects its QP and lets the CM's last MADs leave;
    /// `linger` waits for the peer's answer (not after a failed run, whose peer may be gone).
    pub(crate) fn finish(self, linger: bool) {
        if let Transport::Cm { comm, .. } = self.transport {
            comm.close(linger);
        }
    }

    fn send(&mut self, msg: &[u8], what: &str) -> Result<(), CliError> {
        match &mut self.transport {
            Transport::Tcp(stream) => stream
                .write_all(msg)
                .io_ctx(format_args!("sending the {what} to {}", self.peer)),
            Transport::Cm { comm, .. } => comm.send(msg, &mut self.watch),
        }
    }

    fn recv(&mut self, buf: &mut [u8], what: &str) -> Result<(), CliError> {
        let long = std::mem::take(&mut self.long);
        self.watch.restart();
        let stream = match &mut self.transport {
            Transport::Tcp(stream) => stream,
            Transport::Cm { comm, .. } => {
                // perftest copies the bytes it expects out of its receive buffer; a shorter
                // message is not one of its.
                let msg = comm.recv(&mut self.watch, long)?;
                let part = msg.get(..buf.len()).ok_or_else(|| {
                    CliError::Failed(format!(
                        "the {what} from {} has {} bytes, {} expected",
                        self.peer,
                        msg.len(),
                        buf.len()
                    ))
                })?;
                buf.copy_from_slice(part);
                return Ok(());
            }
        };
        if let Some(ctx) = &self.manual {
            return read_driving(stream, buf, ctx, &mut self.watch, what, long, &self.peer);
        }
        if long {
            // Wait for the first byte in slices, looking at the peer's signs of life between
            // them; then read the message with the usual limit.
            stream
                .set_read_timeout(Some(TCP_SLICE))
                .io_ctx("configuring the exchange socket")?;
            let waited = loop {
                match stream.peek(&mut [0u8; 1]) {
                    Ok(_) => break Ok(()),
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                        if let Err(e) = self.watch.check(&format!("waiting for the {what}"), true) {
                            break Err(e);
                        }
                    }
                    Err(e) => break Err(e).io_ctx(format_args!("waiting for the {what}")),
                }
            };
            let limit = self.watch.limit();
            stream
                .set_read_timeout(limit)
                .io_ctx("configuring the exchange socket")?;
            waited?;
        }
        stream.read_exact(buf).map_err(|e| {
            let peer = &self.peer;
            match e.kind() {
                ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                    CliError::Failed(format!("no reply from {peer} while reading the {what}"))
                }
                ErrorKind::UnexpectedEof => {
                    CliError::Failed(format!("{peer} closed the connection before the {what}"))
                }
                _ => CliError::Io {
                    context: format!("reading the {what} from {peer}"),
                    source: e,
                },
            }
        })
    }

    /// Versions, system data and MTU (`exchange_versions`, `check_sys_data`, `check_mtu`):
    /// `mtu_enum` is this side's MTU as an `ibv_mtu` value.
    pub(crate) fn params(&mut self, mtu_enum: u8) -> Result<PeerParams, CliError> {
        let params = perftest::negotiate(self, mtu_enum).map_err(exchange_error)?;
        if let Transport::Cm { form, .. } = &mut self.transport {
            *form = BinaryForm::for_version(params.version);
        }
        Ok(params)
    }

    /// `ctx_hand_shake`: sends `mine` and returns the peer's destination, read in the GID form
    /// when `mine` has a GID.
    pub(crate) fn hand_shake(&mut self, mine: &Dest) -> Result<Dest, CliError> {
        if let Transport::Cm {
            comm,
            form,
            gid_index,
        } = &mut self.transport
        {
            let msg = mine.encode_binary(*gid_index, *form);
            let long = std::mem::take(&mut self.long);
            self.watch.restart();
            let theirs = if self.client {
                comm.send(&msg, &mut self.watch)?;
                comm.recv(&mut self.watch, long)?
            } else {
                let theirs = comm.recv(&mut self.watch, long)?;
                comm.send(&msg, &mut self.watch)?;
                theirs
            };
            return Dest::decode_binary(&theirs).map_err(|e| CliError::Failed(e.to_string()));
        }
        let theirs = perftest::hand_shake(self, mine).map_err(exchange_error)?;
        // The peer's own address, which names it from now on.
        if let Some(gid) = theirs.gid.filter(|g| !g.is_zero()) {
            self.peer = gid.to_ip().to_string();
        }
        Ok(theirs)
    }

    /// `xchg_bw_reports`: sends `mine` and returns the peer's report.
    pub(crate) fn bw_reports(&mut self, mine: &BwReport) -> Result<BwReport, CliError> {
        perftest::bw_reports(self, mine).map_err(exchange_error)
    }

    /// `ctx_close_connection`: a last hand shake, then (over TCP) `done`; the peer may close
    /// first.
    pub(crate) fn close(&mut self, mine: &Dest) -> Result<(), CliError> {
        self.hand_shake(mine)?;
        // The peer closes after its own "done"; whether ours arrives does not matter.
        if let Transport::Tcp(stream) = &mut self.transport {
            let _ = stream.write_all(perftest::DONE);
        }
        Ok(())
    }
}

/// One exchange of equal-sized messages: the client sends first, the server answers.
impl Exchange for Channel {
    type Error = CliError;

    fn exchange(&mut self, step: Step, mine: &[u8], theirs: &mut [u8]) -> Result<(), CliError> {
        let what = step.to_string();
        if self.client {
            self.send(mine, &what)?;
            self.recv(theirs, &what)
        } else {
            self.recv(theirs, &what)?;
            self.send(mine, &what)
        }
    }
}

/// A failed exchange in the tool's words: the transport's own error, or what was wrong with
/// the peer's message.
fn exchange_error(e: ExchangeError<CliError>) -> CliError {
    match e {
        ExchangeError::Transport(e) => e,
        e => CliError::Failed(e.to_string()),
    }
}

/// A TCP read on a side whose device progresses only inside calls: the device is dispatched
/// (it receives, acknowledges, retransmits) between tries of the socket, which is read
/// without blocking only every [`DISPATCHES_PER_READ`] dispatches (a system call each would
/// slow the device's progress); the peer watch is looked at every [`TCP_SLICE`].
fn read_driving(
    stream: &mut std::net::TcpStream,
    buf: &mut [u8],
    ctx: &portverbs::Context,
    watch: &mut PeerWatch,
    what: &str,
    long: bool,
    peer: &str,
) -> Result<(), CliError> {
    stream
        .set_nonblocking(true)
        .io_ctx("configuring the exchange socket")?;
    let mut got = 0;
    let mut looked = std::time::Instant::now();
    let r = loop {
        if got == buf.len() {
            break Ok(());
        }
        match stream.read(&mut buf[got..]) {
            Ok(0) => {
                break Err(CliError::Failed(format!(
                    "{peer} closed the connection before the {what}"
                )));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                for _ in 0..DISPATCHES_PER_READ {
                    ctx.dispatch();
                }
                if looked.elapsed() >= TCP_SLICE {
                    looked = std::time::Instant::now();
                    if let Err(e) = watch.check(&format!("waiting for the {what}"), long) {
                        break Err(e);
                    }
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => {
                break Err(CliError::Io {
                    context: format!("reading the {what} from {peer}"),
                    source: e,
                });
            }
        }
    };
    stream
        .set_nonblocking(false)
        .io_ctx("configuring the exchange socket")?;
    r
}

/// Dispatches of a manual device between two looks at the exchange socket.
const DISPATCHES_PER_READ: u32 = 64;

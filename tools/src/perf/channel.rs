//! The side channel of a cross-process `perf` run, speaking perftest's exchange
//! ([`crate::report::perftest::wire`] has the formats): over TCP (connecting or accepting),
//! or with `-R` over an RC QP connected by the CM ([`super::cm`], where the destinations are
//! binary); the exchanges in perftest's order, the client writing first in each.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use portverbs::hal::Gid;

use super::cm::{self, CommQp};
use crate::error::{CliError, IoContext as _};
use crate::report::perftest::wire::{
    self, BwReport, DONE, KEY_MSG_SIZE, KEY_MSG_SIZE_GID, KeyMsg, VERSION_LEN,
};
use crate::wait::PeerWatch;

/// What the peer announced before the test.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct PeerParams {
    /// Its protocol version.
    pub(crate) version: f64,
    /// The larger of both sides' cycle buffers (page sizes).
    pub(crate) cycle_buffer: u32,
    /// The smaller of both sides' MTUs, as an `ibv_mtu` value (1 ..= 5).
    pub(crate) mtu_enum: u8,
}

/// What carries the side channel.
#[derive(Debug)]
enum Transport {
    /// perftest's default: a TCP connection, destinations as text.
    Tcp(TcpStream),
    /// `-R`: SENDs on an RC QP, destinations in binary of `dest_len` bytes, announcing
    /// `gid_index`.
    Cm {
        comm: CommQp,
        dest_len: usize,
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
                dest_len: cm::DEST_LEN,
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

    /// One exchange of equal-sized messages: the client sends first, the server answers.
    fn xchg(&mut self, mine: &[u8], theirs: &mut [u8], what: &str) -> Result<(), CliError> {
        if self.client {
            self.send(mine, what)?;
            self.recv(theirs, what)
        } else {
            self.recv(theirs, what)?;
            self.send(mine, what)
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
        let mut v = [0u8; VERSION_LEN];
        self.xchg(
            &wire::version_msg(wire::PROTOCOL_VERSION),
            &mut v,
            "perftest version",
        )?;
        let version = wire::parse_version(&v).map_err(|e| {
            CliError::Failed(format!("the peer's version message is not perftest's: {e}"))
        })?;
        if let Transport::Cm { dest_len, .. } = &mut self.transport {
            *dest_len = cm::dest_len_for(version);
        }
        if version < wire::MIN_PEER_VERSION {
            return Err(CliError::Failed(format!(
                "the peer speaks perftest version {version}; versions older than {} are not \
                 supported",
                wire::MIN_PEER_VERSION
            )));
        }
        let mut cycle = [0u8; 4];
        self.xchg(
            &wire::int_msg(wire::PAGE_SIZE),
            &mut cycle,
            "cycle buffer size",
        )?;
        let mut line = [0u8; 4];
        self.xchg(
            &wire::int_msg(wire::CACHE_LINE_SIZE),
            &mut line,
            "cache line size",
        )?;
        let mut mtu = [0u8; 2];
        self.xchg(&wire::mtu_msg(mtu_enum), &mut mtu, "MTU")?;
        // perftest ignores an invalid MTU from the peer and keeps its own.
        let theirs = wire::parse_mtu(mtu).unwrap_or(mtu_enum);
        let cycle = wire::parse_int(cycle).clamp(wire::PAGE_SIZE, 1 << 24);
        Ok(PeerParams {
            version,
            cycle_buffer: u32::try_from(cycle).unwrap_or(4096),
            mtu_enum: theirs.min(mtu_enum),
        })
    }

    /// `ctx_hand_shake`: sends `mine` and returns the peer's destination, read in the GID form
    /// when `mine` has a GID.
    pub(crate) fn hand_shake(&mut self, mine: &KeyMsg) -> Result<KeyMsg, CliError> {
        if let Transport::Cm {
            comm,
            dest_len,
            gid_index,
        } = &mut self.transport
        {
            let msg = cm::format_dest(mine, *gid_index, *dest_len);
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
            return cm::parse_dest(&theirs);
        }
        let with_gid = mine.gid.is_some();
        let msg = wire::format_keys(mine);
        let mut buf = [0u8; KEY_MSG_SIZE_GID];
        let len = if with_gid {
            KEY_MSG_SIZE_GID
        } else {
            KEY_MSG_SIZE
        };
        self.xchg(&msg, &mut buf[..len], "destination")?;
        let theirs = wire::parse_keys(&buf[..len], with_gid).map_err(|e| {
            CliError::Failed(format!(
                "couldn't parse the peer's destination '{}': {e}",
                String::from_utf8_lossy(&buf[..len]).trim_end_matches('\0')
            ))
        })?;
        // The peer's own address, which names it from now on.
        if let Some(gid) = theirs.gid.filter(|g| g.iter().any(|&b| b != 0)) {
            self.peer = Gid(gid).to_ip().to_string();
        }
        Ok(theirs)
    }

    /// `xchg_bw_reports`: sends `mine` and returns the peer's report.
    pub(crate) fn bw_reports(&mut self, mine: &BwReport) -> Result<BwReport, CliError> {
        let mut theirs = [[0u8; 8]; 5];
        for (m, t) in mine.messages().iter().zip(theirs.iter_mut()) {
            self.xchg(m, t, "BW report")?;
        }
        Ok(BwReport::from_messages(&theirs))
    }

    /// `ctx_close_connection`: a last hand shake, then (over TCP) `done`; the peer may close
    /// first.
    pub(crate) fn close(&mut self, mine: &KeyMsg) -> Result<(), CliError> {
        self.hand_shake(mine)?;
        // The peer closes after its own "done"; whether ours arrives does not matter.
        if let Transport::Tcp(stream) = &mut self.transport {
            let _ = stream.write_all(DONE);
        }
        Ok(())
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

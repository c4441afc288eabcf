//! The side channel of a cross-process `perf` run, speaking perftest's exchange
//! ([`crate::report::perftest::wire`] has the formats): over TCP (connecting or accepting),
//! or with `-R` over an RC QP connected by the CM ([`super::cm`], where the destinations are
//! binary); the exchanges in perftest's order, the client writing first in each.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::cm::{self, CommQp};
use crate::error::{CliError, IoContext as _};
use crate::report::perftest::wire::{
    self, BwReport, DONE, KEY_MSG_SIZE, KEY_MSG_SIZE_GID, KeyMsg, VERSION_LEN,
};

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
#[derive(Debug)]
pub(crate) struct Channel {
    transport: Transport,
    client: bool,
    peer: String,
}

impl Channel {
    /// Connects to `host:port` (the client role).
    pub(crate) fn connect(host: &str, port: u16, timeout: Duration) -> Result<Self, CliError> {
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
                    return Ok(Self {
                        transport: Transport::Tcp(stream),
                        client: true,
                        peer: host.to_owned(),
                    });
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| ErrorKind::NotFound.into()))
            .io_ctx(format_args!("couldn't connect to {host}:{port}"))
    }

    /// Accepts one client on `listener` (the server role), waiting until one connects or
    /// `abort` is set.
    pub(crate) fn accept(listener: &TcpListener, abort: &AtomicBool) -> Result<Self, CliError> {
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
                    return Ok(Self {
                        transport: Transport::Tcp(stream),
                        client: false,
                        peer: addr.ip().to_string(),
                    });
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
    pub(crate) fn over_cm(comm: CommQp, client: bool, peer: String, gid_index: u32) -> Self {
        Self {
            transport: Transport::Cm {
                comm,
                dest_len: cm::DEST_LEN,
                gid_index,
            },
            client,
            peer,
        }
    }

    /// Bounds every later read and write by `timeout` (`None`: wait as long as it takes, as
    /// perftest does while the peer runs the test). Over the CM a wait ends only when the
    /// peer disconnects.
    pub(crate) fn set_timeout(&self, timeout: Option<Duration>) -> Result<(), CliError> {
        match &self.transport {
            Transport::Tcp(stream) => stream
                .set_read_timeout(timeout)
                .and_then(|()| stream.set_write_timeout(timeout))
                .io_ctx("configuring the exchange socket"),
            Transport::Cm { .. } => Ok(()),
        }
    }

    /// Ends the channel: over the CM, disconnects its QP and lets the CM's last MADs leave.
    pub(crate) fn finish(self) {
        if let Transport::Cm { comm, .. } = self.transport {
            comm.close();
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
            Transport::Cm { comm, .. } => comm.send(msg),
        }
    }

    fn recv(&mut self, buf: &mut [u8], what: &str) -> Result<(), CliError> {
        let stream = match &mut self.transport {
            Transport::Tcp(stream) => stream,
            Transport::Cm { comm, .. } => {
                // perftest copies the bytes it expects out of its receive buffer; a shorter
                // message is not one of its.
                let msg = comm.recv()?;
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
        } = &self.transport
        {
            let msg = cm::format_dest(mine, *gid_index, *dest_len);
            let theirs = if self.client {
                comm.send(&msg)?;
                comm.recv()?
            } else {
                let theirs = comm.recv()?;
                comm.send(&msg)?;
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
        wire::parse_keys(&buf[..len], with_gid).map_err(|e| {
            CliError::Failed(format!(
                "couldn't parse the peer's destination '{}': {e}",
                String::from_utf8_lossy(&buf[..len]).trim_end_matches('\0')
            ))
        })
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

//! The ping loop of rping, on an RC QP that is already connected: the client advertises its
//! source buffer, the server RDMA READs it, says "go ahead", the client advertises its sink,
//! the server RDMA WRITEs the ping back and says "go ahead" again; the client may check that
//! what came back is what it sent. Every advertisement is a 16-byte SEND
//! ([`RdmaInfo`]); the server runs until the client disconnects.
//!
//! How the QP got connected, and how completions and the disconnect reach this loop, is the
//! caller's [`Link`].

use std::io::Write;

use portverbs::oob::rping::{INFO_LEN, RdmaInfo, fill_ping};
use portverbs::prelude::*;

use crate::error::{CliError, Context as _, IoContext as _};

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;
const RDMA_WRID: u64 = 3;

/// What the loop waits for next.
#[derive(Debug)]
pub(crate) enum Step {
    /// A completion of the QP's CQ.
    Completion(WorkCompletion),
    /// The peer disconnected (the CM's DISCONNECTED event).
    Disconnected,
}

/// Where completions and the disconnect come from.
pub(crate) trait Link {
    /// Blocks until the next completion of the QP's CQ or the peer's disconnect.
    fn next(&mut self) -> Result<Step, CliError>;
}

/// One side's buffers over its QP: the receive and send buffers of advertisements, the RDMA
/// buffer (the server's read target and write source, the client's sink), and the client's
/// source.
#[derive(Debug)]
pub(crate) struct Rping {
    qp: Qp,
    size: usize,
    recv: Mr,
    send: Mr,
    rdma: Mr,
    start: Option<Mr>,
}

/// The QP capacities rping asks for.
pub(crate) const CAPS: QpCaps = QpCaps {
    max_send_wr: 16,
    max_recv_wr: 2,
    max_send_sge: 1,
    max_recv_sge: 1,
    max_inline_data: 0,
};

impl Rping {
    /// Registers the buffers of a `size`-byte ping on `pd` for `qp` (a client also gets a
    /// source buffer).
    pub(crate) fn new(pd: &Pd, qp: Qp, size: usize, client: bool) -> Result<Self, CliError> {
        let remote =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let reg = |len: usize, access: AccessFlags, what: &str| {
            pd.reg_vec_blocking(vec![0u8; len], access)
                .ctx(format_args!("registering the {what} buffer"))
        };
        Ok(Self {
            recv: reg(INFO_LEN, AccessFlags::LOCAL_WRITE, "receive")?,
            send: reg(INFO_LEN, AccessFlags::empty(), "send")?,
            rdma: reg(size, remote, "RDMA")?,
            start: if client {
                Some(reg(size, remote, "source")?)
            } else {
                None
            },
            qp,
            size,
        })
    }

    /// Posts the one receive rping keeps posted (re-posted after each arrives).
    pub(crate) fn post_recv(&self) -> Result<(), CliError> {
        let sge = self.recv.sge(0, INFO_LEN).ctx("the receive buffer")?;
        self.qp
            .post_recv(&[RecvWr {
                wr_id: RECV_WRID,
                sges: &[sge],
            }])
            .ctx("posting a receive")
    }

    fn send_info(&self, info: RdmaInfo) -> Result<(), CliError> {
        self.send
            .write(0, &info.to_bytes())
            .ctx("writing the send buffer")?;
        let sge = [self.send.sge(0, INFO_LEN).ctx("the send buffer")?];
        self.qp
            .post_send(&[SendWr::new(SEND_WRID, SendOp::Send)
                .sges(&sge)
                .flags(SendFlags::SIGNALED)])
            .ctx("post send error")
    }

    fn advertise(&self, mr: &Mr) -> Result<(), CliError> {
        self.send_info(RdmaInfo {
            addr: mr.addr(),
            rkey: mr.rkey().unwrap_or(0),
            size: self.size as u32,
        })
    }

    /// Waits for the next completion with opcode `want`, passing over the completions of
    /// sends; a receive is re-posted and its advertisement returned. `None` when the peer
    /// disconnected (or the QP was flushed by the disconnect).
    fn wait(
        &self,
        link: &mut dyn Link,
        want: WcOpcode,
    ) -> Result<Option<(WorkCompletion, Option<RdmaInfo>)>, CliError> {
        loop {
            let wc = match link.next()? {
                Step::Disconnected => return Ok(None),
                Step::Completion(wc) => wc,
            };
            match wc.status {
                WcStatus::Success => {}
                WcStatus::WrFlushErr => return Ok(None),
                s => {
                    return Err(CliError::Failed(format!(
                        "cq completion failed status {} ({s:?}) for wr_id {}",
                        s as u32, wc.wr_id
                    )));
                }
            }
            let info = if wc.opcode == WcOpcode::Recv {
                let mut bytes = vec![0u8; INFO_LEN];
                self.recv
                    .read(0, &mut bytes)
                    .ctx("reading the receive buffer")?;
                bytes.truncate(wc.byte_len as usize);
                let info =
                    RdmaInfo::from_bytes(&bytes).map_err(|e| CliError::Failed(e.to_string()))?;
                self.post_recv()?;
                Some(info)
            } else {
                None
            };
            if wc.opcode == want {
                return Ok(Some((wc, info)));
            }
            if wc.opcode != WcOpcode::Send {
                return Err(CliError::Failed(format!(
                    "unexpected {:?} completion while waiting for {want:?}",
                    wc.opcode
                )));
            }
        }
    }

    fn rdma(&self, op: SendOp, len: usize, link: &mut dyn Link) -> Result<bool, CliError> {
        let want = match op {
            SendOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            _ => WcOpcode::RdmaWrite,
        };
        let sge = [self.rdma.sge(0, len).ctx("the RDMA buffer")?];
        self.qp
            .post_send(&[SendWr::new(RDMA_WRID, op)
                .sges(&sge)
                .flags(SendFlags::SIGNALED)])
            .ctx("post send error")?;
        Ok(self.wait(link, want)?.is_some())
    }

    /// The server's loop, until the client disconnects; returns how many pings it echoed.
    /// With `verbose`, prints `server ping data: <text>` per ping.
    pub(crate) fn serve(
        &self,
        link: &mut dyn Link,
        verbose: bool,
        out: &mut dyn Write,
    ) -> Result<u64, CliError> {
        let mut pings = 0;
        loop {
            // The client's source.
            let Some((_, Some(src))) = self.wait(link, WcOpcode::Recv)? else {
                return Ok(pings);
            };
            let len = src.size as usize;
            if len > self.size {
                return Err(CliError::Failed(format!(
                    "the client's ping of {len} bytes is larger than this server's {} (-S)",
                    self.size
                )));
            }
            let remote = RemoteAddr {
                addr: src.addr,
                rkey: src.rkey,
            };
            if !self.rdma(SendOp::RdmaRead { remote }, len, link)? {
                return Ok(pings);
            }
            let mut data = vec![0u8; self.size];
            self.rdma
                .read(0, &mut data)
                .ctx("reading the RDMA buffer")?;
            let text = c_str(&data);
            if verbose {
                writeln!(out, "server ping data: {}", String::from_utf8_lossy(text))
                    .io_ctx("writing to stdout")?;
            }
            // Go ahead: the client advertises its sink.
            self.send_info(RdmaInfo {
                addr: 0,
                rkey: 0,
                size: 0,
            })?;
            let Some((_, Some(sink))) = self.wait(link, WcOpcode::Recv)? else {
                return Ok(pings);
            };
            // Echo the text and its NUL, as rping does.
            let echo = (text.len() + 1).min(self.size).min(sink.size as usize);
            let remote = RemoteAddr {
                addr: sink.addr,
                rkey: sink.rkey,
            };
            if !self.rdma(SendOp::RdmaWrite { remote }, echo, link)? {
                return Ok(pings);
            }
            self.send_info(RdmaInfo {
                addr: 0,
                rkey: 0,
                size: 0,
            })?;
            pings += 1;
        }
    }

    /// The client's loop: `count` pings (0: until an error). With `validate`, what came back
    /// must equal what was sent ("data mismatch!"); with `verbose`, prints
    /// `ping data: <text>` per ping. Returns the pings done.
    pub(crate) fn ping(
        &self,
        link: &mut dyn Link,
        count: u64,
        verbose: bool,
        validate: bool,
        out: &mut dyn Write,
    ) -> Result<u64, CliError> {
        let start = self
            .start
            .as_ref()
            .ok_or_else(|| CliError::Failed("a server has no source buffer".into()))?;
        let mut n = 0;
        let mut sent = vec![0u8; self.size];
        while count == 0 || n < count {
            fill_ping(&mut sent, n);
            start.write(0, &sent).ctx("writing the source buffer")?;
            self.advertise(start)?;
            let gone = |what: &str| {
                CliError::Failed(format!("the server disconnected while {what} (ping {n})"))
            };
            if self.wait(link, WcOpcode::Recv)?.is_none() {
                return Err(gone("reading"));
            }
            self.advertise(&self.rdma)?;
            if self.wait(link, WcOpcode::Recv)?.is_none() {
                return Err(gone("writing"));
            }
            let mut got = vec![0u8; self.size];
            self.rdma.read(0, &mut got).ctx("reading the sink")?;
            if validate && got != sent {
                return Err(CliError::Failed("data mismatch!".into()));
            }
            if verbose {
                writeln!(out, "ping data: {}", String::from_utf8_lossy(c_str(&got)))
                    .io_ctx("writing to stdout")?;
            }
            // The next ping must overwrite the sink to pass the check.
            self.rdma
                .write(0, &vec![0u8; self.size])
                .ctx("clearing the sink")?;
            n += 1;
        }
        Ok(n)
    }
}

/// The C string at the start of `buf`: the bytes before the first NUL (all of them if none).
pub(crate) fn c_str(buf: &[u8]) -> &[u8] {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    &buf[..end]
}

//! One side of `ibv_rc_pingpong`: an RC QP with `rx_depth` receives posted, and the loop that
//! answers every received message with a send.
//!
//! The buffer holds a send region and a receive region of `size` bytes each. The loop follows
//! the C tool: a side may send again once its previous send completed and the peer's message
//! arrived; receives are reposted in bulk when at most one is left.

use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use portverbs::prelude::*;

use crate::error::{CliError, Context as _};
use crate::events::EventChannel;
use crate::verbs::{self, PortInfo};
use crate::wait::Waiter;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// `-c`: the page size of `ibv_rc_pingpong`'s check; the first byte of every page of a
/// message is 0.
const CHECK_PAGE: usize = 4096;

/// `-c`: what the rest of the buffer holds (`ibv_rc_pingpong` fills its buffer with it), and
/// what a checked page start is reset to, so that the next message must overwrite it.
const FILL: u8 = 0x7b;

/// Options shared by both sides.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PpConfig {
    /// Message size.
    pub(crate) size: usize,
    /// Path MTU.
    pub(crate) mtu: Mtu,
    /// Receives kept posted.
    pub(crate) rx_depth: u32,
    /// Messages each way.
    pub(crate) iters: u64,
    /// Service level.
    pub(crate) sl: u8,
    /// Wait for completions on a completion channel instead of polling.
    pub(crate) events: bool,
    /// `-g`.
    pub(crate) gid_index: Option<u32>,
    /// Check the contents of every received message.
    pub(crate) validate: bool,
    /// `--timeout`: how long the run may see nothing from the peer.
    pub(crate) timeout: Duration,
}

/// One side's objects.
#[derive(Debug)]
pub(crate) struct PpSide {
    cfg: PpConfig,
    /// Port, GID index, MTU, SL and first PSN of the QP.
    opts: ConnectOptions,
    /// What the peer needs to reach the QP.
    me: QpEndpoint,
    cq: Cq,
    qp: Qp,
    buf: Buffer,
    mr: Mr,
    channel: Option<EventChannel>,
}

impl PpSide {
    /// Creates the objects on `ctx` port `ib_port`, moves the QP to INIT and posts the receives.
    pub(crate) fn new(ctx: &Context, ib_port: u8, cfg: PpConfig) -> Result<Self, CliError> {
        let port: PortInfo = verbs::port_info(ctx, ib_port, cfg.gid_index)?;
        if cfg.mtu > port.max_mtu {
            return Err(CliError::usage(format_args!(
                "MTU {} is above the port's maximum {}",
                cfg.mtu, port.max_mtu
            )));
        }
        let max_wr = ctx.attr().max_qp_wr;
        if cfg.rx_depth > max_wr {
            return Err(CliError::usage(format_args!(
                "rx depth {} exceeds the device limit of {max_wr}",
                cfg.rx_depth
            )));
        }
        let name = ctx.name().to_owned();
        let channel = if cfg.events {
            Some(EventChannel::new(ctx)?)
        } else {
            None
        };
        let pd = ctx
            .alloc_pd_blocking()
            .ctx(format_args!("allocating a PD on {name}"))?;
        let cq = ctx
            .create_cq_blocking(CqInit {
                entries: cfg.rx_depth + 1,
                comp_vector: 0,
                channel: channel.as_ref().map(EventChannel::channel),
            })
            .ctx("creating the CQ")?;
        let len = 2 * cfg.size;
        let buf = ctx
            .alloc_buffer(len)
            .ctx(format_args!("allocating {len} bytes"))?;
        let mr = pd
            .reg_mr_blocking(&buf, 0..len, AccessFlags::LOCAL_WRITE)
            .ctx("registering the buffer")?;
        let qp = pd
            .create_qp_blocking(QpInit {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: &cq,
                srq: None,
                caps: QpCaps {
                    max_send_wr: 1,
                    max_recv_wr: cfg.rx_depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
                special: None,
            })
            .ctx("creating the QP")?;
        // rc_pingpong's values (the library's defaults): no remote access, ACK timeout 14,
        // 7 retries, 7 RNR retries, RNR timer 12, one READ/atomic each way, hop limit 1.
        let opts = ConnectOptions {
            psn: verbs::random_psn(),
            mtu: Some(cfg.mtu),
            access: AccessFlags::empty(),
            sl: cfg.sl,
            ..verbs::options(&port)
        };
        verbs::init(&qp, &opts)?;
        let side = Self {
            cfg,
            me: verbs::endpoint(&port, &qp, opts.psn),
            opts,
            cq,
            qp,
            buf,
            mr,
            channel,
        };
        if cfg.validate {
            // ibv_rc_pingpong's -c: the buffer holds 0x7b, the client's message has a 0 at the
            // start of every page. Both sides send that here (the C server echoes it).
            side.buf.fill(0, len, FILL).ctx("filling the buffer")?;
            for at in (0..cfg.size).step_by(CHECK_PAGE) {
                side.buf.write(at, &[0]).ctx("filling the send buffer")?;
            }
        }
        side.post_receives(cfg.rx_depth as usize)?;
        Ok(side)
    }

    /// The address the peer needs.
    pub(crate) fn dest(&self) -> QpEndpoint {
        self.me
    }

    /// Moves the QP to RTR toward `remote`, then to RTS.
    pub(crate) fn connect(&self, remote: &QpEndpoint) -> Result<(), CliError> {
        verbs::connect(&self.qp, remote, &self.opts)
    }

    fn post_receives(&self, n: usize) -> Result<(), CliError> {
        let sge = [self
            .mr
            .sge(self.cfg.size, self.cfg.size)
            .ctx("building the receive entry")?];
        let wr = RecvWr {
            wr_id: RECV_WRID,
            sges: &sge,
        };
        for _ in 0..n {
            self.qp.post_recv(&[wr]).ctx("posting a receive")?;
        }
        Ok(())
    }

    fn post_send(&self) -> Result<(), CliError> {
        let size = self.cfg.size;
        let sge = [self.mr.sge(0, size).ctx("building the send entry")?];
        self.qp
            .post_send(&[SendWr::new(SEND_WRID, SendOp::Send).sges(&sge).signaled()])
            .ctx("posting a send")
    }

    /// `-c`: checks that received message `count` has a 0 at the start of every page, as
    /// `ibv_rc_pingpong`'s server checks its last message, then puts 0x7b back there so that
    /// the next message must overwrite it.
    fn check_data(&self, count: u64) -> Result<(), CliError> {
        let base = self.cfg.size;
        for at in (0..self.cfg.size).step_by(CHECK_PAGE) {
            let mut byte = [0u8; 1];
            self.buf
                .read(base + at, &mut byte)
                .ctx("reading the receive buffer")?;
            if byte[0] != 0 {
                return Err(CliError::Failed(format!(
                    "invalid data in page {} of message {count}: found {:#04x} where 0 was sent",
                    at / CHECK_PAGE,
                    byte[0]
                )));
            }
            self.buf
                .write(base + at, &[FILL])
                .ctx("resetting the receive buffer")?;
        }
        Ok(())
    }

    /// Waits for the next event of the completion channel and re-arms the CQ.
    fn wait_event(&self, waiter: &mut Waiter<'_>) -> Result<(), CliError> {
        let Some(channel) = &self.channel else {
            return Ok(());
        };
        let cq = channel.next(waiter)?;
        if cq.cqn() != self.cq.cqn() {
            return Err(CliError::Failed(format!(
                "event for an unknown CQ {:#x}",
                cq.cqn()
            )));
        }
        cq.ack_events(1);
        self.cq.req_notify(false);
        waiter.progress();
        Ok(())
    }

    /// Runs the ping-pong; the client sends first. Gives up when `peer_failed` is set. Returns
    /// the elapsed time.
    pub(crate) fn run(&self, client: bool, peer_failed: &AtomicBool) -> Result<Duration, CliError> {
        let iters = self.cfg.iters;
        let depth = self.cfg.rx_depth;
        let mut routs = depth;
        let (mut scnt, mut rcnt) = (0u64, 0u64);
        let mut wcs = [WorkCompletion::default(); 2];
        let mut waiter =
            Waiter::new("waiting for the peer", Some(peer_failed)).limit(Some(self.cfg.timeout));
        if self.channel.is_some() {
            self.cq.req_notify(false);
        }
        let start = Instant::now();
        let mut pending = RECV_WRID;
        if client {
            self.post_send()?;
            pending |= SEND_WRID;
        }
        while scnt < iters || rcnt < iters {
            self.wait_event(&mut waiter)?;
            let n = self.cq.poll(&mut wcs).ctx("polling the CQ")?;
            if n == 0 {
                if self.channel.is_none() {
                    waiter.idle()?;
                }
                continue;
            }
            waiter.progress();
            for wc in &wcs[..n] {
                if !wc.is_ok() {
                    return Err(CliError::Failed(format!(
                        "Failed status {} ({}) for wr_id {}",
                        wc.status, wc.status as u8, wc.wr_id
                    )));
                }
                match wc.wr_id {
                    SEND_WRID => scnt += 1,
                    RECV_WRID => {
                        routs -= 1;
                        if routs <= 1 {
                            self.post_receives((depth - routs) as usize)?;
                            routs = depth;
                        }
                        rcnt += 1;
                        if self.cfg.validate {
                            self.check_data(rcnt)?;
                        }
                    }
                    other => {
                        return Err(CliError::Failed(format!(
                            "Completion for unknown wr_id {other}"
                        )));
                    }
                }
                pending &= !wc.wr_id;
                if scnt < iters && pending == 0 {
                    self.post_send()?;
                    pending = RECV_WRID | SEND_WRID;
                }
            }
        }
        Ok(start.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `-c`: a message whose page starts are not 0 is refused, naming the page; a checked page
    /// start is reset so that a message that never arrives cannot pass.
    #[test]
    fn check_finds_the_bad_page() {
        let dev = verbs::pick_device(Some("soft0")).expect("soft0");
        let cfg = PpConfig {
            size: 3 * CHECK_PAGE,
            mtu: Mtu::Mtu1024,
            rx_depth: 2,
            iters: 1,
            sl: 0,
            events: false,
            gid_index: None,
            validate: true,
            timeout: Duration::from_secs(10),
        };
        let side = PpSide::new(&verbs::open(dev).expect("open"), 1, cfg).expect("side");
        let recv = cfg.size;
        // What a peer's message leaves: 0 at every page start.
        for page in 0..3 {
            side.buf
                .write(recv + page * CHECK_PAGE, &[0])
                .expect("write");
        }
        side.check_data(1).expect("a good message");
        // Nothing new arrived: the page starts hold 0x7b again.
        let err = side.check_data(2).expect_err("stale buffer");
        assert!(
            err.to_string()
                .starts_with("invalid data in page 0 of message 2"),
            "{err}"
        );
        side.buf.write(recv, &[0]).expect("write");
        side.buf.write(recv + CHECK_PAGE, &[0]).expect("write");
        let err = side.check_data(3).expect_err("bad page 2");
        assert!(
            err.to_string()
                .starts_with("invalid data in page 2 of message 3"),
            "{err}"
        );
    }
}

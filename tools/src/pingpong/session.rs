//! One side of rdma-core's pingpong examples (`libibverbs/examples/rc_pingpong.c`,
//! `uc_pingpong.c`, `ud_pingpong.c`, `srq_pingpong.c`): the QPs with `rx_depth` receives posted,
//! and the loop that answers every received message with a send.
//!
//! The buffer holds a send region of `size` bytes and a receive region: `size` bytes, and on
//! UD 40 more in front for the GRH the device writes there (`ud_pingpong.c` receives into
//! `size + 40` bytes and sends from 40 bytes in). The loop follows the C tools: a QP may send
//! again once its previous send completed and the peer's message to it arrived; receives are
//! reposted in bulk when at most one is left (with an SRQ: at most one per QP).

use std::sync::OnceLock;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use portverbs::oob::pingpong::SRQ_MESSAGES;
use portverbs::prelude::*;

use crate::error::{CliError, Context as _};
use crate::events::EventChannel;
use crate::verbs::{self, PortInfo};
use crate::wait::Waiter;

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// The low byte of a work request ID says receive or send; above it, a receive's slot.
const KIND_MASK: u64 = 0xff;
const SLOT_SHIFT: u32 = 8;

/// `-c`: the page size of the C tools' check; the first byte of every page of a message is 0.
const CHECK_PAGE: usize = 4096;

/// `-c`: what the rest of the buffer holds (`ibv_rc_pingpong` fills its buffer with it), and
/// what a checked page start is reset to, so that the next message must overwrite it.
const FILL: u8 = 0x7b;

/// Bytes of the GRH at the start of every UD receive.
pub(crate) const GRH_BYTES: usize = 40;

/// Which of rdma-core's pingpong examples a side plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    /// `ibv_rc_pingpong`: one RC QP.
    Rc,
    /// `ibv_uc_pingpong`: one UC QP (no acknowledgements, no retries).
    Uc,
    /// `ibv_ud_pingpong`: one UD QP (Q_Key 0x11111111), sending through an address handle
    /// made from the peer's LID and GID.
    Ud,
    /// `ibv_srq_pingpong`: `qps` RC QPs whose receives come from one shared receive queue.
    Srq {
        /// `-q`.
        qps: u32,
    },
}

impl Variant {
    /// The QPs of one side.
    pub(crate) fn qp_count(self) -> usize {
        match self {
            Self::Srq { qps } => qps as usize,
            _ => 1,
        }
    }

    /// The endpoint messages each side sends in the exchange.
    pub(crate) fn messages(self) -> usize {
        match self {
            Self::Srq { .. } => SRQ_MESSAGES,
            _ => 1,
        }
    }

    fn qp_type(self) -> QpType {
        match self {
            Self::Rc | Self::Srq { .. } => QpType::Rc,
            Self::Uc => QpType::Uc,
            Self::Ud => QpType::Ud,
        }
    }

    /// The bytes in front of a received message.
    fn grh(self) -> usize {
        if self == Self::Ud { GRH_BYTES } else { 0 }
    }
}

/// Options shared by both sides.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PpConfig {
    /// Which tool.
    pub(crate) variant: Variant,
    /// Message size.
    pub(crate) size: usize,
    /// Path MTU (connected QPs; UD's messages fit the port's active MTU).
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
    /// Port, GID index, MTU, SL and first PSN of the first QP.
    opts: ConnectOptions,
    /// The GID index the address handle of a UD side uses.
    gid_index: Option<u8>,
    /// What the peer needs to reach each QP.
    me: Vec<QpEndpoint>,
    cq: Cq,
    qps: Vec<Qp>,
    srq: Option<Srq>,
    buf: Buffer,
    mr: Mr,
    /// Bytes of one receive slot (the message and, on UD, the GRH in front).
    slot_len: usize,
    /// Receive slots: one that every receive shares, as in the C tools, or (SRQ with `-c`,
    /// where the messages of several QPs may land at once) one per receive.
    slots: usize,
    channel: Option<EventChannel>,
    /// UD: the address handle toward the peer and its QPN, made when connecting.
    ud_peer: OnceLock<(AddressHandle, u32)>,
}

impl PpSide {
    /// Creates the objects on `ctx` port `ib_port`, moves the QPs to INIT and posts the
    /// receives.
    pub(crate) fn new(ctx: &Context, ib_port: u8, cfg: PpConfig) -> Result<Self, CliError> {
        let port: PortInfo = verbs::port_info(ctx, ib_port, cfg.gid_index)?;
        let variant = cfg.variant;
        if variant == Variant::Ud {
            // ud_pingpong.c: a message must fit one packet of the port's active MTU.
            let mtu = port.active_mtu.bytes() as usize;
            if cfg.size > mtu {
                return Err(CliError::usage(format_args!(
                    "Requested size larger than port MTU ({mtu})"
                )));
            }
        } else if cfg.mtu > port.max_mtu {
            return Err(CliError::usage(format_args!(
                "MTU {} is above the port's maximum {}",
                cfg.mtu, port.max_mtu
            )));
        }
        let max_wr = match variant {
            Variant::Srq { .. } => ctx.attr().max_srq_wr,
            _ => ctx.attr().max_qp_wr,
        };
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
        let n = variant.qp_count();
        let cq = ctx
            .create_cq_blocking(CqInit {
                // srq_pingpong.c: a completion for every receive and one send per QP.
                entries: cfg.rx_depth + n as u32,
                comp_vector: 0,
                channel: channel.as_ref().map(EventChannel::channel),
            })
            .ctx("creating the CQ")?;
        let slot_len = cfg.size + variant.grh();
        let slots = if cfg.validate && matches!(variant, Variant::Srq { .. }) {
            cfg.rx_depth as usize
        } else {
            1
        };
        let len = slots
            .checked_mul(slot_len)
            .and_then(|r| r.checked_add(cfg.size))
            .ok_or_else(|| CliError::usage("the buffer does not fit in memory"))?;
        let buf = ctx
            .alloc_buffer(len)
            .ctx(format_args!("allocating {len} bytes"))?;
        let mr = pd
            .reg_mr_blocking(&buf, 0..len, AccessFlags::LOCAL_WRITE)
            .ctx("registering the buffer")?;
        let srq = match variant {
            Variant::Srq { .. } => Some(
                pd.create_srq_blocking(SrqInit {
                    max_wr: cfg.rx_depth,
                    max_sge: 1,
                    limit: 0,
                })
                .ctx("creating the SRQ")?,
            ),
            _ => None,
        };
        // The C tools' values (the library's defaults): no remote access, ACK timeout 14,
        // 7 retries, 7 RNR retries, RNR timer 12, one READ/atomic each way, hop limit 1.
        let opts = ConnectOptions {
            psn: verbs::random_psn(),
            mtu: Some(cfg.mtu),
            access: AccessFlags::empty(),
            sl: cfg.sl,
            ..verbs::options(&port)
        };
        let mut qps = Vec::with_capacity(n);
        let mut me = Vec::with_capacity(n);
        for i in 0..n {
            let qp = pd
                .create_qp_blocking(QpInit {
                    qp_type: variant.qp_type(),
                    send_cq: &cq,
                    recv_cq: &cq,
                    srq: srq.as_ref(),
                    caps: QpCaps {
                        max_send_wr: 1,
                        max_recv_wr: if srq.is_some() { 0 } else { cfg.rx_depth },
                        max_send_sge: 1,
                        max_recv_sge: u32::from(srq.is_none()),
                        max_inline_data: 0,
                    },
                    sq_sig_all: false,
                    special: None,
                })
                .ctx(if n == 1 {
                    "creating the QP".to_owned()
                } else {
                    format!("creating QP[{i}]")
                })?;
            verbs::init(&qp, &opts)?;
            // Every QP its own first PSN, as srq_pingpong.c draws one per QP.
            let psn = if i == 0 {
                opts.psn
            } else {
                verbs::random_psn()
            };
            me.push(verbs::endpoint(&port, &qp, psn));
            qps.push(qp);
        }
        let side = Self {
            cfg,
            opts,
            gid_index: port.gid_index,
            me,
            cq,
            qps,
            srq,
            buf,
            mr,
            slot_len,
            slots,
            channel,
            ud_peer: OnceLock::new(),
        };
        if cfg.validate {
            // The C tools' -c: the client's message has a 0 at the start of every page (the
            // rest is 0x7b here, as rc_pingpong.c fills it). Both sides send that here (the C
            // servers echo what they received).
            side.buf.fill(0, len, FILL).ctx("filling the buffer")?;
            for at in (0..cfg.size).step_by(CHECK_PAGE) {
                side.buf.write(at, &[0]).ctx("filling the send buffer")?;
            }
        }
        if slots == 1 {
            for _ in 0..cfg.rx_depth {
                side.post_receive(0)?;
            }
        } else {
            for slot in 0..slots {
                side.post_receive(slot)?;
            }
        }
        Ok(side)
    }

    /// What the peer needs to reach each QP.
    pub(crate) fn dests(&self) -> &[QpEndpoint] {
        &self.me
    }

    /// Brings the QPs up toward `remote` (the peer's endpoints, in order; more than the QPs
    /// are ignored): RTR and RTS for connected QPs, RTR and RTS and an address handle toward
    /// the peer for UD.
    pub(crate) fn connect(&self, remote: &[QpEndpoint]) -> Result<(), CliError> {
        let n = self.qps.len();
        if remote.len() < n || remote[..n].iter().any(|r| r.qpn == 0) {
            // QPN 0 is what srq_pingpong sends for the QPs it does not have.
            let theirs = remote.iter().take_while(|r| r.qpn != 0).count();
            return Err(CliError::Failed(format!(
                "the peer has {theirs} QP(s), this side {n} (give both the same -q)"
            )));
        }
        for (i, (qp, (peer, mine))) in self.qps.iter().zip(remote.iter().zip(&self.me)).enumerate()
        {
            let opts = ConnectOptions {
                psn: mine.psn,
                ..self.opts
            };
            verbs::connect(qp, peer, &opts).map_err(|e| match (n, e) {
                (1, e) => e,
                (_, CliError::Verbs { context, source }) => CliError::Verbs {
                    context: context.replacen("the QP", &format!("QP[{i}]"), 1),
                    source,
                },
                (_, e) => e,
            })?;
        }
        if self.cfg.variant == Variant::Ud {
            let peer = &remote[0];
            let ah = self.qps[0]
                .pd()
                .create_ah_blocking(self.opts.address_vector(peer, self.gid_index))
                .ctx("creating the address handle")?;
            // A second connect keeps the first handle (the tools connect once).
            let _ = self.ud_peer.set((ah, peer.qpn));
        }
        Ok(())
    }

    /// Posts one receive into `slot` of the receive region.
    fn post_receive(&self, slot: usize) -> Result<(), CliError> {
        let at = self.cfg.size + slot * self.slot_len;
        let sge = [self
            .mr
            .sge(at, self.slot_len)
            .ctx("building the receive entry")?];
        let wr = RecvWr {
            wr_id: RECV_WRID | ((slot as u64) << SLOT_SHIFT),
            sges: &sge,
        };
        match &self.srq {
            Some(srq) => srq.post_recv(&[wr]).ctx("posting a receive"),
            None => self.qps[0].post_recv(&[wr]).ctx("posting a receive"),
        }
    }

    /// Posts a send of the send region on QP `index`.
    fn post_send(&self, index: usize) -> Result<(), CliError> {
        let size = self.cfg.size;
        let sge = [self.mr.sge(0, size).ctx("building the send entry")?];
        let mut wr = SendWr::new(SEND_WRID, SendOp::Send).sges(&sge).signaled();
        if self.cfg.variant == Variant::Ud {
            let Some((ah, qpn)) = self.ud_peer.get() else {
                return Err(CliError::Failed(
                    "no address handle: the QP is not connected".into(),
                ));
            };
            wr = wr.ud(ah.dest(*qpn, verbs::QKEY));
        }
        self.qps[index].post_send(&[wr]).ctx("posting a send")
    }

    /// `-c`: checks that received message `count` (in `slot`) has a 0 at the start of every
    /// page, as the C tools' servers check their last message, then puts 0x7b back there so
    /// that the next message must overwrite it.
    fn check_data(&self, slot: usize, count: u64) -> Result<(), CliError> {
        let base = self.cfg.size + slot * self.slot_len + self.cfg.variant.grh();
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

    /// Runs the ping-pong; the client sends first (on every QP). Gives up when `peer_failed`
    /// is set. Returns the elapsed time.
    pub(crate) fn run(&self, client: bool, peer_failed: &AtomicBool) -> Result<Duration, CliError> {
        let iters = self.cfg.iters;
        let depth = self.cfg.rx_depth;
        let n = self.qps.len();
        // The C tools repost when at most one receive is left, srq_pingpong.c when at most
        // one per QP is.
        let low = if self.srq.is_some() { n as u32 } else { 1 };
        let mut routs = depth;
        let mut free: Vec<usize> = Vec::with_capacity(if self.slots > 1 { self.slots } else { 0 });
        let (mut scnt, mut rcnt) = (0u64, 0u64);
        let batch = if self.srq.is_some() {
            n + depth as usize
        } else {
            2
        };
        let mut wcs = vec![WorkCompletion::default(); batch];
        let mut waiter =
            Waiter::new("waiting for the peer", Some(peer_failed)).limit(Some(self.cfg.timeout));
        if self.channel.is_some() {
            self.cq.req_notify(false);
        }
        let start = Instant::now();
        let mut pending = vec![RECV_WRID; n];
        if client {
            for (i, p) in pending.iter_mut().enumerate() {
                self.post_send(i)?;
                *p |= SEND_WRID;
            }
        }
        while scnt < iters || rcnt < iters {
            self.wait_event(&mut waiter)?;
            let got = self.cq.poll(&mut wcs).ctx("polling the CQ")?;
            if got == 0 {
                if self.channel.is_none() {
                    waiter.idle()?;
                }
                continue;
            }
            waiter.progress();
            for wc in &wcs[..got] {
                let kind = wc.wr_id & KIND_MASK;
                if !wc.is_ok() {
                    return Err(CliError::Failed(format!(
                        "Failed status {} ({}) for wr_id {kind}",
                        wc.status, wc.status as u8
                    )));
                }
                let Some(index) = self.qps.iter().position(|q| q.qp_num() == wc.qp_num) else {
                    return Err(CliError::Failed(format!(
                        "Couldn't find QPN {:06x}",
                        wc.qp_num
                    )));
                };
                match kind {
                    SEND_WRID => scnt += 1,
                    RECV_WRID => {
                        rcnt += 1;
                        let slot = (wc.wr_id >> SLOT_SHIFT) as usize;
                        if slot >= self.slots {
                            return Err(CliError::Failed(format!(
                                "Completion for unknown wr_id {}",
                                wc.wr_id
                            )));
                        }
                        if self.cfg.validate {
                            self.check_data(slot, rcnt)?;
                        }
                        if self.slots > 1 {
                            free.push(slot);
                        }
                        routs -= 1;
                        if routs <= low {
                            if self.slots > 1 {
                                for slot in free.drain(..) {
                                    self.post_receive(slot)?;
                                }
                            } else {
                                for _ in routs..depth {
                                    self.post_receive(0)?;
                                }
                            }
                            routs = depth;
                        }
                    }
                    other => {
                        return Err(CliError::Failed(format!(
                            "Completion for unknown wr_id {other}"
                        )));
                    }
                }
                pending[index] &= !kind;
                if scnt < iters && pending[index] == 0 {
                    self.post_send(index)?;
                    pending[index] = RECV_WRID | SEND_WRID;
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
            variant: Variant::Rc,
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
        side.check_data(0, 1).expect("a good message");
        // Nothing new arrived: the page starts hold 0x7b again.
        let err = side.check_data(0, 2).expect_err("stale buffer");
        assert!(
            err.to_string()
                .starts_with("invalid data in page 0 of message 2"),
            "{err}"
        );
        side.buf.write(recv, &[0]).expect("write");
        side.buf.write(recv + CHECK_PAGE, &[0]).expect("write");
        let err = side.check_data(0, 3).expect_err("bad page 2");
        assert!(
            err.to_string()
                .starts_with("invalid data in page 2 of message 3"),
            "{err}"
        );
    }
}

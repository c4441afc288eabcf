//! A message channel over a connected RC QP: the side channel perftest's `-R` speaks (its
//! `src/perftest_communication.c`, where every exchange is one SEND each way over an RC QP the
//! connection manager connected), or any exchange of small messages between two programs that
//! already hold a reliable connection.
//!
//! [`MessageChannel`] owns the QP, its two CQs, a completion channel and one registered
//! buffer: slot 0 holds the message being sent, slots 1 ..= `ring` the receives kept posted.
//! A message is at most one slot; a longer SEND from the peer fails its receive (the QP's
//! error, a typed [`ChannelError::Completion`]) instead of writing past the slot. Each
//! received message is copied out and its slot posted again at once.
//!
//! The QP is made and moved to INIT with the receives posted: hand [`MessageChannel::qp`] to
//! the CM (`portverbs::cm::service`), or connect it yourself
//! ([`Qp::connect_rc_blocking`](crate::verbs::Qp::connect_rc_blocking)). Waits sleep in the
//! channel's completion channel; a wait with a short timeout lets a caller look at other
//! things (the CM, a deadline of its own) between looks.
//!
//! # Example
//! Two channels on the embedded devices, connected by hand, one message each way:
//!
//! ```
//! use std::time::Duration;
//! use portverbs::oob::channel::{ChannelConfig, MessageChannel};
//! use portverbs::prelude::*;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let open = |name| portverbs::open(portverbs::device(name).expect("embedded device"));
//! let (ctx_a, ctx_b) = (open("soft0")?, open("soft1")?);
//! let opts = ConnectOptions::default();
//! let a = MessageChannel::new_blocking(&ctx_a, &opts, ChannelConfig::default())?;
//! let b = MessageChannel::new_blocking(&ctx_b, &opts, ChannelConfig::default())?;
//! let (ep_a, ep_b) = (a.qp().endpoint_blocking(&opts)?, b.qp().endpoint_blocking(&opts)?);
//! a.qp().connect_rc_blocking(&ep_b, &opts)?;
//! b.qp().connect_rc_blocking(&ep_a, &opts)?;
//!
//! let limit = Some(Duration::from_secs(5));
//! a.send_blocking(b"ping", limit)?;
//! assert_eq!(b.recv_blocking(limit)?, b"ping");
//! b.send_blocking(b"pong", limit)?;
//! assert_eq!(a.recv_blocking(limit)?, b"pong");
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::verbs::{
    ConnectError, CqError, CreateQpError, MrError, PdError, PollError, PostError, WaitError,
};
use crate::{CompletionChannel, Context, Cq, Mr, Pd, Qp};
use portverbs_verbs::{
    AccessFlags, ConnectOptions, CqInit, QpCaps, QpInit, QpType, RecvWr, SendFlags, SendOp, SendWr,
    WcStatus, WorkCompletion,
};

/// The longest sleep of a blocking wait between two looks at its CQ.
const SLICE: Duration = Duration::from_millis(100);

/// The work request ID of the send (the receives carry their slot, 1 ..= ring).
const SEND_ID: u64 = 0;

/// The size of a channel: how long a message may be, how many receives stay posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelConfig {
    /// Bytes of each slot: the longest message either way (1 ..= [`ChannelConfig::MAX_SLOT`]).
    pub slot: usize,
    /// Receives kept posted (1 ..= [`ChannelConfig::MAX_RING`]): how many messages the peer may
    /// send before this side reads one.
    pub ring: usize,
}

impl ChannelConfig {
    /// The largest slot.
    pub const MAX_SLOT: usize = 1 << 20;
    /// The most receives.
    pub const MAX_RING: usize = 256;

    fn check(&self) -> Result<(), ChannelError> {
        if (1..=Self::MAX_SLOT).contains(&self.slot) && (1..=Self::MAX_RING).contains(&self.ring) {
            Ok(())
        } else {
            Err(ChannelError::Config(*self))
        }
    }
}

impl Default for ChannelConfig {
    /// 1 KiB messages (more than any of perftest's), four receives.
    fn default() -> Self {
        Self {
            slot: 1024,
            ring: 4,
        }
    }
}

/// Which way a failed completion went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// This side's SEND.
    Send,
    /// A receive of the peer's SEND.
    Recv,
}

/// Why a channel call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChannelError {
    /// The configuration is out of range.
    #[error("channel slot {} / ring {} out of range", .0.slot, .0.ring)]
    Config(ChannelConfig),
    /// Allocating the PD failed.
    #[error("allocating the channel's PD: {0}")]
    Pd(#[from] PdError),
    /// Creating the completion channel or a CQ failed.
    #[error("creating the channel's CQs: {0}")]
    Cq(#[from] CqError),
    /// Creating the QP failed.
    #[error("creating the channel's QP: {0}")]
    CreateQp(#[from] CreateQpError),
    /// Registering the buffer, or reaching into it, failed.
    #[error("the channel's buffer: {0}")]
    Mr(#[from] MrError),
    /// Moving the QP to INIT failed.
    #[error("moving the channel's QP to INIT: {0}")]
    Init(#[from] ConnectError),
    /// Posting a request failed.
    #[error("posting on the channel: {0}")]
    Post(#[from] PostError),
    /// Polling a CQ failed.
    #[error("polling the channel: {0}")]
    Poll(#[from] PollError),
    /// Sleeping in the completion channel failed.
    #[error("waiting on the channel: {0}")]
    Wait(WaitError),
    /// The message is longer than a slot.
    #[error("a message of {len} bytes is over the channel's {max}")]
    TooLong {
        /// The message's length.
        len: usize,
        /// The slot's.
        max: usize,
    },
    /// The last message's send has not completed yet.
    #[error("the last send has not completed")]
    Busy,
    /// No send is outstanding to wait for.
    #[error("no send to wait for")]
    NothingSent,
    /// A work request completed in error (a broken connection, a message over the slot).
    #[error("a {dir:?} completed with status {status:?}")]
    Completion {
        /// Which way.
        dir: Direction,
        /// Its status.
        status: WcStatus,
    },
    /// A completion named a request this channel never posted.
    #[error("a completion of unknown request {0}")]
    UnknownRequest(u64),
    /// Nothing came before the timeout (the wait may be tried again).
    #[error("nothing completed before the timeout")]
    TimedOut,
}

/// An RC QP that sends and receives whole messages; see the [module](self).
pub struct MessageChannel {
    qp: Qp,
    send_cq: Cq,
    recv_cq: Cq,
    mr: Mr,
    _pd: Pd,
    events: CompletionChannel,
    config: ChannelConfig,
    sending: AtomicBool,
}

impl fmt::Debug for MessageChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageChannel")
            .field("qpn", &self.qp.qp_num())
            .field("config", &self.config)
            .field("sending", &self.sending.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl MessageChannel {
    /// A channel on `ctx`: its QP in INIT on `opts`' port (with `opts`' P_Key index and
    /// access) and every receive posted.
    ///
    /// # Errors
    /// The configuration is out of range, or a verb failed.
    pub fn new_blocking(
        ctx: &Context,
        opts: &ConnectOptions,
        config: ChannelConfig,
    ) -> Result<Self, ChannelError> {
        config.check()?;
        let pd = ctx.alloc_pd_blocking()?;
        let events = ctx.create_comp_channel()?;
        let cq = |n: usize| {
            ctx.create_cq_blocking(CqInit {
                entries: n as u32,
                comp_vector: 0,
                channel: Some(&events),
            })
        };
        let (send_cq, recv_cq) = (cq(2)?, cq(config.ring)?);
        let qp = pd.create_qp_blocking(QpInit {
            send_cq: &send_cq,
            recv_cq: &recv_cq,
            caps: QpCaps {
                max_send_wr: 2,
                max_recv_wr: config.ring as u32,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            ..QpInit::new(QpType::Rc, &send_cq)
        })?;
        let bytes = (config.ring + 1) * config.slot;
        let mr = pd
            .reg_vec_blocking(vec![0u8; bytes], AccessFlags::LOCAL_WRITE)
            .map_err(|r| r.into_parts().0)?;
        qp.init_blocking(opts)?;
        let chan = Self {
            qp,
            send_cq,
            recv_cq,
            mr,
            _pd: pd,
            events,
            config,
            sending: AtomicBool::new(false),
        };
        for slot in 1..=config.ring {
            chan.post_recv(slot)?;
        }
        Ok(chan)
    }

    /// The QP, for the CM to connect (or for [`Qp::connect_rc_blocking`](crate::verbs::Qp)).
    pub fn qp(&self) -> &Qp {
        &self.qp
    }

    /// The size it was made with.
    pub fn config(&self) -> ChannelConfig {
        self.config
    }

    fn post_recv(&self, slot: usize) -> Result<(), ChannelError> {
        let sge = self.mr.sge(slot * self.config.slot, self.config.slot)?;
        self.qp.post_recv(&[RecvWr {
            wr_id: slot as u64,
            sges: &[sge],
        }])?;
        Ok(())
    }

    /// Posts `msg` as one signaled SEND; [`MessageChannel::try_sent`] or
    /// [`MessageChannel::wait_sent`] sees it complete. One send is outstanding at a time.
    ///
    /// # Errors
    /// [`ChannelError::TooLong`], [`ChannelError::Busy`], or the post failed.
    pub fn post_message(&self, msg: &[u8]) -> Result<(), ChannelError> {
        if msg.len() > self.config.slot {
            return Err(ChannelError::TooLong {
                len: msg.len(),
                max: self.config.slot,
            });
        }
        if self.sending.swap(true, Ordering::AcqRel) {
            return Err(ChannelError::Busy);
        }
        let r = (|| {
            self.mr.write(0, msg)?;
            let sge = [self.mr.sge(0, msg.len())?];
            self.qp.post_send(&[SendWr::new(SEND_ID, SendOp::Send)
                .sges(&sge)
                .flags(SendFlags::SIGNALED)])?;
            Ok(())
        })();
        if r.is_err() {
            self.sending.store(false, Ordering::Release);
        }
        r
    }

    /// Whether the outstanding send has completed (looks once, without waiting).
    ///
    /// # Errors
    /// [`ChannelError::NothingSent`]; the send completed in error; the poll failed.
    pub fn try_sent(&self) -> Result<bool, ChannelError> {
        if !self.sending.load(Ordering::Acquire) {
            return Err(ChannelError::NothingSent);
        }
        let Some(wc) = poll_one(&self.send_cq)? else {
            return Ok(false);
        };
        self.sending.store(false, Ordering::Release);
        if wc.wr_id != SEND_ID {
            return Err(ChannelError::UnknownRequest(wc.wr_id));
        }
        check(&wc, Direction::Send)?;
        Ok(true)
    }

    /// Waits until the outstanding send completes, at most `timeout` (`None`: for ever).
    ///
    /// # Errors
    /// As [`MessageChannel::try_sent`], or [`ChannelError::TimedOut`] (the send is still
    /// outstanding: wait again).
    pub fn wait_sent(&self, timeout: Option<Duration>) -> Result<(), ChannelError> {
        self.wait(&self.send_cq, timeout, || {
            self.try_sent().map(|done| done.then_some(()))
        })
    }

    /// Sends `msg` and waits for its completion, at most `timeout`.
    ///
    /// # Errors
    /// As [`MessageChannel::post_message`] and [`MessageChannel::wait_sent`].
    pub fn send_blocking(&self, msg: &[u8], timeout: Option<Duration>) -> Result<(), ChannelError> {
        self.post_message(msg)?;
        self.wait_sent(timeout)
    }

    /// The next message if one has arrived (looks once, without waiting); its receive is
    /// posted again.
    ///
    /// # Errors
    /// The receive completed in error; the completion is not one of this channel's
    /// receives; a verb failed.
    pub fn try_recv(&self) -> Result<Option<Vec<u8>>, ChannelError> {
        let Some(wc) = poll_one(&self.recv_cq)? else {
            return Ok(None);
        };
        let slot = usize::try_from(wc.wr_id)
            .ok()
            .filter(|s| (1..=self.config.ring).contains(s))
            .ok_or(ChannelError::UnknownRequest(wc.wr_id))?;
        check(&wc, Direction::Recv)?;
        // The device wrote at most the slot; the length it reports is bounded all the same.
        let len = (wc.byte_len as usize).min(self.config.slot);
        let mut bytes = vec![0u8; len];
        self.mr.read(slot * self.config.slot, &mut bytes)?;
        self.post_recv(slot)?;
        Ok(Some(bytes))
    }

    /// Waits for the next message, at most `timeout` (`None`: for ever).
    ///
    /// # Errors
    /// As [`MessageChannel::try_recv`], or [`ChannelError::TimedOut`].
    pub fn recv_blocking(&self, timeout: Option<Duration>) -> Result<Vec<u8>, ChannelError> {
        self.wait(&self.recv_cq, timeout, || self.try_recv())
    }

    /// Runs `look` until it yields, sleeping in the completion channel between looks (the
    /// CQ armed, then looked at once more: a completion before the arm raises no event).
    fn wait<T>(
        &self,
        cq: &Cq,
        timeout: Option<Duration>,
        mut look: impl FnMut() -> Result<Option<T>, ChannelError>,
    ) -> Result<T, ChannelError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(t) = look()? {
                return Ok(t);
            }
            let slice = match deadline {
                None => SLICE,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return Err(ChannelError::TimedOut);
                    }
                    left.min(SLICE)
                }
            };
            cq.req_notify(false);
            if let Some(t) = look()? {
                return Ok(t);
            }
            match self.events.wait_cq_event(Some(slice)) {
                Ok(cq) => cq.ack_events(1),
                Err(WaitError::TimedOut | WaitError::BadEvent(_)) => {}
                Err(e) => return Err(ChannelError::Wait(e)),
            }
        }
    }
}

fn poll_one(cq: &Cq) -> Result<Option<WorkCompletion>, ChannelError> {
    let mut wc = [WorkCompletion::default()];
    Ok((cq.poll(&mut wc)? == 1).then_some(wc[0]))
}

fn check(wc: &WorkCompletion, dir: Direction) -> Result<(), ChannelError> {
    if wc.status == WcStatus::Success {
        Ok(())
    } else {
        Err(ChannelError::Completion {
            dir,
            status: wc.status,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Option<Duration> = Some(Duration::from_secs(10));

    fn open(name: &str) -> Context {
        crate::open(crate::device(name).expect("embedded device")).expect("opens")
    }

    /// Two channels on soft0 and soft1 of the given sizes, connected to each other.
    fn pair(a: ChannelConfig, b: ChannelConfig) -> (MessageChannel, MessageChannel) {
        let opts = ConnectOptions::default();
        let a = MessageChannel::new_blocking(&open("soft0"), &opts, a).expect("channel a");
        let b = MessageChannel::new_blocking(&open("soft1"), &opts, b).expect("channel b");
        let ea = a.qp().endpoint_blocking(&opts).expect("endpoint a");
        let eb = b.qp().endpoint_blocking(&opts).expect("endpoint b");
        a.qp().connect_rc_blocking(&eb, &opts).expect("connect a");
        b.qp().connect_rc_blocking(&ea, &opts).expect("connect b");
        (a, b)
    }

    #[test]
    fn messages_round_trip_and_the_ring_is_reposted() {
        let (a, b) = pair(ChannelConfig::default(), ChannelConfig::default());
        // More messages than receives: each read posts its slot again.
        for i in 0..20u32 {
            let msg = format!("message {i}").into_bytes();
            a.send_blocking(&msg, LIMIT).expect("send");
            assert_eq!(b.recv_blocking(LIMIT).expect("recv"), msg);
            b.send_blocking(&i.to_be_bytes(), LIMIT).expect("answer");
            assert_eq!(a.recv_blocking(LIMIT).expect("answer"), i.to_be_bytes());
        }
        // A full ring's worth sent before the peer reads.
        for i in 0..4u8 {
            a.send_blocking(&[i; 1024], LIMIT).expect("send");
        }
        for i in 0..4u8 {
            assert_eq!(b.recv_blocking(LIMIT).expect("recv"), [i; 1024]);
        }
        assert!(b.try_recv().expect("looks").is_none());
        // An empty message is a message.
        a.send_blocking(&[], LIMIT).expect("send");
        assert!(b.recv_blocking(LIMIT).expect("recv").is_empty());
    }

    #[test]
    fn waits_time_out_and_misuse_is_refused() {
        let (a, b) = pair(ChannelConfig::default(), ChannelConfig::default());
        assert!(matches!(
            b.recv_blocking(Some(Duration::from_millis(20))),
            Err(ChannelError::TimedOut)
        ));
        assert!(matches!(
            a.post_message(&[0; 1025]),
            Err(ChannelError::TooLong {
                len: 1025,
                max: 1024
            })
        ));
        assert!(matches!(a.try_sent(), Err(ChannelError::NothingSent)));
        a.post_message(b"one").expect("post");
        assert!(matches!(a.post_message(b"two"), Err(ChannelError::Busy)));
        a.wait_sent(LIMIT).expect("sent");
        assert_eq!(b.recv_blocking(LIMIT).expect("recv"), b"one");
        for bad in [
            ChannelConfig { slot: 0, ring: 4 },
            ChannelConfig { slot: 64, ring: 0 },
            ChannelConfig {
                slot: ChannelConfig::MAX_SLOT + 1,
                ring: 1,
            },
            ChannelConfig {
                slot: 64,
                ring: ChannelConfig::MAX_RING + 1,
            },
        ] {
            let r = MessageChannel::new_blocking(&open("soft0"), &ConnectOptions::default(), bad);
            assert!(matches!(r, Err(ChannelError::Config(_))), "{bad:?}");
        }
    }

    /// A peer's SEND longer than a slot fails the receive with a typed error, never writing
    /// past the slot.
    #[test]
    fn an_over_long_message_from_the_peer_is_an_error() {
        let small = ChannelConfig { slot: 64, ring: 2 };
        let big = ChannelConfig { slot: 256, ring: 2 };
        let (a, b) = pair(big, small);
        a.post_message(&[7; 200]).expect("post");
        match b.recv_blocking(LIMIT) {
            Err(ChannelError::Completion {
                dir: Direction::Recv,
                status,
            }) => assert_ne!(status, WcStatus::Success),
            other => panic!("expected a failed receive, got {other:?}"),
        }
    }
}

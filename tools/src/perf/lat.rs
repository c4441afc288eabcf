//! Latency tests.
//!
//! * `write_lat`: ping-pong of RDMA writes. Each side writes the iteration number into the
//!   last byte of its message and waits until the peer's write shows that number in the last
//!   byte of its own receive region (read with [`Buffer::read`]).
//! * `send_lat`: ping-pong of sends; each side waits for its receive completion and reposts.
//! * `read_lat`, `atomic_lat`: the client alone, one operation at a time.
//!
//! The client stamps the clock before every iteration and once after the last; a sample is the
//! difference of consecutive stamps. Ping-pong samples are halved (half the round trip).
//! Across processes ([`run_remote`]) both sides stamp their iterations, as perftest's do, and
//! the side that moves first is perftest's: the server in `write_lat`, the client in `send_lat`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use portverbs::prelude::*;

use super::bw::RecvState;
use super::config::{PerfConfig, RunMode};
use super::ops::{OpPlan, PeerQp, RecvPlan, check_wc, peer_of};
use super::recorder::{LatOutcome, Recorder};
use super::setup::{Setup, Side};
use super::tracker::Tracker;
use crate::error::{CliError, Context as _};
use crate::report::Verb;
use crate::wait::Waiter;

/// How long past its duration a ping-pong side keeps waiting for a peer that stopped first.
const DEADLINE_SLACK: Duration = Duration::from_millis(100);

/// How long a duration ping-pong side keeps its device answering after its run.
const LINGER: Duration = Duration::from_millis(500);

/// Runs one size.
pub(crate) fn run(
    setup: &Setup,
    size: u64,
    recv: &mut [RecvState; 2],
    tracker: &mut Tracker,
) -> Result<LatOutcome, CliError> {
    let cfg = &setup.cfg;
    let (client, server) = (&setup.client, &setup.server);
    let (cpeer, speer) = (peer_of(server), peer_of(client));
    let mut cplan = OpPlan::new(client, &cpeer, cfg.test.verb, cfg.atomic, size, cfg.inline)?;
    let mut splan = OpPlan::new(server, &speer, cfg.test.verb, cfg.atomic, size, cfg.inline)?;
    let mut rec = Recorder::new(cfg.mode);
    let half = matches!(cfg.test.verb, Verb::Send | Verb::Write);
    if !half {
        solo(client, &cplan, &mut rec, tracker, cfg.peer_timeout)?;
        return Ok(rec.outcome(half));
    }
    let pingpong = Pingpong {
        verb: cfg.test.verb,
        size: size as usize,
        mode: cfg.mode,
        limit: cfg.peer_timeout,
        deadline: None,
    };
    let (crecv, srecv) = (RecvPlan::new(client)?, RecvPlan::new(server)?);
    let [cstate, sstate] = recv;
    if cfg.test.verb == Verb::Send {
        let depth = cfg.rx_depth as usize;
        let cb: Vec<_> = (0..client.qps.len())
            .map(|i| vec![crecv.wr(i); depth])
            .collect();
        let sb: Vec<_> = (0..server.qps.len())
            .map(|i| vec![srecv.wr(i); depth])
            .collect();
        cstate.top_up(client, &cb, cfg.rx_depth)?;
        sstate.top_up(server, &sb, cfg.rx_depth)?;
    } else {
        for side in [client, server] {
            side.buf
                .fill(0, side.buf.len(), 0)
                .ctx("clearing the buffer")?;
        }
    }
    // The client's end (normal or not) stops the server; the server stops the client only when
    // it failed (after its last answer the client may still be reading that answer).
    let client_done = AtomicBool::new(false);
    let server_failed = AtomicBool::new(false);
    let (c, s) = std::thread::scope(|sc| {
        let peer = sc.spawn(|| {
            let r = pingpong.serve(server, &mut splan, &srecv, &client_done, None);
            server_failed.store(r.is_err(), Ordering::Release);
            r
        });
        let c = pingpong.ping(
            client,
            &mut cplan,
            &crecv,
            &mut rec,
            tracker,
            &server_failed,
        );
        client_done.store(true, Ordering::Release);
        let s = peer
            .join()
            .unwrap_or_else(|_| Err(CliError::Failed("the server thread panicked".into())));
        (c, s)
    });
    CliError::merge(c, s)?;
    Ok(rec.outcome(half))
}

/// One size of a cross-process ping-pong latency test (send or write): the client pings
/// `peer`, the server answers; each side times every iteration, as perftest's two sides do.
/// Receives (send tests) are topped up before `ready` (the hand shake after which the client
/// starts).
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_remote(
    cfg: &PerfConfig,
    side: &Side,
    peer: &[PeerQp],
    size: u64,
    client: bool,
    recv: &mut RecvState,
    tracker: &mut Tracker,
    ready: impl FnOnce() -> Result<(), CliError>,
) -> Result<LatOutcome, CliError> {
    let mut plan = OpPlan::new(side, peer, cfg.test.verb, cfg.atomic, size, cfg.inline)?;
    let rplan = RecvPlan::new(side)?;
    if cfg.test.verb == Verb::Send {
        let depth = cfg.rx_depth as usize;
        let batches: Vec<_> = (0..side.qps.len())
            .map(|i| vec![rplan.wr(i); depth])
            .collect();
        recv.top_up(side, &batches, cfg.rx_depth)?;
    }
    ready()?;
    // Duration mode: each side stops on its own clock, as perftest's two do; a side whose
    // peer stopped first gives up waiting at the end of its own duration.
    let deadline = match cfg.mode {
        // (A moment past the duration, so that the window has closed by then.)
        RunMode::Duration { total, .. } => Some(Instant::now() + total + DEADLINE_SLACK),
        RunMode::Iters(_) => None,
    };
    let pingpong = Pingpong {
        verb: cfg.test.verb,
        size: size as usize,
        mode: cfg.mode,
        limit: cfg.peer_timeout,
        deadline,
    };
    let mut rec = Recorder::new(cfg.mode);
    let never = AtomicBool::new(false);
    // Who moves first is perftest's: in send_lat the client sends first, in write_lat the
    // server writes first and the client waits for it (either side waits for exactly the
    // next count, so both must agree or both wait forever).
    let first = if cfg.test.verb == Verb::Write {
        !client
    } else {
        client
    };
    if first {
        pingpong.ping(side, &mut plan, &rplan, &mut rec, tracker, &never)?;
    } else {
        pingpong.serve(side, &mut plan, &rplan, &never, Some(&mut rec))?;
    }
    if deadline.is_some() {
        // The peer's clock ends after this side's: its answer to this side's last message
        // may still be on its way, and its sender waits for that answer's acknowledgement
        // (perftest polls for it with no time limit). Keep the device acknowledging for a
        // while (a manual device only progresses when driven) before this side goes away.
        let until = Instant::now() + LINGER;
        while Instant::now() < until {
            side.ctx.dispatch();
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    Ok(rec.outcome(true))
}

/// One size of a cross-process read or atomic latency test: the client alone, one operation
/// at a time toward `peer`, each timed whole (perftest's server posts nothing).
pub(crate) fn run_solo(
    cfg: &PerfConfig,
    side: &Side,
    peer: &[PeerQp],
    size: u64,
    tracker: &mut Tracker,
) -> Result<LatOutcome, CliError> {
    let plan = OpPlan::new(side, peer, cfg.test.verb, cfg.atomic, size, cfg.inline)?;
    let mut rec = Recorder::new(cfg.mode);
    solo(side, &plan, &mut rec, tracker, cfg.peer_timeout)?;
    Ok(rec.outcome(false))
}

/// One operation at a time from the client (read and atomic latency).
fn solo(
    side: &Side,
    plan: &OpPlan<'_>,
    rec: &mut Recorder,
    tracker: &mut Tracker,
    limit: Option<Duration>,
) -> Result<(), CliError> {
    let mut wc = [WorkCompletion::default(); 1];
    let mut waiter = Waiter::new("waiting for a completion", None).limit(limit);
    let mut k = 0u64;
    while rec.tick(k) {
        side.qps[0]
            .post_send(&[plan.wr(0, k + 1, true)])
            .ctx("posting a request")?;
        poll_one(&side.send_cq, &mut wc, &mut waiter)?;
        k += 1;
        if k % 256 == 0 {
            tracker.update(rec.units(k));
        }
    }
    Ok(())
}

/// The two halves of a ping-pong.
#[derive(Debug, Clone, Copy)]
struct Pingpong {
    verb: Verb,
    size: usize,
    mode: RunMode,
    /// `--timeout`: how long the peer may not answer.
    limit: Option<Duration>,
    /// Duration mode across processes: when waiting for the peer ends the run.
    deadline: Option<Instant>,
}

impl Pingpong {
    /// The measuring side: sends first, then waits for the answer (gives up when
    /// `peer_failed` is set).
    fn ping(
        &self,
        side: &Side,
        plan: &mut OpPlan<'_>,
        recv: &RecvPlan,
        rec: &mut Recorder,
        tracker: &mut Tracker,
        peer_failed: &AtomicBool,
    ) -> Result<(), CliError> {
        let mut wc = [WorkCompletion::default(); 1];
        let mut waiter =
            Waiter::new("waiting for the peer's answer", Some(peer_failed)).limit(self.limit);
        let mut k = 0u64;
        while rec.tick(k) {
            k += 1;
            if !self.send(side, plan, k, &mut wc, &mut waiter)?
                || !self.receive(side, recv, k, &mut wc, &mut waiter)?
            {
                // The deadline: iteration k did not complete; the window closes here.
                rec.tick(k - 1);
                break;
            }
            if k % 256 == 0 {
                tracker.update(rec.units(k));
            }
        }
        Ok(())
    }

    /// The answering side: waits for a message, then answers, until `peer_done` (the client
    /// ended) or after the configured iterations.
    fn serve(
        &self,
        side: &Side,
        plan: &mut OpPlan<'_>,
        recv: &RecvPlan,
        peer_done: &AtomicBool,
        mut rec: Option<&mut Recorder>,
    ) -> Result<(), CliError> {
        let mut wc = [WorkCompletion::default(); 1];
        let mut waiter =
            Waiter::new("waiting for the client's message", Some(peer_done)).limit(self.limit);
        let mut k = 0u64;
        loop {
            if let Some(r) = rec.as_deref_mut() {
                if !r.tick(k) {
                    break;
                }
            }
            if matches!(self.mode, RunMode::Iters(n) if k >= n) {
                break;
            }
            k += 1;
            let arrived = match self.receive(side, recv, k, &mut wc, &mut waiter) {
                Err(CliError::PeerStopped(_)) => return Ok(()),
                other => other?,
            };
            if !arrived || !self.send(side, plan, k, &mut wc, &mut waiter)? {
                if let Some(r) = rec.as_deref_mut() {
                    r.tick(k - 1);
                }
                break;
            }
        }
        Ok(())
    }

    /// Sends message `k` and reaps its completion; false when the deadline passed first.
    fn send(
        &self,
        side: &Side,
        plan: &mut OpPlan<'_>,
        k: u64,
        wc: &mut [WorkCompletion; 1],
        waiter: &mut Waiter<'_>,
    ) -> Result<bool, CliError> {
        if self.verb == Verb::Write {
            let mark = k as u8;
            if plan.is_inline() {
                plan.set_inline_last(mark);
            } else {
                side.buf
                    .write(side.send_off(0) + self.size - 1, &[mark])
                    .ctx("writing the iteration mark")?;
            }
        }
        side.qps[0]
            .post_send(&[plan.wr(0, k, true)])
            .ctx("posting a request")?;
        poll_until(&side.send_cq, wc, waiter, self.deadline)
    }

    /// Waits for the peer's message `k` (and reposts the receive it used); false when the
    /// deadline passed first.
    fn receive(
        &self,
        side: &Side,
        recv: &RecvPlan,
        k: u64,
        wc: &mut [WorkCompletion; 1],
        waiter: &mut Waiter<'_>,
    ) -> Result<bool, CliError> {
        if self.verb == Verb::Send {
            if !poll_until(&side.recv_cq, wc, waiter, self.deadline)? {
                return Ok(false);
            }
            side.qps[0]
                .post_recv(&[recv.wr(0)])
                .ctx("reposting a receive")?;
            return Ok(true);
        }
        let at = side.recv_off(0) + self.size - 1;
        let want = k as u8;
        let mut byte = [0u8; 1];
        loop {
            // A write lands in memory with no completion to poll: in manual progress nothing
            // would receive it unless this loop drives the device (auto: nothing to do).
            side.ctx.dispatch();
            side.buf.read(at, &mut byte).ctx("reading the buffer")?;
            if byte[0] == want {
                waiter.progress();
                return Ok(true);
            }
            if self.deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
            waiter.idle()?;
        }
    }
}

/// [`poll_one`] that gives up (false) once `deadline` has passed.
fn poll_until(
    cq: &Cq,
    wc: &mut [WorkCompletion; 1],
    waiter: &mut Waiter<'_>,
    deadline: Option<Instant>,
) -> Result<bool, CliError> {
    let Some(deadline) = deadline else {
        return poll_one(cq, wc, waiter).map(|()| true);
    };
    loop {
        if cq.poll(wc).ctx("polling a CQ")? == 1 {
            waiter.progress();
            return check_wc(&wc[0]).map(|()| true);
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        waiter.idle()?;
    }
}

/// Polls `cq` until one completion arrives and checks it.
fn poll_one(
    cq: &Cq,
    wc: &mut [WorkCompletion; 1],
    waiter: &mut Waiter<'_>,
) -> Result<(), CliError> {
    loop {
        if cq.poll(wc).ctx("polling a CQ")? == 1 {
            waiter.progress();
            return check_wc(&wc[0]);
        }
        waiter.idle()?;
    }
}

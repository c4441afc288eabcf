//! Bandwidth tests: keep up to `tx_depth` requests outstanding on every QP, ask for a
//! completion every `cq_mod` requests, and time from the first post to the last completion.
//!
//! The sender runs on the calling thread. Send tests also need a receiver: a scoped thread on
//! the server side keeps `rx_depth` receives posted on each QP, reposting in batches, and
//! counts what arrives; send rows are computed from those arrivals (see [`run`]).
//! Across processes ([`super::remote`]) one side runs here: the client's sender
//! ([`run_sender`]) or a send test server's receiver ([`run_receiver`]).
//! Nothing in the loops allocates: requests are built on the stack from a prepared plan, post
//! lists go through a vector reserved up front, completions are polled into an array, and the
//! completion marks for the peak go into a vector sized for the whole run.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use portverbs::prelude::*;

use super::config::{PerfConfig, RunMode};
use super::ops::{OpPlan, PeerQp, RecvPlan, check_wc, peer_of, split_wr_id};
use super::setup::{Setup, Side};
use super::tracker::Tracker;
use crate::error::{CliError, Context as _};
use crate::report::{BwResult, BwUnits, CompletionMark, Verb, bw_result};
use crate::wait::Waiter;

/// Completions taken per poll call.
const POLL_BATCH: usize = 64;

/// Receives outstanding per QP on the receiving side, kept across sizes.
#[derive(Debug)]
pub(crate) struct RecvState {
    outstanding: Vec<u32>,
}

impl RecvState {
    /// No receives posted yet on `qps` QPs.
    pub(crate) fn new(qps: usize) -> Self {
        Self {
            outstanding: vec![0; qps],
        }
    }

    /// Posts receives until `depth` are outstanding on every QP of `side`.
    pub(crate) fn top_up(
        &mut self,
        side: &Side,
        batches: &[Vec<RecvWr<'_>>],
        depth: u32,
    ) -> Result<(), CliError> {
        for (i, qp) in side.qps.iter().enumerate() {
            let missing = depth.saturating_sub(self.outstanding[i]) as usize;
            if missing > 0 {
                qp.post_recv(&batches[i][..missing])
                    .ctx("posting receives")?;
                self.outstanding[i] = depth;
            }
        }
        Ok(())
    }
}

/// What one size of a bandwidth test produced.
#[derive(Debug)]
pub(crate) struct BwRun {
    /// The result row.
    pub(crate) result: BwResult,
    /// Send tests: messages the sender completed and messages that arrived, when fewer
    /// arrived (UC and UD drop a send that finds no receive posted).
    pub(crate) lost: Option<Loss>,
}

/// Sends that completed on the sender without arriving at the receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loss {
    /// Sends completed on the sender.
    pub(crate) sent: u64,
    /// Receives completed on the receiver.
    pub(crate) arrived: u64,
}

/// After the sender is done, a lossy receiver (UC, UD, duration mode) stops once nothing has
/// arrived for this long: messages still in flight then have had time to land.
const DRAIN_QUIET: Duration = Duration::from_millis(50);

/// Runs one size and returns its result row.
///
/// Send tests count what arrived, as perftest's receiving side does: the messages are the
/// receive completions, and the time runs from the first post to the later of the last send
/// completion and the last receive completion. Over RC that is what the sender sees (every
/// send completes after its message arrived); over UC and UD a send completes once it has
/// left, arrived or not, so counting send completions would report traffic that never
/// reached the receiver (with `-r 1` nearly all of it).
pub(crate) fn run(
    setup: &Setup,
    size: u64,
    recv: &mut RecvState,
    tracker: &mut Tracker,
) -> Result<BwRun, CliError> {
    let cfg = &setup.cfg;
    let peer = peer_of(&setup.server);
    let plan = OpPlan::new(
        &setup.client,
        &peer,
        cfg.test.verb,
        cfg.atomic,
        size,
        cfg.inline,
    )?;
    if cfg.test.verb != Verb::Send {
        let s = send_loop(cfg, &setup.client, &plan, tracker)?;
        return Ok(BwRun {
            result: s.measured().result(cfg.units, size),
            lost: None,
        });
    }
    let recv_plan = RecvPlan::new(&setup.server)?;
    let depth = cfg.rx_depth;
    let batches: Vec<Vec<RecvWr<'_>>> = (0..setup.server.qps.len())
        .map(|i| vec![recv_plan.wr(i); depth as usize])
        .collect();
    recv.top_up(&setup.server, &batches, depth)?;
    let goal = RecvGoal::new(cfg, setup.client.qps.len());
    // The receiver ends after the last expected message, or (UC, UD, duration mode) once the
    // sender is done and nothing more arrives; either side's failure stops the other.
    let sender_done = AtomicBool::new(false);
    let sender_failed = AtomicBool::new(false);
    let receiver_failed = AtomicBool::new(false);
    let arrivals = AtomicU64::new(0);
    let (sent, received) = std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let r = receive_loop(
                &setup.server,
                recv,
                &batches,
                &goal,
                &sender_done,
                &sender_failed,
                &arrivals,
                None,
            );
            receiver_failed.store(r.is_err(), Ordering::Release);
            r
        });
        let sent = send_loop_watching(
            cfg,
            &setup.client,
            &plan,
            tracker,
            &receiver_failed,
            Some(&arrivals),
            None,
        );
        sender_failed.store(sent.is_err(), Ordering::Release);
        sender_done.store(true, Ordering::Release);
        let received = receiver
            .join()
            .unwrap_or_else(|_| Err(CliError::Failed("the receiver thread panicked".into())));
        (sent, received)
    });
    let (s, a) = both(sent, received)?;
    let lost = (a.count < s.completed).then_some(Loss {
        sent: s.completed,
        arrived: a.count,
    });
    Ok(BwRun {
        result: s
            .measured_arrivals(a, pipeline(cfg, setup.client.qps.len()))
            .result(cfg.units, size),
        lost,
    })
}

/// Both sides' results, or the error that explains the failure (a real error wins over
/// [`CliError::PeerStopped`], the sender's over the receiver's).
fn both<T, U>(
    sent: Result<T, CliError>,
    received: Result<U, CliError>,
) -> Result<(T, U), CliError> {
    match (sent, received) {
        (Ok(s), Ok(r)) => Ok((s, r)),
        (Err(CliError::PeerStopped(_)), Err(e)) | (Err(e), _) | (Ok(_), Err(e)) => Err(e),
    }
}

/// What a row is computed from.
#[derive(Debug)]
struct Measured {
    messages: u64,
    elapsed: Duration,
    marks: Option<Vec<CompletionMark>>,
}

impl Measured {
    fn result(&self, units: BwUnits, size: u64) -> BwResult {
        bw_result(
            size,
            self.messages,
            1,
            self.elapsed,
            self.marks.as_deref(),
            units,
        )
    }
}

/// What the sender saw.
#[derive(Debug)]
struct SenderRun {
    /// Just before the first post.
    start: Instant,
    /// The last poll that found completions (`start` when none did).
    last: Instant,
    /// Requests posted, all QPs.
    posted: u64,
    /// Requests completed, all QPs.
    completed: u64,
    /// Iterations mode with the peak on, sender-counted runs only: completion marks,
    /// thinned to whole pipelines.
    marks: Option<Vec<CompletionMark>>,
    /// Duration mode: the measured window and the messages counted in it.
    window: Option<(Duration, u64)>,
    /// Iterations mode.
    iterations: bool,
}

impl SenderRun {
    /// The figures of a test that counts the sender's completions.
    fn measured(self) -> Measured {
        match self.window {
            Some((elapsed, messages)) => Measured {
                messages,
                elapsed,
                marks: None,
            },
            None => Measured {
                messages: if self.iterations {
                    self.posted
                } else {
                    self.completed
                },
                elapsed: self.last - self.start,
                marks: self.marks,
            },
        }
    }

    /// The figures of a send test: the messages that arrived, from the first post to the
    /// later of the last send completion and the last arrival; peak intervals span at least
    /// `pipeline` arrivals.
    fn measured_arrivals(self, a: Arrivals, pipeline: u64) -> Measured {
        if let Some((elapsed, messages)) = self.window {
            // Counted from the receiver's running total at the window's ends.
            return Measured {
                messages,
                elapsed,
                marks: None,
            };
        }
        let end = a.last.map_or(self.last, |t| t.max(self.last));
        let marks = a.marks.map(|raw| {
            let mut marks: Vec<CompletionMark> = raw
                .iter()
                .map(|&(t, messages)| CompletionMark {
                    at: t.saturating_duration_since(self.start),
                    messages,
                })
                .collect();
            if let Some(last) = a
                .last
                .filter(|_| marks.last().is_none_or(|m| m.messages < a.count))
            {
                marks.push(CompletionMark {
                    at: last.saturating_duration_since(self.start),
                    messages: a.count,
                });
            }
            thin_marks(&mut marks, pipeline);
            marks
        });
        Measured {
            messages: a.count,
            elapsed: end.saturating_duration_since(self.start),
            marks,
        }
    }
}

/// Requests outstanding at once over all QPs: the shortest interval the peak is measured over.
fn pipeline(cfg: &PerfConfig, qps: usize) -> u64 {
    u64::from(cfg.tx_depth) * qps as u64
}

fn send_loop(
    cfg: &PerfConfig,
    side: &Side,
    plan: &OpPlan<'_>,
    t: &mut Tracker,
) -> Result<SenderRun, CliError> {
    let never = AtomicBool::new(false);
    send_loop_watching(cfg, side, plan, t, &never, None, None)
}

/// What [`run_sender_for_ever`] is told after every interval: its length and the requests
/// completed in it.
type IntervalReport<'r> = &'r mut dyn FnMut(Duration, u64) -> Result<(), CliError>;

/// `--run_infinitely` on the sending side: posts toward `peer` until an error, calling
/// `report` with the row of every interval of the duration `cfg.mode` gives (perftest's
/// periodic reports: no peak, the interval's own average and message rate).
pub(crate) fn run_sender_for_ever(
    cfg: &PerfConfig,
    side: &Side,
    peer: &[PeerQp],
    size: u64,
    tracker: &mut Tracker,
    report: &mut dyn FnMut(&BwResult) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let plan = OpPlan::new(side, peer, cfg.test.verb, cfg.atomic, size, cfg.inline)?;
    let never = AtomicBool::new(false);
    let mut every = |elapsed: Duration, messages: u64| {
        let m = Measured {
            messages,
            elapsed,
            marks: None,
        };
        report(&m.result(cfg.units, size))
    };
    send_loop_watching(cfg, side, &plan, tracker, &never, None, Some(&mut every))?;
    Ok(())
}

/// One size of a cross-process BW test's sending side (the client): `side` posts toward
/// `peer`, and the row counts the send completions, as perftest's client does (over RC every
/// send completes after its message arrived).
pub(crate) fn run_sender(
    cfg: &PerfConfig,
    side: &Side,
    peer: &[PeerQp],
    size: u64,
    tracker: &mut Tracker,
) -> Result<BwResult, CliError> {
    let plan = OpPlan::new(side, peer, cfg.test.verb, cfg.atomic, size, cfg.inline)?;
    Ok(send_loop(cfg, side, &plan, tracker)?
        .measured()
        .result(cfg.units, size))
}

/// One size of a cross-process send test's receiving side (the server): tops the receives
/// up, calls `ready` (the hand shake that lets the client start), then counts arrivals until
/// every expected message arrived. The row runs from the first arrival to the last, as
/// perftest's server measures.
pub(crate) fn run_receiver(
    cfg: &PerfConfig,
    side: &Side,
    recv: &mut RecvState,
    size: u64,
    ready: impl FnOnce() -> Result<(), CliError>,
) -> Result<BwResult, CliError> {
    let recv_plan = RecvPlan::new(side)?;
    let batches = post_receives(cfg, side, recv, &recv_plan, ready)?;
    let goal = RecvGoal::with_server_clock(cfg, side.qps.len());
    let never = AtomicBool::new(false);
    let counter = AtomicU64::new(0);
    let a = receive_loop(side, recv, &batches, &goal, &never, &never, &counter, None)?;
    let start = a.first.unwrap_or_else(Instant::now);
    let run = SenderRun {
        start,
        last: start,
        posted: a.count,
        completed: a.count,
        marks: None,
        window: goal.clock.map(|_| a.window.unwrap_or_default()),
        iterations: true,
    };
    Ok(run
        .measured_arrivals(a, pipeline(cfg, side.qps.len()))
        .result(cfg.units, size))
}

/// One size of a cross-process `send_bw -b` side: both directions at once, as perftest's
/// duplex send test. Tops the receives up, calls `ready` (the hand shake after which both
/// sides start), then sends toward `peer` while a scoped thread counts the peer's messages
/// until all arrived (RC; UC and UD: until this side's sender is done and nothing more
/// arrives). The row is the sender's, as perftest's duplex row is; the caller adds the peer's.
pub(crate) fn run_both(
    cfg: &PerfConfig,
    side: &Side,
    peer: &[PeerQp],
    recv: &mut RecvState,
    size: u64,
    tracker: &mut Tracker,
    ready: impl FnOnce() -> Result<(), CliError>,
) -> Result<BwResult, CliError> {
    let plan = OpPlan::new(side, peer, cfg.test.verb, cfg.atomic, size, cfg.inline)?;
    let recv_plan = RecvPlan::new(side)?;
    let batches = post_receives(cfg, side, recv, &recv_plan, ready)?;
    let goal = RecvGoal::new(cfg, side.qps.len());
    let sender_done = AtomicBool::new(false);
    let sender_failed = AtomicBool::new(false);
    let receiver_failed = AtomicBool::new(false);
    let arrivals = AtomicU64::new(0);
    let (sent, received) = std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let r = receive_loop(
                side,
                recv,
                &batches,
                &goal,
                &sender_done,
                &sender_failed,
                &arrivals,
                None,
            );
            receiver_failed.store(r.is_err(), Ordering::Release);
            r
        });
        let sent = send_loop_watching(cfg, side, &plan, tracker, &receiver_failed, None, None);
        sender_failed.store(sent.is_err(), Ordering::Release);
        sender_done.store(true, Ordering::Release);
        let received = receiver
            .join()
            .unwrap_or_else(|_| Err(CliError::Failed("the receiver thread panicked".into())));
        (sent, received)
    });
    let (s, _) = both(sent, received)?;
    Ok(s.measured().result(cfg.units, size))
}

/// `--run_infinitely` on a send test's receiving side (the server): tops the receives up,
/// calls `ready`, then counts arrivals for ever, calling `report` with the row of every
/// interval (`cfg.mode`'s duration) from the first arrival on, as perftest's server does.
pub(crate) fn run_receiver_for_ever(
    cfg: &PerfConfig,
    side: &Side,
    recv: &mut RecvState,
    size: u64,
    ready: impl FnOnce() -> Result<(), CliError>,
    report: &mut dyn FnMut(&BwResult) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let recv_plan = RecvPlan::new(side)?;
    let batches = post_receives(cfg, side, recv, &recv_plan, ready)?;
    let goal = RecvGoal::with_server_clock(cfg, side.qps.len());
    let never = AtomicBool::new(false);
    let counter = AtomicU64::new(0);
    let mut every = |elapsed: Duration, messages: u64| {
        let m = Measured {
            messages,
            elapsed,
            marks: None,
        };
        report(&m.result(cfg.units, size))
    };
    receive_loop(
        side,
        recv,
        &batches,
        &goal,
        &never,
        &never,
        &counter,
        Some(&mut every),
    )?;
    Ok(())
}

/// The sender: posts, polls, and measures (and gives up when `peer_failed` is set). With
/// `arrivals` (send tests), the duration window counts the receiver's running total of
/// arrived messages instead of the send completions, and no completion marks are kept (the
/// receiver keeps them). With `every` (duration mode only) the loop never ends: each
/// duration is an interval reported to it.
fn send_loop_watching(
    cfg: &PerfConfig,
    side: &Side,
    plan: &OpPlan<'_>,
    tracker: &mut Tracker,
    peer_failed: &AtomicBool,
    arrivals: Option<&AtomicU64>,
    mut every: Option<IntervalReport<'_>>,
) -> Result<SenderRun, CliError> {
    let nqp = side.qps.len();
    let (limit, window) = match cfg.mode {
        RunMode::Iters(n) => (Some(n), None),
        RunMode::Duration { total, margin } => (None, Some((total, margin))),
    };
    let depth = u64::from(cfg.tx_depth);
    let cq_mod = u64::from(cfg.cq_mod).min(depth);
    let post_list = u64::from(cfg.post_list).min(depth);
    let mut posted = vec![0u64; nqp];
    let mut completed = vec![0u64; nqp];
    let mut wrs: Vec<SendWr<'_>> = Vec::with_capacity(cfg.post_list as usize);
    let mut wcs = [WorkCompletion::default(); POLL_BATCH];
    let mut marks = match (cfg.peak, limit, arrivals) {
        (true, Some(n), None) => Some(Vec::with_capacity(
            (n * nqp as u64 / cq_mod.max(1)) as usize + 2 * nqp + 2,
        )),
        _ => None,
    };
    let counted = |done: u64| arrivals.map_or(done, |a| a.load(Ordering::Acquire));
    let mut waiter =
        Waiter::new("waiting for send completions", Some(peer_failed)).limit(cfg.peer_timeout);
    let mut total_done = 0u64;
    let mut sample: Option<(Instant, u64)> = None;
    let mut measured: Option<(Duration, u64)> = None;
    let start = Instant::now();
    let mut last = start;
    let mut loops = 0u32;
    loop {
        let mut progress = false;
        for i in 0..nqp {
            loop {
                let room = depth - (posted[i] - completed[i]);
                let left = limit.map_or(u64::MAX, |n| n - posted[i]);
                let batch = post_list.min(left);
                if batch == 0 || batch > room {
                    break;
                }
                wrs.clear();
                for k in 1..=batch {
                    let seq = posted[i] + k;
                    let signaled = seq % cq_mod == 0 || Some(seq) == limit;
                    wrs.push(plan.wr(i, seq, signaled));
                }
                side.qps[i].post_send(&wrs).ctx("posting send requests")?;
                posted[i] += batch;
                progress = true;
            }
        }
        let n = side.send_cq.poll(&mut wcs).ctx("polling the send CQ")?;
        if n > 0 {
            last = Instant::now();
            for wc in &wcs[..n] {
                check_wc(wc)?;
                let (i, seq) = split_wr_id(wc.wr_id);
                if let Some(done) = completed.get_mut(i) {
                    total_done += seq.saturating_sub(*done);
                    *done = seq.max(*done);
                }
            }
            if let Some(m) = marks.as_mut() {
                m.push(CompletionMark {
                    at: last - start,
                    messages: total_done,
                });
            }
            progress = true;
        }
        if progress {
            waiter.progress();
        } else {
            waiter.idle()?;
        }
        loops = loops.wrapping_add(1);
        match (limit, window) {
            (Some(n), _) => {
                if loops % 256 == 0 {
                    tracker.update(total_done);
                }
                if completed.iter().all(|&c| c >= n) {
                    break;
                }
            }
            (None, Some((total, margin))) => {
                if loops % 64 != 0 {
                    continue;
                }
                // perftest's duration mode: traffic runs for the whole duration, the
                // measurement leaves out the margin at both ends.
                let now = Instant::now();
                if let Some(report) = every.as_mut() {
                    let (t0, d0) = *sample.get_or_insert((start, 0));
                    if now - t0 >= total {
                        report(now - t0, total_done - d0)?;
                        sample = Some((now, total_done));
                    }
                    continue;
                }
                let elapsed = now - start;
                tracker.update(elapsed.as_millis() as u64);
                if sample.is_none() && elapsed >= margin {
                    sample = Some((now, counted(total_done)));
                }
                if measured.is_none() && elapsed >= total - margin {
                    if let Some((t0, d0)) = sample {
                        measured = Some((now - t0, counted(total_done).saturating_sub(d0)));
                    }
                }
                if elapsed >= total {
                    break;
                }
            }
            (None, None) => break,
        }
    }
    if let Some(m) = marks.as_mut() {
        thin_marks(m, pipeline(cfg, nqp));
    }
    Ok(SenderRun {
        start,
        last,
        posted: posted.iter().sum(),
        completed: total_done,
        marks,
        window: measured,
        iterations: limit.is_some(),
    })
}

/// Keeps only marks at least `window` messages after the previous kept one (the last mark
/// ends the last interval), so that every interval the peak is computed over spans a full pipeline of
/// outstanding requests. Completions are polled in bursts; without this, two polls a few
/// nanoseconds apart that each found a batch of completions would make an absurd "peak".
fn thin_marks(marks: &mut Vec<CompletionMark>, window: u64) {
    let last = marks.last().copied();
    let mut base = 0u64;
    marks.retain(|m| {
        let keep = m.messages >= base + window;
        if keep {
            base = m.messages;
        }
        keep
    });
    // A short tail joins the last interval.
    if let Some(last) = last {
        match marks.last_mut() {
            Some(kept) => *kept = last,
            None => marks.push(last),
        }
    }
}

/// Fills every QP's receive queue to `rx_depth` with `plan`'s receives, then calls `ready`
/// (the peer may send from then on); returns the per-QP batches the receive loop tops up
/// with.
fn post_receives<'a>(
    cfg: &PerfConfig,
    side: &Side,
    recv: &mut RecvState,
    plan: &'a RecvPlan,
    ready: impl FnOnce() -> Result<(), CliError>,
) -> Result<Vec<Vec<RecvWr<'a>>>, CliError> {
    let depth = cfg.rx_depth;
    let batches: Vec<Vec<RecvWr<'a>>> = (0..side.qps.len())
        .map(|i| vec![plan.wr(i); depth as usize])
        .collect();
    recv.top_up(side, &batches, depth)?;
    ready()?;
    Ok(batches)
}

/// When the receiver of a send test stops, and what it records.
#[derive(Debug)]
struct RecvGoal {
    /// Iterations mode: messages the sender posts; the receiver stops once all arrived.
    expected: Option<u64>,
    /// Whether every message must arrive (RC, iterations mode): the receiver then waits for
    /// `expected` even after the sender is done (a send completes after its message arrived,
    /// but the receive completion may be polled later).
    exact: bool,
    /// Peak: a mark every so many arrivals, and the room they need.
    marks: Option<(u64, usize)>,
    /// `--timeout`: how long nothing may arrive before the receiver gives up.
    limit: Option<Duration>,
    /// A cross-process receiver in duration mode: perftest's server clock, which starts at
    /// the first arrival, runs `(total, margin)` and counts the arrivals between the margins.
    clock: Option<(Duration, Duration)>,
}

impl RecvGoal {
    /// [`RecvGoal::new`] for a cross-process receiver, which in duration mode runs
    /// perftest's server clock.
    fn with_server_clock(cfg: &PerfConfig, qps: usize) -> Self {
        let mut goal = Self::new(cfg, qps);
        if let RunMode::Duration { total, margin } = cfg.mode {
            goal.clock = Some((total, margin));
        }
        goal
    }

    fn new(cfg: &PerfConfig, qps: usize) -> Self {
        let expected = match cfg.mode {
            RunMode::Iters(n) => Some(n * qps as u64),
            RunMode::Duration { .. } => None,
        };
        let every = u64::from(cfg.cq_mod.min(cfg.tx_depth)).max(1);
        Self {
            expected,
            exact: expected.is_some() && cfg.conn == QpType::Rc,
            marks: expected
                .filter(|_| cfg.peak)
                .map(|e| (every, usize::try_from(e / every).unwrap_or(0) + 2)),
            limit: cfg.peer_timeout,
            clock: None,
        }
    }
}

/// What the receiver counted.
#[derive(Debug)]
struct Arrivals {
    /// Receive completions.
    count: u64,
    /// The poll that found the first of them.
    first: Option<Instant>,
    /// The poll that found the last of them.
    last: Option<Instant>,
    /// Peak: `(when, arrived so far)` about every `cq_mod` arrivals.
    marks: Option<Vec<(Instant, u64)>>,
    /// With [`RecvGoal::clock`]: the measured window and the arrivals in it.
    window: Option<(Duration, u64)>,
}

/// The receiver: keeps receives posted and counts the messages that arrive, until every
/// expected message arrived or (`goal.exact` unset) the sender is done and nothing arrived for
/// [`DRAIN_QUIET`]. `arrivals` mirrors the running count for the sender's duration window.
#[allow(clippy::too_many_arguments)]
fn receive_loop(
    side: &Side,
    state: &mut RecvState,
    batches: &[Vec<RecvWr<'_>>],
    goal: &RecvGoal,
    sender_done: &AtomicBool,
    sender_failed: &AtomicBool,
    arrivals: &AtomicU64,
    mut every: Option<IntervalReport<'_>>,
) -> Result<Arrivals, CliError> {
    let mut wcs = [WorkCompletion::default(); POLL_BATCH];
    let depth = batches.first().map_or(0, Vec::len) as u32;
    let refill = (depth / 4).max(1);
    let mut received = 0u64;
    let mut first = None;
    let mut last = None;
    let (mark_every, mark_room) = goal.marks.unwrap_or((u64::MAX, 0));
    let mut marks = goal.marks.map(|_| Vec::with_capacity(mark_room));
    let mut next_mark = mark_every;
    let mut quiet_since: Option<Instant> = None;
    let mut waiter = Waiter::new("waiting for receives", Some(sender_failed)).limit(goal.limit);
    // The duration clock: the window's start, then the window.
    let mut sample: Option<(Instant, u64)> = None;
    let mut window = None;
    while goal.expected.is_none_or(|e| received < e) {
        if let (Some((total, margin)), Some(t0)) = (goal.clock, first) {
            let now = Instant::now();
            if let Some(report) = every.as_mut() {
                // --run_infinitely: every interval reported, no end.
                let (ts, r0) = *sample.get_or_insert((t0, 0));
                if now - ts >= total {
                    report(now - ts, received - r0)?;
                    sample = Some((now, received));
                }
            } else {
                if sample.is_none() && now - t0 >= margin {
                    sample = Some((now, received));
                }
                if window.is_none() && now - t0 >= total - margin {
                    window = sample.map(|(ts, r0)| (now - ts, received - r0));
                }
                if now - t0 >= total {
                    break;
                }
            }
        }
        let n = side.recv_cq.poll(&mut wcs).ctx("polling the receive CQ")?;
        if n == 0 {
            if !goal.exact && sender_done.load(Ordering::Acquire) {
                let now = Instant::now();
                if now - *quiet_since.get_or_insert(now) >= DRAIN_QUIET {
                    break;
                }
            }
            waiter.idle()?;
            continue;
        }
        let now = Instant::now();
        waiter.progress();
        quiet_since = None;
        for wc in &wcs[..n] {
            check_wc(wc)?;
            let (i, _) = split_wr_id(wc.wr_id);
            if let Some(o) = state.outstanding.get_mut(i) {
                *o = o.saturating_sub(1);
            }
        }
        received += n as u64;
        first.get_or_insert(now);
        last = Some(now);
        arrivals.store(received, Ordering::Release);
        if received >= next_mark {
            if let Some(m) = marks.as_mut() {
                m.push((now, received));
            }
            next_mark = received.saturating_add(mark_every);
        }
        for (i, qp) in side.qps.iter().enumerate() {
            let missing = depth.saturating_sub(state.outstanding[i]);
            if missing >= refill {
                qp.post_recv(&batches[i][..missing as usize])
                    .ctx("reposting receives")?;
                state.outstanding[i] = depth;
            }
        }
    }
    Ok(Arrivals {
        count: received,
        first,
        last,
        marks,
        window,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::perf::args::PerfArgs;
    use crate::perf::config::PerfConfig;
    use crate::report::BwUnits;
    use crate::report::stats::MIB;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: PerfArgs,
    }

    fn setup(line: &[&str]) -> Setup {
        use clap::Parser as _;
        let argv = std::iter::once("perf").chain(line.iter().copied());
        let cfg = PerfConfig::from_args(&Cli::try_parse_from(argv).expect("flags parse").args)
            .expect("valid flags");
        Setup::new(cfg).expect("both devices open and connect")
    }

    /// The soft device the in-process server runs on.
    fn server_device(setup: &Setup) -> portverbs::soft::SoftDevice {
        let name = setup.server.ctx.name().to_owned();
        match portverbs::devices()
            .into_iter()
            .find(|d| d.info().name == name)
        {
            Some(portverbs::AnyDevice::Soft(d)) => d,
            other => panic!("{name} is not a soft device: {other:?}"),
        }
    }

    #[test]
    fn send_rows_count_arrivals_up_to_the_last_one() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let sender = |last| SenderRun {
            start: t0,
            last,
            posted: 1000,
            completed: 1000,
            marks: None,
            window: None,
            iterations: true,
        };
        let arrived = |count, last: Instant, marks| Arrivals {
            count,
            first: None,
            last: Some(last),
            marks,
            window: None,
        };
        // UC: the sends completed at 10 ms, the 10 messages that arrived did by 20 ms.
        let m = sender(t0 + ms(10)).measured_arrivals(arrived(10, t0 + ms(20), None), 128);
        assert_eq!((m.messages, m.elapsed), (10, ms(20)));
        // RC: the last acknowledgement comes after the last arrival.
        let marks = vec![(t0 + ms(3), 400), (t0 + ms(6), 800)];
        let m = sender(t0 + ms(10)).measured_arrivals(arrived(1000, t0 + ms(9), Some(marks)), 128);
        assert_eq!((m.messages, m.elapsed), (1000, ms(10)));
        // The last arrival ends the peak's last interval.
        let want = [(3, 400), (6, 800), (9, 1000)].map(|(at, messages)| CompletionMark {
            at: ms(at),
            messages,
        });
        assert_eq!(m.marks.as_deref(), Some(&want[..]));
        // Nothing arrived: nothing counted, and no division by a zero time either.
        let none = Arrivals {
            count: 0,
            first: None,
            last: None,
            marks: Some(Vec::new()),
            window: None,
        };
        let m = sender(t0 + ms(10)).measured_arrivals(none, 128);
        assert_eq!(m.messages, 0);
        let r = bw_result(
            65536,
            m.messages,
            1,
            m.elapsed,
            m.marks.as_deref(),
            BwUnits::MiBps,
        );
        assert_eq!((r.bw_average, r.bw_peak, r.msg_rate_mpps), (0.0, 0.0, 0.0));
    }

    /// `send_bw -c UC -r 1`: with one receive posted the receiver drops most messages; the row
    /// must count exactly those that arrived (the sends that the device dropped, by its own
    /// counter, are not in it), and its bandwidth must be that count times the size over the
    /// time its message rate uses. No timing is asserted.
    #[test]
    fn uc_send_with_one_receive_counts_only_what_arrived() {
        const N: u64 = 300;
        let _alone = crate::perf::DEVICE_TRAFFIC
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let n = N.to_string();
        for (conn, size) in [("UC", 1024u64), ("UC", 65536), ("RC", 4096)] {
            let s = size.to_string();
            let setup = setup(&["send_bw", "-c", conn, "-r", "1", "-n", &n, "-s", &s]);
            let server = server_device(&setup);
            let before = server.engine_stats();
            let mut recv = RecvState::new(1);
            let mut tracker = Tracker::new("send_bw", N);
            let run = run(&setup, size, &mut recv, &mut tracker).expect("the run completes");
            let r = run.result;
            assert!(r.iterations <= N, "{conn} {size}: {r:?}");
            if conn == "RC" {
                // RC retries until a receive is posted: everything arrives.
                assert_eq!((r.iterations, run.lost), (N, None), "{r:?}");
            } else {
                // Let the server's engine take every packet (its count stays put for a while),
                // then compare with its drop counter: a message that finds no receive is
                // dropped whole, each of its packets counted.
                let mut after = server.engine_stats();
                let mut still = Instant::now();
                while still.elapsed() < Duration::from_millis(300) {
                    std::thread::sleep(Duration::from_millis(10));
                    let now = server.engine_stats();
                    if now != after {
                        (after, still) = (now, Instant::now());
                    }
                }
                let rx = after.rx_packets - before.rx_packets;
                assert!(rx >= N && rx % N == 0, "{conn} {size}: {after:?}");
                let packets = rx / N;
                let dropped_packets = after.dropped - before.dropped;
                assert_eq!(dropped_packets % packets, 0, "{conn} {size}: {after:?}");
                let dropped = dropped_packets / packets;
                assert_eq!(r.iterations, N - dropped, "{conn} {size}: {r:?} {after:?}");
                match run.lost {
                    Some(l) => assert_eq!((l.sent, l.arrived), (N, r.iterations)),
                    None => assert_eq!(r.iterations, N),
                }
                // Nothing arrived after the receiver stopped counting.
                let mut wcs = [WorkCompletion::default(); 4];
                assert_eq!(setup.server.recv_cq.poll(&mut wcs).expect("poll"), 0);
            }
            // Bytes counted = messages counted x size: the average bandwidth and the message
            // rate come from the same count and time.
            if r.msg_rate_mpps > 0.0 {
                let bytes_per_message = r.bw_average * MIB / (r.msg_rate_mpps * 1e6);
                assert!(
                    (bytes_per_message / size as f64 - 1.0).abs() < 1e-9,
                    "{conn} {size}: {r:?}"
                );
            }
        }
    }

    fn mark(ms: u64, messages: u64) -> CompletionMark {
        CompletionMark {
            at: Duration::from_millis(ms),
            messages,
        }
    }

    #[test]
    fn marks_are_thinned_to_whole_pipelines() {
        let mut m = vec![
            mark(1, 100),
            mark(2, 128),
            mark(3, 200),
            mark(4, 300),
            mark(5, 310),
        ];
        thin_marks(&mut m, 128);
        // 128 is a full window after 0, 300 a full window after 128; 310 ends the run.
        assert_eq!(m, vec![mark(2, 128), mark(5, 310)]);
        let mut short = vec![mark(1, 10), mark(2, 20)];
        thin_marks(&mut short, 128);
        assert_eq!(short, vec![mark(2, 20)]);
        let mut none = Vec::new();
        thin_marks(&mut none, 128);
        assert!(none.is_empty());
    }
}

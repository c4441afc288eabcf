//! Bandwidth tests: keep up to `tx_depth` requests outstanding on every QP, ask for a
//! completion every `cq_mod` requests, and time from the first post to the last completion.
//!
//! The sender runs on the calling thread. Send tests also need a receiver: a scoped thread on
//! the server side keeps `rx_depth` receives posted on each QP, reposting in batches.
//! Nothing in the loops allocates: requests are built on the stack from a prepared plan, post
//! lists go through a vector reserved up front, completions are polled into an array, and the
//! completion marks for the peak go into a vector sized for the whole run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use portverbs::prelude::*;

use super::config::RunMode;
use super::ops::{OpPlan, RecvPlan, check_wc, split_wr_id};
use super::setup::{Setup, Side};
use super::tracker::Tracker;
use crate::error::{CliError, Context as _};
use crate::report::{BwResult, CompletionMark, Verb, bw_result};
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

/// Runs one size and returns its result row.
pub(crate) fn run(
    setup: &Setup,
    size: u64,
    recv: &mut RecvState,
    tracker: &mut Tracker,
) -> Result<BwResult, CliError> {
    let cfg = &setup.cfg;
    let plan = OpPlan::new(
        &setup.client,
        &setup.server,
        cfg.test.verb,
        cfg.atomic,
        size,
        cfg.inline,
    );
    if cfg.test.verb != Verb::Send {
        let m = send_loop(setup, &plan, tracker)?;
        return Ok(m.result(setup, size));
    }
    let recv_plan = RecvPlan::new(&setup.server);
    let depth = cfg.rx_depth;
    let batches: Vec<Vec<RecvWr<'_>>> = (0..setup.server.qps.len())
        .map(|i| vec![recv_plan.wr(i); depth as usize])
        .collect();
    recv.top_up(&setup.server, &batches, depth)?;
    // The sender's end stops the receiver (UC/UD lose messages, so it cannot count them);
    // the receiver stops the sender only when it failed: on RC it ends after the last receive,
    // while the sender may still wait for the last acknowledgements.
    let sender_done = AtomicBool::new(false);
    let receiver_failed = AtomicBool::new(false);
    let expected = match cfg.mode {
        RunMode::Iters(n) if cfg.conn == QpType::Rc => Some(n * u64::from(cfg.qps)),
        _ => None,
    };
    let (sent, received) = std::thread::scope(|s| {
        let receiver = s.spawn(|| {
            let r = receive_loop(&setup.server, recv, &batches, expected, &sender_done);
            receiver_failed.store(r.is_err(), Ordering::Release);
            r
        });
        let sent = send_loop_watching(setup, &plan, tracker, &receiver_failed);
        sender_done.store(true, Ordering::Release);
        let received = receiver
            .join()
            .unwrap_or_else(|_| Err(CliError::Failed("the receiver thread panicked".into())));
        (sent, received)
    });
    let m = CliError::merge(sent, received)?;
    Ok(m.result(setup, size))
}

/// What the sender measured.
#[derive(Debug)]
struct Measured {
    messages: u64,
    elapsed: Duration,
    marks: Option<Vec<CompletionMark>>,
}

impl Measured {
    fn result(&self, setup: &Setup, size: u64) -> BwResult {
        bw_result(
            size,
            self.messages,
            1,
            self.elapsed,
            self.marks.as_deref(),
            setup.cfg.units,
        )
    }
}

fn send_loop(setup: &Setup, plan: &OpPlan<'_>, t: &mut Tracker) -> Result<Measured, CliError> {
    let never = AtomicBool::new(false);
    send_loop_watching(setup, plan, t, &never)
}

/// The sender: posts, polls, and measures (and gives up when `peer_failed` is set).
fn send_loop_watching(
    setup: &Setup,
    plan: &OpPlan<'_>,
    tracker: &mut Tracker,
    peer_failed: &AtomicBool,
) -> Result<Measured, CliError> {
    let cfg = &setup.cfg;
    let side = &setup.client;
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
    let mut marks = match (cfg.peak, limit) {
        (true, Some(n)) => Some(Vec::with_capacity(
            (n * nqp as u64 / cq_mod.max(1)) as usize + 2 * nqp + 2,
        )),
        _ => None,
    };
    let mut waiter = Waiter::new("waiting for send completions", Some(peer_failed));
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
                let elapsed = now - start;
                tracker.update(elapsed.as_millis() as u64);
                if sample.is_none() && elapsed >= margin {
                    sample = Some((now, total_done));
                }
                if measured.is_none() && elapsed >= total - margin {
                    if let Some((t0, d0)) = sample {
                        measured = Some((now - t0, total_done - d0));
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
        thin_marks(m, depth * nqp as u64);
    }
    let posted_total = posted.iter().sum::<u64>();
    Ok(match measured {
        Some((elapsed, messages)) => Measured {
            messages,
            elapsed,
            marks: None,
        },
        None => Measured {
            messages: if limit.is_some() {
                posted_total
            } else {
                total_done
            },
            elapsed: last - start,
            marks,
        },
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

/// The receiver: keeps receives posted until every expected message arrived (RC) or the
/// sender is done.
fn receive_loop(
    side: &Side,
    state: &mut RecvState,
    batches: &[Vec<RecvWr<'_>>],
    expected: Option<u64>,
    sender_done: &AtomicBool,
) -> Result<(), CliError> {
    let mut wcs = [WorkCompletion::default(); POLL_BATCH];
    let depth = batches.first().map_or(0, Vec::len) as u32;
    let refill = (depth / 4).max(1);
    let mut received = 0u64;
    let mut waiter = Waiter::new("waiting for receives", Some(sender_done));
    while expected.is_none_or(|e| received < e) {
        let n = side.recv_cq.poll(&mut wcs).ctx("polling the receive CQ")?;
        if n == 0 {
            match waiter.idle() {
                Err(CliError::PeerStopped(_)) => break,
                other => other?,
            }
            continue;
        }
        waiter.progress();
        for wc in &wcs[..n] {
            check_wc(wc)?;
            let (i, _) = split_wr_id(wc.wr_id);
            if let Some(o) = state.outstanding.get_mut(i) {
                *o = o.saturating_sub(1);
            }
        }
        received += n as u64;
        for (i, qp) in side.qps.iter().enumerate() {
            let missing = depth.saturating_sub(state.outstanding[i]);
            if missing >= refill {
                qp.post_recv(&batches[i][..missing as usize])
                    .ctx("reposting receives")?;
                state.outstanding[i] = depth;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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

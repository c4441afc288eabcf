//! Timers as data: each endpoint has at most one deadline (retransmission or TIMEWAIT); the
//! agent keeps a min-heap of (deadline, slot, sequence) and skips entries whose sequence no
//! longer matches the endpoint's (cancelled or re-armed timers are never searched for).

use core::cmp::Reverse;

use super::conn::TimerKind;
use super::{CmAgent, CmEvent, CmState, QpTarget};
use crate::time::{MAX_WAIT_NS, from_peer, timeout_ns};
use crate::wire::RejReason;

impl CmAgent {
    pub(super) fn arm(&mut self, index: u32, deadline: u64, kind: TimerKind) {
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        c.timer_seq = c.timer_seq.wrapping_add(1);
        c.timer = Some((deadline, kind));
        let seq = c.timer_seq;
        self.timers.push(Reverse((deadline, index, seq)));
        // Cancelled and re-armed timers leave stale entries behind until their deadline; keep
        // them to a bounded multiple of the endpoints (amortised O(1) per arm).
        if self.timers.len() > 64 && self.timers.len() > 4 * self.table.live() {
            let table = &self.table;
            self.timers.retain(|&Reverse((d, i, s))| {
                table
                    .conn(i)
                    .is_some_and(|c| c.timer_seq == s && c.timer.is_some_and(|(t, _)| t == d))
            });
        }
    }

    pub(super) fn cancel(&mut self, index: u32) {
        if let Some(c) = self.table.conn_mut(index) {
            c.timer_seq = c.timer_seq.wrapping_add(1);
            c.timer = None;
        }
    }

    /// Sends the endpoint's retransmittable MAD (already in `retx`) and arms its timer. The
    /// whole exchange is given up [`MAX_WAIT_NS`] after this first send at the latest,
    /// whatever the interval and the retries (a REQ: at the application's deadline, if
    /// sooner).
    pub(super) fn start_retx(&mut self, index: u32, now: u64, interval_ns: u64, retries: u8) {
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        c.retx_interval_ns = interval_ns;
        c.retries_left = retries;
        c.give_up_at = now.saturating_add(MAX_WAIT_NS).min(c.req_deadline);
        let (to, mad, end) = (c.path.remote_gid, c.retx, c.give_up_at);
        self.send_raw(to, mad);
        self.arm(
            index,
            now.saturating_add(interval_ns).min(end),
            TimerKind::Retransmit,
        );
    }

    /// Enters TIMEWAIT for `convert(av_timeout)`, at most 2^15 ms (the path's ACK timeout may
    /// come from the peer: [`from_peer`]).
    pub(super) fn enter_timewait(&mut self, index: u32, now: u64) {
        let Some(c) = self.table.conn(index) else {
            return;
        };
        let len = timeout_ns(from_peer(c.av_timeout));
        self.set_state(index, CmState::Timewait);
        self.arm(index, now.saturating_add(len), TimerKind::Timewait);
    }

    fn live_entry(&self, deadline: u64, index: u32, seq: u32) -> Option<TimerKind> {
        let c = self.table.conn(index)?;
        match c.timer {
            Some((d, kind)) if d == deadline && c.timer_seq == seq => Some(kind),
            _ => None,
        }
    }

    /// The earliest deadline (ns) at which [`CmAgent::handle_timeout`] has work, if any.
    pub fn poll_timeout(&mut self) -> Option<u64> {
        while let Some(&Reverse((deadline, index, seq))) = self.timers.peek() {
            if self.live_entry(deadline, index, seq).is_some() {
                return Some(deadline);
            }
            self.timers.pop();
        }
        None
    }

    /// Runs every timer due at `now`: retransmissions, give-ups and TIMEWAIT exits. Work is
    /// bounded by the number of armed timers.
    pub fn handle_timeout(&mut self, now: u64) {
        while let Some(&Reverse((deadline, index, seq))) = self.timers.peek() {
            if deadline > now {
                break;
            }
            self.timers.pop();
            match self.live_entry(deadline, index, seq) {
                Some(TimerKind::Retransmit) => self.retransmit_due(index, now),
                Some(TimerKind::Timewait) => self.timewait_due(index),
                Some(TimerKind::Withdraw) => self.withdraw_due(index),
                None => {}
            }
        }
    }

    fn retransmit_due(&mut self, index: u32, now: u64) {
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        c.timer = None;
        if c.retries_left > 0 && now < c.give_up_at {
            c.retries_left -= 1;
            let (to, mad, interval) = (c.path.remote_gid, c.retx, c.retx_interval_ns);
            let end = c.give_up_at;
            self.stats.retransmits += 1;
            self.send_raw(to, mad);
            let next = now.saturating_add(interval).min(end);
            self.arm(index, next, TimerKind::Retransmit);
            return;
        }
        let state = c.state;
        let id = self.table.comm_id(index);
        match state {
            // REQ_ERROR / REP_ERROR / SIDR_REQ_ERROR: the peer never answered.
            CmState::ReqSent
            | CmState::MraReqRcvd
            | CmState::RepSent
            | CmState::MraRepRcvd
            | CmState::SidrReqSent => {
                if state != CmState::SidrReqSent {
                    self.qp(index, QpTarget::Error);
                }
                self.finish_outcome(index, CmEvent::Unreachable { id });
                self.set_state(index, CmState::Idle);
            }
            // DREQ_ERROR: disconnected all the same.
            CmState::DreqSent => {
                self.report_disconnect(index);
                self.enter_timewait(index, now);
            }
            _ => {}
        }
    }

    /// A connection request (or SIDR_REQ) nobody answered, whose sender has given up by now
    /// (or never existed: a forged REQ from an address that answers nothing): withdrawn as
    /// if its REJ Timeout had come, so that it leaves the listener's backlog.
    fn withdraw_due(&mut self, index: u32) {
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        c.timer = None;
        if !matches!(
            c.state,
            CmState::ReqRcvd | CmState::MraReqSent | CmState::SidrReqRcvd
        ) {
            return;
        }
        let id = self.table.comm_id(index);
        self.stats.withdrawn += 1;
        let ev = CmEvent::Rejected {
            id,
            reason: RejReason::Timeout,
            private_data: Vec::new(),
        };
        self.event(index, ev);
        self.set_state(index, CmState::Idle);
    }

    fn timewait_due(&mut self, index: u32) {
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        c.timer = None;
        let id = self.table.comm_id(index);
        self.event(index, CmEvent::TimewaitExit { id });
        self.set_state(index, CmState::Idle);
    }

    /// Delivers the outcome of `connect`/`accept` once.
    pub(super) fn finish_outcome(&mut self, index: u32, ev: CmEvent) {
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        if !c.outcome_pending {
            return;
        }
        c.outcome_pending = false;
        c.req_deadline = u64::MAX;
        if matches!(ev, CmEvent::Established { .. }) {
            c.connected = true;
        }
        self.event(index, ev);
    }

    /// Delivers Disconnected once, and only for a connection that was established.
    pub(super) fn report_disconnect(&mut self, index: u32) {
        let Some(c) = self.table.conn_mut(index) else {
            return;
        };
        if !c.connected || c.disconnect_reported {
            return;
        }
        c.disconnect_reported = true;
        let id = self.table.comm_id(index);
        self.event(index, CmEvent::Disconnected { id });
    }
}

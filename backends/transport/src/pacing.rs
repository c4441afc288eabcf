//! Pacing: a token bucket per path, so that what a path's window grants leaves spread over the
//! round trip instead of in one burst.
//!
//! A window alone lets a path send `cwnd` packets the moment ACKs free room, and a device that
//! batches its sends (the UDP port hands a GSO message of up to 64 datagrams to the kernel)
//! puts them on the wire back to back: behind a queue shallower than the burst they are
//! dropped whole, however right the window is. So each path also meters its packets: tokens
//! accrue at `gain · cwnd / srtt` packets per nanosecond (twice that in slow start, 1.25 times
//! after: the pacing gains of Linux TCP), a packet spends one, and the bucket holds at most
//! [`CcConfig::pace_burst`] packets — or what accrues in one [`CcConfig::pace_tick_ns`], the
//! finest wake-up the device can count on, if that is more. A QP that finds the bucket empty
//! waits in its path's queue as for the window, and a pace timer wakes the queue when the
//! bucket has refilled by a tick's worth (never less than the packets the QPs ahead need).
//!
//! The rate is never what limits a path that its window does not: 1.25 windows per round
//! trip is more than a window per round trip. Before the path's first round-trip sample
//! there is no rate and nothing is paced (the initial window is the first burst), and a path
//! is paced only once a congestion signal (a loss, a CNP, a round trip above target) has cut
//! its window: a path that never met a queue it could overflow (loopback, an idle LAN) does
//! not pay for the wake-ups, which behind a busy host's scheduler cost more than the bursts
//! they would spread.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::CcConfig;

/// One packet, in tokens (the bucket counts fractions of a packet).
const ONE: i64 = 1024;

/// The token bucket of one path.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Pacer {
    /// Tokens, scaled by [`ONE`]; negative after a charge beyond the balance (packets sent
    /// on a grant made before the bucket was counted, a go-back's resends).
    tokens: i64,
    /// When the tokens were last brought up to date; `None` until the path has a rate.
    last: Option<u64>,
}

/// What the bucket's rate depends on: the path's window, round trip and phase.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    pub(crate) cwnd: u32,
    pub(crate) srtt_ns: u64,
    pub(crate) slow_start: bool,
    /// A congestion signal cut the path's window at least once.
    pub(crate) congested: bool,
}

impl Rate {
    /// Tokens (scaled) that accrue in `dt` nanoseconds.
    fn accrued(self, dt: u64) -> i64 {
        let (num, den) = if self.slow_start { (2, 1) } else { (5, 4) };
        let t = u128::from(dt) * u128::from(self.cwnd) * ONE as u128 * num
            / (u128::from(self.srtt_ns.max(1)) * den);
        t.min(i64::MAX as u128) as i64
    }

    /// Nanoseconds for `tokens` (scaled) to accrue.
    fn time_for(self, tokens: i64) -> u64 {
        let (num, den) = if self.slow_start { (2, 1) } else { (5, 4) };
        let per = u128::from(self.cwnd.max(1)) * ONE as u128 * num;
        let t = (tokens.max(0) as u128 * u128::from(self.srtt_ns.max(1)) * den).div_ceil(per);
        t.min(u128::from(u64::MAX)) as u64
    }

    /// Packets (scaled) that accrue in one tick of `cfg`.
    fn per_tick(self, cfg: &CcConfig) -> i64 {
        self.accrued(cfg.pace_tick_ns)
    }

    /// Most tokens (scaled) the bucket holds.
    fn cap(self, cfg: &CcConfig) -> i64 {
        (i64::from(cfg.pace_burst) * ONE).max(self.per_tick(cfg))
    }
}

impl Pacer {
    /// Whether pacing applies: it is configured, the path met congestion and has a round
    /// trip to pace by.
    pub(crate) fn active(cfg: &CcConfig, rate: Rate) -> bool {
        cfg.pace_burst > 0 && rate.congested && rate.srtt_ns > 0
    }

    /// Brings the tokens up to `now` and returns the whole packets available. A bucket that
    /// starts (its path's first round trip was just measured) starts full.
    pub(crate) fn available(&mut self, cfg: &CcConfig, rate: Rate, now: u64) -> u32 {
        let cap = rate.cap(cfg);
        match self.last {
            None => self.tokens = cap,
            Some(last) if now > last => {
                self.tokens = self
                    .tokens
                    .saturating_add(rate.accrued(now - last))
                    .min(cap);
            }
            Some(_) => {}
        }
        self.last = Some(now.max(self.last.unwrap_or(0)));
        self.whole()
    }

    /// Whole packets in the bucket as last brought up to date.
    pub(crate) fn whole(&self) -> u32 {
        (self.tokens.max(0) / ONE).min(i64::from(u32::MAX)) as u32
    }

    /// `packets` left: their tokens are spent (the balance may go below zero, down to one
    /// bucket's worth of debt, which the next packets then wait out).
    pub(crate) fn spend(&mut self, cfg: &CcConfig, packets: u32) {
        if self.last.is_none() {
            return;
        }
        let floor = -(i64::from(cfg.pace_burst.max(1)) * ONE);
        self.tokens = self
            .tokens
            .saturating_sub(i64::from(packets) * ONE)
            .max(floor);
    }

    /// When the bucket will hold `need` whole packets, and at least a tick's worth (so that
    /// a device whose wake-ups are coarse is woken once per tick, not once per packet), or
    /// as much as it can hold; `None` when it holds that already (the QPs it wakes now spend
    /// it, and the first turned away asks again).
    pub(crate) fn ready_at(&self, cfg: &CcConfig, rate: Rate, need: u32) -> Option<u64> {
        let want = (i64::from(need.max(1)) * ONE)
            .max(rate.per_tick(cfg))
            .min(rate.cap(cfg).max(ONE));
        if self.tokens >= want {
            return None;
        }
        let last = self.last.unwrap_or(0);
        Some(last.saturating_add(rate.time_for(want - self.tokens).max(1)))
    }
}

/// The pace timers of an engine's paths: (deadline, path slot, path id). An entry whose path
/// is gone (another id in the slot) or was woken since is stale and ignored when it fires.
#[derive(Debug, Default)]
pub(crate) struct PaceTimers {
    heap: BinaryHeap<Reverse<(u64, u32, u64)>>,
}

impl PaceTimers {
    pub(crate) fn push(&mut self, at: u64, slot: u32, id: u64) {
        self.heap.push(Reverse((at, slot, id)));
    }

    pub(crate) fn next_deadline(&self) -> Option<u64> {
        self.heap.peek().map(|Reverse(e)| e.0)
    }

    pub(crate) fn pop_due(&mut self, now: u64) -> Option<(u64, u32, u64)> {
        if self.heap.peek().is_some_and(|Reverse(e)| e.0 <= now) {
            self.heap.pop().map(|Reverse(e)| e)
        } else {
            None
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(burst: u32, tick: u64) -> CcConfig {
        CcConfig {
            pace_burst: burst,
            pace_tick_ns: tick,
            ..CcConfig::default()
        }
    }

    /// 100 packets per 100 µs round trip: 1.25 packets per µs after slow start.
    const STEADY: Rate = Rate {
        cwnd: 100,
        srtt_ns: 100_000,
        slow_start: false,
        congested: true,
    };

    #[test]
    fn a_new_bucket_is_full_and_refills_at_five_quarters_of_the_window_per_round_trip() {
        let c = cfg(8, 0);
        let mut p = Pacer::default();
        assert_eq!(p.available(&c, STEADY, 1_000), 8);
        p.spend(&c, 8);
        assert_eq!(p.available(&c, STEADY, 1_000), 0);
        // 4 µs later: 5 packets accrued.
        assert_eq!(p.available(&c, STEADY, 5_000), 5);
        // Never more than the burst, however long it was idle.
        assert_eq!(p.available(&c, STEADY, 10_000_000_000), 8);
    }

    #[test]
    fn slow_start_paces_at_twice_the_window() {
        let c = cfg(64, 0);
        let rate = Rate {
            slow_start: true,
            ..STEADY
        };
        let mut p = Pacer::default();
        p.available(&c, rate, 0);
        p.spend(&c, 64);
        // 2 packets per µs.
        assert_eq!(p.available(&c, rate, 10_000), 20);
    }

    #[test]
    fn debt_is_waited_out_and_the_wake_up_waits_for_a_tick() {
        let c = cfg(8, 10_000);
        let mut p = Pacer::default();
        // A 10 µs tick holds 12.5 packets: the bucket holds that much, not just 8.
        assert_eq!(p.available(&c, STEADY, 0), 12);
        p.spend(&c, 12 + 20);
        // The debt stops at one burst below zero: 8 packets owed, then a tick's worth.
        assert_eq!(p.available(&c, STEADY, 0), 0);
        // Woken when a whole tick's worth is back (12.5 packets from 8 below zero: 20.5
        // packets at 1.25 per µs), not for the first packet.
        let at = p.ready_at(&c, STEADY, 1).unwrap();
        assert_eq!(at, 16_400);
        assert_eq!(p.available(&c, STEADY, at), 12);
    }

    #[test]
    fn ready_at_asks_for_what_the_waiting_qps_need() {
        let c = cfg(16, 0);
        let mut p = Pacer::default();
        p.available(&c, STEADY, 0);
        p.spend(&c, 16);
        // Four packets at 1.25 per µs: 3.2 µs.
        assert_eq!(p.ready_at(&c, STEADY, 4), Some(3_200));
        // A full bucket has nothing to wait for.
        let mut full = Pacer::default();
        full.available(&c, STEADY, 0);
        assert_eq!(full.ready_at(&c, STEADY, 4), None);
        // More than it can hold: it waits for a full bucket, no longer.
        assert_eq!(p.ready_at(&c, STEADY, 100), Some(12_800));
        assert_eq!(p.available(&c, STEADY, 3_200), 4);
        assert_eq!(p.available(&c, STEADY, 4_000), 5);
    }

    #[test]
    fn no_round_trip_no_congestion_or_no_burst_means_no_pacing() {
        let rate = Rate {
            srtt_ns: 0,
            ..STEADY
        };
        assert!(!Pacer::active(&cfg(8, 0), rate));
        let calm = Rate {
            congested: false,
            ..STEADY
        };
        assert!(!Pacer::active(&cfg(8, 0), calm));
        assert!(!Pacer::active(&cfg(0, 0), STEADY));
        assert!(Pacer::active(&cfg(8, 0), STEADY));
    }

    #[test]
    fn stale_timers_pop_in_deadline_order() {
        let mut t = PaceTimers::default();
        t.push(30, 0, 1);
        t.push(10, 1, 2);
        assert_eq!(t.next_deadline(), Some(10));
        assert_eq!(t.pop_due(5), None);
        assert_eq!(t.pop_due(30), Some((10, 1, 2)));
        assert_eq!(t.pop_due(30), Some((30, 0, 1)));
        assert_eq!(t.len(), 0);
    }
}

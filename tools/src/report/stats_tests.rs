//! Tests for the statistics, with values computed by hand.

use super::*;

const EPS: f64 = 1e-9;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < EPS * b.abs().max(1.0)
}

#[test]
fn percentile_index_formula() {
    // ceil(kept * p), clamped to the array.
    assert_eq!(percentile_index(1000, 0.99, 1002), 990);
    assert_eq!(percentile_index(1000, 0.999, 1002), 999);
    assert_eq!(percentile_index(100, 0.99, 102), 99);
    assert_eq!(percentile_index(100, 0.999, 102), 100);
    // kept = 10: ceil(9.9) = 10, one past the kept range (perftest reads it too).
    assert_eq!(percentile_index(10, 0.99, 12), 10);
    // Clamping: kept = len = 5 gives ceil(4.95) = 5, clamped to 4.
    assert_eq!(percentile_index(5, 0.99, 5), 4);
    assert_eq!(percentile_index(0, 0.99, 0), 0);
}

#[test]
fn latency_even_kept_count() {
    // 1..=12 shuffled; the two largest (11, 12) are set aside, kept = 1..=10.
    let samples = [
        7.0, 3.0, 12.0, 1.0, 5.0, 9.0, 2.0, 11.0, 4.0, 8.0, 6.0, 10.0,
    ];
    let st = latency_stats(&samples);
    assert_eq!(st.kept, 10);
    assert_eq!(st.t_min, 1.0);
    assert_eq!(st.t_max, 11.0, "sorted[kept] = second largest");
    assert_eq!(st.t_typical, 5.5, "median of 1..=10");
    assert_eq!(st.t_avg, 5.5);
    // Population variance of 1..=10 is 8.25.
    assert!(close(st.t_stdev, 8.25_f64.sqrt()));
    assert_eq!(st.p99, 11.0, "index ceil(9.9) = 10");
    assert_eq!(st.p99_9, 11.0, "index ceil(9.99) = 10");
}

#[test]
fn latency_odd_kept_count() {
    let samples = [200.0, 4.0, 1.0, 100.0, 3.0, 5.0, 2.0];
    let st = latency_stats(&samples);
    assert_eq!(st.kept, 5);
    assert_eq!(st.t_min, 1.0);
    assert_eq!(st.t_max, 100.0);
    assert_eq!(st.t_typical, 3.0);
    assert_eq!(st.t_avg, 3.0);
    assert!(close(st.t_stdev, 2.0_f64.sqrt()));
    assert_eq!(st.p99, 100.0, "index ceil(4.95) = 5");
    assert_eq!(st.p99_9, 100.0);
}

#[test]
fn latency_thousand_kept_samples() {
    let samples: Vec<f64> = (1..=1002).rev().map(f64::from).collect();
    let st = latency_stats(&samples);
    assert_eq!(st.kept, 1000);
    assert_eq!(st.t_min, 1.0);
    assert_eq!(st.t_max, 1001.0);
    assert_eq!(st.t_typical, 500.5);
    assert_eq!(st.t_avg, 500.5);
    // sqrt((n^2 - 1) / 12) for 1..=n.
    assert!(close(st.t_stdev, (999_999.0_f64 / 12.0).sqrt()));
    assert_eq!(st.p99, 991.0, "sorted[990]");
    assert_eq!(st.p99_9, 1000.0, "sorted[999]");
}

#[test]
fn latency_small_and_empty_inputs() {
    assert_eq!(latency_stats(&[]), LatencyStats::default());

    let one = latency_stats(&[4.0]);
    assert_eq!(
        one,
        LatencyStats {
            kept: 1,
            t_min: 4.0,
            t_max: 4.0,
            t_typical: 4.0,
            t_avg: 4.0,
            t_stdev: 0.0,
            p99: 4.0,
            p99_9: 4.0
        }
    );

    // Two samples: too few to drop anything.
    let two = latency_stats(&[3.0, 1.0]);
    assert_eq!(two.kept, 2);
    assert_eq!(
        (two.t_min, two.t_max, two.t_typical, two.t_avg),
        (1.0, 3.0, 2.0, 2.0)
    );
    assert_eq!(two.t_stdev, 1.0);
    assert_eq!(two.p99, 3.0);

    // Three samples: drop two, keep the smallest.
    let three = latency_stats(&[5.0, 1.0, 3.0]);
    assert_eq!(three.kept, 1);
    assert_eq!((three.t_min, three.t_max, three.t_typical), (1.0, 3.0, 1.0));
    assert_eq!(three.p99, 3.0, "index ceil(0.99) = 1");
}

#[test]
fn latency_ignores_non_finite_samples() {
    let st = latency_stats(&[f64::NAN, 2.0, f64::INFINITY, f64::NEG_INFINITY]);
    assert_eq!(st.kept, 1);
    assert_eq!(st.t_avg, 2.0);
    assert_eq!(latency_stats(&[f64::NAN]), LatencyStats::default());
}

#[test]
fn duration_latency_values() {
    let half = duration_latency(1_000_000, Duration::from_secs(2), true);
    assert_eq!(half.t_avg, 1.0);
    assert_eq!(half.tps, 500_000.0);
    let full = duration_latency(1_000_000, Duration::from_secs(2), false);
    assert_eq!(full.t_avg, 2.0);
    let none = duration_latency(0, Duration::from_secs(2), true);
    assert_eq!((none.t_avg, none.tps), (0.0, 0.0));
    let instant = duration_latency(10, Duration::ZERO, true);
    assert_eq!(
        (instant.iterations, instant.t_avg, instant.tps),
        (10, 0.0, 0.0)
    );
}

#[test]
fn bw_average_and_rate() {
    // 65536 B × 5000 in 1 s = 327 680 000 B/s = 312.5 MiB/s = 2.62144 Gb/s.
    let r = bw_result(65536, 5000, 1, Duration::from_secs(1), None, BwUnits::MiBps);
    assert_eq!(r.iterations, 5000);
    assert_eq!(r.bw_average, 312.5);
    assert_eq!(r.msg_rate_mpps, 0.005);
    assert_eq!(r.bw_peak, 0.0, "no marks: peak not measured");
    let g = bw_result(65536, 5000, 1, Duration::from_secs(1), None, BwUnits::Gbps);
    assert!(close(g.bw_average, 2.62144));

    // Two QPs double the messages counted.
    let q = bw_result(65536, 5000, 2, Duration::from_secs(1), None, BwUnits::MiBps);
    assert_eq!(
        (q.iterations, q.bw_average, q.msg_rate_mpps),
        (10_000, 625.0, 0.01)
    );

    let zero = bw_result(65536, 5000, 1, Duration::ZERO, Some(&[]), BwUnits::MiBps);
    assert_eq!(
        (zero.bw_peak, zero.bw_average, zero.msg_rate_mpps),
        (0.0, 0.0, 0.0)
    );
}

fn mark(ms: f64, messages: u64) -> CompletionMark {
    CompletionMark {
        at: Duration::from_secs_f64(ms / 1000.0),
        messages,
    }
}

#[test]
fn bw_peak_takes_fastest_interval() {
    // 4096-byte messages, a mark every 100 messages.
    // Intervals: 100 in 1 ms, 100 in 1 ms, 100 in 0.5 ms, 100 in 1.5 ms.
    // Fastest: 409 600 B / 0.5 ms = 819.2e6 B/s = 781.25 MiB/s.
    let marks = [
        mark(1.0, 100),
        mark(2.0, 200),
        mark(2.5, 300),
        mark(4.0, 400),
    ];
    assert!(close(bw_peak(4096, &marks, BwUnits::MiBps), 781.25));
    assert!(close(bw_peak(4096, &marks, BwUnits::Gbps), 6.5536));

    let r = bw_result(
        4096,
        400,
        1,
        Duration::from_millis(4),
        Some(&marks),
        BwUnits::MiBps,
    );
    assert!(close(r.bw_average, 390.625));
    assert!(r.bw_peak >= r.bw_average);

    // Order of the marks does not matter.
    let shuffled = [
        mark(2.5, 300),
        mark(1.0, 100),
        mark(4.0, 400),
        mark(2.0, 200),
    ];
    assert!(close(bw_peak(4096, &shuffled, BwUnits::MiBps), 781.25));
}

#[test]
fn bw_peak_edge_cases() {
    assert_eq!(bw_peak(4096, &[], BwUnits::MiBps), 0.0);
    assert_eq!(bw_peak(4096, &[mark(0.0, 100)], BwUnits::MiBps), 0.0);
    // A mark at the same time as the previous one joins the next interval:
    // (0,0)→(1 ms,100) and (1 ms,100)→(2 ms,200), both 100 per ms.
    let same_time = [mark(1.0, 100), mark(1.0, 150), mark(2.0, 200)];
    assert!(close(bw_peak(4096, &same_time, BwUnits::MiBps), 390.625));
    // A count going backwards is ignored.
    let backwards = [mark(1.0, 100), mark(1.5, 50), mark(2.0, 200)];
    assert!(close(bw_peak(4096, &backwards, BwUnits::MiBps), 390.625));
}

#[test]
fn latency_invariants_on_pseudo_random_samples() {
    let mut state: u64 = 42;
    for len in 0..200 {
        let samples: Vec<f64> = (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                (state >> 11) as f64 / (1u64 << 53) as f64 * 100.0
            })
            .collect();
        let st = latency_stats(&samples);
        let all = [
            st.t_min,
            st.t_max,
            st.t_typical,
            st.t_avg,
            st.t_stdev,
            st.p99,
            st.p99_9,
        ];
        assert!(all.iter().all(|x| x.is_finite()), "len {len}");
        if len > 0 {
            assert!(
                st.t_min <= st.t_typical && st.t_typical <= st.t_max,
                "len {len}"
            );
            assert!(st.t_min <= st.t_avg && st.t_avg <= st.t_max, "len {len}");
            assert!(st.t_typical <= st.p99 && st.p99 <= st.p99_9 && st.p99_9 <= st.t_max);
        }
    }
}

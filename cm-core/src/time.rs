//! CM time arithmetic as Linux does it (`cm_convert_to_ms`, `core/cm.c`). Every 5-bit timeout
//! field encodes
//! 4.096 µs·2^x; Linux rounds that to 2^(x−8) ms (at least 1 ms), and this CM does the same so
//! that its timers match a Linux peer's.

/// Nanoseconds in a millisecond.
pub const NS_PER_MS: u64 = 1_000_000;

/// The largest 5-bit timeout this CM takes from a peer: every timeout a MAD proposes (a REQ's
/// CM response timeouts and local ACK timeout, a REP's target ACK delay, an MRA's service
/// timeout) is clamped to it before it becomes a timer, a QP attribute or a TIMEWAIT. 23 is
/// 2^15 ms (32.8 s) by Linux's rounding, the largest exponent under the 60 s Linux's MAD
/// layer allows one retry interval (`IB_MAD_MAX_TIMEOUT_MS` in `drivers/infiniband/core/
/// mad.c`); unclamped, 31 is 2^23 ms, 2.3 hours.
pub const MAX_PEER_TIMEOUT: u8 = 23;

/// The longest this CM waits for a peer to answer one message, retransmissions included
/// (five minutes, Linux's `IB_MAD_MAX_DEADLINE` for a MAD and its retries): a REQ, REP, DREQ
/// or SIDR_REQ still unanswered then is given up whatever its interval and retry count, and a
/// connection request nobody answered is withdrawn by then. An MRA's service timeout extends
/// the wait it acknowledges, as Linux extends a MAD's deadline.
pub const MAX_WAIT_NS: u64 = 300_000 * NS_PER_MS;

/// A timeout a peer proposed, clamped to [`MAX_PEER_TIMEOUT`].
pub const fn from_peer(x: u8) -> u8 {
    if x > MAX_PEER_TIMEOUT {
        MAX_PEER_TIMEOUT
    } else {
        x
    }
}

/// Linux's `cm_convert_to_ms`: 2^max(x−8, 0) ms, `x` capped at 31.
pub const fn timeout_ms(x: u8) -> u64 {
    let x = if x > 31 { 31 } else { x };
    let shift = x.saturating_sub(8);
    1u64 << shift
}

/// [`timeout_ms`] in nanoseconds.
pub const fn timeout_ns(x: u8) -> u64 {
    timeout_ms(x) * NS_PER_MS
}

/// Linux's `cm_ack_timeout`: the local ACK timeout from the CA ACK delay and the packet life
/// time (about 2·PLT + ACK delay, as an exponent), capped at 31.
pub const fn ack_timeout(ca_ack_delay: u8, packet_life_time: u8) -> u8 {
    let t = packet_life_time.saturating_add(1);
    let r = if t >= ca_ack_delay {
        t + (ca_ack_delay >= packet_life_time) as u8
    } else {
        ca_ack_delay + (t >= ca_ack_delay.saturating_sub(1)) as u8
    };
    if r > 31 { 31 } else { r }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversion_matches_the_linux_table() {
        for (x, ms) in [
            (0, 1),
            (8, 1),
            (14, 64),
            (16, 256),
            (17, 512),
            (18, 1024),
            (20, 4096),
            (24, 65536),
            (31, 8_388_608),
            (40, 8_388_608),
        ] {
            assert_eq!(timeout_ms(x), ms, "x = {x}");
        }
        assert_eq!(timeout_ns(9), 2 * NS_PER_MS);
    }

    #[test]
    fn a_peers_timeout_is_clamped_under_a_minute() {
        assert_eq!(from_peer(31), 23);
        assert_eq!(from_peer(20), 20);
        assert_eq!(timeout_ms(from_peer(31)), 32_768);
        assert!(timeout_ms(from_peer(31)) < 60_000);
        assert!(timeout_ms(from_peer(31) + 1) > 60_000);
    }

    #[test]
    fn ack_timeout_matches_the_worked_examples() {
        assert_eq!(ack_timeout(15, 16), 17);
        assert_eq!(ack_timeout(15, 18), 19);
        assert_eq!(ack_timeout(0, 16), 17);
        assert_eq!(ack_timeout(31, 31), 31);
        // D > P+1: the ACK delay dominates, plus one when P+1 is within one of it.
        assert_eq!(ack_timeout(20, 16), 20);
        assert_eq!(ack_timeout(20, 18), 21);
    }
}

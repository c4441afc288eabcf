//! CM time arithmetic as Linux does it (facts §2.10). Every 5-bit timeout field encodes
//! 4.096 µs·2^x; Linux rounds that to 2^(x−8) ms (at least 1 ms), and this CM does the same so
//! that its timers match a Linux peer's.

/// Nanoseconds in a millisecond.
pub const NS_PER_MS: u64 = 1_000_000;

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

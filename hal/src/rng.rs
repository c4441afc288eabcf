//! Randomness for the identifiers a peer could guess, and the small seeded generator that
//! hands them out.
//!
//! A peer that can guess a memory key, a QP number, a starting PSN or a CM communication ID
//! can aim packets at a region, a QP or a connection it was never told about: everything
//! from the wire may come from such a peer. IBTA leaves these values to the
//! implementation (the memory keys of IBA 10.6, a QP's starting PSN, the CM's communication
//! IDs), so Portverbs draws them from the OS's randomness, as Linux does: rxe draws a fresh key
//! byte for every registration (`rxe_get_next_key` in `drivers/infiniband/sw/rxe/rxe_mr.c`), the
//! kernel CM XORs its IDs with a random operand (`drivers/infiniband/core/cm.c`) and rdma_cm
//! draws each starting PSN (`drivers/infiniband/core/cma.c`), and the C tools draw theirs with
//! `lrand48() & 0xffffff` (perftest, `ibv_rc_pingpong`).
//!
//! * [`os_random`] reads 64 bits from the OS (through the `getrandom` crate: the `getrandom`
//!   system call on Linux, `ProcessPrng` on Windows). It never panics: if the OS refuses, it
//!   falls back to the standard library's [`RandomState`] (keys the OS gave the thread earlier,
//!   or its own sources), mixed with a counter and the process's addresses, and counts the
//!   fallback ([`fallbacks`]) so that a device can say so.
//! * [`SplitMix64`] is the per-device generator: seeded once from [`os_random`], or from a seed
//!   the caller pins ([`seed`]), so that a deterministic run (the stepped fabric, a seeded test)
//!   gives the same keys and numbers every time.
//!
//! SplitMix64 is fast, not cryptographic: it makes identifiers that a peer cannot guess without
//! first seeing many of them, which is what a device can afford per registration and per QP.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};

/// SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA
/// 2014): 64 bits of state, passes BigCrush. It is written out here rather than taken from a
/// general purpose RNG crate on purpose: the simulation's promise is "same seed, same run"
/// across versions of Portverbs, which such a crate does not make across its own releases.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

/// The generator's increment (the odd integer nearest 2^64 divided by the golden ratio).
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A generator seeded from the OS ([`os_random`]).
    pub fn from_os() -> Self {
        Self(os_random())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        mix(self.0)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.unit() < p
    }

    /// Uniform in `[0, n)` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A random byte other than `last`: the key byte of a memory key whose slot is used again
    /// (rxe's rule: a fresh random byte, never the previous one, so that a stale key stops
    /// matching).
    pub fn other_byte(&mut self, last: u8) -> u8 {
        last.wrapping_add(1 + self.below(255) as u8)
    }

    /// A random 24-bit packet sequence number.
    pub fn psn(&mut self) -> u32 {
        (self.next_u64() & 0x00ff_ffff) as u32
    }
}

/// SplitMix64's output function.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The seed of a device's generator: `pinned` when the caller pins one (deterministic runs),
/// else 64 bits from the OS.
pub fn seed(pinned: Option<u64>) -> u64 {
    pinned.unwrap_or_else(os_random)
}

/// The seed of stream `stream` (a device's number …) under the run-wide seed `seed`: distinct
/// streams get unrelated seeds, and the same pair always the same one.
pub fn derive(seed: u64, stream: u64) -> u64 {
    mix(seed ^ mix(stream.wrapping_add(GAMMA)))
}

/// A random 24-bit starting PSN straight from the OS (for a QP whose device keeps no
/// generator of its own).
pub fn random_psn() -> u32 {
    (os_random() & 0x00ff_ffff) as u32
}

static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// 64 bits from the OS's randomness. Never panics: when the OS refuses (it should not; see
/// the module documentation), the bits come from [`RandomState`] instead and [`fallbacks`]
/// counts the time.
pub fn os_random() -> u64 {
    match getrandom::u64() {
        Ok(v) => v,
        Err(_) => fallback(),
    }
}

/// How many times [`os_random`] had to fall back because the OS refused (0 on every system
/// Portverbs supports; a device may report a non-zero count as a warning).
pub fn fallbacks() -> u64 {
    FALLBACKS.load(Ordering::Relaxed)
}

/// The fallback of [`os_random`]: std's per-thread random keys hashing a counter, the process
/// id and a stack address (ASLR). If even std cannot get keys (it panics then), the last
/// resort is the counter, id and address alone, mixed.
fn fallback() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    FALLBACKS.fetch_add(1, Ordering::Relaxed);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let here = 0u8;
    let addr = std::ptr::addr_of!(here) as usize as u64;
    let input = (n, std::process::id(), addr);
    std::panic::catch_unwind(|| RandomState::new().hash_one(input)).unwrap_or_else(|_| {
        mix(n ^ mix(
            u64::from(std::process::id()) ^ mix(addr ^ (fallback as *const () as usize as u64))
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence() {
        let mut a = SplitMix64::new(42);
        let mut b = SplitMix64::new(42);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(SplitMix64::new(1).next_u64(), SplitMix64::new(2).next_u64());
    }

    #[test]
    fn chance_matches_probability_roughly() {
        let mut r = SplitMix64::new(7);
        let hits = (0..100_000).filter(|_| r.chance(0.2)).count();
        assert!((19_000..21_000).contains(&hits), "{hits}");
        assert!(!SplitMix64::new(1).chance(0.0));
        assert!(r.below(10) < 10);
    }

    #[test]
    fn other_byte_never_repeats_the_last_and_reaches_every_other() {
        let mut r = SplitMix64::new(3);
        let mut seen = [false; 256];
        let mut last = 0u8;
        for _ in 0..20_000 {
            let b = r.other_byte(last);
            assert_ne!(b, last);
            seen[usize::from(b)] = true;
            last = b;
        }
        assert!(seen.iter().all(|&s| s), "every byte value comes up");
        assert!(r.psn() < 1 << 24);
    }

    #[test]
    fn the_os_gives_different_seeds_and_pinned_ones_stay() {
        // Three draws of 64 bits from the OS that agree would mean it gives no randomness.
        let (a, b, c) = (os_random(), os_random(), os_random());
        assert!(a != b || b != c, "{a:#x} {b:#x} {c:#x}");
        assert_eq!(seed(Some(5)), 5);
        assert_ne!(derive(5, 0), derive(5, 1));
        assert_eq!(derive(5, 1), derive(5, 1));
        assert_ne!(derive(5, 1), derive(6, 1));
        assert!(random_psn() < 1 << 24);
    }

    #[test]
    fn the_fallback_gives_different_values_and_is_counted() {
        let before = fallbacks();
        let (a, b) = (fallback(), fallback());
        assert_ne!(a, b);
        assert!(fallbacks() >= before + 2);
    }
}

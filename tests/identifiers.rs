//! Identifiers a peer could guess are not guessable: the memory keys
//! and QP numbers of every device come from a generator seeded from the OS's randomness, so
//! two devices (of one process or of two) start from different values, a key's byte changes
//! every time its slot is used again, and only a pinned seed (a stepped fabric's, or one the
//! configuration gives) makes them reproducible.
//!
//! Chance agreements are kept far below one in a million: keys are compared over several
//! registrations, QP numbers over a range of 2^18 (soft) or three devices (mlx4, whose range
//! is 1024 numbers).

use std::time::Duration;

use portverbs::mlx4::{CommandMode, Mlx4Config, Mlx4Device};
use portverbs::mlx4_model::{Mlx4Model, ModelConfig};
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric, SoftDevice};
use portverbs::verbs::ContextOptions;

/// Registrations compared per device.
const REGS: usize = 6;

/// A device's first registrations (their rkeys) and first QP numbers.
#[derive(Debug, PartialEq, Eq)]
struct Firsts {
    rkeys: Vec<u32>,
    qpns: Vec<u32>,
}

fn firsts(ctx: &Context) -> Firsts {
    let pd = ctx.alloc_pd_blocking().unwrap();
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let mrs: Vec<Mr> = (0..REGS)
        .map(|_| pd.reg_vec_blocking(vec![0u8; 64], access).unwrap())
        .collect();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 4,
            ..CqInit::default()
        })
        .unwrap();
    let qps: Vec<Qp> = (0..2)
        .map(|_| pd.create_qp_blocking(QpInit::new(QpType::Rc, &cq)).unwrap())
        .collect();
    Firsts {
        rkeys: mrs.iter().map(|m| m.rkey().unwrap()).collect(),
        qpns: qps.iter().map(Qp::qp_num).collect(),
    }
}

fn open(dev: AnyDevice) -> Context {
    Context::open_blocking(dev, ContextOptions::default()).unwrap()
}

fn soft(fabric: &Fabric, ip: &str, seed: Option<u64>) -> Context {
    let config = DeviceConfig {
        seed,
        ..DeviceConfig::with_ip(ip.parse().unwrap())
    };
    open(AnyDevice::Soft(SoftDevice::attach(fabric, config).unwrap()))
}

fn mlx4(fabric: &Fabric, i: usize, seed: Option<u64>) -> (Mlx4Model, Context) {
    let (model, function) = Mlx4Model::attach(
        fabric,
        ModelConfig {
            name: Some(format!("mlx4_model{i}")),
            ..ModelConfig::default()
        },
    )
    .unwrap();
    let ip: std::net::IpAddr = format!("10.0.1.{}", i + 1).parse().unwrap();
    let mut config = Mlx4Config::new(format!("mlx4_{i}"), vec![vec![Gid::from_ip(ip)]]);
    config.command_mode = CommandMode::Events;
    config.command_timeout = Duration::from_secs(5);
    config.seed = seed;
    let dev = Mlx4Device::open(function, config).expect("the mlx4 model opens");
    (model, open(AnyDevice::Mlx4(dev)))
}

/// The key bytes of the rkeys.
fn key_bytes(f: &Firsts) -> Vec<u8> {
    f.rkeys.iter().map(|k| *k as u8).collect()
}

/// Whether `v` goes up by one each time (wrapping), as a counter does.
fn counts_up(v: &[u8]) -> bool {
    v.windows(2).all(|w| w[1] == w[0].wrapping_add(1))
}

#[test]
fn two_soft_devices_start_from_different_keys_and_qp_numbers() {
    let fabric = Fabric::threaded();
    let a = firsts(&soft(&fabric, "10.0.2.1", None));
    let b = firsts(&soft(&fabric, "10.0.2.2", None));
    assert_ne!(key_bytes(&a), key_bytes(&b), "{a:x?} {b:x?}");
    assert_ne!(a.qpns[0], b.qpns[0], "{a:x?} {b:x?}");
    for f in [&a, &b] {
        assert!(
            f.rkeys.iter().all(|&k| k >> 8 != 0),
            "index 0 is never used"
        );
        assert!(!counts_up(&key_bytes(f)), "{f:x?}");
        assert!(
            f.qpns.iter().all(|&q| q > 1),
            "QP0 and QP1 stay special: {f:x?}"
        );
    }
}

#[test]
fn soft_devices_with_a_pinned_seed_repeat_their_keys_and_numbers() {
    let fabric = Fabric::threaded();
    let a = firsts(&soft(&fabric, "10.0.3.1", Some(7)));
    let b = firsts(&soft(&fabric, "10.0.3.2", Some(7)));
    let c = firsts(&soft(&fabric, "10.0.3.3", Some(8)));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn stepped_fabrics_derive_the_devices_seeds_from_their_own() {
    let run = |seed: u64| {
        let fabric = Fabric::stepped(seed);
        [
            firsts(&soft(&fabric, "10.0.4.1", None)),
            firsts(&soft(&fabric, "10.0.4.2", None)),
        ]
    };
    let (first, again, other) = (run(11), run(11), run(12));
    assert_eq!(first, again, "same seed, same identifiers");
    assert_ne!(first[0], first[1], "the devices of one fabric differ");
    assert_ne!(first, other);
}

#[test]
fn a_soft_key_changes_its_byte_every_time_its_slot_is_used_again() {
    let fabric = Fabric::threaded();
    let ctx = soft(&fabric, "10.0.5.1", None);
    key_bytes_change_on_reuse(&ctx);
}

#[test]
fn mlx4_devices_start_from_different_keys_and_qp_numbers() {
    let fabric = Fabric::threaded();
    let devs: Vec<_> = (0..3).map(|i| mlx4(&fabric, i, None)).collect();
    let f: Vec<Firsts> = devs.iter().map(|(_, ctx)| firsts(ctx)).collect();
    assert_ne!(key_bytes(&f[0]), key_bytes(&f[1]), "{f:x?}");
    assert!(
        f[0].qpns[0] != f[1].qpns[0] || f[1].qpns[0] != f[2].qpns[0],
        "{f:x?}"
    );
    for d in &f {
        assert!(!counts_up(&key_bytes(d)), "{d:x?}");
    }
}

#[test]
fn mlx4_devices_with_a_pinned_seed_repeat_their_keys_and_numbers() {
    let fabric = Fabric::threaded();
    let (_ma, a) = mlx4(&fabric, 0, Some(5));
    let (_mb, b) = mlx4(&fabric, 1, Some(5));
    let (_mc, c) = mlx4(&fabric, 2, Some(6));
    let (a, b, c) = (firsts(&a), firsts(&b), firsts(&c));
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn an_mlx4_key_changes_its_byte_every_time_its_slot_is_used_again() {
    let fabric = Fabric::threaded();
    let (_model, ctx) = mlx4(&fabric, 0, None);
    key_bytes_change_on_reuse(&ctx);
}

/// Registers and frees 64 MRs one after another: each reuses the one slot, and its key byte
/// is new every time and no counter.
fn key_bytes_change_on_reuse(ctx: &Context) {
    let pd = ctx.alloc_pd_blocking().unwrap();
    let mut keys = Vec::new();
    for _ in 0..64 {
        let mr = pd
            .reg_vec_blocking(vec![0u8; 64], AccessFlags::LOCAL_WRITE)
            .unwrap();
        keys.push(mr.lkey());
    }
    let index = keys[0] >> 8;
    assert!(keys.iter().all(|k| k >> 8 == index), "one slot: {keys:x?}");
    let bytes: Vec<u8> = keys.iter().map(|k| *k as u8).collect();
    assert!(bytes.windows(2).all(|w| w[0] != w[1]), "{bytes:x?}");
    assert!(!counts_up(&bytes), "{bytes:x?}");
}

/// The CM's communication IDs are the table slot XORed with a per-device salt (as Linux's CM
/// does with its random operand): the salts of devices opened together share no bits that a
/// clock would give them (the top bits of a nanosecond count barely move in a second).
#[test]
fn cm_devices_opened_together_salt_their_comm_ids_apart() {
    use portverbs::cm::service::{CmDevice, Connector};
    let fabric = Fabric::threaded();
    let ids: Vec<u32> = (0..8)
        .map(|i| {
            let ip = format!("10.0.6.{}", i + 1);
            let ctx = soft(&fabric, &ip, None);
            let cm = CmDevice::open_blocking(&ctx, ip.parse().unwrap()).unwrap();
            // The first endpoint of each device: the same slot, so the IDs differ by the salt.
            Connector::new(&cm).unwrap().cm_id().comm_id()
        })
        .collect();
    let tops: Vec<u32> = ids.iter().map(|id| id >> 28).collect();
    assert!(tops.windows(2).any(|w| w[0] != w[1]), "{ids:08x?}");
}

//! The test environment every conformance case runs in: two opened devices on one fabric, a
//! way to let the fabric settle, and helpers that bring QPs up with the IBTA masks pyverbs uses.
//! A backend joins the suite by providing an [`Env`] constructor; the cases are the same.
//!
//! When an `Env` is dropped (at the end of every test that did not panic) it checks that every
//! object the test created is gone: the contexts' counts and the devices' own counts return to
//! zero.

#![allow(dead_code)]

use std::time::Duration;

// The backends' devices themselves, before the facade wraps them: their `info` is the HAL's.
use portverbs::backends::hal::Device as _;
use portverbs::mlx4::{CommandMode, Mlx4Config, Mlx4Device};
use portverbs::mlx4_model::{Mlx4Model, ModelConfig};
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, EngineStats, Fabric, LinkFaults, ObjectCounts, SoftDevice};
use portverbs::verbs::{ContextOptions, PollError};

/// Which backend a case runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The software device on a stepped fabric.
    Soft,
    /// The mlx4 driver over the emulated HCA, on a stepped fabric.
    Mlx4,
    /// Two software devices, each on a stepped fabric of its own with a UDP port on a
    /// loopback address of its own: every packet crosses the kernel (Linux). The fabrics run
    /// in lock-step virtual time.
    Udp,
    /// Two UDP-bound software devices as applications make them, in manual progress: no
    /// thread, real time; settling dispatches both devices until every datagram sent was
    /// received and neither has a timer armed (Linux).
    UdpManual,
    /// The mlx4 driver on a real ConnectX-3 bound to vfio-pci (Linux; `#[ignore]`d cases).
    /// `PORTVERBS_MLX4_PCI` names the function (`0000:01:00.0`), `PORTVERBS_MLX4_IP` the
    /// port's RoCE address; both contexts open the same HCA and talk through its loopback.
    Mlx4Hw,
}

impl Backend {
    /// The driver name the devices report.
    pub fn driver(self) -> &'static str {
        match self {
            Self::Soft | Self::Udp | Self::UdpManual => "soft",
            Self::Mlx4 | Self::Mlx4Hw => "mlx4",
        }
    }
}

/// One device of the environment, with the controls tests use to inject faults and count
/// objects.
#[derive(Debug, Clone)]
pub enum DevCtl {
    Soft(SoftDevice),
    Mlx4 { model: Mlx4Model, dev: Mlx4Device },
    Mlx4Hw(Mlx4Device),
}

impl DevCtl {
    /// Live objects of the device.
    pub fn resources(&self) -> ObjectCounts {
        match self {
            Self::Soft(d) => d.resources(),
            // The device's own rings stay while it is open (no DMA regions counted); checked
            // when it closes.
            Self::Mlx4 { dev, .. } | Self::Mlx4Hw(dev) => dev.live(),
        }
    }

    /// Transport counters.
    pub fn engine_stats(&self) -> EngineStats {
        match self {
            Self::Soft(d) => d.engine_stats(),
            Self::Mlx4 { model, .. } => model.engine_stats(),
            Self::Mlx4Hw(_) => panic!("a real HCA has no transport counters to read"),
        }
    }

    /// The device's name.
    pub fn name(&self) -> String {
        match self {
            Self::Soft(d) => d.info().name.clone(),
            Self::Mlx4 { dev, .. } | Self::Mlx4Hw(dev) => dev.info().name.clone(),
        }
    }
}

/// The addresses of the two devices on the in-process backends.
const DEFAULT_IPS: [&str; 2] = ["10.0.0.1", "10.0.0.2"];

pub struct Env {
    pub backend: Backend,
    /// The fabric (of the first device, on the UDP backend: the clocks are kept equal).
    pub fabric: Fabric,
    pub devs: Vec<DevCtl>,
    /// The devices' addresses (their GID index 0).
    pub ips: [std::net::IpAddr; 2],
    ctxs: Vec<Context>,
    /// The UDP backend: the second fabric, the ports, and the lock-step driver.
    #[cfg(target_os = "linux")]
    udp: Option<UdpEnv>,
}

#[cfg(target_os = "linux")]
struct UdpEnv {
    other: Fabric,
    /// `None` in manual progress: settling dispatches the devices instead.
    lockstep: Option<portverbs::udp_port::Lockstep>,
    devices: Vec<portverbs::UdpDevice>,
    /// Manual progress: datagrams sent to the ports from outside them.
    foreign: std::cell::Cell<u64>,
}

/// Two loopback addresses no other environment of this process uses.
#[cfg(target_os = "linux")]
fn loopback_pair() -> [std::net::IpAddr; 2] {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let (x, y) = (100 + (n / 250) % 100, n % 250 + 1);
    [1u8, 2].map(|h| std::net::IpAddr::from([127, x as u8, y as u8, h]))
}

impl Env {
    /// Two soft devices (10.0.0.1, 10.0.0.2) on a stepped fabric.
    pub fn new(backend: Backend) -> Self {
        Self::with_faults(backend, 1, LinkFaults::NONE)
    }

    pub fn with_faults(backend: Backend, seed: u64, faults: LinkFaults) -> Self {
        match backend {
            Backend::Soft => {
                let fabric = Fabric::new(portverbs::soft::FabricConfig {
                    mode: portverbs::soft::Mode::Stepped,
                    seed,
                    faults,
                    capture: None,
                    bottleneck: None,
                });
                let devs: Vec<SoftDevice> = DEFAULT_IPS
                    .iter()
                    .map(|ip| {
                        SoftDevice::attach(&fabric, DeviceConfig::with_ip(ip.parse().unwrap()))
                            .unwrap()
                    })
                    .collect();
                let open = |d: &SoftDevice| {
                    Context::open_blocking(AnyDevice::Soft(d.clone()), ContextOptions::default())
                        .unwrap()
                };
                let ctxs = devs.iter().map(open).collect();
                Self {
                    backend,
                    fabric,
                    devs: devs.into_iter().map(DevCtl::Soft).collect(),
                    ips: DEFAULT_IPS.map(|ip| ip.parse().unwrap()),
                    ctxs,
                    #[cfg(target_os = "linux")]
                    udp: None,
                }
            }
            Backend::Mlx4Hw => Self::real_hca(faults),
            Backend::Udp => Self::udp(seed, faults),
            Backend::UdpManual => Self::udp_manual(faults),
            Backend::Mlx4 => {
                let fabric = Fabric::new(portverbs::soft::FabricConfig {
                    mode: portverbs::soft::Mode::Stepped,
                    seed,
                    faults,
                    capture: None,
                    bottleneck: None,
                });
                let mut devs = Vec::new();
                let mut ctxs = Vec::new();
                for (i, ip) in DEFAULT_IPS.iter().enumerate() {
                    let (model, function) = Mlx4Model::attach(
                        &fabric,
                        ModelConfig {
                            name: Some(format!("mlx4_model{i}")),
                            ..ModelConfig::default()
                        },
                    )
                    .unwrap();
                    let mut config = Mlx4Config::new(
                        format!("mlx4_{i}"),
                        vec![vec![Gid::from_ip(ip.parse().unwrap())]],
                    );
                    config.command_mode = CommandMode::Events;
                    config.command_timeout = Duration::from_secs(5);
                    // The driver's keys and QP numbers repeat with the fabric's seed, as the
                    // soft devices' do.
                    config.seed = Some(seed.wrapping_mul(1000).wrapping_add(i as u64));
                    let dev = Mlx4Device::open(function, config).expect("the mlx4 model opens");
                    ctxs.push(
                        Context::open_blocking(
                            AnyDevice::Mlx4(dev.clone()),
                            ContextOptions::default(),
                        )
                        .unwrap(),
                    );
                    devs.push(DevCtl::Mlx4 { model, dev });
                }
                Self {
                    backend,
                    fabric,
                    devs,
                    ips: DEFAULT_IPS.map(|ip| ip.parse().unwrap()),
                    ctxs,
                    #[cfg(target_os = "linux")]
                    udp: None,
                }
            }
        }
    }

    #[cfg(target_os = "linux")]
    fn real_hca(faults: LinkFaults) -> Self {
        assert_eq!(
            faults,
            LinkFaults::NONE,
            "a real HCA's link has no fault injection"
        );
        let addr = std::env::var("PORTVERBS_MLX4_PCI")
            .expect("set PORTVERBS_MLX4_PCI to the ConnectX-3's PCI address (bound to vfio-pci)");
        let ip = std::env::var("PORTVERBS_MLX4_IP")
            .expect("set PORTVERBS_MLX4_IP to an IP address for the port's RoCE GID");
        let mut config = Mlx4Config::new(
            "mlx4_hw",
            vec![vec![Gid::from_ip(ip.parse().expect("PORTVERBS_MLX4_IP"))]],
        );
        config.command_timeout = Duration::from_secs(60);
        let dev = Mlx4Device::open_vfio(&addr, config).expect("the ConnectX-3 opens");
        let open = || {
            Context::open_blocking(AnyDevice::Mlx4(dev.clone()), ContextOptions::default()).unwrap()
        };
        let ctxs = vec![open(), open()];
        Self {
            backend: Backend::Mlx4Hw,
            fabric: Fabric::stepped(0),
            devs: vec![DevCtl::Mlx4Hw(dev.clone()), DevCtl::Mlx4Hw(dev)],
            ips: [ip.parse().unwrap(); 2],
            ctxs,
            udp: None,
        }
    }

    #[cfg(target_os = "linux")]
    fn udp(seed: u64, faults: LinkFaults) -> Self {
        use portverbs::udp_port::{Lockstep, UdpConfig};
        let fabrics: Vec<Fabric> = (0..2u64)
            .map(|i| {
                Fabric::new(portverbs::soft::FabricConfig {
                    mode: portverbs::soft::Mode::Stepped,
                    seed: seed + 1000 * i,
                    faults,
                    capture: None,
                    bottleneck: None,
                })
            })
            .collect();
        let ips = loopback_pair();
        let devices: Vec<portverbs::UdpDevice> = ips
            .iter()
            .zip(&fabrics)
            .enumerate()
            .map(|(i, (ip, f))| {
                portverbs::udp_device_on(f, &format!("udp{i}"), UdpConfig::new(*ip))
                    .unwrap_or_else(|e| panic!("a UDP device on {ip}: {e}"))
            })
            .collect();
        let ports: Vec<&portverbs::udp_port::UdpPort> = devices.iter().map(|d| d.port()).collect();
        let lockstep = Lockstep::new(fabrics.clone(), &ports).unwrap();
        Self::of_udp(Backend::Udp, ips, devices, &fabrics, Some(lockstep))
    }

    /// The environment of two UDP-bound devices (`fabrics`: theirs, in order), each opened
    /// once.
    #[cfg(target_os = "linux")]
    fn of_udp(
        backend: Backend,
        ips: [std::net::IpAddr; 2],
        devices: Vec<portverbs::UdpDevice>,
        fabrics: &[Fabric],
        lockstep: Option<portverbs::udp_port::Lockstep>,
    ) -> Self {
        let ctxs = devices
            .iter()
            .map(|d| Context::open_blocking(d.any(), ContextOptions::default()).unwrap())
            .collect();
        let devs = devices
            .iter()
            .map(|d| DevCtl::Soft(d.device().clone()))
            .collect();
        Self {
            backend,
            fabric: fabrics[0].clone(),
            devs,
            ips,
            ctxs,
            udp: Some(UdpEnv {
                other: fabrics[1].clone(),
                lockstep,
                devices,
                foreign: std::cell::Cell::new(0),
            }),
        }
    }

    #[cfg(target_os = "linux")]
    fn udp_manual(faults: LinkFaults) -> Self {
        use portverbs::udp_port::UdpConfig;
        let ips = loopback_pair();
        let devices: Vec<portverbs::UdpDevice> = ips
            .iter()
            .enumerate()
            .map(|(i, ip)| {
                let mut config = UdpConfig::new(*ip);
                config.progress = portverbs::hal::Progress::Manual;
                portverbs::udp_device(&format!("udp{i}"), config)
                    .unwrap_or_else(|e| panic!("a UDP device on {ip}: {e}"))
            })
            .collect();
        let fabrics: Vec<Fabric> = devices
            .iter()
            .map(|d| d.device().fabric().clone())
            .collect();
        for f in &fabrics {
            f.set_faults(faults);
        }
        Self::of_udp(Backend::UdpManual, ips, devices, &fabrics, None)
    }

    /// Manual progress: dispatches both devices until, three rounds running, every datagram
    /// either port sent (and every one sent to them from outside) was received and neither
    /// device has a timer armed; `until` ends it sooner (real time).
    #[cfg(target_os = "linux")]
    fn dispatch_until_quiet(&self, u: &UdpEnv, until: Option<std::time::Instant>) {
        use std::time::Instant;
        let give_up = Instant::now() + Duration::from_secs(60);
        let mut quiet = 0;
        loop {
            let timers = self.ctxs.iter().filter_map(|c| c.dispatch()).min();
            let s: Vec<_> = u.devices.iter().map(|d| d.port().stats()).collect();
            // A datagram to a multicast group is received once per other member here.
            let sent = s[0].expected_peer_rx() + s[1].expected_peer_rx() + u.foreign.get();
            let received = s[0].rx_packets + s[1].rx_packets;
            if until.is_some_and(|t| Instant::now() >= t) {
                return;
            }
            if received >= sent && timers.is_none() {
                quiet += 1;
                if quiet >= 3 && until.is_none() {
                    return;
                }
            } else {
                quiet = 0;
            }
            assert!(
                Instant::now() < give_up,
                "the manual devices do not settle: {s:?}"
            );
            if let Some(t) = timers {
                // Nothing to do until the next timer: sleep a little toward it.
                let left = t.saturating_duration_since(Instant::now());
                if received >= sent && !left.is_zero() {
                    std::thread::sleep(left.min(Duration::from_millis(1)));
                }
            }
            std::thread::yield_now();
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn udp(_seed: u64, _faults: LinkFaults) -> Self {
        panic!("the UDP port is Linux-only");
    }

    #[cfg(not(target_os = "linux"))]
    fn udp_manual(_faults: LinkFaults) -> Self {
        panic!("the UDP port is Linux-only");
    }

    #[cfg(not(target_os = "linux"))]
    fn real_hca(_faults: LinkFaults) -> Self {
        panic!("VFIO is Linux-only");
    }

    /// The first device.
    pub fn a(&self) -> &Context {
        &self.ctxs[0]
    }

    /// The second device.
    pub fn b(&self) -> &Context {
        &self.ctxs[1]
    }

    /// Lets every packet, timer and completion in flight run to the end.
    pub fn settle(&self) {
        #[cfg(target_os = "linux")]
        if let Some(u) = &self.udp {
            match &u.lockstep {
                Some(l) => l.run_until_idle().expect("the fabrics settle"),
                None => self.dispatch_until_quiet(u, None),
            }
            return;
        }
        match self.backend {
            Backend::Mlx4Hw => std::thread::sleep(Duration::from_millis(20)),
            _ => self.fabric.run_until_idle().expect("the fabric settles"),
        }
    }

    /// Lets the fabric run for `ns` of virtual time.
    pub fn run_for(&self, ns: u64) {
        #[cfg(target_os = "linux")]
        if let Some(u) = &self.udp {
            match &u.lockstep {
                Some(l) => l.run_for(ns).unwrap(),
                None => self.dispatch_until_quiet(
                    u,
                    Some(std::time::Instant::now() + Duration::from_nanos(ns)),
                ),
            }
            return;
        }
        match self.backend {
            Backend::Mlx4Hw => std::thread::sleep(Duration::from_nanos(ns)),
            _ => self.fabric.run_for(ns).unwrap(),
        }
    }

    /// Settles, then polls until `n` completions arrived or nothing more comes.
    pub fn poll(&self, cq: &Cq, n: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let mut wc = [WorkCompletion::default(); 16];
        for _ in 0..4 {
            self.settle();
            loop {
                let got = cq.poll(&mut wc).expect("poll");
                out.extend_from_slice(&wc[..got]);
                if got == 0 {
                    break;
                }
            }
            if out.len() >= n {
                break;
            }
        }
        out
    }

    /// Settles and polls, returning an error the CQ reported.
    pub fn try_poll(&self, cq: &Cq) -> Result<Vec<WorkCompletion>, PollError> {
        self.settle();
        let mut out = Vec::new();
        let mut wc = [WorkCompletion::default(); 16];
        loop {
            let got = cq.poll(&mut wc)?;
            out.extend_from_slice(&wc[..got]);
            if got == 0 {
                return Ok(out);
            }
        }
    }

    /// Device fault: QP `qpn` of device `dev` (0 or 1) suffers a catastrophic error.
    pub fn inject_qp_fatal(&self, dev: usize, qpn: u32) {
        match &self.devs[dev] {
            DevCtl::Soft(d) => d.inject_qp_fatal(qpn),
            DevCtl::Mlx4 { model, .. } => model.inject_qp_fatal(qpn),
            DevCtl::Mlx4Hw(_) => panic!("a real HCA has no fault injection"),
        }
    }

    /// Device fault: port `port` of device `dev` goes down or comes back up.
    pub fn set_port_active(&self, dev: usize, port: u8, active: bool) {
        match &self.devs[dev] {
            DevCtl::Soft(d) => d.set_port_active(port, active),
            DevCtl::Mlx4 { model, .. } => model.set_port_active(port, active),
            DevCtl::Mlx4Hw(_) => panic!("a real HCA has no fault injection"),
        }
    }

    /// Device fault: device `dev` fails catastrophically.
    pub fn inject_device_fatal(&self, dev: usize) {
        match &self.devs[dev] {
            DevCtl::Soft(d) => d.inject_fatal(),
            DevCtl::Mlx4 { model, .. } => model.catastrophic_error(),
            DevCtl::Mlx4Hw(_) => panic!("a real HCA has no fault injection"),
        }
    }

    /// Changes link behaviour (loss, duplication …) on the fabric.
    pub fn set_faults(&self, faults: LinkFaults) {
        self.fabric.set_faults(faults);
        #[cfg(target_os = "linux")]
        if let Some(u) = &self.udp {
            u.other.set_faults(faults);
        }
    }

    /// The UDP backend: the UDP address of device `dev`'s port (`None` on the in-process
    /// backends).
    pub fn udp_addr(&self, dev: usize) -> Option<std::net::SocketAddr> {
        #[cfg(target_os = "linux")]
        if let Some(u) = &self.udp {
            return u.devices.get(dev).map(|d| d.port().local_addr());
        }
        let _ = dev;
        None
    }

    /// The UDP backend: device `dev`'s port counters.
    #[cfg(target_os = "linux")]
    pub fn udp_stats(&self, dev: usize) -> Option<portverbs::udp_port::UdpStats> {
        self.udp
            .as_ref()
            .and_then(|u| u.devices.get(dev))
            .map(|d| d.port().stats())
    }

    /// The UDP backend: `n` datagrams were sent to the ports from outside them (a hostile
    /// peer's raw socket); settling waits for them too. Nothing on the in-process backends.
    pub fn expect_foreign(&self, n: u64) {
        #[cfg(target_os = "linux")]
        if let Some(u) = &self.udp {
            match &u.lockstep {
                Some(l) => l.expect_foreign(n),
                None => u.foreign.set(u.foreign.get() + n),
            }
        }
        let _ = n;
    }

    /// The GID of context `ctx` (index 0 of port 1).
    pub fn gid(ctx: &Context) -> Gid {
        ctx.query_gid_blocking(1, 0).unwrap().gid
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        for ctx in &self.ctxs {
            let counts = ctx.object_counts();
            assert!(
                counts.is_zero(),
                "objects leaked on {}: {counts:?}",
                ctx.name()
            );
        }
        // Dropping the contexts releases their event queues; then the devices must be empty.
        self.ctxs.clear();
        for d in &self.devs {
            let r = d.resources();
            assert!(
                r.is_zero(),
                "device resources left after the test: {r:?} ({} packets in flight)",
                self.fabric.in_flight()
            );
        }
        // An mlx4 device closes when its last handle goes: then the HCA must hold nothing
        // (no object, no ICM, no firmware area, no DMA region).
        let models: Vec<Mlx4Model> = self
            .devs
            .drain(..)
            .filter_map(|d| match d {
                DevCtl::Mlx4 { model, .. } => Some(model),
                DevCtl::Soft(_) | DevCtl::Mlx4Hw(_) => None,
            })
            .collect();
        for m in models {
            let c = m.counts();
            assert!(
                c.is_clear(),
                "{} holds resources after close: {c:?}",
                m.name()
            );
        }
    }
}

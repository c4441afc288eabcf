//! The test environment every conformance case runs in: two opened devices on one fabric, a
//! way to let the fabric settle, and helpers that bring QPs up with the IBTA masks pyverbs uses.
//! A backend joins the suite by providing an [`Env`] constructor; the cases are the same.
//!
//! When an `Env` is dropped (at the end of every test that did not panic) it checks that every
//! object the test created is gone: the contexts' counts and the devices' own counts return to
//! zero.

#![allow(dead_code)]

use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric, LinkFaults, SoftDevice};
use portverbs::verbs::{ContextOptions, PollError};

/// Which backend a case runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The software device on a stepped fabric.
    Soft,
}

pub struct Env {
    pub backend: Backend,
    pub fabric: Fabric,
    pub devs: Vec<SoftDevice>,
    ctxs: Vec<Context>,
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
                });
                let devs: Vec<SoftDevice> = ["10.0.0.1", "10.0.0.2"]
                    .iter()
                    .map(|ip| {
                        fabric
                            .add_device(DeviceConfig::with_ip(ip.parse().unwrap()))
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
                    devs,
                    ctxs,
                }
            }
        }
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
        self.fabric.run_until_idle().expect("the fabric settles");
    }

    /// Lets the fabric run for `ns` of virtual time.
    pub fn run_for(&self, ns: u64) {
        self.fabric.run_for(ns).unwrap();
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
        match self.backend {
            Backend::Soft => self.devs[dev].inject_qp_fatal(qpn),
        }
    }

    /// Device fault: port `port` of device `dev` goes down or comes back up.
    pub fn set_port_active(&self, dev: usize, port: u8, active: bool) {
        match self.backend {
            Backend::Soft => self.devs[dev].set_port_active(port, active),
        }
    }

    /// Device fault: device `dev` fails catastrophically.
    pub fn inject_device_fatal(&self, dev: usize) {
        match self.backend {
            Backend::Soft => self.devs[dev].inject_fatal(),
        }
    }

    /// Changes link behaviour (loss, duplication …) on the fabric.
    pub fn set_faults(&self, faults: LinkFaults) {
        self.fabric.set_faults(faults);
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
    }
}

//! The soft device on the fabric: its configuration, and its node — the engine with the
//! device side that the fabric steps ([`EngineNode`], around the soft [`DeviceSide`]).

use std::net::IpAddr;
use std::sync::atomic::Ordering;

use portverbs_fabric::{DeviceSide, EngineNode};
use portverbs_hal::types::Mtu;
use portverbs_transport::CcConfig;

use super::doorbell::KickKind;
use super::hw::Hw;
use super::state::DevState;
use crate::engine::{Engine, Packet};

/// One port of a soft device.
#[derive(Debug, Clone)]
pub struct PortConfig {
    /// Addresses of the port; each becomes a RoCEv2 GID (index = position).
    pub addrs: Vec<IpAddr>,
    /// Active MTU.
    pub mtu: Mtu,
}

/// A soft device to put on a fabric ([`super::SoftDevice::attach`]).
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Name; `softN` by default (N counts the soft devices on the fabric).
    pub name: Option<String>,
    /// Ports (at least one).
    pub ports: Vec<PortConfig>,
    /// Seed of the device's memory keys and QP numbers (`portverbs_hal::rng`). `None`, the
    /// default: the fabric's choice ([`portverbs_fabric::Joining::seed`]: drawn from the OS
    /// on a free-running fabric, derived from a stepped fabric's seed). `Some` pins it, so that
    /// a test can repeat the device's identifiers exactly.
    pub seed: Option<u64>,
    /// Congestion control of the device's transport ([`CcConfig`]). `None`, the default: on,
    /// with ECN — [`CcConfig::default`] on a stepped fabric, whose virtual clock is exact,
    /// and [`CcConfig::host_sockets`] on a free-running or manual one, which runs on the
    /// host's clock and its scheduling noise (no delay target, probe timeouts of at least
    /// 500 µs). `Some(CcConfig { enabled: false, .. })` lets every RC QP keep its whole PSN
    /// window in flight, as the transport did before it had a congestion window.
    pub congestion: Option<CcConfig>,
}

impl DeviceConfig {
    /// One port with one address and a 4096-byte MTU.
    pub fn with_ip(ip: IpAddr) -> Self {
        Self {
            name: None,
            ports: vec![PortConfig {
                addrs: vec![ip],
                mtu: Mtu::Mtu4096,
            }],
            seed: None,
            congestion: None,
        }
    }
}

/// One soft device on the fabric: its engine, its view of the rings ([`Hw`]), its bookkeeping
/// ([`DevState`]). The fabric owns it behind its lock; the [`super::SoftDevice`] handle reaches
/// it through [`portverbs_fabric::NodeHandle::with`].
pub(crate) type SimDevice = EngineNode<Hw, DevState>;

impl DeviceSide for Hw {
    /// `what` is a [`KickKind`]: a QP's send doorbell, or a CQ's arming.
    fn kick(&mut self, engine: &mut Engine, now: u64, what: u32, out: &mut Vec<Packet>) {
        match KickKind::decode(what) {
            KickKind::Qp(qpn) => {
                if let Some(qp) = self.qps.get(qpn) {
                    // A read-modify-write, not a plain store: it orders this clear before the
                    // head read below against the host's head store and `scheduled` swap
                    // (a store could pass the head load, and a post seeing `scheduled` still
                    // set would then be lost until the next kick).
                    qp.sq.db.scheduled.swap(false, Ordering::AcqRel);
                }
                engine.doorbell(now, qpn, self, out);
            }
            KickKind::Cq(cqn) => self.check_arm(cqn),
        }
    }

    fn rescan(&mut self, engine: &mut Engine, now: u64, out: &mut Vec<Packet>) {
        let qpns: Vec<u32> = self.qps.iter_mut().map(|(n, _)| n).collect();
        for qpn in qpns {
            engine.doorbell(now, qpn, self, out);
        }
        let cqns: Vec<u32> = self.cqs.iter_mut().map(|(n, _)| n).collect();
        for cqn in cqns {
            self.check_arm(cqn);
        }
    }
}

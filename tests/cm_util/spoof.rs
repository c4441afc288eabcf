//! A lying peer for the CM tests: a node of its own on a fabric ([`Spoofer`]) that puts
//! crafted MADs on the wire to a device's QP1 under any source GID, as a host that forges its
//! IP source address can, and records what comes back to the addresses it owns. Also the CM
//! of a soft device of its own on such a fabric, and builders for the MADs a liar sends.

#![allow(dead_code, unreachable_pub)]

use std::net::IpAddr;
use std::time::{Duration, Instant};

use portverbs::cm::service::CmDevice;
use portverbs::cm::wire::{
    CMA_HEADER_LEN, CmMessage, CmaHeader, Dreq, Mad, PortSpace, Req, ReqPath, Rtu, service_id,
};
use portverbs::hal::Gid;
use portverbs::soft::{DeviceConfig, Fabric, SoftDevice};
use portverbs_fabric::{Node, NodeConfig, NodeHandle};
use portverbs_transport::{Packet, PayloadData};
use portverbs_wire::{Bth, Deth, Opcode, TransportHdr};

use crate::cm_util::Dev;

/// QP1's Q_Key, the well-known Q_Key of the General Services Interface.
pub const GSI_QKEY: u32 = 0x8001_0000;

/// What came back to an address the liar owns.
#[derive(Debug, Clone)]
pub struct Heard {
    /// The address it was sent to.
    pub to: Gid,
    /// Its source address.
    pub from: Gid,
    /// The UD payload (a MAD).
    pub mad: Vec<u8>,
}

impl Heard {
    /// The MAD, parsed.
    pub fn parsed(&self) -> Option<Mad> {
        Mad::parse(&self.mad).ok()
    }
}

/// The liar's node: no queues, no engine; what it sends is made by the test.
#[derive(Debug, Default)]
pub struct Liar {
    heard: Vec<Heard>,
}

impl Node for Liar {
    fn kick(&mut self, _now: u64, _what: u32, _out: &mut Vec<Packet>) {}

    fn rescan(&mut self, _now: u64, _out: &mut Vec<Packet>) {}

    fn run_work(&mut self, _now: u64, _out: &mut Vec<Packet>) -> bool {
        false
    }

    fn receive(&mut self, _now: u64, _port: u8, pkt: &Packet, _out: &mut Vec<Packet>) {
        let mut mad = vec![0u8; pkt.payload.len()];
        if pkt.payload.read(0, &mut mad).is_ok() {
            self.heard.push(Heard {
                to: pkt.dst_gid,
                from: pkt.src_gid,
                mad,
            });
        }
    }

    fn run_timers(&mut self, _now: u64, _out: &mut Vec<Packet>) -> bool {
        false
    }

    fn next_deadline(&self) -> Option<u64> {
        None
    }

    fn set_max_train(&mut self, _n: u32) {}
}

/// A host on the fabric that sends UD datagrams to QP1 from "QP1" under whatever source
/// address it likes.
pub struct Spoofer {
    node: NodeHandle<Liar>,
    psn: std::cell::Cell<u32>,
}

impl Spoofer {
    /// Puts the liar on `fabric`, owning `addrs` (what is sent to them comes back to it;
    /// replies to the other addresses it forges are lost on the fabric).
    pub fn attach(fabric: &Fabric, addrs: &[&str]) -> Self {
        let routes = addrs.iter().map(|a| (1u8, gid(a))).collect::<Vec<_>>();
        let node = fabric
            .attach("liar", |_| {
                (
                    NodeConfig {
                        name: "liar".into(),
                        routes,
                    },
                    Liar::default(),
                )
            })
            .expect("the liar joins the fabric");
        Self {
            node,
            psn: std::cell::Cell::new(0),
        }
    }

    /// Sends `bytes` (a MAD, or fewer bytes) from `from`'s QP1 to `to`'s QP1.
    pub fn send(&self, from: Gid, to: Gid, bytes: &[u8]) {
        let psn = self.psn.get();
        self.psn.set(psn.wrapping_add(1) & 0x00FF_FFFF);
        let mut hdr = TransportHdr::new(Bth::new(Opcode::UdSendOnly, 1, psn));
        hdr.bth.pad_count = ((4 - bytes.len() % 4) % 4) as u8;
        hdr.deth = Some(Deth {
            qkey: GSI_QKEY,
            src_qp: 1,
        });
        let pkt = Packet::new(from, to, hdr, PayloadData::from_slice(bytes));
        self.node.with(|ctx| ctx.out.push(pkt));
    }

    /// What came back since the last call.
    pub fn heard(&self) -> Vec<Heard> {
        self.node.with(|ctx| std::mem::take(&mut ctx.node.heard))
    }
}

/// The GID of an IP address.
pub fn gid(ip: &str) -> Gid {
    Gid::from_ip(ip.parse::<IpAddr>().expect("an IP address"))
}

/// The CM of a soft device of its own on `fabric`, at `ip`.
pub fn cm_on(fabric: &Fabric, ip: &str) -> Dev {
    let ip: IpAddr = ip.parse().expect("an IP address");
    let dev = SoftDevice::attach(fabric, DeviceConfig::with_ip(ip)).expect("attach");
    let ctx = portverbs::open(portverbs::AnyDevice::Soft(dev)).expect("open");
    CmDevice::open_blocking(&ctx, ip).expect("the CM opens")
}

/// Drives `dev` until its QP1 has received `count` MADs in all.
pub fn pump_until_received(dev: &Dev, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while dev.mad_counts().received < count {
        dev.progress().expect("progress");
        assert!(
            Instant::now() < deadline,
            "QP1 received {} of {count} MADs",
            dev.mad_counts().received
        );
        std::thread::yield_now();
    }
    dev.progress().expect("progress");
}

/// A DREQ for the connection whose sender's ID is `local` and receiver's `remote` (QPN
/// `remote_qpn`), with transaction ID `tid`.
pub fn dreq(tid: u64, local: u32, remote: u32, remote_qpn: u32) -> [u8; 256] {
    Mad::new(
        tid,
        CmMessage::Dreq(Dreq {
            local_comm_id: local,
            remote_comm_id: remote,
            remote_qpn,
            private_data: [0; 220],
        }),
    )
    .emit()
}

/// An RTU that matches nothing.
pub fn rtu(tid: u64, local: u32, remote: u32) -> [u8; 256] {
    Mad::new(
        tid,
        CmMessage::Rtu(Rtu {
            local_comm_id: local,
            remote_comm_id: remote,
            private_data: [0; 224],
        }),
    )
    .emit()
}

/// The timers a REQ proposes (5-bit exponents, 4.096 µs·2^x) and its retries.
#[derive(Debug, Clone, Copy)]
pub struct ReqTimers {
    /// How long the sender gives the receiver to answer (its REQ retransmission interval,
    /// with two packet life times).
    pub remote_cm_response_timeout: u8,
    /// How long the sender takes to answer the REP (the receiver's REP retransmission
    /// interval).
    pub local_cm_response_timeout: u8,
    /// The path's local ACK timeout (the receiver's QP timeout and TIMEWAIT).
    pub local_ack_timeout: u8,
    /// Max CM retries (4 bits).
    pub max_cm_retries: u8,
}

impl ReqTimers {
    /// rdma_cm's values: 20, 20, 17 (PLT 16), 15 retries.
    pub const RDMA_CM: Self = Self {
        remote_cm_response_timeout: 20,
        local_cm_response_timeout: 20,
        local_ack_timeout: 17,
        max_cm_retries: 15,
    };

    /// Every timeout at its largest (31: 2^23 ms by Linux's rounding, 2.3 hours), 15
    /// retries.
    pub const LONGEST: Self = Self {
        remote_cm_response_timeout: 31,
        local_cm_response_timeout: 31,
        local_ack_timeout: 31,
        max_cm_retries: 15,
    };
}

/// An rdma_cm REQ (`RDMA_PS_TCP`, with the CMA header) as someone at `src` would send it.
#[derive(Debug, Clone, Copy)]
pub struct ForgedReq {
    /// The sender's communication ID.
    pub local: u32,
    /// The sender's CA GUID.
    pub guid: u64,
    /// The sender's QPN.
    pub qpn: u32,
    /// The address in the CMA header and the path's local GID.
    pub src: IpAddr,
    /// The listener's address.
    pub dst: IpAddr,
    /// The listener's port.
    pub port: u16,
    /// The timers it proposes.
    pub timers: ReqTimers,
}

impl ForgedReq {
    /// The MAD, with transaction ID `tid`.
    pub fn mad(&self, tid: u64) -> [u8; 256] {
        let (src, dst) = (self.src, self.dst);
        let mut private_data = [0u8; 92];
        CmaHeader {
            src_port: 0xC123,
            src,
            dst,
        }
        .emit(&mut private_data[..CMA_HEADER_LEN])
        .expect("a CMA header");
        let t = self.timers;
        Mad::new(
            tid,
            CmMessage::Req(Req {
                local_comm_id: self.local,
                vendor_id: 0,
                service_id: service_id(PortSpace::Tcp, self.port),
                local_ca_guid: self.guid,
                local_qkey: 0,
                local_qpn: self.qpn,
                responder_resources: 1,
                local_eecn: 0,
                initiator_depth: 1,
                remote_eecn: 0,
                remote_cm_response_timeout: t.remote_cm_response_timeout,
                transport: 0,
                end_to_end_flow_control: false,
                starting_psn: 0x1234,
                local_cm_response_timeout: t.local_cm_response_timeout,
                retry_count: 7,
                pkey: 0xFFFF,
                path_mtu: 3,
                rdc_exists: false,
                rnr_retry_count: 7,
                max_cm_retries: t.max_cm_retries,
                srq: false,
                extended_transport: 0,
                primary: ReqPath {
                    local_lid: 0xFFFF,
                    remote_lid: 0xFFFF,
                    local_gid: Gid::from_ip(src),
                    remote_gid: Gid::from_ip(dst),
                    flow_label: 0,
                    packet_rate: 0,
                    traffic_class: 0,
                    hop_limit: 64,
                    sl: 0,
                    subnet_local: false,
                    local_ack_timeout: t.local_ack_timeout,
                },
                alternate: ReqPath::default(),
                sap_supported: false,
                private_data,
            }),
        )
        .emit()
    }
}

/// A thread that drives a device's CM while it lives (the CM has no thread of its own: a
/// device nobody calls does not answer).
pub struct Driver {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Driver {
    /// Starts driving `dev`.
    pub fn start(dev: &Dev) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let (dev, flag) = (dev.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                dev.progress().expect("progress");
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits (at most 30 s, driving nothing itself) until `what` holds.
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

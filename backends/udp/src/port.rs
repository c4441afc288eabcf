//! The port: its configuration, its node on the fabric (which sends and, since it is stepped
//! by whoever progresses the fabric, receives too), and the handle that owns it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use portverbs_fabric::{
    CaptureError, CaptureStats, Fabric, FabricError, Fate, LinkFaults, Node, NodeConfig,
    NodeHandle, PcapCapture, SplitMix64, corrupt_packet,
};
use portverbs_hal::Progress;
use portverbs_hal::types::{Gid, Mtu};
use portverbs_transport::{CcConfig, Packet};
use thiserror::Error;

use crate::io::UdpIo;
use crate::mcast::McastRx;
use crate::rx::{self, Rx};
use crate::stats::{Counters, UdpStats, add};
use crate::sys;
use crate::tx::{Sockets, TxQueue};

/// How a [`UdpPort`] is set up.
#[derive(Debug, Clone)]
pub struct UdpConfig {
    /// The address to own (IPv4 or IPv6); a software device on the same fabric takes its GID.
    pub addr: IpAddr,
    /// The UDP port to listen on and to send to (4791, RoCEv2's; tests may pick another).
    pub port: u16,
    /// Name on the fabric (`udpN` by default).
    pub name: Option<String>,
    /// Use UDP GSO and GRO where the kernel has them.
    pub offload: bool,
    /// Most flow-label source ports to open sockets for (see the crate docs).
    pub max_source_ports: usize,
    /// Socket buffer to ask for, in bytes.
    pub socket_buffer: usize,
    /// Faults injected into outgoing packets (none by default): the fabric's link-fault
    /// model ([`LinkFaults`]), applied as the port hands packets to its sockets.
    pub faults: LinkFaults,
    /// Seed of the generator that draws the faults' decisions, so that a run can be repeated.
    pub fault_seed: u64,
    /// Who makes the device progress (auto by default): one progress thread that receives,
    /// runs the transport and the agents, and sends; or the application's calls
    /// ([`Progress`]). Read by the facade's `udp_device`, which makes the fabric of that
    /// mode; a port joining a fabric of the caller's follows the fabric's mode.
    pub progress: Progress,
    /// Congestion control of the software device on this address ([`CcConfig`]; on by
    /// default, reacting to loss and ECN but not to round trips:
    /// [`CcConfig::host_sockets`]). Read by the facade's `udp_device`, which makes the
    /// device; the port itself carries packets as they come.
    pub congestion: CcConfig,
}

impl UdpConfig {
    /// RoCEv2 on `addr`, UDP port 4791, offloads on, no faults.
    pub fn new(addr: IpAddr) -> Self {
        Self {
            addr,
            port: portverbs_wire::ROCEV2_UDP_PORT,
            name: None,
            offload: true,
            max_source_ports: 64,
            socket_buffer: 8 << 20,
            faults: LinkFaults::NONE,
            fault_seed: 0,
            progress: Progress::default(),
            congestion: CcConfig::host_sockets(),
        }
    }
}

/// Why a port could not be made.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum UdpError {
    /// The socket could not be bound (address not local, port taken …).
    #[error("binding UDP {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A socket option could not be set.
    #[error("configuring the UDP socket: {0}")]
    Socket(#[source] std::io::Error),
    /// The fabric refused the port.
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// The running capture of a port (shared by the port's handle and its node).
#[derive(Debug, Default)]
pub(crate) struct CaptureSlot {
    capture: Option<PcapCapture<BufWriter<File>>>,
    failure: Option<CaptureError>,
}

impl CaptureSlot {
    pub(crate) fn is_running(&self) -> bool {
        self.capture.is_some()
    }

    /// Writes one frame stamped with the wall clock; a failure ends the capture.
    pub(crate) fn write(&mut self, frame: &[u8]) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        if let Some(c) = self.capture.as_mut() {
            if let Err(e) = c.write_frame(now, frame) {
                self.capture = None;
                self.failure = Some(e);
            }
        }
    }

    pub(crate) fn flush(&mut self) {
        if let Some(c) = self.capture.as_mut() {
            if let Err(e) = c.flush() {
                self.capture = None;
                self.failure = Some(e);
            }
        }
    }
}

fn lock(slot: &Mutex<CaptureSlot>) -> MutexGuard<'_, CaptureSlot> {
    slot.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The port as the fabric drives it.
#[derive(Debug)]
pub(crate) struct UdpNode {
    peer_port: u16,
    sockets: Sockets,
    txq: TxQueue,
    gso: bool,
    rx: Rx,
    faults: LinkFaults,
    rng: SplitMix64,
    /// Where a packet to corrupt is serialised.
    frame: Vec<u8>,
    /// Packets held back by injected delay or reordering, by release time (and arrival, to
    /// keep equal times in order).
    held: BTreeMap<(u64, u64), Packet>,
    held_count: u64,
    stats: Arc<Counters>,
    capture: Arc<Mutex<CaptureSlot>>,
    /// The IP multicast groups the fabric's devices joined.
    mcast: McastRx,
    /// What the fabric sleeps on (a group's socket joins its set on Linux).
    #[cfg(target_os = "linux")]
    io: Arc<UdpIo>,
}

impl UdpNode {
    /// Receives what waits on the socket (at most one batch) onto the fabric.
    fn take_received(&mut self, now: u64, out: &mut Vec<Packet>) -> bool {
        // The groups first: the port's own receive clears the hint both go by.
        let hint = self.rx.hint.load(std::sync::atomic::Ordering::Acquire);
        let groups = self.mcast.receive(
            now,
            hint,
            &self.stats,
            &self.capture,
            &mut self.rx.pool,
            out,
        );
        self.rx.receive(now, &self.stats, &self.capture, out) | groups
    }

    /// Sends `pkt` through the injected faults: each copy [`LinkFaults::decide`] lets through
    /// is queued at once, or held until its delay has passed. A corrupted copy whose ICRC
    /// no longer matches is dropped here, as the receiver would drop it.
    fn send(&mut self, now: u64, pkt: &Packet) {
        if self.faults == LinkFaults::NONE {
            self.queue(pkt);
            return;
        }
        let fate = self.faults.decide(&mut self.rng);
        match fate {
            Fate::Lost => add(&self.stats.injected_loss, 1),
            Fate::Once(_) => {}
            Fate::Twice(..) => add(&self.stats.injected_duplicate, 1),
        }
        for copy in fate.copies() {
            let corrupted = match copy.corrupt {
                Some(draw) => {
                    add(&self.stats.injected_corrupt, 1);
                    match corrupt_packet(pkt, draw, &mut self.frame) {
                        Some(p) => Some(p),
                        None => continue,
                    }
                }
                None => None,
            };
            let pkt = corrupted.as_ref().unwrap_or(pkt);
            if copy.reordered {
                add(&self.stats.injected_reorder, 1);
            }
            if copy.delay_ns == 0 {
                self.queue(pkt);
            } else {
                self.held_count += 1;
                self.held
                    .insert((now + copy.delay_ns, self.held_count), pkt.clone());
            }
        }
    }

    /// Queues `pkt` for the end of the step, sending what is queued first when the queue is
    /// full: however much one step produces, the port holds at most `tx::ARENA_MAX` bytes.
    fn queue(&mut self, pkt: &Packet) {
        if self.txq.is_full() {
            self.flush();
        }
        self.txq
            .push(pkt, self.peer_port, &mut self.sockets, &self.stats);
    }

    fn release_held(&mut self, now: u64) {
        while let Some(entry) = self.held.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let pkt = entry.remove();
            self.queue(&pkt);
        }
    }

    fn flush(&mut self) {
        if self.txq.is_empty() {
            return;
        }
        let mut cap = lock(&self.capture);
        if cap.is_running() {
            let mut write = |frame: &[u8]| cap.write(frame);
            self.txq
                .flush(&self.sockets, self.gso, &self.stats, Some(&mut write));
            cap.flush();
        } else {
            drop(cap);
            self.txq.flush(&self.sockets, self.gso, &self.stats, None);
        }
    }
}

impl Node for UdpNode {
    fn kick(&mut self, now: u64, _what: u32, out: &mut Vec<Packet>) {
        self.take_received(now, out);
    }

    fn rescan(&mut self, now: u64, out: &mut Vec<Packet>) {
        self.take_received(now, out);
    }

    fn run_work(&mut self, now: u64, out: &mut Vec<Packet>) -> bool {
        self.take_received(now, out)
    }

    fn receive(&mut self, now: u64, _port: u8, pkt: &Packet, _out: &mut Vec<Packet>) {
        if pkt.dst_gid.is_multicast() && pkt.src_gid.to_ip() != self.mcast_source() {
            // A multicast packet the port did not originate (one that came in from the
            // network and was fanned out on the fabric): never sent back out.
            return;
        }
        if pkt.train > 1 {
            for part in pkt.clone().split() {
                self.send(now, &part);
            }
        } else {
            self.send(now, pkt);
        }
    }

    fn run_timers(&mut self, now: u64, _out: &mut Vec<Packet>) -> bool {
        self.release_held(now);
        false
    }

    fn flush(&mut self) {
        Self::flush(self);
    }

    fn next_deadline(&self) -> Option<u64> {
        self.held.keys().next().map(|&(at, _)| at)
    }

    fn set_max_train(&mut self, _n: u32) {}

    fn mcast_membership(&mut self, gid: Gid, joined: bool) -> Result<(), String> {
        if !joined {
            self.mcast.leave(gid);
            return Ok(());
        }
        #[cfg(target_os = "linux")]
        let io = self.io.clone();
        self.mcast.join(gid, |sock| {
            #[cfg(target_os = "linux")]
            io.watch(sock)?;
            let _ = sock;
            Ok(())
        })
    }
}

impl UdpNode {
    /// The address multicast packets the port sends come from: its own.
    fn mcast_source(&self) -> IpAddr {
        self.rx.local.ip()
    }
}

/// A UDP port on a fabric (see the crate docs). Dropping it takes it off the fabric and
/// closes its sockets.
#[derive(Debug)]
pub struct UdpPort {
    node: NodeHandle<UdpNode>,
    local: SocketAddr,
    stats: Arc<Counters>,
    capture: Arc<Mutex<CaptureSlot>>,
    hint: Arc<AtomicBool>,
    ib_mtu: Mtu,
}

impl UdpPort {
    /// Binds `config.addr:config.port` and joins `fabric` as its uplink, lending the fabric
    /// its socket to sleep on ([`portverbs_fabric::PortIo`]): whoever steps the fabric
    /// receives from then on (see the crate docs).
    ///
    /// # Errors
    /// [`UdpError::Bind`] when the address is not this host's or the port is taken;
    /// [`UdpError::Fabric`] when the fabric has an uplink already; [`UdpError::Socket`].
    pub fn attach(fabric: &Fabric, config: UdpConfig) -> Result<Self, UdpError> {
        let want = SocketAddr::new(config.addr, config.port);
        let sock = UdpSocket::bind(want).map_err(|source| UdpError::Bind { addr: want, source })?;
        let local = sock.local_addr().map_err(UdpError::Socket)?;
        sys::set_dont_fragment(&sock, local.is_ipv6()).map_err(UdpError::Socket)?;
        sys::enable_ip_fields(&sock, local.is_ipv6()).map_err(UdpError::Socket)?;
        let (rcvbuf, _) = sys::set_buffers(&sock, config.socket_buffer);
        let gro = config.offload && sys::enable_gro(&sock);
        let gso = config.offload && sys::gso_available(&sock);
        let rx_sock = sock.try_clone().map_err(UdpError::Socket)?;
        let io = Arc::new(UdpIo::new(&rx_sock, fabric.mode()).map_err(UdpError::Socket)?);
        let stats = Arc::new(Counters::default());
        add(&stats.rcvbuf, rcvbuf as u64);
        add(
            &stats.segmentation_fallback,
            u64::from(config.offload && !gso),
        );
        add(
            &stats.coalescing_fallback,
            u64::from(config.offload && !gro),
        );
        let capture = Arc::new(Mutex::new(CaptureSlot::default()));
        // Without GRO a buffer holds one datagram: RoCEv2 ones are at most 4 KiB of payload
        // plus headers; with it, up to 64 KiB of one flow.
        let (count, size) = if gro { (16, 1 << 16) } else { (64, 9216) };
        let bufs = io
            .recv_bufs(&rx_sock, count, size)
            .map_err(UdpError::Socket)?;
        let rx = Rx {
            sock: rx_sock,
            local,
            bufs,
            pool: rx::PayloadPool::default(),
            hint: io.hint.clone(),
            last_look: None,
            frame: Vec::new(),
        };
        crate::mcast::prepare_sender(&sock);
        let sockets =
            Sockets::new(sock, local.port(), config.max_source_ports).map_err(UdpError::Socket)?;
        let node = UdpNode {
            peer_port: config.port,
            sockets,
            txq: TxQueue::default(),
            gso,
            rx,
            faults: config.faults,
            rng: SplitMix64::new(config.fault_seed),
            frame: Vec::new(),
            held: BTreeMap::new(),
            held_count: 0,
            stats: stats.clone(),
            capture: capture.clone(),
            mcast: McastRx::new(local),
            #[cfg(target_os = "linux")]
            io: io.clone(),
        };
        let name = config.name.clone();
        let handle = fabric.attach("udp", |j| {
            let config = NodeConfig {
                name: name.unwrap_or_else(|| format!("udp{}", j.ordinal)),
                routes: Vec::new(),
            };
            (config, node)
        })?;
        if let Err(e) = handle.with(|c| c.claim_uplink(1)) {
            handle.detach();
            return Err(e.into());
        }
        fabric.set_port_io(io.clone());
        let ib_mtu = sys::interface_mtu(local.ip()).map_or(Mtu::Mtu1024, ib_mtu_for);
        Ok(Self {
            node: handle,
            local,
            stats,
            capture,
            hint: io.hint.clone(),
            ib_mtu,
        })
    }

    /// The address and UDP port the port listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The largest IB MTU the interface that holds the address carries (rxe's rule:
    /// interface MTU less 80 bytes of headers, 1024 to 4096; 1024 when the interface is not
    /// known). Loopback: 4096.
    pub fn ib_mtu(&self) -> Mtu {
        self.ib_mtu
    }

    /// What the port did so far.
    pub fn stats(&self) -> UdpStats {
        self.stats.snapshot()
    }

    /// Starts writing every datagram sent and received to a new pcap file at `path`.
    ///
    /// # Errors
    /// [`CaptureError::AlreadyRunning`], or the file cannot be created.
    pub fn start_capture(&self, path: impl AsRef<Path>) -> Result<(), CaptureError> {
        if lock(&self.capture).is_running() {
            return Err(CaptureError::AlreadyRunning);
        }
        let c = PcapCapture::create(path.as_ref())?;
        let mut slot = lock(&self.capture);
        if slot.is_running() {
            return Err(CaptureError::AlreadyRunning);
        }
        slot.capture = Some(c);
        slot.failure = None;
        Ok(())
    }

    /// Ends the capture: `Ok(Some(counts))` when one ran, `Ok(None)` when none did.
    ///
    /// # Errors
    /// The write error that ended the capture early, or the final flush's.
    pub fn stop_capture(&self) -> Result<Option<CaptureStats>, CaptureError> {
        let (c, failure) = {
            let mut slot = lock(&self.capture);
            (slot.capture.take(), slot.failure.take())
        };
        match (c, failure) {
            (Some(c), _) => c.finish().map(|(_, s)| Some(s)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(None),
        }
    }

    /// What [`crate::Lockstep`] watches: the port's counters, and the flag that makes the
    /// next step look at the socket.
    pub(crate) fn probe(&self) -> (Arc<Counters>, Arc<AtomicBool>) {
        (self.stats.clone(), self.hint.clone())
    }

    /// Changes the injected faults (tests), keeping the generator's place in its sequence
    /// (as [`Fabric::set_faults`] does).
    pub fn set_faults(&self, faults: LinkFaults) {
        self.node.with(|c| c.node.faults = faults);
    }
}

impl Drop for UdpPort {
    fn drop(&mut self) {
        // The node, and with it every socket, goes with the fabric's last reference to it.
        self.node.detach();
    }
}

/// rxe's port MTU for an interface MTU: the largest IB MTU not above it less 80 bytes.
fn ib_mtu_for(if_mtu: u32) -> Mtu {
    let room = if_mtu.saturating_sub(80);
    if room >= 4096 {
        Mtu::Mtu4096
    } else if room >= 2048 {
        Mtu::Mtu2048
    } else {
        Mtu::Mtu1024
    }
}

//! Multicast on the port: the IP groups the fabric's devices joined, as rdma_cm maps them
//! for RoCEv2 (Linux `drivers/infiniband/core/cma.c`, `cma_iboe_set_mgid`: an IPv4 group
//! 239.a.b.c is the MGID `::ffff:239.a.b.c`, an IPv6 group its own address; see
//! `Gid::mcast_ip`).
//!
//! * **Joining**: when the fabric's first device attaches a QP to a group, the port opens a
//!   socket bound to the group's address and the RoCEv2 port with `SO_REUSEADDR` (so that
//!   every port of the host that joins the group binds it too and each gets its copy), and
//!   joins the group on it (`IP_ADD_MEMBERSHIP` on the interface of the port's address, or
//!   `IPV6_JOIN_GROUP`, through std's `join_multicast_v4`/`_v6`). When the last device's QP
//!   leaves, the socket is closed, which leaves the group. A port holds at most
//!   [`MAX_GROUPS`] of them.
//! * **Sending**: a packet to a group leaves from the port's own socket (4791) to the group's
//!   address on port 4791 (RoCEv2 keeps no flow-label source port for it), through the
//!   interface of the port's address (`IP_MULTICAST_IF` on Linux), hop limit 64 as rdma_cm
//!   sets for RoCEv2 groups.
//! * **Loopback**: RoCE devices do not see their own Ethernet frames; here the fabric already
//!   gave the sending device its copy. The port keeps `IP_MULTICAST_LOOP` on, so that other
//!   ports of this host (two UDP-bound devices in one process, as tests make them) hear each
//!   other, and drops the datagrams that come back from its own address
//!   ([`crate::UdpStats::rx_mcast_loop`]). Nothing from the network is ever sent on to it
//!   again: a port only sends multicast packets whose source is its own address.
//! * **Receiving**: each group's socket is read without waiting when the port receives (at
//!   most [`BATCH`] datagrams per group per look), every datagram checked (ICRC, parse) as on
//!   the port's own socket; on Linux the sockets sit in the port's epoll set, so a datagram
//!   to a group wakes a sleeping fabric. On Windows they are read when the port looks for
//!   other reasons (no wake-up of their own yet), and the outgoing interface is the
//!   system's choice.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::sync::{Mutex, PoisonError};

use portverbs_hal::types::Gid;
use portverbs_transport::Packet;
use portverbs_wire::WireError;

use crate::port::CaptureSlot;
use crate::rx::{PayloadPool, RX_LOOK};
use crate::stats::{Counters, add};

/// Most groups one port joins (above any device's `max_mcast_grp`).
pub(crate) const MAX_GROUPS: usize = 64;

/// Most datagrams read from one group's socket per look.
pub(crate) const BATCH: usize = 64;

/// The groups every port of this process joined, with the addresses of the ports that did:
/// how many copies of a multicast datagram this process's ports are to receive
/// ([`crate::UdpStats::tx_mcast_local_copies`]).
static LOCAL_MEMBERS: Mutex<Vec<(SocketAddr, IpAddr)>> = Mutex::new(Vec::new());

fn members() -> std::sync::MutexGuard<'static, Vec<(SocketAddr, IpAddr)>> {
    LOCAL_MEMBERS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The ports of this process other than `local` that joined `group`.
pub(crate) fn local_copies(group: SocketAddr, local: IpAddr) -> u64 {
    members()
        .iter()
        .filter(|(g, m)| *g == group && *m != local)
        .count() as u64
}

/// One joined group.
#[derive(Debug)]
struct Group {
    sock: UdpSocket,
    /// The group's address and port (the receiving socket's local address).
    addr: SocketAddr,
}

/// The port's multicast groups.
#[derive(Debug)]
pub(crate) struct McastRx {
    local: SocketAddr,
    groups: HashMap<Gid, Group>,
    buf: Vec<u8>,
    last_look: Option<u64>,
}

impl McastRx {
    pub(crate) fn new(local: SocketAddr) -> Self {
        Self {
            local,
            groups: HashMap::new(),
            buf: Vec::new(),
            last_look: None,
        }
    }

    /// Joins the IP group `gid` stands for; `watch` registers its socket with the port's
    /// wake-up. Joining a group already joined is a no-op.
    pub(crate) fn join(
        &mut self,
        gid: Gid,
        watch: impl FnOnce(&UdpSocket) -> io::Result<()>,
    ) -> Result<(), String> {
        if self.groups.contains_key(&gid) {
            return Ok(());
        }
        if self.groups.len() >= MAX_GROUPS {
            return Err(format!("the port holds {MAX_GROUPS} groups already"));
        }
        let ip = gid
            .mcast_ip()
            .ok_or_else(|| format!("{gid} is not a multicast GID"))?;
        if ip.is_ipv4() != self.local.is_ipv4() {
            return Err(format!(
                "{ip} is not of the port's address family ({})",
                self.local.ip()
            ));
        }
        let addr = SocketAddr::new(ip, self.local.port());
        let sock = open(addr, self.local.ip()).map_err(|e| format!("{addr}: {e}"))?;
        watch(&sock).map_err(|e| format!("watching {addr}: {e}"))?;
        members().push((addr, self.local.ip()));
        self.groups.insert(gid, Group { sock, addr });
        Ok(())
    }

    /// Leaves the group (its socket closes); false when it was not joined.
    pub(crate) fn leave(&mut self, gid: Gid) -> bool {
        let Some(g) = self.groups.remove(&gid) else {
            return false;
        };
        let me = (g.addr, self.local.ip());
        let mut m = members();
        if let Some(i) = m.iter().position(|e| *e == me) {
            m.swap_remove(i);
        }
        true
    }

    /// Reads what waits on the groups' sockets when input may be there (`hint`) or the last
    /// look is [`RX_LOOK`] old; puts the packets in `out`. Returns whether a datagram was
    /// taken.
    pub(crate) fn receive(
        &mut self,
        now: u64,
        hint: bool,
        stats: &Counters,
        capture: &Mutex<CaptureSlot>,
        pool: &mut PayloadPool,
        out: &mut Vec<Packet>,
    ) -> bool {
        if self.groups.is_empty() {
            return false;
        }
        let recent = self
            .last_look
            .is_some_and(|t| now >= t && now - t < RX_LOOK.as_nanos() as u64);
        if recent && !hint {
            return false;
        }
        self.last_look = Some(now);
        if self.buf.len() < 9216 {
            self.buf.resize(9216, 0);
        }
        let mut took = false;
        for g in self.groups.values() {
            for _ in 0..BATCH {
                // Nothing more (WouldBlock), or an error queued on the socket: next group.
                let Ok((n, src)) = g.sock.recv_from(&mut self.buf) else {
                    break;
                };
                if src.ip() == self.local.ip() {
                    // Our own datagram, looped back by the system.
                    add(&stats.rx_mcast_loop, 1);
                    continue;
                }
                took = true;
                add(&stats.rx_packets, 1);
                add(&stats.rx_mcast, 1);
                add(&stats.rx_settled, 1);
                let d = self.buf.get(..n).unwrap_or(&[]);
                add(&stats.rx_bytes, d.len() as u64);
                match crate::rx::accept(src, g.addr, d, pool) {
                    Ok((pkt, id, df)) => {
                        let mut cap = capture.lock().unwrap_or_else(PoisonError::into_inner);
                        if cap.is_running() {
                            let opts = crate::msg::IpFields::default().frame_options(id);
                            let mut frame = Vec::new();
                            if portverbs_wire::datagram_frame(src, g.addr, &opts, df, d, &mut frame)
                                .is_ok()
                            {
                                cap.write(&frame);
                                cap.flush();
                            }
                        }
                        out.push(pkt);
                    }
                    Err(WireError::BadIcrc { .. }) => add(&stats.icrc_drops, 1),
                    Err(_) => add(&stats.malformed, 1),
                }
            }
        }
        took
    }
}

impl Drop for McastRx {
    fn drop(&mut self) {
        let gids: Vec<Gid> = self.groups.keys().copied().collect();
        for gid in gids {
            self.leave(gid);
        }
    }
}

/// The receiving socket of group `addr`, joined on the interface of `local`.
fn open(addr: SocketAddr, local: IpAddr) -> io::Result<UdpSocket> {
    let sock = bind(addr)?;
    match (addr.ip(), local) {
        (IpAddr::V4(group), IpAddr::V4(iface)) => sock.join_multicast_v4(&group, &iface)?,
        (IpAddr::V6(group), _) => sock.join_multicast_v6(&group, interface_index(local))?,
        (IpAddr::V4(_), IpAddr::V6(_)) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an IPv4 group on an IPv6 port",
            ));
        }
    }
    sock.set_nonblocking(true)?;
    Ok(sock)
}

#[cfg(target_os = "linux")]
fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
    crate::sys::bind_shared(addr)
}

/// Windows: a socket cannot be bound to a multicast address; the group's socket is bound to
/// the unspecified address and the port, and receives the groups it joined.
#[cfg(windows)]
fn bind(addr: SocketAddr) -> io::Result<UdpSocket> {
    let any: IpAddr = if addr.is_ipv4() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    UdpSocket::bind(SocketAddr::new(any, addr.port()))
}

#[cfg(target_os = "linux")]
fn interface_index(local: IpAddr) -> u32 {
    crate::sys::interface_index(local).unwrap_or(0)
}

#[cfg(windows)]
fn interface_index(_local: IpAddr) -> u32 {
    0
}

/// Sets the port's sending socket up for multicast: loopback on (other ports of this host
/// hear it), hop limit 64, and on Linux the outgoing interface of its address. Best effort:
/// a socket that refuses sends multicast where the system routes it.
pub(crate) fn prepare_sender(sock: &UdpSocket) {
    let Ok(local) = sock.local_addr() else {
        return;
    };
    if local.is_ipv4() {
        let _ = sock.set_multicast_loop_v4(true);
        let _ = sock.set_multicast_ttl_v4(64);
    } else {
        let _ = sock.set_multicast_loop_v6(true);
    }
    #[cfg(target_os = "linux")]
    let _ = crate::sys::set_multicast_if(sock, local.ip());
}

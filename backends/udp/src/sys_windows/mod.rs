//! The socket calls std does not offer, on Winsock: `WSASendMsg` with UDP send offload (USO,
//! `UDP_SEND_MSG_SIZE`), `WSARecvMsg` with OVERLAPPED requests completing to an I/O
//! completion port and UDP receive offload (URO, `UDP_RECV_MAX_COALESCED_SIZE`), and the
//! options a RoCEv2 port needs (don't-fragment, the IP fields of received datagrams, large
//! buffers). The same functions as the Linux `sys` module, so that the rest of the crate is
//! one code base; all of the Windows `unsafe` is here and in [`recv`].
//!
//! Microsoft Learn pages these calls follow: "IPPROTO_IP socket options", "IPPROTO_IPV6
//! socket options", "IPPROTO_UDP socket options" (USO and URO), "WSASendMsg function",
//! "LPFN_WSARECVMSG (WSARecvMsg) callback function", "WSAGetOverlappedResult function",
//! "GetAdaptersAddresses function".
//!
//! What Windows does not let a sender set, and what happens instead:
//! * **traffic class**: `IP_TOS` / `IPV6_TCLASS` are set per socket, best effort — whether
//!   Windows applies them is not relied on (Windows marks DSCP through the QoS API, qWAVE's
//!   `QOSSetFlow`, which this crate does not use), so on Windows the datagrams may leave with
//!   0; under Wine, whose sockets are Linux's, the value is applied;
//! * **hop limit**: `IP_TTL` / `IPV6_UNICAST_HOPS`, per socket, set before each run of
//!   datagrams that asks for another value;
//! * **IPv6 flow label**: no Winsock option sets it; Windows chooses. The ICRC masks all three
//!   fields, so none of this changes whether a receiver accepts a packet;
//! * **IPv4 identification**: chosen by the stack (see the crate docs); the ICRC covers it.

mod cmsg;
pub(crate) mod port_io;
pub(crate) mod recv;

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::windows::io::AsRawSocket;

use windows_sys::Win32::Networking::WinSock::{
    self as ws, IP_DONTFRAGMENT, IP_HOPLIMIT, IP_PKTINFO, IP_RECVECN, IP_RECVTOS, IP_TOS, IP_TTL,
    IPPROTO_IP, IPPROTO_IPV6, IPPROTO_UDP, IPV6_DONTFRAG, IPV6_HOPLIMIT, IPV6_PKTINFO,
    IPV6_RECVECN, IPV6_RECVTCLASS, IPV6_TCLASS, IPV6_UNICAST_HOPS, SIO_UDP_CONNRESET, SO_RCVBUF,
    SO_SNDBUF, SOCKADDR, SOCKET, SOCKET_ERROR, SOL_SOCKET, UDP_RECV_MAX_COALESCED_SIZE,
    UDP_SEND_MSG_SIZE, WSABUF, WSAMSG,
};

pub(crate) use crate::msg::{IpFields, Outgoing};
pub(crate) use recv::{RecvBufs, recv_batch};

/// The largest number of segments one USO send is given (the Linux port's GSO limit; the
/// arena in `tx` also keeps a message under 64 KiB).
pub(crate) const GSO_MAX_SEGMENTS: usize = 64;

/// The largest coalesced receive URO is asked for: a UDP payload can be no longer.
const URO_MAX: u32 = 65_527;

pub(crate) fn raw(sock: &UdpSocket) -> SOCKET {
    sock.as_raw_socket() as SOCKET
}

/// The last Winsock error as an `io::Error`.
pub(crate) fn last_error() -> io::Error {
    // SAFETY: reads the calling thread's last Winsock error; no memory is involved.
    io::Error::from_raw_os_error(unsafe { ws::WSAGetLastError() })
}

fn setsockopt_u32(sock: &UdpSocket, level: i32, name: i32, value: u32) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`, a live u32 (a DWORD), for the whole
    // call; the socket is owned by `sock`.
    let rc = unsafe {
        ws::setsockopt(
            raw(sock),
            level,
            name,
            (&raw const value).cast::<u8>(),
            size_of::<u32>() as i32,
        )
    };
    if rc == 0 { Ok(()) } else { Err(last_error()) }
}

fn getsockopt_u32(sock: &UdpSocket, level: i32, name: i32) -> io::Result<u32> {
    let mut value = 0u32;
    let mut len = size_of::<u32>() as i32;
    // SAFETY: the pointers describe `value` and `len`, both live for the call.
    let rc = unsafe {
        ws::getsockopt(
            raw(sock),
            level,
            name,
            (&raw mut value).cast::<u8>(),
            &raw mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(last_error())
    }
}

/// Don't-fragment: `IP_DONTFRAGMENT` (IPv4) or `IPV6_DONTFRAG` (IPv6) — a datagram too big
/// for the path is refused rather than fragmented, as with Linux's `IP_PMTUDISC_DO`.
pub(crate) fn set_dont_fragment(sock: &UdpSocket, v6: bool) -> io::Result<()> {
    if v6 {
        setsockopt_u32(sock, IPPROTO_IPV6, IPV6_DONTFRAG, 1)
    } else {
        setsockopt_u32(sock, IPPROTO_IP, IP_DONTFRAGMENT, 1)
    }
}

/// Asks for `bytes` of receive and send buffer and returns what the system granted.
pub(crate) fn set_buffers(sock: &UdpSocket, bytes: usize) -> (usize, usize) {
    let want = u32::try_from(bytes).unwrap_or(i32::MAX as u32);
    for name in [SO_RCVBUF, SO_SNDBUF] {
        // Best effort: the default buffer still works, with more loss under bursts.
        let _ = setsockopt_u32(sock, SOL_SOCKET, name, want);
    }
    let get = |name| {
        getsockopt_u32(sock, SOL_SOCKET, name)
            .ok()
            .and_then(|v| usize::try_from(v).ok())
            .unwrap_or(0)
    };
    (get(SO_RCVBUF), get(SO_SNDBUF))
}

/// Asks Winsock to report each datagram's destination (`IP_PKTINFO`), traffic class
/// (`IP_RECVTOS`; where a Windows build lacks it, only the ECN bits through `IP_RECVECN`)
/// and hop limit (`IP_HOPLIMIT`), and turns off `SIO_UDP_CONNRESET`, so that an ICMP port
/// unreachable caused by an earlier send does not fail the next receive with
/// `WSAECONNRESET`. All best effort: a datagram whose fields are not reported keeps the
/// defaults (traffic class 0, hop limit 64), which the ICRC does not cover anyway.
pub(crate) fn enable_ip_fields(sock: &UdpSocket, v6: bool) -> io::Result<()> {
    if v6 {
        let _ = setsockopt_u32(sock, IPPROTO_IPV6, IPV6_PKTINFO, 1);
        if setsockopt_u32(sock, IPPROTO_IPV6, IPV6_RECVTCLASS, 1).is_err() {
            let _ = setsockopt_u32(sock, IPPROTO_IPV6, IPV6_RECVECN, 1);
        }
        let _ = setsockopt_u32(sock, IPPROTO_IPV6, IPV6_HOPLIMIT, 1);
    } else {
        let _ = setsockopt_u32(sock, IPPROTO_IP, IP_PKTINFO, 1);
        if setsockopt_u32(sock, IPPROTO_IP, IP_RECVTOS, 1).is_err() {
            let _ = setsockopt_u32(sock, IPPROTO_IP, IP_RECVECN, 1);
        }
        let _ = setsockopt_u32(sock, IPPROTO_IP, IP_HOPLIMIT, 1);
    }
    let off = 0u32;
    let mut returned = 0u32;
    // SAFETY: the input is `off`, a live DWORD; no output buffer; a synchronous call (no
    // OVERLAPPED, no completion routine).
    let _ = unsafe {
        ws::WSAIoctl(
            raw(sock),
            SIO_UDP_CONNRESET,
            (&raw const off).cast(),
            size_of::<u32>() as u32,
            std::ptr::null_mut(),
            0,
            &raw mut returned,
            std::ptr::null_mut(),
            None,
        )
    };
    Ok(())
}

/// Turns UDP receive offload (URO) on: Winsock may then hand over several datagrams of one
/// flow in one buffer, their size in a `UDP_COALESCED_INFO` message ([`recv::Received::segment`]).
/// False where the system lacks it (Windows before URO, Wine).
pub(crate) fn enable_gro(sock: &UdpSocket) -> bool {
    setsockopt_u32(sock, IPPROTO_UDP, UDP_RECV_MAX_COALESCED_SIZE, URO_MAX).is_ok()
}

/// Whether the system offers UDP send offload (USO, `UDP_SEND_MSG_SIZE`) on this socket.
/// False where it does not (Windows before USO, Wine).
pub(crate) fn gso_available(sock: &UdpSocket) -> bool {
    getsockopt_u32(sock, IPPROTO_UDP, UDP_SEND_MSG_SIZE).is_ok()
}

/// A socket address in the system's layout (`SOCKADDR_IN` / `SOCKADDR_IN6`), as bytes.
#[derive(Clone, Copy, Default)]
#[repr(C, align(8))]
pub(crate) struct RawAddr(pub(crate) [u8; 32]);

impl std::fmt::Debug for RawAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.get(self.0.len()))
    }
}

impl RawAddr {
    /// `addr` in the system's layout, and its length.
    pub(crate) fn new(addr: SocketAddr) -> (Self, i32) {
        let mut b = [0u8; 32];
        let len = match addr {
            SocketAddr::V4(a) => {
                b[..2].copy_from_slice(&ws::AF_INET.to_le_bytes());
                b[2..4].copy_from_slice(&a.port().to_be_bytes());
                b[4..8].copy_from_slice(&a.ip().octets());
                16
            }
            SocketAddr::V6(a) => {
                b[..2].copy_from_slice(&ws::AF_INET6.to_le_bytes());
                b[2..4].copy_from_slice(&a.port().to_be_bytes());
                b[4..8].copy_from_slice(&a.flowinfo().to_be_bytes());
                b[8..24].copy_from_slice(&a.ip().octets());
                b[24..28].copy_from_slice(&a.scope_id().to_le_bytes());
                28
            }
        };
        (Self(b), len)
    }

    /// The address the system wrote (`len` bytes of it); `None` for another family.
    pub(crate) fn get(&self, len: usize) -> Option<SocketAddr> {
        let b = self.0.get(..len.min(self.0.len()))?;
        let family = u16::from_le_bytes(b.get(..2)?.try_into().ok()?);
        let port = u16::from_be_bytes(b.get(2..4)?.try_into().ok()?);
        match family {
            ws::AF_INET => {
                let ip: [u8; 4] = b.get(4..8)?.try_into().ok()?;
                Some(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port)))
            }
            ws::AF_INET6 => {
                let flow = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?);
                let ip: [u8; 16] = b.get(8..24)?.try_into().ok()?;
                let scope = u32::from_le_bytes(b.get(24..28)?.try_into().ok()?);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(ip),
                    port,
                    flow,
                    scope,
                )))
            }
            _ => None,
        }
    }
}

/// Sets the socket's traffic class and hop limit for the datagrams that follow (best effort,
/// see the module docs).
fn set_ip_fields(sock: &UdpSocket, v6: bool, ip: IpFields) {
    let (level, tc, hops) = if v6 {
        (IPPROTO_IPV6, IPV6_TCLASS, IPV6_UNICAST_HOPS)
    } else {
        (IPPROTO_IP, IP_TOS, IP_TTL)
    };
    let _ = setsockopt_u32(sock, level, tc, u32::from(ip.traffic_class));
    let _ = setsockopt_u32(sock, level, hops, u32::from(ip.hop_limit.max(1)));
}

/// Sends one message with `WSASendMsg`; with a segment size, as one USO message.
fn send_msg(
    sock: &UdpSocket,
    dst: SocketAddr,
    bytes: &[u8],
    segment: Option<u16>,
) -> io::Result<()> {
    let (name, name_len) = RawAddr::new(dst);
    let mut control = cmsg::Control::<32>::default();
    let control_len = segment.map_or(0, |s| cmsg::write_segment_size(&mut control.0, s));
    let mut buf = WSABUF {
        len: u32::try_from(bytes.len())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        buf: bytes.as_ptr().cast_mut(),
    };
    let msg = WSAMSG {
        name: (&raw const name.0).cast::<SOCKADDR>().cast_mut(),
        namelen: name_len,
        lpBuffers: &raw mut buf,
        dwBufferCount: 1,
        Control: WSABUF {
            len: control_len as u32,
            buf: if control_len > 0 {
                control.0.as_mut_ptr()
            } else {
                std::ptr::null_mut()
            },
        },
        dwFlags: 0,
    };
    let mut sent = 0u32;
    // SAFETY: `msg` points at `name`, `buf` (which points at `bytes`, only read) and
    // `control`, all alive and unmoved for the call; no OVERLAPPED, so the call is
    // synchronous and nothing refers to them afterwards.
    let rc = unsafe {
        ws::WSASendMsg(
            raw(sock),
            &raw const msg,
            0,
            &raw mut sent,
            std::ptr::null_mut(),
            None,
        )
    };
    if rc == SOCKET_ERROR {
        Err(last_error())
    } else {
        Ok(())
    }
}

/// Sends the messages, one `WSASendMsg` each (Winsock has no `sendmmsg`); returns how many
/// went out (the rest failed with the error, which is returned when none went out). A USO
/// message the system refuses is sent again datagram by datagram, so that a system whose
/// option probe succeeded but whose send path lacks USO still delivers.
pub(crate) fn send_batch(sock: &UdpSocket, msgs: &[Outgoing<'_>]) -> io::Result<usize> {
    let mut fields: Option<IpFields> = None;
    for (i, m) in msgs.iter().enumerate() {
        if fields != Some(m.ip) {
            set_ip_fields(sock, m.dst.is_ipv6(), m.ip);
            fields = Some(m.ip);
        }
        let mut result = send_msg(sock, m.dst, m.bytes, m.segment);
        if let (Err(_), Some(seg)) = (&result, m.segment) {
            result = m
                .bytes
                .chunks(usize::from(seg).max(1))
                .try_for_each(|d| send_msg(sock, m.dst, d, None));
        }
        if let Err(e) = result {
            return if i == 0 { Err(e) } else { Ok(i) };
        }
    }
    Ok(msgs.len())
}

/// The MTU of the interface that holds `ip`, from `GetAdaptersAddresses`; loopback
/// addresses get 65536 (every 127/8 address and ::1 is the loopback interface's, whose
/// Windows MTU is reported as 4294967295); `None` when no adapter holds it.
pub(crate) fn interface_mtu(ip: IpAddr) -> Option<u32> {
    use windows_sys::Win32::Foundation::{ERROR_BUFFER_OVERFLOW, ERROR_SUCCESS};
    use windows_sys::Win32::NetworkManagement::IpHelper::{
        GAA_FLAG_SKIP_ANYCAST, GAA_FLAG_SKIP_DNS_SERVER, GAA_FLAG_SKIP_MULTICAST,
        GetAdaptersAddresses, IP_ADAPTER_ADDRESSES_LH,
    };

    if ip.is_loopback() {
        return Some(65_536);
    }
    let flags = GAA_FLAG_SKIP_ANYCAST | GAA_FLAG_SKIP_MULTICAST | GAA_FLAG_SKIP_DNS_SERVER;
    let mut words: Vec<u64> = vec![0; 2048];
    let mut rc = ERROR_BUFFER_OVERFLOW;
    for _ in 0..4 {
        let mut size = u32::try_from(words.len() * 8).unwrap_or(u32::MAX);
        // SAFETY: the buffer is `size` bytes, 8-aligned (as IP_ADAPTER_ADDRESSES needs), and
        // alive for the call; on ERROR_BUFFER_OVERFLOW `size` says how much to give.
        rc = unsafe {
            GetAdaptersAddresses(
                u32::from(ws::AF_UNSPEC),
                flags,
                std::ptr::null(),
                words.as_mut_ptr().cast::<IP_ADAPTER_ADDRESSES_LH>(),
                &raw mut size,
            )
        };
        if rc != ERROR_BUFFER_OVERFLOW {
            break;
        }
        words.resize((size as usize).div_ceil(8) + 64, 0);
    }
    if rc != ERROR_SUCCESS {
        return None;
    }
    let mut adapter = words.as_ptr().cast::<IP_ADAPTER_ADDRESSES_LH>();
    while !adapter.is_null() {
        // SAFETY: `adapter` is the list head in `words` or a `Next` link the system wrote,
        // pointing inside `words`, which is alive and not written while the list is read.
        let a = unsafe { &*adapter };
        let mut unicast = a.FirstUnicastAddress;
        while !unicast.is_null() {
            // SAFETY: as above, a node of the adapter's unicast list inside `words`.
            let u = unsafe { &*unicast };
            let sa = u.Address.lpSockaddr;
            let len = usize::try_from(u.Address.iSockaddrLength).unwrap_or(0);
            if !sa.is_null() && len > 0 {
                let mut raw_addr = RawAddr::default();
                let n = len.min(raw_addr.0.len());
                // SAFETY: the system says `lpSockaddr` points at `iSockaddrLength` bytes of a
                // socket address inside `words`; `n` does not pass them or `raw_addr`.
                unsafe {
                    std::ptr::copy_nonoverlapping(sa.cast::<u8>(), raw_addr.0.as_mut_ptr(), n);
                }
                if raw_addr.get(n).map(|s| s.ip()) == Some(ip) {
                    return Some(a.Mtu);
                }
            }
            unicast = u.Next;
        }
        adapter = a.Next;
    }
    None
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn pair(a: &str, b: &str) -> (UdpSocket, UdpSocket) {
        let tx = UdpSocket::bind(format!("{a}:0")).unwrap();
        let rx = UdpSocket::bind(format!("{b}:0")).unwrap();
        for s in [&tx, &rx] {
            set_dont_fragment(s, false).unwrap();
            enable_ip_fields(s, false).unwrap();
        }
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        (tx, rx)
    }

    /// Receive buffers on `rx` driven as the engine thread drives them: sleep on the port's
    /// I/O, then take what completed.
    fn bufs(rx: &UdpSocket, count: usize) -> (port_io::UdpIo, RecvBufs) {
        let io = port_io::UdpIo::new(rx, portverbs_fabric::Mode::Threaded).unwrap();
        let bufs = io.recv_bufs(rx, count, 9216).unwrap();
        (io, bufs)
    }

    /// Every datagram `recv_batch` hands over until `n` arrived (or 5 s passed), sleeping on
    /// the port's I/O while none is there.
    fn receive(
        rx: &UdpSocket,
        (io, bufs): &mut (port_io::UdpIo, RecvBufs),
        n: usize,
    ) -> Vec<(recv::Received, Vec<u8>)> {
        use portverbs_fabric::PortIo as _;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let mut out = Vec::new();
        while out.len() < n && std::time::Instant::now() < deadline {
            if recv_batch(rx, bufs).unwrap() == 0 {
                io.wait(Duration::from_millis(100));
                continue;
            }
            for (r, b) in bufs.got.iter().zip(&bufs.bufs) {
                let seg = r.segment.unwrap_or(r.len).max(1);
                for d in b[..r.len].chunks(seg) {
                    out.push((*r, d.to_vec()));
                }
            }
        }
        out
    }

    #[test]
    fn the_options_a_port_needs_are_set() {
        let (tx, _rx) = pair("127.0.0.1", "127.0.0.1");
        assert_eq!(getsockopt_u32(&tx, IPPROTO_IP, IP_DONTFRAGMENT).unwrap(), 1);
        let (rcv, snd) = set_buffers(&tx, 1 << 20);
        assert!(rcv > 0 && snd > 0, "{rcv} {snd}");
        // What this system offers, for the record (Wine: neither USO nor URO).
        let uso = gso_available(&tx);
        let uro = enable_gro(&tx);
        eprintln!("USO {uso}, URO {uro}");
        let v6 = UdpSocket::bind("[::1]:0");
        if let Ok(v6) = v6 {
            set_dont_fragment(&v6, true).unwrap();
            enable_ip_fields(&v6, true).unwrap();
            assert_eq!(getsockopt_u32(&v6, IPPROTO_IPV6, IPV6_DONTFRAG).unwrap(), 1);
        }
    }

    #[test]
    fn a_datagram_goes_round_trip_with_its_addresses_and_hop_limit() {
        let (tx, rx) = pair("127.0.0.1", "127.0.0.2");
        let dst = rx.local_addr().unwrap();
        let ip = IpFields {
            traffic_class: 0x20,
            hop_limit: 17,
            flow_label: 0,
        };
        let msg = Outgoing {
            dst,
            bytes: b"hello over overlapped I/O",
            segment: None,
            ip,
        };
        assert_eq!(send_batch(&tx, &[msg, msg]).unwrap(), 2);
        let mut bufs = bufs(&rx, 4);
        let got = receive(&rx, &mut bufs, 2);
        assert_eq!(got.len(), 2);
        for (r, bytes) in &got {
            assert_eq!(bytes, b"hello over overlapped I/O");
            assert_eq!(r.src, Some(tx.local_addr().unwrap()));
            assert_eq!(r.dst, Some(dst.ip()), "IP_PKTINFO");
            eprintln!(
                "received traffic class {:#x}, hop limit {}",
                r.ip.traffic_class, r.ip.hop_limit
            );
        }
        // The requests went straight back out: more arrive on the same buffers.
        assert_eq!(send_batch(&tx, &[msg]).unwrap(), 1);
        assert_eq!(receive(&rx, &mut bufs, 1).len(), 1);
    }

    /// Wine passes no control message to the Linux socket it sends on, so a USO message
    /// would leave as one datagram: the probe must say no there, and the send queue then
    /// sends datagram by datagram. Where the probe says yes, one message carries them all.
    #[test]
    fn equal_datagrams_arrive_apart_whether_or_not_uso_carries_them() {
        use portverbs_hal::types::Gid;
        use portverbs_transport::{Packet, PayloadData};
        use portverbs_wire::{Bth, Opcode, TransportHdr};

        use crate::stats::Counters;
        use crate::tx::{Sockets, TxQueue};

        let (tx, rx) = pair("127.0.0.1", "127.0.0.3");
        let uso = gso_available(&tx);
        let dst = rx.local_addr().unwrap();
        let src = tx.local_addr().unwrap();
        let (mut q, stats) = (TxQueue::default(), Counters::default());
        let mut sockets = Sockets::new(tx, src.port(), 0).unwrap();
        for psn in 0..3 {
            let hdr = TransportHdr::new(Bth::new(Opcode::ReadResponseMiddle, 0x11, psn));
            let pkt = Packet::new(
                Gid::from_ip(src.ip()),
                Gid::from_ip(dst.ip()),
                hdr,
                PayloadData::Bytes(vec![psn as u8; 1024]),
            );
            q.push(&pkt, dst.port(), &mut sockets, &stats);
        }
        q.flush(&sockets, uso, &stats, None);
        let sent = stats.snapshot();
        assert_eq!(sent.tx_packets, 3);
        assert_eq!(sent.tx_gso_segments, if uso { 3 } else { 0 });
        let mut bufs = bufs(&rx, 8);
        let got = receive(&rx, &mut bufs, 3);
        let sizes: Vec<usize> = got.iter().map(|(_, b)| b.len()).collect();
        // BTH, payload, ICRC.
        assert_eq!(sizes, [12 + 1024 + 4; 3]);
        for (k, (_, d)) in got.iter().enumerate() {
            assert!(
                portverbs_wire::open_datagram(src, dst, d).is_ok(),
                "datagram {k}: ICRC"
            );
        }
    }

    #[test]
    fn a_ring_on_a_port_completes_cancels_and_reposts_from_any_thread() {
        let (tx, rx) = pair("127.0.0.1", "127.0.0.4");
        let port = recv::Port::new().unwrap();
        let mut ring = recv::RecvRing::new(&rx, 2, 2048).unwrap();
        ring.associate(port.handle(), 0x5057).unwrap();
        assert_eq!(ring.post_idle(), 0);
        assert_eq!(ring.in_flight(), 2);
        let msg = Outgoing {
            dst: rx.local_addr().unwrap(),
            bytes: b"ring",
            segment: None,
            ip: IpFields::default(),
        };
        // The port is shared, as an application's would be: a packet of someone else's (a
        // device's doorbell: a null OVERLAPPED) comes first.
        // SAFETY: the port handle is live; the packet carries no pointer anyone dereferences.
        let posted = unsafe {
            windows_sys::Win32::System::IO::PostQueuedCompletionStatus(
                port.handle(),
                0,
                0xD00B,
                std::ptr::null(),
            )
        };
        assert_ne!(posted, 0);
        send_batch(&tx, &[msg]).unwrap();
        // The completion is taken on another thread than the one that posted.
        let (mut ring, port) = std::thread::spawn(move || {
            let mut entries = vec![windows_sys::Win32::System::IO::OVERLAPPED_ENTRY::default(); 4];
            let mut got = Vec::new();
            while got.len() < 2 {
                let n = port.dequeue(&mut entries, 5000).unwrap();
                assert!(n > 0, "{} packets only", got.len());
                got.extend_from_slice(&entries[..n]);
            }
            assert_eq!(got[0].lpCompletionKey, 0xD00B);
            assert_eq!(ring.slot_of(got[0].lpOverlapped), None, "not the ring's");
            assert_eq!(got[1].lpCompletionKey, 0x5057);
            let i = ring
                .slot_of(got[1].lpOverlapped)
                .expect("the ring's request");
            let recv::Completion::Datagram(r) = ring.complete(i) else {
                panic!("a datagram");
            };
            assert_eq!(&ring.buffer_mut(i).unwrap()[..r.len], b"ring");
            ring.post(i).unwrap();
            (ring, port)
        })
        .join()
        .unwrap();
        assert_eq!(ring.in_flight(), 2);
        // Cancelled requests still complete through the port, as failures.
        ring.cancel();
        let mut entries = vec![windows_sys::Win32::System::IO::OVERLAPPED_ENTRY::default(); 4];
        let mut failed = 0;
        while ring.in_flight() > 0 {
            let n = port.dequeue(&mut entries, 5000).unwrap();
            assert!(n > 0, "a cancelled request never completed");
            for e in entries.iter().take(n) {
                let i = ring.slot_of(e.lpOverlapped).unwrap();
                if let recv::Completion::Failed(e) = ring.complete(i) {
                    assert_eq!(e.raw_os_error(), Some(ws::WSA_OPERATION_ABORTED), "{e}");
                    failed += 1;
                }
            }
        }
        assert_eq!(failed, 2);
    }

    /// The whole port on Windows: the fabric's engine thread takes datagrams off the
    /// OVERLAPPED requests, checks every ICRC (a bad one is dropped and counted, garbage is
    /// counted as malformed), says which offloads it lacks, and stops cleanly (the requests
    /// in flight are cancelled and waited for).
    #[test]
    fn the_port_checks_every_datagram_and_counts_the_offloads_it_lacks() {
        use portverbs_fabric::Fabric;
        use portverbs_hal::types::Gid;
        use portverbs_transport::{Packet, PayloadData};
        use portverbs_wire::{Bth, Opcode, TransportHdr};

        use crate::{UdpConfig, UdpPort};

        // A free port on 127.0.0.1 (the one IPv4 address Wine binds as asked).
        let port_no = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let fabric = Fabric::threaded();
        let port = UdpPort::attach(
            &fabric,
            UdpConfig {
                port: port_no,
                ..UdpConfig::new("127.0.0.1".parse().unwrap())
            },
        )
        .unwrap();
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        let stats = port.stats();
        assert_eq!(
            stats.segmentation_fallback,
            u64::from(!gso_available(&probe))
        );
        assert_eq!(stats.coalescing_fallback, u64::from(!enable_gro(&probe)));
        eprintln!(
            "segmentation fallback {}, coalescing fallback {}",
            stats.segmentation_fallback, stats.coalescing_fallback
        );

        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (src, dst) = (peer.local_addr().unwrap(), port.local_addr());
        let pkt = Packet::new(
            Gid::from_ip(src.ip()),
            Gid::from_ip(dst.ip()),
            TransportHdr::new(Bth::new(Opcode::SendOnly, 0x11, 7)),
            PayloadData::Bytes(vec![0x5a; 300]),
        );
        let mut good = Vec::new();
        pkt.write_datagram(&mut good).unwrap();
        portverbs_wire::seal_datagram(src, dst, &mut good).unwrap();
        let mut bad = good.clone();
        *bad.last_mut().unwrap() ^= 1;
        for d in [&good[..], &bad[..], b"not RoCEv2"] {
            peer.send_to(d, dst).unwrap();
        }
        let start = std::time::Instant::now();
        while port.stats().rx_packets < 3 {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{:?}",
                port.stats()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let stats = port.stats();
        assert_eq!(stats.rx_packets, 3);
        assert_eq!(stats.icrc_drops, 1, "{stats:?}");
        assert_eq!(stats.malformed, 1, "{stats:?}");
        drop(port);
    }

    #[test]
    fn the_loopback_mtu_is_large_and_a_foreign_address_has_none() {
        assert_eq!(interface_mtu("127.0.0.2".parse().unwrap()), Some(65_536));
        assert_eq!(interface_mtu("192.0.2.77".parse().unwrap()), None);
    }
}

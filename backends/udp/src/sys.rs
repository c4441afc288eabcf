//! The socket calls std does not offer: `sendmmsg` with UDP GSO, `recvmmsg` with UDP GRO,
//! and the options a RoCEv2 port needs (path MTU discovery on, so DF is set and the IPv4
//! identification is 0; large buffers). All of this crate's `unsafe` is here.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

use libc::{c_int, c_void, sockaddr_storage, socklen_t};

pub(crate) use crate::msg::{IpFields, Outgoing};

/// The largest number of segments one GSO send may carry (the kernel's `UDP_MAX_SEGMENTS`
/// is 64 on older kernels, 128 on newer ones).
pub(crate) const GSO_MAX_SEGMENTS: usize = 64;

fn setsockopt_int(sock: &UdpSocket, level: c_int, name: c_int, value: c_int) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`, a live c_int, for the whole call; the
    // descriptor is owned by `sock`.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&raw const value).cast::<c_void>(),
            size_of::<c_int>() as socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn getsockopt_int(sock: &UdpSocket, level: c_int, name: c_int) -> io::Result<c_int> {
    let mut value: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: the pointers describe `value` and `len`, both live for the call.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            level,
            name,
            (&raw mut value).cast::<c_void>(),
            &raw mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Path MTU discovery on: DF set, never fragmented locally, and (unconnected IPv4 socket)
/// identification 0, the header the ICRC is computed for.
pub(crate) fn set_dont_fragment(sock: &UdpSocket, v6: bool) -> io::Result<()> {
    if v6 {
        setsockopt_int(
            sock,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            libc::IPV6_PMTUDISC_DO,
        )
    } else {
        setsockopt_int(
            sock,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )
    }
}

/// Asks for `bytes` of receive and send buffer (past the sysctl limits when the process may:
/// `SO_RCVBUFFORCE` needs CAP_NET_ADMIN) and returns what the kernel granted.
pub(crate) fn set_buffers(sock: &UdpSocket, bytes: usize) -> (usize, usize) {
    let want = c_int::try_from(bytes).unwrap_or(c_int::MAX);
    for (force, plain) in [
        (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
        (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
    ] {
        if setsockopt_int(sock, libc::SOL_SOCKET, force, want).is_err() {
            // Best effort: the default buffer still works, with more loss under bursts.
            let _ = setsockopt_int(sock, libc::SOL_SOCKET, plain, want);
        }
    }
    let get = |name| {
        getsockopt_int(sock, libc::SOL_SOCKET, name)
            .ok()
            .and_then(|v| usize::try_from(v).ok())
            .unwrap_or(0)
    };
    (get(libc::SO_RCVBUF), get(libc::SO_SNDBUF))
}

/// Asks the kernel to report each datagram's traffic class, hop limit and (IPv6) flow
/// label, and to take the flow label of an outgoing IPv6 datagram from its destination.
pub(crate) fn enable_ip_fields(sock: &UdpSocket, v6: bool) -> io::Result<()> {
    if v6 {
        setsockopt_int(sock, libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, 1)?;
        setsockopt_int(sock, libc::IPPROTO_IPV6, libc::IPV6_RECVHOPLIMIT, 1)?;
        setsockopt_int(sock, libc::IPPROTO_IPV6, libc::IPV6_FLOWINFO, 1)?;
        setsockopt_int(sock, libc::IPPROTO_IPV6, libc::IPV6_FLOWINFO_SEND, 1)
    } else {
        setsockopt_int(sock, libc::IPPROTO_IP, libc::IP_RECVTOS, 1)?;
        setsockopt_int(sock, libc::IPPROTO_IP, libc::IP_RECVTTL, 1)
    }
}

/// Turns UDP GRO on for the socket: the kernel may then hand over several datagrams of one
/// flow in one buffer ([`Received::segment`]). False when the kernel lacks it.
pub(crate) fn enable_gro(sock: &UdpSocket) -> bool {
    setsockopt_int(sock, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok()
}

/// Whether the kernel offers UDP GSO (`UDP_SEGMENT`) on this socket.
pub(crate) fn gso_available(sock: &UdpSocket) -> bool {
    getsockopt_int(sock, libc::SOL_UDP, libc::UDP_SEGMENT).is_ok()
}

fn to_storage(addr: &SocketAddr, flow_label: u32) -> (sockaddr_storage, socklen_t) {
    // SAFETY: sockaddr_storage is plain data for which all-zero bytes are valid.
    let mut storage: sockaddr_storage = unsafe { zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { (&raw mut storage).cast::<libc::sockaddr_in>().write(sin) };
            size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                // With IPV6_FLOWINFO_SEND on, the kernel takes the flow label from here.
                sin6_flowinfo: (a.flowinfo() | (flow_label & 0x000F_FFFF)).to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { (&raw mut storage).cast::<libc::sockaddr_in6>().write(sin6) };
            size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, len as socklen_t)
}

fn from_storage(storage: &sockaddr_storage) -> Option<SocketAddr> {
    match c_int::from(storage.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the kernel wrote a sockaddr_in, which sockaddr_storage
            // is large enough and aligned for.
            let sin = unsafe { &*(storage as *const sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = sin.sin_addr.s_addr.to_ne_bytes();
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip.into(),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6.
            let sin6 =
                unsafe { &*(storage as *const sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                sin6.sin6_addr.s6_addr.into(),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Room for the control messages of one datagram, each `CMSG_SPACE` = 16 bytes of header
/// plus its data rounded up to 8: on send UDP_SEGMENT, the traffic class and the hop limit
/// (72 bytes); on receive UDP_GRO, the traffic class, the hop limit and the IPv6 flow
/// information (96 bytes).
const CMSG_ROOM: usize = 128;

/// Sends the messages with as few `sendmmsg` calls as it takes; returns how many messages
/// went out (the rest failed with the error, which is returned when none went out).
pub(crate) fn send_batch(sock: &UdpSocket, msgs: &[Outgoing<'_>]) -> io::Result<usize> {
    let mut names = Vec::with_capacity(msgs.len());
    let mut iovs = Vec::with_capacity(msgs.len());
    let mut cmsgs = vec![[0u64; CMSG_ROOM / 8]; msgs.len()];
    for m in msgs {
        names.push(to_storage(&m.dst, m.ip.flow_label));
        iovs.push(libc::iovec {
            iov_base: m.bytes.as_ptr().cast_mut().cast::<c_void>(),
            iov_len: m.bytes.len(),
        });
    }
    let mut hdrs: Vec<libc::mmsghdr> = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        // SAFETY: msghdr/mmsghdr are plain data for which all-zero bytes are valid.
        let mut h: libc::mmsghdr = unsafe { zeroed() };
        let (name, name_len) = names.get_mut(i).map_or((std::ptr::null_mut(), 0), |n| {
            ((&raw mut n.0).cast::<c_void>(), n.1)
        });
        h.msg_hdr.msg_name = name;
        h.msg_hdr.msg_namelen = name_len;
        h.msg_hdr.msg_iov = iovs.as_mut_ptr().wrapping_add(i);
        h.msg_hdr.msg_iovlen = 1;
        if let Some(room) = cmsgs.get_mut(i) {
            let v6 = m.dst.is_ipv6();
            let (tc_level, tc_name, hl_name) = if v6 {
                (libc::IPPROTO_IPV6, libc::IPV6_TCLASS, libc::IPV6_HOPLIMIT)
            } else {
                (libc::IPPROTO_IP, libc::IP_TOS, libc::IP_TTL)
            };
            let ints = [
                (tc_level, tc_name, c_int::from(m.ip.traffic_class)),
                (tc_level, hl_name, c_int::from(m.ip.hop_limit.max(1))),
            ];
            h.msg_hdr.msg_control = room.as_mut_ptr().cast::<c_void>();
            h.msg_hdr.msg_controllen = CMSG_ROOM;
            // SAFETY: the control buffer is CMSG_ROOM bytes and u64-aligned; the messages
            // written take 3 × CMSG_SPACE(4) = 72 bytes at most (checked by `fits` before each
            // write); CMSG_FIRSTHDR and CMSG_NXTHDR stay inside msg_controllen.
            unsafe {
                let mut used = 0usize;
                let fits = |used: usize, data: usize| {
                    used + libc::CMSG_SPACE(data as u32) as usize <= CMSG_ROOM
                };
                let mut c = libc::CMSG_FIRSTHDR(&raw const h.msg_hdr);
                for (level, name, value) in ints {
                    if c.is_null() || !fits(used, size_of::<c_int>()) {
                        break;
                    }
                    (*c).cmsg_level = level;
                    (*c).cmsg_type = name;
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<c_int>() as u32) as usize;
                    libc::CMSG_DATA(c).cast::<c_int>().write_unaligned(value);
                    used += libc::CMSG_SPACE(size_of::<c_int>() as u32) as usize;
                    c = libc::CMSG_NXTHDR(&raw const h.msg_hdr, c);
                }
                if let Some(seg) = m.segment {
                    if !c.is_null() && fits(used, size_of::<u16>()) {
                        (*c).cmsg_level = libc::SOL_UDP;
                        (*c).cmsg_type = libc::UDP_SEGMENT;
                        (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                        libc::CMSG_DATA(c).cast::<u16>().write_unaligned(seg);
                        used += libc::CMSG_SPACE(size_of::<u16>() as u32) as usize;
                    }
                }
                h.msg_hdr.msg_controllen = used;
            }
        }
        hdrs.push(h);
    }
    let mut sent = 0usize;
    while sent < hdrs.len() {
        let rest = hdrs.get_mut(sent..).unwrap_or(&mut []);
        let n = rest.len().min(1024) as u32;
        // SAFETY: `rest` holds `n` initialised headers whose name, iovec and control
        // pointers point into `names`, `iovs`, `cmsgs` and the callers' byte slices, all
        // alive and unmoved until this function returns.
        let rc = unsafe { libc::sendmmsg(sock.as_raw_fd(), rest.as_mut_ptr(), n, 0) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return if sent == 0 { Err(e) } else { Ok(sent) };
        }
        sent += rc as usize;
        if rc == 0 {
            break;
        }
    }
    Ok(sent)
}

/// What [`recv_batch`] got in one buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Received {
    /// Who sent it.
    pub(crate) src: Option<SocketAddr>,
    /// Bytes in the buffer.
    pub(crate) len: usize,
    /// With GRO: the buffer holds datagrams of this size back to back (the last may be
    /// shorter).
    pub(crate) segment: Option<usize>,
    /// The IP header's traffic class, hop limit and (IPv6) flow label, as the kernel
    /// reported them ([`enable_ip_fields`]).
    pub(crate) ip: IpFields,
}

/// Buffers for [`recv_batch`], reused across calls.
#[derive(Debug)]
pub(crate) struct RecvBufs {
    pub(crate) bufs: Vec<Vec<u8>>,
    names: Vec<sockaddr_storage>,
    cmsgs: Vec<[u64; CMSG_ROOM / 8]>,
    pub(crate) got: Vec<Received>,
}

impl RecvBufs {
    /// `count` buffers of `size` bytes.
    pub(crate) fn new(count: usize, size: usize) -> Self {
        Self {
            bufs: vec![vec![0u8; size]; count],
            // SAFETY: sockaddr_storage is plain data for which all-zero bytes are valid.
            names: vec![unsafe { zeroed() }; count],
            cmsgs: vec![[0u64; CMSG_ROOM / 8]; count],
            got: Vec::with_capacity(count),
        }
    }
}

/// Takes every datagram already queued, up to the number of buffers, without waiting
/// (`recvmmsg` with `MSG_DONTWAIT`; an empty queue is `Ok(0)`). The results are in
/// `bufs.got`.
pub(crate) fn recv_batch(sock: &UdpSocket, bufs: &mut RecvBufs) -> io::Result<usize> {
    bufs.got.clear();
    let count = bufs.bufs.len();
    let mut iovs: Vec<libc::iovec> = bufs
        .bufs
        .iter_mut()
        .map(|b| libc::iovec {
            iov_base: b.as_mut_ptr().cast::<c_void>(),
            iov_len: b.len(),
        })
        .collect();
    let mut hdrs: Vec<libc::mmsghdr> = Vec::with_capacity(count);
    for i in 0..count {
        // SAFETY: plain data; all-zero is valid.
        let mut h: libc::mmsghdr = unsafe { zeroed() };
        if let Some(n) = bufs.names.get_mut(i) {
            h.msg_hdr.msg_name = (n as *mut sockaddr_storage).cast::<c_void>();
            h.msg_hdr.msg_namelen = size_of::<sockaddr_storage>() as socklen_t;
        }
        h.msg_hdr.msg_iov = iovs.as_mut_ptr().wrapping_add(i);
        h.msg_hdr.msg_iovlen = 1;
        if let Some(c) = bufs.cmsgs.get_mut(i) {
            h.msg_hdr.msg_control = c.as_mut_ptr().cast::<c_void>();
            h.msg_hdr.msg_controllen = CMSG_ROOM;
        }
        hdrs.push(h);
    }
    let rc = loop {
        // SAFETY: `hdrs` holds `count` headers pointing into `iovs`, `bufs.bufs`,
        // `bufs.names` and `bufs.cmsgs`, all alive and unmoved during the call.
        let rc = unsafe {
            libc::recvmmsg(
                sock.as_raw_fd(),
                hdrs.as_mut_ptr(),
                count as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if rc >= 0 {
            break rc as usize;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::Interrupted => {}
            io::ErrorKind::WouldBlock => return Ok(0),
            _ => return Err(e),
        }
    };
    for (i, h) in hdrs.iter().take(rc).enumerate() {
        let mut segment = None;
        let mut ip = IpFields::default();
        // SAFETY: the kernel filled `msg_control`/`msg_controllen` of this header; the CMSG
        // macros walk inside that buffer only, and each read is of the size the kernel
        // writes for that message (IP_TOS: one byte; the others an int or a be32).
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&raw const h.msg_hdr);
            while !c.is_null() {
                let data = libc::CMSG_DATA(c);
                let int = || data.cast::<c_int>().read_unaligned();
                match ((*c).cmsg_level, (*c).cmsg_type) {
                    (libc::SOL_UDP, libc::UDP_GRO) => {
                        segment = usize::try_from(int()).ok().filter(|&s| s > 0);
                    }
                    (libc::IPPROTO_IP, libc::IP_TOS) => ip.traffic_class = data.read(),
                    (libc::IPPROTO_IP, libc::IP_TTL)
                    | (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT) => {
                        ip.hop_limit = u8::try_from(int()).unwrap_or(u8::MAX);
                    }
                    (libc::IPPROTO_IPV6, libc::IPV6_TCLASS) => {
                        ip.traffic_class = u8::try_from(int()).unwrap_or(0);
                    }
                    (libc::IPPROTO_IPV6, libc::IPV6_FLOWINFO) => {
                        let v = u32::from_be(data.cast::<u32>().read_unaligned());
                        ip.flow_label = v & 0x000F_FFFF;
                    }
                    _ => {}
                }
                c = libc::CMSG_NXTHDR(&raw const h.msg_hdr, c);
            }
        }
        bufs.got.push(Received {
            src: bufs.names.get(i).and_then(from_storage),
            len: h.msg_len as usize,
            segment,
            ip,
        });
    }
    Ok(rc)
}

/// The MTU of the interface that holds `ip`, from `getifaddrs` and sysfs; `None` when no
/// interface holds it or the MTU cannot be read.
pub(crate) fn interface_mtu(ip: std::net::IpAddr) -> Option<u32> {
    // Every 127/8 address is the loopback interface's, though only 127.0.0.1 is listed on it.
    let name = if ip.is_loopback() {
        "lo".to_string()
    } else {
        interface_of(ip)?
    };
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/mtu")).ok()?;
    text.trim().parse().ok()
}

fn interface_of(ip: std::net::IpAddr) -> Option<String> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into `list`, freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&raw mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = list;
    while !cur.is_null() && found.is_none() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs;
        // a non-null `ifa_addr` points at a sockaddr of the family it names, and `ifa_name`
        // at a NUL-terminated string.
        unsafe {
            let ifa = &*cur;
            if !ifa.ifa_addr.is_null() {
                let family = c_int::from((*ifa.ifa_addr).sa_family);
                let addr = match family {
                    libc::AF_INET | libc::AF_INET6 => {
                        let mut storage: sockaddr_storage = zeroed();
                        let len = if family == libc::AF_INET {
                            size_of::<libc::sockaddr_in>()
                        } else {
                            size_of::<libc::sockaddr_in6>()
                        };
                        std::ptr::copy_nonoverlapping(
                            ifa.ifa_addr.cast::<u8>(),
                            (&raw mut storage).cast::<u8>(),
                            len,
                        );
                        from_storage(&storage).map(|a| a.ip())
                    }
                    _ => None,
                };
                if addr == Some(ip) && !ifa.ifa_name.is_null() {
                    found = std::ffi::CStr::from_ptr(ifa.ifa_name)
                        .to_str()
                        .ok()
                        .map(str::to_owned);
                }
            }
            cur = ifa.ifa_next;
        }
    }
    // SAFETY: `list` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(list) };
    found
}

/// A UDP socket bound to `addr` with `SO_REUSEADDR` set first: a multicast group's receiving
/// socket, bound to the group's address and port, which every port of the host that joined
/// the group binds too (each then gets its own copy of every datagram to the group).
pub(crate) fn bind_shared(addr: SocketAddr) -> io::Result<UdpSocket> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let family = if addr.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain system call with constant arguments.
    let fd = unsafe {
        libc::socket(
            family,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by socket(2) and nothing else owns it.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let sock = UdpSocket::from(owned);
    setsockopt_int(&sock, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)?;
    let (storage, len) = to_storage(&addr, 0);
    // SAFETY: `storage` holds a sockaddr of `len` bytes for the whole call; the descriptor
    // is owned by `sock`.
    let rc = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&raw const storage).cast::<libc::sockaddr>(),
            len,
        )
    };
    if rc == 0 {
        Ok(sock)
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Multicast datagrams `sock` sends leave through the interface that holds `local`
/// (`IP_MULTICAST_IF` with an `ip_mreqn`, or `IPV6_MULTICAST_IF`), so that a port on a
/// loopback address reaches the group's members on this host rather than following the
/// default route.
pub(crate) fn set_multicast_if(sock: &UdpSocket, local: std::net::IpAddr) -> io::Result<()> {
    let index = interface_index(local).unwrap_or(0);
    match local {
        std::net::IpAddr::V4(v4) => {
            let mreq = libc::ip_mreqn {
                imr_multiaddr: libc::in_addr { s_addr: 0 },
                imr_address: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.octets()),
                },
                imr_ifindex: index as c_int,
            };
            // SAFETY: the pointer and length describe `mreq`, live for the whole call; the
            // descriptor is owned by `sock`.
            let rc = unsafe {
                libc::setsockopt(
                    sock.as_raw_fd(),
                    libc::IPPROTO_IP,
                    libc::IP_MULTICAST_IF,
                    (&raw const mreq).cast::<c_void>(),
                    size_of::<libc::ip_mreqn>() as socklen_t,
                )
            };
            if rc == 0 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        }
        std::net::IpAddr::V6(_) => setsockopt_int(
            sock,
            libc::IPPROTO_IPV6,
            libc::IPV6_MULTICAST_IF,
            index as c_int,
        ),
    }
}

/// The index of the interface that holds `ip` (every 127/8 address is the loopback
/// interface's).
pub(crate) fn interface_index(ip: std::net::IpAddr) -> Option<u32> {
    let name = if ip.is_loopback() {
        "lo".to_string()
    } else {
        interface_of(ip)?
    };
    let name = std::ffi::CString::new(name).ok()?;
    // SAFETY: `name` is a NUL-terminated string, live for the call.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    (index != 0).then_some(index)
}

//! The socket calls std does not offer: `sendmmsg` with UDP GSO, `recvmmsg` with UDP GRO,
//! and the options a RoCEv2 port needs (path MTU discovery on, so DF is set and the IPv4
//! identification is 0; large buffers). All of this crate's `unsafe` is here.

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket};
use std::os::fd::AsRawFd;

use libc::{c_int, c_void, sockaddr_storage, socklen_t};

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

/// Turns UDP GRO on for the socket: the kernel may then hand over several datagrams of one
/// flow in one buffer ([`Received::segment`]). False when the kernel lacks it.
pub(crate) fn enable_gro(sock: &UdpSocket) -> bool {
    setsockopt_int(sock, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok()
}

/// Whether the kernel offers UDP GSO (`UDP_SEGMENT`) on this socket.
pub(crate) fn gso_available(sock: &UdpSocket) -> bool {
    getsockopt_int(sock, libc::SOL_UDP, libc::UDP_SEGMENT).is_ok()
}

fn to_storage(addr: &SocketAddr) -> (sockaddr_storage, socklen_t) {
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
                sin6_flowinfo: a.flowinfo(),
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

/// One message for [`send_batch`]: `bytes` to `dst`; with `segment`, several datagrams of
/// that many bytes each (the last may be shorter) sent as one GSO message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outgoing<'a> {
    pub(crate) dst: SocketAddr,
    pub(crate) bytes: &'a [u8],
    pub(crate) segment: Option<u16>,
}

/// Room for one `UDP_SEGMENT` control message (a u16 payload, padded).
const CMSG_ROOM: usize = 32;

/// Sends the messages with as few `sendmmsg` calls as it takes; returns how many messages
/// went out (the rest failed with the error, which is returned when none went out).
pub(crate) fn send_batch(sock: &UdpSocket, msgs: &[Outgoing<'_>]) -> io::Result<usize> {
    let mut names = Vec::with_capacity(msgs.len());
    let mut iovs = Vec::with_capacity(msgs.len());
    let mut cmsgs = vec![[0u64; CMSG_ROOM / 8]; msgs.len()];
    for m in msgs {
        names.push(to_storage(&m.dst));
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
        if let (Some(seg), Some(room)) = (m.segment, cmsgs.get_mut(i)) {
            let buf = room.as_mut_ptr().cast::<u8>();
            // SAFETY: CMSG_SPACE(2) fits in CMSG_ROOM bytes of the u64-aligned buffer `room`;
            // the header and data pointers the CMSG macros return stay inside it.
            unsafe {
                let space = libc::CMSG_SPACE(size_of::<u16>() as u32) as usize;
                h.msg_hdr.msg_control = buf.cast::<c_void>();
                h.msg_hdr.msg_controllen = space;
                let c = libc::CMSG_FIRSTHDR(&raw const h.msg_hdr);
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = libc::UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                libc::CMSG_DATA(c).cast::<u16>().write_unaligned(seg);
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

/// Waits for at least one datagram (up to the socket's read timeout) and takes every one
/// already queued, up to the number of buffers (`recvmmsg` with `MSG_WAITFORONE`). The
/// results are in `bufs.got`.
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
                libc::MSG_WAITFORONE,
                std::ptr::null_mut(),
            )
        };
        if rc >= 0 {
            break rc as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    for (i, h) in hdrs.iter().take(rc).enumerate() {
        let mut segment = None;
        // SAFETY: the kernel filled `msg_control`/`msg_controllen` of this header; the CMSG
        // macros walk inside that buffer only.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&raw const h.msg_hdr);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                    let v = libc::CMSG_DATA(c).cast::<c_int>().read_unaligned();
                    segment = usize::try_from(v).ok().filter(|&s| s > 0);
                }
                c = libc::CMSG_NXTHDR(&raw const h.msg_hdr, c);
            }
        }
        bufs.got.push(Received {
            src: bufs.names.get(i).and_then(from_storage),
            len: h.msg_len as usize,
            segment,
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

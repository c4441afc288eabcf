//! UD multicast between UDP-bound devices as IP multicast (RoCEv2): two devices of this
//! process on two loopback addresses, in auto progress (each on its own fabric with its own
//! progress thread), so that a datagram to a group leaves one port's socket for the IP group
//! and reaches the other's group socket through the kernel. The group is an IPv4 group named
//! as rdma_cm names it on RoCEv2 (`::ffff:239.91.0.1`); attaching a device's first QP joins
//! the IP group on the port (it shows in `/proc/net/igmp` on `lo`), detaching its last QP
//! leaves it.
//!
//! A datagram to the group from another address of the host (what another host's would
//! look like) reaches the attached QP and is never sent back out; one claiming the port's
//! own address is taken for the port's own looped-back copy and dropped.
//!
//! Loopback multicast needs no multicast route: the ports send through the interface of
//! their own address (`IP_MULTICAST_IF`; Linux also routes a multicast datagram from a socket
//! bound to a local address through that address's interface) with `IP_MULTICAST_LOOP` on.
#![cfg(target_os = "linux")]

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use portverbs::hal::{CommandError, Progress};
use portverbs::prelude::*;
use portverbs::udp_port::UdpConfig;
use portverbs::verbs::{ContextOptions, McastError};
use portverbs::{UdpDevice, udp_device};

#[path = "util/mcast/mod.rs"]
mod mcast_util;

use mcast_util::completions;

const QKEY: u32 = 0x1111_2222;
/// How long a wait for one completion may take.
const PATIENCE: Duration = Duration::from_secs(10);
const MCAST_QPN: u32 = 0x00ff_ffff;
const GROUP: Ipv4Addr = Ipv4Addr::new(239, 91, 0, 1);

fn device(name: &str, ip: &str) -> UdpDevice {
    let mut config = UdpConfig::new(ip.parse::<IpAddr>().unwrap());
    config.progress = Progress::Auto;
    udp_device(name, config).unwrap_or_else(|e| panic!("{name} on {ip}: {e}"))
}

/// Whether `lo` holds the IP group (as `/proc/net/igmp` lists it: the address's four bytes
/// read as a little-endian word, in hex).
fn lo_in_group(group: Ipv4Addr) -> bool {
    let want = format!("{:08X}", u32::from_le_bytes(group.octets()));
    let text = std::fs::read_to_string("/proc/net/igmp").unwrap();
    let mut on_lo = false;
    for line in text.lines() {
        if !line.starts_with('\t') {
            on_lo = line.split_whitespace().nth(1) == Some("lo");
        } else if on_lo && line.split_whitespace().next() == Some(want.as_str()) {
            return true;
        }
    }
    false
}

#[test]
fn udp_devices_deliver_multicast_through_an_ip_group_and_leave_it() {
    let (a, b) = (device("mc_a", "127.0.91.1"), device("mc_b", "127.0.91.2"));
    let open = |d: &UdpDevice| Context::open_blocking(d.any(), ContextOptions::default()).unwrap();
    let (ctx_a, ctx_b) = (open(&a), open(&b));
    let gid = Gid::from_ipv4(GROUP);
    let sender = mcast_util::ud(&ctx_a, QKEY);
    let (r1, r2) = (mcast_util::ud(&ctx_b, QKEY), mcast_util::ud(&ctx_b, QKEY));
    assert!(
        !lo_in_group(GROUP),
        "the group is not joined before the test"
    );
    r1.qp.attach_mcast_blocking(gid, 0).unwrap();
    r2.qp.attach_mcast_blocking(gid, 0).unwrap();
    assert!(lo_in_group(GROUP), "the first attach joined the IP group");
    r1.post_recv(1);
    r2.post_recv(2);

    let ah = sender
        .pd
        .create_ah_blocking(AddressVector {
            dgid: gid,
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AddressVector::default()
        })
        .unwrap();
    let payload = b"to every member of 239.91.0.1";
    sender.mr.write(0, payload).unwrap();
    let sge = [sender.mr.sge(0, payload.len()).unwrap()];
    let dest = UdDest {
        ah_pd: None,
        av: ah.av(),
        remote_qpn: MCAST_QPN,
        remote_qkey: QKEY,
    };
    let wr = SendWr::new(7, SendOp::Send).sges(&sge).ud(dest).signaled();
    sender.qp.post_send(&[wr]).unwrap();
    let wc = completions(&sender.cq, 1, PATIENCE);
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, WcStatus::Success);

    for (r, wr_id) in [(&r1, 1), (&r2, 2)] {
        let wc = completions(&r.cq, 1, PATIENCE);
        assert_eq!(wc.len(), 1, "one copy for each attached QP");
        assert_eq!(wc[0].wr_id, wr_id);
        assert_eq!(wc[0].status, WcStatus::Success);
        assert_eq!(wc[0].src_qp, sender.qp.qp_num());
        assert_eq!(wc[0].byte_len as usize, 40 + payload.len());
        let mut got = vec![0u8; 40 + payload.len()];
        r.mr.read(0, &mut got).unwrap();
        assert_eq!(
            got[32..36],
            [127, 0, 91, 1],
            "GRH source: the sender's address"
        );
        assert_eq!(got[36..40], GROUP.octets(), "GRH destination: the group");
        assert_eq!(&got[40..], payload);
    }
    let (sa, sb) = (a.port().stats(), b.port().stats());
    assert_eq!(sa.tx_mcast, 1, "{sa:?}");
    assert_eq!(sa.tx_mcast_local_copies, 1, "b's port joined: {sa:?}");
    assert_eq!(sb.rx_mcast, 1, "one datagram for both QPs of b: {sb:?}");

    // The device stays in the group while one of its QPs is attached.
    r1.qp.detach_mcast_blocking(gid, 0).unwrap();
    assert!(lo_in_group(GROUP), "r2 still needs the group");
    r2.qp.detach_mcast_blocking(gid, 0).unwrap();
    assert!(!lo_in_group(GROUP), "the last detach left the IP group");
    drop(ah);
}

#[test]
fn a_group_of_the_other_address_family_is_refused_by_a_udp_port() {
    let a = device("mc_v6", "127.0.92.1");
    let ctx = Context::open_blocking(a.any(), ContextOptions::default()).unwrap();
    let s = mcast_util::ud(&ctx, QKEY);
    let v6 = Gid::from_ipv6("ff0e::91:1".parse().unwrap());
    let err = s.qp.attach_mcast_blocking(v6, 0).unwrap_err();
    assert!(
        matches!(
            &err,
            McastError::Device {
                source: CommandError::InvalidArgument { .. },
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(s.qp.mcast_groups(), []);
    // Nothing was left half-joined: an IPv4 group still attaches and detaches.
    let gid = Gid::from_ipv4(Ipv4Addr::new(239, 92, 0, 1));
    s.qp.attach_mcast_blocking(gid, 0).unwrap();
    s.qp.detach_mcast_blocking(gid, 0).unwrap();
}

/// A UD SEND ONLY to the multicast QP from `from`, sealed for `to` (the group and 4791).
fn forged_datagram(
    from: std::net::SocketAddr,
    to: std::net::SocketAddr,
    payload: &[u8],
) -> Vec<u8> {
    use portverbs_wire::{Bth, Deth, Opcode, TransportHdr, seal_datagram};
    let mut hdr = TransportHdr::new(Bth::new(Opcode::UdSendOnly, MCAST_QPN, 7));
    hdr.deth = Some(Deth {
        qkey: QKEY,
        src_qp: 0x77,
    });
    let mut d = Vec::new();
    hdr.emit_packet(payload, &mut d).unwrap();
    seal_datagram(from, to, &mut d).unwrap();
    d
}

/// Polls `cond` until it holds (at most 10 s).
fn until(mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

#[test]
fn a_multicast_datagram_from_the_network_is_delivered_and_never_sent_back_out() {
    let dev = device("mc_net", "127.0.93.1");
    let ctx = Context::open_blocking(dev.any(), ContextOptions::default()).unwrap();
    let group = Ipv4Addr::new(239, 93, 0, 1);
    let r = mcast_util::ud(&ctx, QKEY);
    r.qp.attach_mcast_blocking(Gid::from_ipv4(group), 0)
        .unwrap();
    r.post_recv(1);
    r.post_recv(2);
    let to = std::net::SocketAddr::new(group.into(), portverbs_wire::ROCEV2_UDP_PORT);

    // Another host's datagram to the group (a socket on another loopback address sends
    // through lo, where the port joined the group).
    let peer = std::net::UdpSocket::bind("127.0.93.7:0").unwrap();
    let d = forged_datagram(peer.local_addr().unwrap(), to, b"from the network");
    peer.send_to(&d, to).unwrap();
    let wc = completions(&r.cq, 1, PATIENCE);
    assert_eq!(wc.len(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    assert_eq!(wc[0].src_qp, 0x77);
    let mut got = vec![0u8; 40 + 16];
    r.mr.read(0, &mut got).unwrap();
    assert_eq!(got[32..36], [127, 0, 93, 7], "GRH source: the sender");
    assert_eq!(got[36..40], group.octets(), "GRH destination: the group");
    assert_eq!(&got[40..], b"from the network");

    // One claiming the port's own address is its own looped-back copy: dropped.
    let liar = std::net::UdpSocket::bind("127.0.93.1:0").unwrap();
    let d = forged_datagram(liar.local_addr().unwrap(), to, b"my own, looped back");
    liar.send_to(&d, to).unwrap();
    assert!(
        until(|| dev.port().stats().rx_mcast_loop >= 1),
        "{:?}",
        dev.port().stats()
    );
    // So the second receive is still there for the next datagram from the network.
    let d = forged_datagram(peer.local_addr().unwrap(), to, b"again from there");
    peer.send_to(&d, to).unwrap();
    let wc = completions(&r.cq, 1, PATIENCE);
    assert_eq!(wc.len(), 1);
    assert_eq!((wc[0].wr_id, wc[0].status), (2, WcStatus::Success));
    r.mr.read(0, &mut got).unwrap();
    assert_eq!(&got[40..], b"again from there");

    let s = dev.port().stats();
    assert_eq!(s.rx_mcast, 2, "{s:?}");
    assert_eq!(
        s.tx_mcast, 0,
        "nothing from the network is sent back out: {s:?}"
    );
    assert_eq!(s.tx_packets, 0, "{s:?}");
}

//! The CM's connection semantics that need a backend of their own: the path MTU of the ports
//! (soft devices whose port MTU each test chooses; the emulated HCA and the UDP port have one
//! MTU each), and the options flow control, SRQ, TOS, MTU and depths as the REQ carries them
//! on the wire (read off a plain UDP socket on a loopback address, the peer that never
//! answers). The semantics every backend shares (parameters checked against the device,
//! depths, EADDRINUSE, receives before accept/connect, TOS and ACK timeout on the QPs) run on
//! every backend in `cm_matrix.rs`'s `params` module.
#![cfg(target_os = "linux")]

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use portverbs::cm::service::{CmDevice, ConnParam, Connector, ServiceError};
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric, SoftDevice};

#[path = "util/cm/mod.rs"]
mod cm_util;
use cm_util::udp::{Silent, udp_cm};
use cm_util::{Dev, attr, close, connect, side};

/// The CM of a soft device on `fabric` at `ip`, whose port's active MTU is `mtu`.
fn soft_cm(fabric: &Fabric, ip: &str, mtu: Mtu) -> Dev {
    let ip: IpAddr = ip.parse().unwrap();
    let mut config = DeviceConfig::with_ip(ip);
    config.ports[0].mtu = mtu;
    let dev = SoftDevice::attach(fabric, config).unwrap();
    let ctx = portverbs::open(portverbs::AnyDevice::Soft(dev)).unwrap();
    CmDevice::open_blocking(&ctx, ip).unwrap()
}

/// Two soft devices' CMs on a fabric of their own, with these port MTUs.
fn pair(mtus: [Mtu; 2]) -> (Fabric, Dev, Dev) {
    let fabric = Fabric::threaded();
    let a = soft_cm(&fabric, "10.88.0.1", mtus[0]);
    let b = soft_cm(&fabric, "10.88.0.2", mtus[1]);
    (fabric, a, b)
}

// ---- 1. path MTU ------------------------------------------------------------------------

#[test]
fn both_qps_get_the_4096_mtu_of_their_ports() {
    let (_f, a, b) = pair([Mtu::Mtu4096, Mtu::Mtu4096]);
    let ends = connect(&a, &b, 7601, &ConnParam::default(), ConnParam::default());
    assert_eq!(attr(&ends.0.0).path_mtu, Mtu::Mtu4096);
    assert_eq!(attr(&ends.1.0).path_mtu, Mtu::Mtu4096);
    close(&a, &b, ends);
}

#[test]
fn a_conn_param_mtu_is_used_and_cut_to_the_port() {
    let (_f, a, b) = pair([Mtu::Mtu4096, Mtu::Mtu4096]);
    let small = ConnParam {
        path_mtu: Some(Mtu::Mtu1024),
        ..ConnParam::default()
    };
    let ends = connect(&a, &b, 7602, &small, ConnParam::default());
    assert_eq!(attr(&ends.0.0).path_mtu, Mtu::Mtu1024);
    // The REQ said 1024: the passive side takes no more.
    assert_eq!(attr(&ends.1.0).path_mtu, Mtu::Mtu1024);
    close(&a, &b, ends);

    // Asking more than the port has gets the port's.
    let (_f, a, b) = pair([Mtu::Mtu2048, Mtu::Mtu2048]);
    let big = ConnParam {
        path_mtu: Some(Mtu::Mtu4096),
        ..ConnParam::default()
    };
    let ends = connect(&a, &b, 7603, &big, big.clone());
    assert_eq!(attr(&ends.0.0).path_mtu, Mtu::Mtu2048);
    assert_eq!(attr(&ends.1.0).path_mtu, Mtu::Mtu2048);
    close(&a, &b, ends);
}

#[test]
fn the_passive_side_takes_the_smaller_of_the_req_mtu_and_its_port() {
    // a's port 4096, b's 2048.
    let (_f, a, b) = pair([Mtu::Mtu4096, Mtu::Mtu2048]);
    assert_eq!((a.port_mtu(), b.port_mtu()), (Mtu::Mtu4096, Mtu::Mtu2048));
    // a connects: its REQ says 4096, b's QP gets its port's 2048.
    let ends = connect(&a, &b, 7604, &ConnParam::default(), ConnParam::default());
    assert_eq!(attr(&ends.1.0).path_mtu, Mtu::Mtu2048);
    // The REP carries no MTU: a keeps its port's (as Linux's CM does).
    assert_eq!(attr(&ends.0.0).path_mtu, Mtu::Mtu4096);
    close(&a, &b, ends);
    // b connects: both get 2048 (the REQ's, a's port allowing more).
    let ends = connect(&b, &a, 7605, &ConnParam::default(), ConnParam::default());
    assert_eq!(attr(&ends.0.0).path_mtu, Mtu::Mtu2048);
    assert_eq!(attr(&ends.1.0).path_mtu, Mtu::Mtu2048);
    close(&b, &a, ends);
}

// ---- the REQ on the wire ----------------------------------------------------------------

#[test]
fn the_req_carries_flow_control_srq_tos_mtu_and_the_device_depths() {
    let (ip, peer) = ("127.0.197.1", "127.0.197.2");
    let silent = Silent::bind(peer.parse().unwrap());
    let (dev, a) = udp_cm(
        "cm_semantics",
        ip.parse().unwrap(),
        portverbs::hal::Progress::Auto,
    );
    let ctx = a.context().clone();
    let port_mtu = ctx.query_port_blocking(1).unwrap().active_mtu;
    let dst = SocketAddr::new(peer.parse().unwrap(), 7615);
    let quick = ConnParam {
        timeout: Some(Duration::from_millis(100)),
        ..ConnParam::default()
    };

    // Defaults, on a QP with an SRQ.
    let pd = ctx.alloc_pd_blocking().unwrap();
    let srq = pd
        .create_srq_blocking(SrqInit {
            max_wr: 8,
            max_sge: 1,
            limit: 0,
        })
        .unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 16,
            ..CqInit::default()
        })
        .unwrap();
    let mut init = QpInit::new(QpType::Rc, &cq);
    init.srq = Some(&srq);
    let qp = pd.create_qp_blocking(init).unwrap();
    let mut conn = Connector::new(&a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    let r = conn.connect_blocking(&qp, &quick);
    assert!(matches!(r, Err(ServiceError::Unreachable)), "{r:?}");
    let req = silent.req();
    assert!(req.srq);
    assert!(!req.end_to_end_flow_control);
    assert_eq!(req.primary.traffic_class, 0);
    assert_eq!(req.path_mtu, port_mtu as u8);
    let max = |n: u32| u8::try_from(n).unwrap_or(u8::MAX);
    assert_eq!(req.responder_resources, max(ctx.attr().max_qp_rd_atom));
    assert_eq!(req.initiator_depth, max(ctx.attr().max_qp_init_rd_atom));
    drop(conn);

    // Every option set, on a QP without an SRQ.
    let s = side(&ctx, None);
    let param = ConnParam {
        flow_control: true,
        tos: 0xb8,
        path_mtu: Some(Mtu::Mtu1024),
        responder_resources: Some(2),
        initiator_depth: Some(3),
        ..quick
    };
    let mut conn = Connector::new(&a).unwrap();
    conn.resolve_blocking(dst).unwrap();
    let r = conn.connect_blocking(&s.qp, &param);
    assert!(matches!(r, Err(ServiceError::Unreachable)), "{r:?}");
    let req = silent.req();
    assert!(!req.srq);
    assert!(req.end_to_end_flow_control);
    assert_eq!(req.primary.traffic_class, 0xb8);
    assert_eq!(req.path_mtu, Mtu::Mtu1024 as u8);
    assert_eq!((req.responder_resources, req.initiator_depth), (2, 3));
    drop(conn);
    drop(dev);
}

// ---- the CM's port -----------------------------------------------------------------------

/// A two-port soft device whose second port alone holds `ip`, port 1 another address; the
/// ports' MTUs are 4096 and 1024, so the path MTU shows which port a QP was brought up on.
fn two_port_cm(fabric: &Fabric, port1_ip: &str, ip: &str) -> Dev {
    use portverbs::soft::PortConfig;
    let ip: IpAddr = ip.parse().unwrap();
    let port = |addr: IpAddr, mtu| PortConfig {
        addrs: vec![addr],
        mtu,
    };
    let mut config = DeviceConfig::with_ip(ip);
    config.ports = vec![
        port(port1_ip.parse().unwrap(), Mtu::Mtu4096),
        port(ip, Mtu::Mtu1024),
    ];
    let dev = SoftDevice::attach(fabric, config).unwrap();
    let ctx = portverbs::open(portverbs::AnyDevice::Soft(dev)).unwrap();
    CmDevice::open_blocking(&ctx, ip).unwrap()
}

#[test]
fn the_cm_runs_on_the_port_whose_gid_table_holds_its_address() {
    let fabric = Fabric::threaded();
    let a = two_port_cm(&fabric, "10.88.1.1", "10.88.2.1");
    let b = soft_cm(&fabric, "10.88.2.2", Mtu::Mtu4096);
    assert_eq!((a.port(), a.port_mtu()), (2, Mtu::Mtu1024));
    assert_eq!((b.port(), b.port_mtu()), (1, Mtu::Mtu4096));
    // QP1 on port 2 carries the whole exchange, and the data moves over port 2.
    cm_util::connect_send_disconnect(&a, &b, 7611);
    let ends = connect(&a, &b, 7612, &ConnParam::default(), ConnParam::default());
    let qa = attr(&ends.0.0);
    assert_eq!((qa.port_num, qa.ah_attr.port_num), (2, 2));
    assert_eq!(qa.path_mtu, Mtu::Mtu1024, "port 2's MTU, not port 1's");
    assert_eq!(attr(&ends.1.0).path_mtu, Mtu::Mtu1024);
    close(&a, &b, ends);
}

#[test]
fn an_address_on_no_port_is_not_local() {
    let fabric = Fabric::threaded();
    let dev = SoftDevice::attach(&fabric, DeviceConfig::with_ip([10, 88, 3, 1].into())).unwrap();
    let ctx = portverbs::open(portverbs::AnyDevice::Soft(dev)).unwrap();
    let other: IpAddr = [10, 88, 3, 2].into();
    assert!(matches!(
        CmDevice::open_blocking(&ctx, other),
        Err(ServiceError::AddressNotLocal(ip)) if ip == other
    ));
}

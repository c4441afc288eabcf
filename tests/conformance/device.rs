//! Devices, ports, GID and P_Key tables (pyverbs `test_device`).

use std::collections::HashSet;
use std::net::IpAddr;

use portverbs::hal::{AtomicCap, CommandError, GidType, LinkLayer, QuirkId};
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric, PortConfig};
use portverbs::verbs::{
    AsyncEventKind, ContextOptions, EventElement, MrError, PdError, PortState, QueryError,
};

use super::env::{Backend, Env};

fn device_list_is_non_empty_and_names_are_unique(_backend: Backend) {
    let devs = portverbs::devices();
    assert!(!devs.is_empty(), "ibv_get_device_list returned no device");
    let names: Vec<String> = devs.iter().map(|d| d.info().name.clone()).collect();
    let unique: HashSet<&String> = names.iter().collect();
    assert_eq!(unique.len(), names.len(), "duplicate names in {names:?}");
    for name in &names {
        let found = portverbs::device(name).expect("every listed device is found by name");
        assert_eq!(&found.info().name, name);
    }
    assert!(portverbs::device("no-such-device").is_err());
}

fn open_device_reports_its_name_and_attributes(backend: Backend) {
    let env = Env::new(backend);
    for (ctx, dev) in [(env.a(), &env.devs[0]), (env.b(), &env.devs[1])] {
        let info = ctx.device().info();
        assert_eq!(ctx.name(), info.name);
        assert_eq!(ctx.name(), dev.name());
        assert_eq!(info.driver, backend.driver());
        assert_eq!(ctx.attr().node_guid, info.node_guid);
        assert!(!ctx.is_fatal());
        assert!(ctx.object_counts().is_zero());
    }
    assert_ne!(env.a().name(), env.b().name());
    assert_ne!(env.a().attr().node_guid, env.b().attr().node_guid);
}

fn query_device_reports_sane_limits(backend: Backend) {
    let env = Env::new(backend);
    let a = env.a().query_device_blocking().unwrap();
    assert_eq!(
        &a,
        env.a().attr(),
        "a fresh query equals the attributes cached at open"
    );
    assert!(a.phys_port_cnt >= 1);
    assert!(a.max_cqe >= 1);
    assert!(a.max_cq >= 1);
    assert!(a.max_qp >= 1);
    assert!(a.max_qp_wr >= 1);
    assert!(a.max_sge >= 1);
    assert!(a.max_pd >= 1);
    assert!(a.max_mr >= 1);
    assert!(a.max_mr_size > 0);
    assert!(a.max_pkeys >= 1);
    assert!(a.num_comp_vectors >= 1);
    assert!(a.max_srq_wr >= 1 && a.max_srq_sge >= 1);
    assert!(a.max_qp_init_rd_atom >= 1 && a.max_qp_rd_atom >= 1);
    assert_ne!(
        a.atomic_cap,
        AtomicCap::None,
        "the soft device implements atomics"
    );
    assert_ne!(a.node_guid, 0);
    assert!(!a.fw_ver.is_empty());
}

fn query_port_one_works_and_ports_outside_the_device_fail(backend: Backend) {
    let env = Env::new(backend);
    let ctx = env.a();
    let count = ctx.attr().phys_port_cnt;
    let p = ctx.query_port_blocking(1).unwrap();
    assert_eq!(p.state, PortState::Active);
    assert_eq!(p.link_layer, LinkLayer::Ethernet);
    assert!(p.gid_tbl_len >= 1);
    assert!(p.pkey_tbl_len >= 1);
    assert!(p.active_mtu <= p.max_mtu);
    assert!(p.max_msg_sz >= 1 << 20);
    assert!(
        p.active_width > 0 && p.active_speed > 0,
        "query_port_speed: {p:?}"
    );
    assert_eq!(p.phys_state, 5, "LinkUp");
    for bad in [0, count + 1] {
        match ctx.query_port_blocking(bad) {
            Err(QueryError::NoSuchPort { port, count: c }) => {
                assert_eq!((port, c), (bad, count));
            }
            other => panic!("port {bad}: expected NoSuchPort, got {other:?}"),
        }
    }
}

fn query_port_reflects_port_state_changes(backend: Backend) {
    let env = Env::new(backend);
    env.set_port_active(0, 1, false);
    assert_eq!(
        env.a().query_port_blocking(1).unwrap().state,
        PortState::Down
    );
    let ev = env.a().get_async_event().unwrap().expect("a port event");
    assert_eq!(ev.kind, AsyncEventKind::PortErr);
    assert_eq!(ev.element, EventElement::Port(1));
    env.set_port_active(0, 1, true);
    assert_eq!(
        env.a().query_port_blocking(1).unwrap().state,
        PortState::Active
    );
    let ev = env.a().get_async_event().unwrap().expect("a port event");
    assert_eq!(ev.kind, AsyncEventKind::PortActive);
}

fn gid_index_zero_is_the_devices_ip_as_a_rocev2_gid(backend: Backend) {
    let env = Env::new(backend);
    for (ctx, ip) in [(env.a(), env.ips[0]), (env.b(), env.ips[1])] {
        let IpAddr::V4(ip) = ip else {
            panic!("the environments use IPv4 addresses")
        };
        let e = ctx.query_gid_blocking(1, 0).unwrap();
        assert_eq!(e.gid, Gid::from_ipv4(ip));
        assert_eq!(e.gid_type, GidType::RoceV2);
        assert!(e.gid.is_ipv4_mapped());
        assert_eq!(e.gid.to_ip(), IpAddr::from(ip));
    }
}

fn gid_index_beyond_the_table_fails_with_index_out_of_range(backend: Backend) {
    let env = Env::new(backend);
    let len = env.a().query_port_blocking(1).unwrap().gid_tbl_len;
    for index in [len, len + 1, u32::MAX] {
        match env.a().query_gid_blocking(1, index) {
            Err(QueryError::IndexOutOfRange {
                table,
                index: i,
                len: l,
            }) => assert_eq!((table, i, l), ("GID", index, len)),
            other => panic!("index {index}: expected IndexOutOfRange, got {other:?}"),
        }
    }
    assert!(matches!(
        env.a().query_gid_blocking(0, 0),
        Err(QueryError::NoSuchPort { port: 0, .. })
    ));
}

fn empty_gid_index_fails_with_empty_gid(backend: Backend) {
    let env = Env::new(backend);
    let len = env.a().query_port_blocking(1).unwrap().gid_tbl_len;
    assert!(len > 1, "the table has room for more than the one address");
    for index in [1, len - 1] {
        match env.a().query_gid_blocking(1, index) {
            Err(QueryError::EmptyGid { port, index: i }) => assert_eq!((port, i), (1, index)),
            other => panic!("index {index}: expected EmptyGid, got {other:?}"),
        }
    }
}

fn gid_table_lists_exactly_the_configured_entries(_backend: Backend) {
    let fabric = Fabric::stepped(7);
    let addrs: Vec<IpAddr> = ["192.168.7.1", "192.168.7.2", "fd00::7"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let port2: IpAddr = "192.168.8.1".parse().unwrap();
    let dev = portverbs::soft::SoftDevice::attach(
        &fabric,
        DeviceConfig {
            name: Some("multi".into()),
            ports: vec![
                PortConfig {
                    addrs: addrs.clone(),
                    mtu: Mtu::Mtu4096,
                },
                PortConfig {
                    addrs: vec![port2],
                    mtu: Mtu::Mtu1024,
                },
            ],
            seed: None,
            congestion: None,
        },
    )
    .unwrap();
    {
        let ctx = Context::open_blocking(AnyDevice::Soft(dev.clone()), ContextOptions::default())
            .unwrap();
        assert_eq!(ctx.name(), "multi");
        assert_eq!(ctx.attr().phys_port_cnt, 2);
        let table = ctx.gid_table_blocking(1).unwrap();
        let expect: Vec<(u32, Gid)> = addrs
            .iter()
            .enumerate()
            .map(|(i, ip)| (i as u32, Gid::from_ip(*ip)))
            .collect();
        let got: Vec<(u32, Gid)> = table.iter().map(|(i, e)| (*i, e.gid)).collect();
        assert_eq!(got, expect);
        assert!(table.iter().all(|(_, e)| e.gid_type == GidType::RoceV2));
        let t2 = ctx.gid_table_blocking(2).unwrap();
        assert_eq!(t2.len(), 1);
        assert_eq!((t2[0].0, t2[0].1.gid), (0, Gid::from_ip(port2)));
        assert_eq!(ctx.query_port_blocking(2).unwrap().active_mtu, Mtu::Mtu1024);
        assert!(matches!(
            ctx.query_port_blocking(3),
            Err(QueryError::NoSuchPort { port: 3, count: 2 })
        ));
        assert!(matches!(
            ctx.gid_table_blocking(3),
            Err(QueryError::NoSuchPort { port: 3, count: 2 })
        ));
    }
    assert!(dev.resources().is_zero(), "{:?}", dev.resources());
}

fn pkey_index_zero_is_the_default_pkey_and_beyond_the_table_fails(backend: Backend) {
    let env = Env::new(backend);
    let ctx = env.a();
    assert_eq!(ctx.query_pkey_blocking(1, 0).unwrap(), 0xffff);
    let len = ctx.query_port_blocking(1).unwrap().pkey_tbl_len;
    match ctx.query_pkey_blocking(1, len) {
        Err(QueryError::IndexOutOfRange {
            table,
            index,
            len: l,
        }) => assert_eq!((table, index, l), ("P_Key", u32::from(len), u32::from(len))),
        other => panic!("expected IndexOutOfRange, got {other:?}"),
    }
    assert!(matches!(
        ctx.query_pkey_blocking(0, 0),
        Err(QueryError::NoSuchPort { port: 0, .. })
    ));
    assert!(matches!(
        ctx.query_pkey_blocking(2, 0),
        Err(QueryError::NoSuchPort { port: 2, .. })
    ));
}

fn commands_fail_after_a_device_fatal_error(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    env.inject_device_fatal(0);
    let ev = env
        .a()
        .get_async_event()
        .unwrap()
        .expect("IBV_EVENT_DEVICE_FATAL");
    assert_eq!(
        (ev.kind, ev.element),
        (AsyncEventKind::DeviceFatal, EventElement::Device)
    );
    assert!(env.a().is_fatal());
    let fatal = |e: &CommandError| matches!(e, CommandError::DeviceFatal);
    match env.a().query_device_blocking() {
        Err(QueryError::Device(e)) => assert!(fatal(&e), "{e:?}"),
        other => panic!("expected DeviceFatal, got {other:?}"),
    }
    match env.a().alloc_pd_blocking() {
        Err(PdError::Device(e)) => assert!(fatal(&e), "{e:?}"),
        other => panic!("expected DeviceFatal, got {other:?}"),
    }
    let buf = env.a().alloc_buffer(64).unwrap();
    match pd.reg_mr_blocking(&buf, 0..64, AccessFlags::LOCAL_WRITE) {
        Err(MrError::Device(e)) => assert!(fatal(&e), "{e:?}"),
        other => panic!("expected DeviceFatal, got {other:?}"),
    }
    // The other device is unaffected, and everything can still be released.
    assert!(!env.b().is_fatal());
    assert!(env.b().query_device_blocking().is_ok());
    pd.dealloc().unwrap();
}

fn quirks_table_is_non_empty_and_every_entry_is_explained(backend: Backend) {
    let env = Env::new(backend);
    let quirks = env.a().device().info().quirks;
    assert!(!quirks.is_empty());
    let ids: HashSet<QuirkId> = quirks.iter().map(|q| q.id).collect();
    assert_eq!(ids.len(), quirks.len(), "each quirk is listed once");
    for q in quirks {
        assert!(
            q.summary.trim().len() >= 20,
            "{:?} needs a real summary: {:?}",
            q.id,
            q.summary
        );
    }
    for shared in [
        QuirkId::DeregMrWithBoundMwRefused,
        QuirkId::ResetToErrRefused,
        QuirkId::UdOversizeIsLocLenErr,
        QuirkId::NoZeroBasedAddressing,
    ] {
        assert!(ids.contains(&shared), "{shared:?} missing");
    }
}

cases!(
    manual;
    device_list_is_non_empty_and_names_are_unique,
    open_device_reports_its_name_and_attributes,
    query_device_reports_sane_limits,
    query_port_one_works_and_ports_outside_the_device_fail,
    query_port_reflects_port_state_changes,
    gid_index_zero_is_the_devices_ip_as_a_rocev2_gid,
    gid_index_beyond_the_table_fails_with_index_out_of_range,
    empty_gid_index_fails_with_empty_gid,
    gid_table_lists_exactly_the_configured_entries,
    pkey_index_zero_is_the_default_pkey_and_beyond_the_table_fails,
    commands_fail_after_a_device_fatal_error,
    quirks_table_is_non_empty_and_every_entry_is_explained,
);

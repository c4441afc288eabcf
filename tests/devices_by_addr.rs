//! Devices by IP address, as an rdma_cm application finds them: `device_by_addr`,
//! `open_by_addr` and its async twin, the CM on the device, and the port's addresses read
//! back from the GID table.

use std::net::IpAddr;

use portverbs::cm::service::Listener;
use portverbs::{DeviceError, OpenByAddrError};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn each_embedded_address_finds_its_device() {
    for (addr, name) in [
        ("10.0.0.1", "soft0"),
        ("10.0.0.2", "soft1"),
        ("10.0.0.3", "mlx4_0"),
        ("10.0.0.4", "mlx4_1"),
    ] {
        let dev = portverbs::device_by_addr(ip(addr)).unwrap();
        assert_eq!(portverbs::hal::Device::info(&dev).name, name);
        let ctx = portverbs::open_by_addr(ip(addr)).unwrap();
        assert_eq!(ctx.name(), name);
        assert_eq!(ctx.port_ips_blocking(1).unwrap(), vec![ip(addr)]);
    }
}

#[test]
fn an_address_no_device_has_is_a_typed_error() {
    let err = portverbs::device_by_addr(ip("192.0.2.9")).unwrap_err();
    assert!(
        matches!(err, DeviceError::NoAddress { addr } if addr == ip("192.0.2.9")),
        "{err:?}"
    );
    assert!(err.to_string().contains("PORTVERBS_UDP"), "{err}");
    let err = portverbs::open_by_addr(ip("192.0.2.9")).unwrap_err();
    assert!(
        matches!(err, OpenByAddrError::Device(DeviceError::NoAddress { .. })),
        "{err:?}"
    );
}

#[test]
fn async_twins_agree_with_the_blocking_calls() {
    portverbs::hal::block_on(async {
        let ctx = portverbs::open_by_addr_async(ip("10.0.0.2")).await.unwrap();
        assert_eq!(ctx.name(), "soft1");
        let table = ctx.gid_table(1).await.unwrap();
        assert_eq!(table, ctx.gid_table_blocking(1).unwrap());
        assert_eq!(table[0].1.gid.to_ip(), ip("10.0.0.2"));
        assert_eq!(ctx.port_ips(1).await.unwrap(), vec![ip("10.0.0.2")]);
        assert!(
            ctx.gid_table(2).await.is_err(),
            "soft devices have one port"
        );
        let cm = portverbs::cm_device_by_addr_async(ip("10.0.0.1"))
            .await
            .unwrap();
        assert_eq!(
            (cm.context().name(), cm.local_ip()),
            ("soft0", ip("10.0.0.1"))
        );
    });
}

#[test]
fn the_cm_device_binds_a_listener_on_its_address_only() {
    let cm = portverbs::cm_device_by_addr(ip("10.0.0.3")).unwrap();
    assert_eq!(cm.context().name(), "mlx4_0");
    assert!(Listener::bind(&cm, (ip("10.0.0.3"), 7801).into()).is_ok());
    assert!(Listener::bind(&cm, (ip("10.0.0.1"), 7801).into()).is_err());
}

#[test]
fn embedded_devices_do_not_start_the_vfio_scan() {
    // No test of this binary lists every device, so nothing here may have scanned.
    let dev = portverbs::device("mlx4_1").unwrap();
    // An emulated HCA lives in this process (asking does not scan either).
    assert!(portverbs::in_process(&dev));
    let _ = portverbs::device_by_addr(ip("10.0.0.4")).unwrap();
    assert!(portverbs::embedded_fabric_started());
    assert!(
        !portverbs::vfio_scanned(),
        "asking for an emulated HCA scanned for VFIO functions"
    );
}

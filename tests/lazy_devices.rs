//! Asking for one device starts only that device: a UDP-bound device of `PORTVERBS_UDP`
//! neither starts the embedded fabric nor scans for VFIO functions. One test only: the
//! devices are made once per process, so the order of the checks matters.

use std::net::IpAddr;

use portverbs::{DeviceError, SkipReason};

#[test]
fn a_udp_device_starts_nothing_else_and_a_failed_bind_says_why() {
    // The second address is not this host's (TEST-NET-1, RFC 5737), so it cannot be bound.
    // (A second loopback address held by another socket does on Linux; under Wine the bind
    // to the first one then failed as well, with WSAEADDRINUSE.)
    let (free, held): (IpAddr, IpAddr) =
        ("127.0.211.1".parse().unwrap(), "192.0.2.1".parse().unwrap());
    // SAFETY: set before any thread of this test binary reads the environment.
    unsafe {
        std::env::set_var("PORTVERBS_UDP", format!("{free},{held}"));
        std::env::set_var("PORTVERBS_NO_VFIO", "1");
    }

    let dev = portverbs::device("udp0").expect("udp0 binds");
    assert_eq!(portverbs::hal::Device::info(&dev).name, "udp0");
    let by_addr = portverbs::device_by_addr(free).unwrap();
    assert_eq!(portverbs::hal::Device::info(&by_addr).name, "udp0");
    let ctx = portverbs::open_by_addr(free).unwrap();
    assert_eq!(ctx.port_ips_blocking(1).unwrap(), vec![free]);

    let err = portverbs::device("udp1").unwrap_err();
    let DeviceError::Unavailable(skipped) = &err else {
        panic!("{err:?}")
    };
    assert_eq!((skipped.name.as_str(), skipped.addr), ("udp1", Some(held)));
    assert!(
        matches!(skipped.reason, SkipReason::Udp(_)),
        "{:?}",
        skipped.reason
    );
    let text = err.to_string();
    assert!(
        text.contains("udp1") && text.contains("PORTVERBS_UDP"),
        "{text}"
    );
    let by_addr = portverbs::device_by_addr(held).unwrap_err();
    assert!(matches!(by_addr, DeviceError::Unavailable(s) if s.name == "udp1"));
    assert!(matches!(
        portverbs::device("udp2"),
        Err(DeviceError::NotFound { .. })
    ));

    assert!(
        !portverbs::embedded_fabric_started(),
        "asking for UDP devices started the embedded fabric"
    );
    assert!(
        !portverbs::vfio_scanned(),
        "asking for UDP devices scanned for VFIO"
    );

    // Listing starts everything, and the failed device is listed apart with its reason.
    let names: Vec<String> = portverbs::devices()
        .iter()
        .map(|d| portverbs::hal::Device::info(d).name.clone())
        .collect();
    assert_eq!(names, ["soft0", "soft1", "mlx4_0", "mlx4_1", "udp0"]);
    assert!(portverbs::embedded_fabric_started());
    let skipped: Vec<&str> = portverbs::skipped_devices()
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(skipped, ["udp1"]);
}

//! The facade's public surface, pinned: the paths an application and a backend author write
//! against compile ([`new_paths_compile_and_work`]), the names the crate root shows in its
//! documentation (not `#[doc(hidden)]`) are exactly the verbs and CM API listed here, and the
//! prelude brings none of the HAL's device traits. A name added to, moved out of or hidden in
//! the root fails here until this list says so.

use std::net::{IpAddr, Ipv4Addr};

use portverbs::backends::hal::Device as _;
use portverbs::backends::mlx4::Mlx4Device;
use portverbs::backends::mlx4_model::Mlx4Model;
use portverbs::backends::soft::{DeviceConfig, Fabric, SoftDevice};
use portverbs::backends::{AnyCq, AnyRq, AnySq, AnySrq};
use portverbs::cm::agent::{CmAgent, ConnectParams as AgentConnectParams};
use portverbs::cm::{
    CmDevice, ConnParam, ConnectParams, ConnectionRequest, Connector, Listener, RdmaCmEvent,
    ServiceError,
};
use portverbs::env::{
    EnvError, HardwareEnv, Progress, SkipReason, SkippedDevice, capture_env, cc_env, hardware_env,
    progress_env, skipped_devices,
};
use portverbs::prelude::*;
use portverbs::testing::{
    EMBEDDED_ADDRS, EMBEDDED_MLX4_ADDRS, EmulatedMlx4Error, embedded_fabric, embedded_mlx4_models,
    emulated_mlx4,
};
use portverbs::{AnyDevice, context_options, device, devices, open, platform_sinks};

/// Names a type, so that the import of each is used.
fn named<T>() -> &'static str {
    std::any::type_name::<T>()
}

#[test]
fn new_paths_compile_and_work() {
    // The service's and the agent's connect parameters are two types, each at its own path.
    assert_ne!(named::<ConnectParams>(), named::<AgentConnectParams>());
    for name in [
        named::<CmDevice<AnyDevice>>(),
        named::<ConnParam>(),
        named::<ConnectionRequest<AnyDevice>>(),
        named::<Connector<AnyDevice>>(),
        named::<Listener<AnyDevice>>(),
        named::<RdmaCmEvent>(),
        named::<ServiceError>(),
        named::<CmAgent>(),
        named::<(AnySq, AnyRq, AnySrq, AnyCq)>(),
        named::<(
            EnvError,
            HardwareEnv,
            SkipReason,
            SkippedDevice,
            EmulatedMlx4Error,
        )>(),
        named::<(Mlx4Device, Mlx4Model, Progress)>(),
    ] {
        assert!(name.contains("portverbs"), "{name}");
    }

    // The embedded fabric, through `testing` and the root.
    let _: &Fabric = embedded_fabric();
    assert_eq!(embedded_mlx4_models().len(), EMBEDDED_MLX4_ADDRS.len());
    let soft0 = device("soft0").expect("the embedded fabric has soft0");
    assert_eq!(soft0.info().name, "soft0");
    assert!(devices().iter().any(|d| d.info().name == "soft1"));
    let ctx: Context = open(soft0).expect("soft0 opens");
    assert_eq!(ctx.name(), "soft0");
    let _: Pd = ctx.alloc_pd_blocking().expect("a PD");
    {
        // What src/lib.rs's `compile_fail` example refuses without the HAL's trait compiles
        // with it, from `backends::hal`: the raw path is an opt-in for backend authors.
        use portverbs::backends::hal::BlockingDevice;
        let _ = ctx.device().query_qp_blocking(0, QpAttr::default());
    }
    assert!(context_options().is_ok() && platform_sinks().is_ok());

    // A fabric of one's own, through `backends`, with an emulated HCA from `testing`.
    let fabric = Fabric::threaded();
    let ip = IpAddr::V4(Ipv4Addr::new(10, 9, 0, 1));
    assert!(!EMBEDDED_ADDRS.contains(&ip));
    let soft = SoftDevice::attach(&fabric, DeviceConfig::with_ip(ip)).expect("attached");
    assert_eq!(soft.info().driver, "soft");
    let (_model, hca) = emulated_mlx4(&fabric, "mlx4_s", IpAddr::V4(Ipv4Addr::new(10, 9, 0, 2)))
        .expect("the emulated HCA comes up");
    assert_eq!(AnyDevice::from(hca).info().driver, "mlx4");

    // The environment readers answer (whatever the environment of this test run).
    let _ = (hardware_env(), progress_env(), cc_env(), capture_env());
    assert!(skipped_devices().iter().all(|s| !s.name.is_empty()));
}

#[cfg(any(target_os = "linux", windows))]
#[test]
fn the_udp_backend_is_under_backends() {
    use portverbs::backends::udp::{UdpConfig, UdpDevice, UdpDeviceError, UdpPort, udp_device};
    use portverbs::env::{set_udp_progress, udp_env, udp_progress};
    use portverbs::testing::in_process;
    let _ = (
        named::<UdpDevice>(),
        named::<UdpDeviceError>(),
        named::<UdpPort>(),
    );
    let _ = (
        udp_env(),
        udp_progress(),
        set_udp_progress as fn(Progress) -> bool,
    );
    let _ = udp_device as fn(&str, UdpConfig) -> Result<UdpDevice, UdpDeviceError>;
    assert!(in_process(&device("soft0").expect("soft0")));
}

/// The names a top-level item of `src/lib.rs` puts in the crate root (`pub use a::{b, c as d}`,
/// `pub mod m`, `pub type T`), with whether `#[doc(hidden)]` hides it.
#[cfg(not(windows))]
fn root_items(src: &str) -> Vec<(String, bool)> {
    let mut items = Vec::new();
    let mut hidden = false;
    let mut lines = src.lines();
    while let Some(line) = lines.next() {
        if line.starts_with("#[doc(hidden)]") {
            hidden = true;
            continue;
        }
        if line.starts_with("#[") || line.starts_with("///") || line.starts_with("//") {
            continue;
        }
        let names: Vec<String> = if let Some(rest) = line.strip_prefix("pub use ") {
            let mut stmt = rest.to_string();
            while !stmt.contains(';') {
                stmt.push_str(lines.next().expect("a `use` ends with `;`"));
            }
            let stmt = stmt.trim_end_matches(';');
            let list = match stmt.find('{') {
                Some(i) => stmt[i + 1..].trim_end_matches('}').to_string(),
                None => stmt.to_string(),
            };
            list.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| match s.split_once(" as ") {
                    Some((_, alias)) => alias.trim().to_string(),
                    None => s.rsplit("::").next().expect("a name").to_string(),
                })
                .collect()
        } else if let Some(rest) = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("pub type "))
        {
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            vec![rest[..end].to_string()]
        } else {
            if !line.trim().is_empty() && !line.starts_with(' ') && !line.starts_with('}') {
                hidden = false;
            }
            continue;
        };
        items.extend(names.into_iter().map(|n| (n, hidden)));
        hidden = false;
    }
    items
}

/// What the crate root's documentation shows: the verbs and CM API.
#[cfg(not(windows))]
const ROOT_SURFACE: &[&str] = &[
    // Devices and opening them, by name or by IP address.
    "AnyDevice",
    "DeviceError",
    "context_options",
    "device",
    "devices",
    "open",
    "platform_sinks",
    "OpenByAddrError",
    "cm_device_by_addr",
    "cm_device_by_addr_async",
    "device_by_addr",
    "open_by_addr",
    "open_by_addr_async",
    // The verbs objects over `AnyDevice`.
    "AddressHandle",
    "CompletionChannel",
    "Context",
    "Cq",
    "Mr",
    "Mw",
    "Pd",
    "Qp",
    "Srq",
    // Modules.
    "backends",
    "cm",
    "env",
    "linux",
    "oob",
    "prelude",
    "testing",
    "verbs",
    "windows",
];

#[cfg(not(windows))]
#[test]
fn the_root_shows_the_verbs_and_cm_api_only() {
    let src = include_str!("../src/lib.rs");
    let items = root_items(src);
    let shown: std::collections::BTreeSet<&str> = items
        .iter()
        .filter(|(_, hidden)| !hidden)
        .map(|(n, _)| n.as_str())
        .collect();
    let expected: std::collections::BTreeSet<&str> = ROOT_SURFACE.iter().copied().collect();
    assert_eq!(
        shown, expected,
        "the names the root's documentation shows: a name of the verbs or CM API belongs in \
         ROOT_SURFACE; anything else goes under `backends`, `env` or `testing` (or is \
         `#[doc(hidden)]` at the root, as an old path)"
    );
    // The old paths stay, hidden, for code written against them.
    for old in [
        "soft",
        "mlx4",
        "mlx4_model",
        "udp_port",
        "hal",
        "AnyCq",
        "udp_device",
    ] {
        assert!(
            items.iter().any(|(n, hidden)| n == old && *hidden),
            "{old} is kept hidden"
        );
    }
}

/// The names `pub use` and `pub mod` lines of a crate's `lib.rs` put in its root.
#[cfg(not(windows))]
fn exported_names(src: &str) -> Vec<String> {
    root_items(src).into_iter().map(|(name, _)| name).collect()
}

#[cfg(not(windows))]
#[test]
fn the_verbs_module_documents_every_name_of_verbs_core() {
    let core = exported_names(include_str!("../verbs-core/src/lib.rs"));
    assert!(
        core.iter().any(|n| n == "Qp") && core.iter().any(|n| n == "hal"),
        "{core:?}"
    );
    let facade = include_str!("../src/lib.rs");
    let start = facade.find("pub mod verbs {").expect("the verbs module");
    let body = &facade[start..];
    // The documented list: the `#[doc(inline)]` re-export of names, not the module's prose.
    let list = &body[body.find("pub use portverbs_verbs::{").expect("the list")..];
    let list = &list[..list.find("};").expect("its end")];
    let listed: Vec<&str> = list
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|s| !s.is_empty())
        .collect();
    for name in core {
        // `error::*` is re-exported as a glob; `hal` is `backends::hal`, on purpose.
        if name == "*" || name == "hal" {
            continue;
        }
        assert!(
            listed.contains(&name.as_str()),
            "verbs-core exports {name}, which `portverbs::verbs` does not document: add it to \
             the list in src/lib.rs"
        );
    }
}

#[cfg(not(windows))]
#[test]
fn the_prelude_has_no_device_traits() {
    let src = include_str!("../src/lib.rs");
    let start = src.find("pub mod prelude {").expect("the prelude");
    let body = &src[start..];
    let body = &body[..body.find("\n}").expect("its end")];
    let names: Vec<&str> = body
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|s| !s.is_empty())
        .collect();
    assert!(
        names.contains(&"Context") && names.contains(&"SendWr"),
        "{body}"
    );
    for raw in [
        "Device",
        "BlockingDevice",
        "LocalDevice",
        "hal",
        "portverbs_hal",
    ] {
        assert!(!names.contains(&raw), "the prelude exports {raw}: {body}");
    }
}

/// `cargo doc -p portverbs --no-deps` with warnings as errors (a broken intra-doc link fails
/// it: the crate denies them), then its pages: the generic verbs and CM types are documented
/// in the facade's own docs with every method an application calls, the aliases link to
/// them, and neither the root nor the prelude shows what the root hides. Slow (a rustdoc
/// run), so `#[ignore]`d; `.ci/run` runs it by name.
#[cfg(not(windows))]
#[test]
#[ignore = "runs cargo doc; .ci/run runs it by name"]
fn the_docs_show_every_method_an_application_calls() {
    use std::path::Path;
    use std::process::Command;

    // The target directory this test was built in (CARGO_TARGET_TMPDIR is its `tmp`).
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir");
    let out = Command::new(env!("CARGO"))
        .args(["doc", "-p", "portverbs", "--no-deps", "--target-dir"])
        .arg(target)
        .env("RUSTDOCFLAGS", "-D warnings")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo doc runs");
    assert!(
        out.status.success(),
        "cargo doc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = target.join("doc/portverbs");
    let page = |rel: &str| {
        std::fs::read_to_string(docs.join(rel))
            .unwrap_or_else(|e| panic!("the docs have no page {rel}: {e}"))
    };
    for (rel, methods) in [
        (
            "verbs/struct.Context.html",
            &[
                "alloc_pd_blocking",
                "create_cq_blocking",
                "create_comp_channel",
                "query_port",
            ][..],
        ),
        (
            "verbs/struct.Pd.html",
            &["reg_vec_blocking", "create_qp_blocking"],
        ),
        (
            "verbs/struct.Qp.html",
            &[
                "post_send",
                "post_recv",
                "endpoint_blocking",
                "connect_rc_blocking",
            ],
        ),
        ("verbs/struct.Cq.html", &["poll", "wait_notify"]),
        ("verbs/struct.Mr.html", &["sge", "rkey"]),
        ("cm/struct.CmDevice.html", &["open_blocking"]),
        (
            "cm/struct.Listener.html",
            &["listen", "get_request_blocking"],
        ),
        ("cm/struct.ConnectionRequest.html", &["accept_blocking"]),
        (
            "cm/struct.Connector.html",
            &["resolve_blocking", "connect_blocking"],
        ),
    ] {
        let html = page(rel);
        for method in methods {
            assert!(
                html.contains(&format!("id=\"method.{method}\"")),
                "{rel} documents {method}"
            );
        }
    }
    assert!(
        page("cm/struct.ConnParam.html").contains("id=\"structfield."),
        "ConnParam's fields"
    );
    // The raw device stays off the pages: `Context::device` is hidden.
    assert!(!page("verbs/struct.Context.html").contains("id=\"method.device\""));
    for alias in ["Context", "Pd", "Mr", "Mw", "Cq", "Qp", "Srq"] {
        let html = page(&format!("type.{alias}.html"));
        assert!(
            html.contains(&format!("href=\"verbs/struct.{alias}.html")),
            "{alias} links"
        );
    }
    let root = page("index.html");
    assert!(
        root.contains("href=\"fn.devices.html\""),
        "the root lists devices"
    );
    for hidden in [
        "fn.udp_device.html",
        "soft/index.html",
        "hal/index.html",
        "enum.AnyCq.html",
        "fn.hardware_env.html",
    ] {
        assert!(
            !root.contains(&format!("href=\"{hidden}")),
            "the root shows {hidden}"
        );
    }
    let prelude = page("prelude/index.html");
    assert!(!prelude.contains("trait.Device.html") && !prelude.contains("BlockingDevice"));
}

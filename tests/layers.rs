//! The layers of README.md's "Layout" section and the crates' `lib.rs` docs, checked against the
//! workspace's manifests with `cargo metadata`: which Portverbs crate may depend on which (normal
//! dependencies; tests may reach further through dev-dependencies). A new dependency that breaks a
//! rule fails here rather than blurring the layers unnoticed. (Run on the build host only: under
//! Wine there is no cargo to ask.)
#![cfg(not(windows))]

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

/// Normal (non-dev, non-build) dependencies on workspace crates, per workspace crate.
fn workspace_graph() -> BTreeMap<String, BTreeSet<String>> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let packages = meta["packages"].as_array().expect("packages");
    let ours: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().expect("name").to_owned())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .expect("dependencies")
                .iter()
                .filter(|d| d["kind"].is_null())
                .map(|d| d["name"].as_str().expect("name").to_owned())
                .filter(|n| ours.contains(n))
                .collect();
            (p["name"].as_str().expect("name").to_owned(), deps)
        })
        .collect()
}

/// The crates `name` may depend on directly (normal dependencies).
fn allowed(name: &str) -> &'static [&'static str] {
    match name {
        "portverbs-hal" => &[],
        // The object table of the device models knows nothing else.
        "portverbs-table" => &[],
        "portverbs-verbs" => &["portverbs-hal"],
        // The CM core: a sans-IO agent on the HAL's types (no I/O, no clock), and the
        // service that drives it over QP1 through verbs-core; never a backend or a platform
        // crate.
        "portverbs-cm" => &["portverbs-hal"],
        "portverbs-cm-service" => &["portverbs-hal", "portverbs-verbs", "portverbs-cm"],
        "portverbs-dma" | "portverbs-wire" => &["portverbs-hal"],
        "portverbs-transport" => &[
            "portverbs-hal",
            "portverbs-dma",
            "portverbs-table",
            "portverbs-wire",
        ],
        "portverbs-fabric" => &["portverbs-hal", "portverbs-transport"],
        // The UDP port routes packets between a fabric and the kernel's sockets; it knows no
        // device.
        "portverbs-udp" => &[
            "portverbs-hal",
            "portverbs-dma",
            "portverbs-wire",
            "portverbs-transport",
            "portverbs-fabric",
        ],
        "portverbs-soft" => &[
            "portverbs-hal",
            "portverbs-dma",
            "portverbs-table",
            "portverbs-transport",
            "portverbs-fabric",
        ],
        // The layouts compose the special QPs' packet headers from the wire formats' own
        // encoders, so each header has one.
        "portverbs-mlx4-layout" => &["portverbs-hal", "portverbs-dma", "portverbs-wire"],
        "portverbs-vfio" => &["portverbs-hal", "portverbs-dma"],
        "portverbs-mlx4" => &[
            "portverbs-hal",
            "portverbs-dma",
            "portverbs-mlx4-layout",
            "portverbs-vfio",
        ],
        // The model shares the layouts with the driver and the engine with the soft device,
        // and depends on neither.
        "portverbs-mlx4-model" => &[
            "portverbs-hal",
            "portverbs-dma",
            "portverbs-table",
            "portverbs-mlx4-layout",
            "portverbs-transport",
            "portverbs-fabric",
        ],
        // The backend dispatch: one match over the backends, below verbs-core.
        "portverbs-any" => &["portverbs-hal", "portverbs-soft", "portverbs-mlx4"],
        // Platform crates implement the notification contract; they never name a backend.
        "portverbs-linux" | "portverbs-windows" => &["portverbs-hal", "portverbs-verbs"],
        "portverbs-test-support" => &["portverbs-hal", "portverbs-soft", "portverbs-verbs"],
        // Only the facade, the CLI and the test programs know every crate.
        "portverbs" | "portverbs-cli" | "portverbs-vfio-guest" | "portverbs-rxe-guest" => &["*"],
        other => panic!("{other}: a new crate — add its place in the layers to this test"),
    }
}

#[test]
fn every_crate_depends_only_on_the_layers_below_it() {
    let graph = workspace_graph();
    assert!(graph.len() >= 15, "{graph:?}");
    let mut broken = Vec::new();
    for (name, deps) in &graph {
        let ok = allowed(name);
        if ok == ["*"] {
            continue;
        }
        for d in deps {
            if !ok.contains(&d.as_str()) {
                broken.push(format!("{name} -> {d}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "dependencies against the layers (README.md, Layout): {broken:?}"
    );
}

#[test]
fn the_facade_is_the_only_crate_that_knows_every_backend() {
    let graph = workspace_graph();
    for (name, deps) in &graph {
        let backends = ["portverbs-soft", "portverbs-mlx4", "portverbs-mlx4-model"];
        let known = backends.iter().filter(|b| deps.contains(**b)).count();
        if known == backends.len() {
            assert!(
                ["portverbs", "portverbs-cli"].contains(&name.as_str()),
                "{name} knows every backend"
            );
        }
    }
    assert!(graph["portverbs"].contains("portverbs-verbs"));
}

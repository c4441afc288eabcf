//! The facade's `AnyDevice` at the HAL level: its queue objects are enums over the backends'
//! types, so a queue object of one backend handed to a command of another must be refused with
//! a typed error, not misused.

use std::sync::Arc;

use portverbs::hal::device::{CqParams, EqKind, EqParams};
use portverbs::hal::queue::CompletionQueue;
use portverbs::hal::{BlockingDevice, CommandError, NullSink};
use portverbs::mlx4::{Mlx4Config, Mlx4Device};
use portverbs::mlx4_model::{Mlx4Model, ModelConfig};
use portverbs::prelude::*;
use portverbs::soft::{DeviceConfig, Fabric};
use portverbs::{AnyCq, AnyDevice};

fn cq_on(dev: &AnyDevice) -> AnyCq {
    let eq = dev
        .create_eq_blocking(
            EqParams {
                entries: 16,
                kind: EqKind::Completion { vector: 0 },
            },
            Arc::new(NullSink),
        )
        .unwrap();
    dev.create_cq_blocking(CqParams {
        entries: 8,
        eqn: eq.eqn(),
    })
    .unwrap()
}

#[test]
fn resizing_a_cq_of_another_backend_is_refused_and_harms_neither() {
    let fabric = Fabric::stepped(1);
    let soft = AnyDevice::Soft(
        portverbs::soft::SoftDevice::attach(
            &fabric,
            DeviceConfig::with_ip("10.8.0.1".parse().unwrap()),
        )
        .unwrap(),
    );
    let (_model, function) = Mlx4Model::attach(&fabric, ModelConfig::default()).unwrap();
    let mlx4 = AnyDevice::Mlx4(
        Mlx4Device::open(
            function,
            Mlx4Config::new(
                "mlx4_any",
                vec![vec![Gid::from_ip("10.8.0.2".parse().unwrap())]],
            ),
        )
        .unwrap(),
    );
    let mut on_soft = cq_on(&soft);
    let mut on_mlx4 = cq_on(&mlx4);
    assert!(matches!(on_soft, AnyCq::Soft(_)));
    assert!(matches!(on_mlx4, AnyCq::Mlx4(_)));
    for (dev, cq) in [(&soft, &mut on_mlx4), (&mlx4, &mut on_soft)] {
        let depth = cq.depth();
        match dev.resize_cq_blocking(cq, 64) {
            Err(CommandError::InvalidArgument { what }) => {
                assert!(what.contains("another device"), "{what}");
            }
            other => panic!("resize across backends: {other:?}"),
        }
        assert_eq!(cq.depth(), depth, "the refused CQ is unchanged");
    }
    // Each still resizes on its own device.
    soft.resize_cq_blocking(&mut on_soft, 64).unwrap();
    mlx4.resize_cq_blocking(&mut on_mlx4, 64).unwrap();
    assert!(on_soft.depth() >= 64 && on_mlx4.depth() >= 64);
}

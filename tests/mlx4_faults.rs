//! The mlx4 driver against the emulated HCA's fault injection (issue: "the driver then
//! completes every outstanding request with an error, without hanging"): a command that never
//! completes, a corrupt CQE, a catastrophic error, a surprise removal. Every case also checks
//! that closing the device afterwards returns.

use std::time::{Duration, Instant};

use portverbs::hal::CqeError;
use portverbs::mlx4::{CommandMode, Mlx4Config, Mlx4Device};
use portverbs::mlx4_model::{Mlx4Model, ModelConfig};
use portverbs::prelude::*;
use portverbs::soft::Fabric;
use portverbs::verbs::{ContextOptions, PollError, UdDest};

const TIMEOUT: Duration = Duration::from_millis(200);

fn open(fabric: &Fabric, mode: CommandMode) -> (Mlx4Model, Mlx4Device, Context) {
    let (model, function) = Mlx4Model::attach(fabric, ModelConfig::default()).unwrap();
    let mut config = Mlx4Config::new(
        "mlx4_faults",
        vec![vec![Gid::from_ip("10.9.0.1".parse().unwrap())]],
    );
    config.command_mode = mode;
    config.command_timeout = TIMEOUT;
    let dev = Mlx4Device::open(function, config).unwrap();
    let ctx =
        Context::open_blocking(AnyDevice::Mlx4(dev.clone()), ContextOptions::default()).unwrap();
    (model, dev, ctx)
}

#[test]
fn a_command_that_never_completes_times_out_in_both_modes() {
    for mode in [CommandMode::Polling, CommandMode::Events] {
        let fabric = Fabric::stepped(1);
        let (model, dev, ctx) = open(&fabric, mode);
        let cq = cq(&ctx);
        let pd = ctx.alloc_pd_blocking().unwrap();
        model.inject_command_timeout(true);
        let started = Instant::now();
        let r = pd.alloc_mw_blocking(MwType::Type1);
        let waited = started.elapsed();
        assert!(r.is_err(), "{mode:?}: {r:?}");
        assert!(
            format!("{r:?}").contains("Timeout"),
            "{mode:?}: the error is the timeout: {r:?}"
        );
        assert!(
            waited >= TIMEOUT && waited < TIMEOUT * 20,
            "{mode:?}: {waited:?}"
        );
        // Every later command fails the same way instead of hanging, destroy included.
        let started = Instant::now();
        drop(cq);
        drop(pd);
        drop(ctx);
        drop(dev);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "close returned"
        );
    }
}

#[test]
fn a_corrupt_cqe_is_refused_not_trusted() {
    bad_cqe_between_good_ones(Mlx4Model::corrupt_next_cqe, |e| {
        matches!(e, CqeError::BadOpcode { .. })
    });
}

#[test]
fn a_well_formed_cqe_of_an_unknown_qp_is_refused_by_the_core() {
    bad_cqe_between_good_ones(Mlx4Model::misaddress_next_cqe, |e| {
        matches!(e, CqeError::UnknownQp { qpn: 0xff_ffff, .. })
    });
}

#[test]
fn a_cqe_naming_no_outstanding_wqe_is_refused_by_the_core() {
    bad_cqe_between_good_ones(
        Mlx4Model::misindex_next_cqe,
        |e| matches!(e, CqeError::BadWqeIndex { wqe_index, .. } if *wqe_index == 0x8001),
    );
}

/// Three signalled UD sends polled in one array, the middle one's CQE spoiled by `inject`:
/// the poll returns the first, the next poll the error `expected` accepts (the entry was
/// consumed), the one after that the third (which also retires nothing wrongly).
fn bad_cqe_between_good_ones(inject: fn(&Mlx4Model), expected: fn(&CqeError) -> bool) {
    let fabric = Fabric::stepped(2);
    let (model, _dev, ctx) = open(&fabric, CommandMode::Events);
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = cq(&ctx);
    let qp = pd
        .create_qp_blocking(QpInit {
            qp_type: QpType::Ud,
            send_cq: &cq,
            recv_cq: &cq,
            srq: None,
            caps: QpCaps {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 64,
            },
            sq_sig_all: false,
        })
        .unwrap();
    let init = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey: 7,
        ..QpAttr::default()
    };
    qp.modify_blocking(
        &init,
        QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::QKEY,
    )
    .unwrap();
    qp.modify_blocking(
        &QpAttr {
            qp_state: QpState::Rtr,
            ..QpAttr::default()
        },
        QpAttrMask::STATE,
    )
    .unwrap();
    qp.modify_blocking(
        &QpAttr {
            qp_state: QpState::Rts,
            ..QpAttr::default()
        },
        QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    )
    .unwrap();
    let ah = pd
        .create_ah_blocking(AddressVector {
            dgid: Gid::from_ip("10.9.0.2".parse().unwrap()),
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AddressVector::default()
        })
        .unwrap();
    // Nobody has 10.9.0.2: each datagram is lost, but its send completes. The middle one's CQE
    // is corrupted; all three are polled in one batch.
    let send = |id: u64| {
        let wr = SendWr::new(id, SendOp::Send)
            .inline(b"hello")
            .signaled()
            .ud(UdDest {
                av: ah.av(),
                remote_qpn: 2,
                remote_qkey: 7,
            });
        qp.post_send(&[wr]).unwrap();
        fabric.run_until_idle().unwrap();
    };
    send(1);
    inject(&model);
    send(2);
    send(3);
    let mut wc = [WorkCompletion::default(); 4];
    assert_eq!(
        cq.poll(&mut wc).unwrap(),
        1,
        "the good CQE before the bad one"
    );
    assert_eq!((wc[0].wr_id, wc[0].status), (1, WcStatus::Success));
    let r = cq.poll(&mut wc);
    assert!(
        matches!(&r, Err(PollError::BadCompletion(e)) if expected(e)),
        "{r:?}"
    );
    // The bad entry was consumed; the CQE after it still completes (retiring the unsignalled
    // predecessor whose completion was lost).
    assert_eq!(
        cq.poll(&mut wc).unwrap(),
        1,
        "the good CQE after the bad one"
    );
    assert_eq!((wc[0].wr_id, wc[0].status), (3, WcStatus::Success));
    assert_eq!(cq.poll(&mut wc).unwrap(), 0);
}

#[test]
fn surprise_removal_fails_commands_and_posts_and_close_returns() {
    let fabric = Fabric::stepped(3);
    let (model, dev, ctx) = open(&fabric, CommandMode::Events);
    let pd = ctx.alloc_pd_blocking().unwrap();
    model.remove();
    let started = Instant::now();
    let r = ctx.create_cq_blocking(CqInit {
        entries: 16,
        ..CqInit::default()
    });
    assert!(r.is_err(), "{r:?}");
    assert!(
        started.elapsed() < TIMEOUT * 20,
        "no waiting for a device that is gone"
    );
    assert!(dev.is_fatal(), "the driver noticed");
    let q = ctx.query_port_blocking(1);
    assert!(q.is_err(), "a removed device answers no query: {q:?}");
    let started = Instant::now();
    drop(pd);
    drop(ctx);
    drop(dev);
    assert!(started.elapsed() < Duration::from_secs(30));
}

fn cq(ctx: &Context) -> Cq {
    ctx.create_cq_blocking(CqInit {
        entries: 16,
        ..CqInit::default()
    })
    .unwrap()
}

//! The mlx4 driver against the emulated HCA's fault injection — after each fault the driver
//! completes every outstanding request with an error, without hanging: a command that never
//! completes, a corrupt CQE, a catastrophic error, a surprise removal. Every case also checks
//! that closing the device afterwards returns.

#[path = "util/mlx4/mod.rs"]
mod mlx4_util;

use std::time::{Duration, Instant};

use mlx4_util::{TIMEOUT, cq, dest, lost_ah, open, ud_qp};
use portverbs::hal::CqeError;
use portverbs::mlx4::CommandMode;
use portverbs::mlx4::layout::opcode::HW2SW_MPT;
use portverbs::mlx4::layout::status::Status;
use portverbs::mlx4_model::Mlx4Model;
use portverbs::prelude::*;
use portverbs::soft::Fabric;
use portverbs::verbs::PollError;

#[test]
fn a_command_that_never_completes_times_out_in_both_modes() {
    for mode in [CommandMode::Polling, CommandMode::Events] {
        let fabric = Fabric::stepped(1);
        let (model, dev, ctx) = open(&fabric, mode, |_| ());
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
    let (model, _dev, ctx) = open(&fabric, CommandMode::Events, |_| ());
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = cq(&ctx);
    let qp = ud_qp(&pd, &cq, 4);
    let ah = lost_ah(&pd);
    // Nobody has 10.9.0.2: each datagram is lost, but its send completes. The middle one's CQE
    // is corrupted; all three are polled in one batch.
    let send = |id: u64| {
        let wr = SendWr::new(id, SendOp::Send)
            .inline(b"hello")
            .signaled()
            .ud(dest(&ah));
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
    let (model, dev, ctx) = open(&fabric, CommandMode::Events, |_| ());
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

#[test]
fn a_window_the_hca_will_not_give_back_keeps_its_mpt_number() {
    let fabric = Fabric::stepped(5);
    let (model, _dev, ctx) = open(&fabric, CommandMode::Events, |_| ());
    let pd = ctx.alloc_pd_blocking().unwrap();
    // The MPT index is the key without its 8-bit tag.
    let index = |mw: &Mw| mw.rkey() >> 8;
    // Control: a window given back normally frees its number for the next one.
    let first = pd.alloc_mw_blocking(MwType::Type1).unwrap();
    let freed = index(&first);
    drop(first);
    let reused = pd.alloc_mw_blocking(MwType::Type1).unwrap();
    assert_eq!(
        index(&reused),
        freed,
        "the allocator hands a freed number out again"
    );
    // Now the HCA refuses HW2SW_MPT: the number must not be handed out again while the HCA
    // may still own that MPT.
    let stuck = index(&reused);
    let live = model.counts().mpts;
    model.fail_next_command(HW2SW_MPT, Status::ResourceBusy);
    drop(reused);
    assert_eq!(model.counts().mpts, live, "the HCA still holds the MPT");
    let next = pd.alloc_mw_blocking(MwType::Type1).unwrap();
    assert_ne!(
        index(&next),
        stuck,
        "a number the HCA may still use is not reused"
    );
    // The device carries on: the new window is freed normally and its number comes back.
    let again = index(&next);
    drop(next);
    assert_eq!(index(&pd.alloc_mw_blocking(MwType::Type1).unwrap()), again);
}

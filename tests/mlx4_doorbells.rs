//! Which doorbell an mlx4 post rings (rdma-core `providers/mlx4/qp.c`): one WQE with inline data
//! that fits a BlueFlame half goes through BlueFlame, everything else through the UAR send
//! doorbell; with BlueFlame switched off, everything through the doorbell. Every request completes
//! either way.

#[path = "util/mlx4/mod.rs"]
mod mlx4_util;

use mlx4_util::{cq, dest, lost_ah, open, ud_qp};
use portverbs::mlx4::CommandMode;
use portverbs::mlx4_model::Mlx4Model;
use portverbs::prelude::*;
use portverbs::soft::Fabric;

/// (BlueFlame writes, send doorbells) the emulated HCA has seen.
fn rung(model: &Mlx4Model) -> (u64, u64) {
    let c = model.counts();
    (c.blueflame_writes, c.send_doorbells)
}

#[test]
fn single_small_inline_posts_go_through_blueflame_and_the_rest_through_the_doorbell() {
    for blueflame in [true, false] {
        let fabric = Fabric::stepped(4);
        let (model, _dev, ctx) = open(&fabric, CommandMode::Events, |c| c.blueflame = blueflame);
        let pd = ctx.alloc_pd_blocking().unwrap();
        let cq = cq(&ctx);
        let qp = ud_qp(&pd, &cq, 8);
        let ah = lost_ah(&pd);
        let buf = ctx.alloc_buffer(4096).unwrap();
        let mr = pd
            .reg_mr_blocking(&buf, 0..4096, AccessFlags::empty())
            .unwrap();
        let sge = [mr.sge(0, 64).expect("inside the MR")];
        let small = [7u8; 5];
        // 16 (control) + 48 (datagram) + 4 × 4 (inline headers) + 200 = 280 bytes: more than
        // the 256-byte BlueFlame half.
        let large = [9u8; 200];
        let send = |id| SendWr::new(id, SendOp::Send).signaled().ud(dest(&ah));
        // (what is posted, the doorbell it must ring with BlueFlame on)
        let cases: [(&str, Vec<SendWr<'_>>, (u64, u64)); 5] = [
            (
                "one small inline send",
                vec![send(1).inline(&small)],
                (1, 0),
            ),
            (
                "a list of two",
                vec![send(2).inline(&small), send(3).inline(&small)],
                (0, 1),
            ),
            ("gather entries", vec![send(4).sges(&sge)], (0, 1)),
            ("inline beyond a half", vec![send(5).inline(&large)], (0, 1)),
            (
                "one small inline send again",
                vec![send(6).inline(&small)],
                (1, 0),
            ),
        ];
        let mut expected_ids = Vec::new();
        for (what, wrs, (bf, db)) in cases {
            let before = rung(&model);
            qp.post_send(&wrs).unwrap();
            fabric.run_until_idle().unwrap();
            let after = rung(&model);
            let got = (after.0 - before.0, after.1 - before.1);
            let want = if blueflame { (bf, db) } else { (0, 1) };
            assert_eq!(got, want, "blueflame {blueflame}: {what}");
            expected_ids.extend(wrs.iter().map(|w| w.wr_id));
        }
        let mut wc = [WorkCompletion::default(); 16];
        let n = cq.poll(&mut wc).unwrap();
        let ids: Vec<u64> = wc[..n].iter().map(|w| w.wr_id).collect();
        assert_eq!(ids, expected_ids, "blueflame {blueflame}");
        assert!(
            wc[..n].iter().all(|w| w.status == WcStatus::Success),
            "{:?}",
            &wc[..n]
        );
    }
}

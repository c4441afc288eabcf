//! The UD endpoint and the completion wait the multicast tests share (`tests/udp_mcast.rs`,
//! `tests/cm_matrix.rs`).

use std::time::{Duration, Instant};

use portverbs::prelude::*;

/// Bytes of an endpoint's buffer: one receive of the GRH and a message, or one send.
pub(crate) const BUF: usize = 4096;

/// A UD QP in RTS with Q_Key `qkey`, with its PD, CQ and one registered buffer.
pub(crate) struct Ud {
    pub(crate) pd: Pd,
    pub(crate) cq: Cq,
    pub(crate) qp: Qp,
    pub(crate) mr: Mr,
}

/// A [`Ud`] on `ctx`.
pub(crate) fn ud(ctx: &Context, qkey: u32) -> Ud {
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 64,
            ..CqInit::default()
        })
        .unwrap();
    let qp = pd.create_qp_blocking(QpInit::new(QpType::Ud, &cq)).unwrap();
    qp.ready_ud_blocking(&ConnectOptions {
        qkey,
        ..ConnectOptions::default()
    })
    .unwrap();
    let mr = pd
        .reg_vec_blocking(vec![0u8; BUF], AccessFlags::LOCAL_WRITE)
        .unwrap();
    Ud { pd, cq, qp, mr }
}

impl Ud {
    /// Posts the whole buffer as receive `wr_id`.
    pub(crate) fn post_recv(&self, wr_id: u64) {
        let sge = [self.mr.sge(0, BUF).unwrap()];
        self.qp.post_recv(&[RecvWr { wr_id, sges: &sge }]).unwrap();
    }
}

/// Up to `n` completions, polling for at most `patience`.
pub(crate) fn completions(cq: &Cq, n: usize, patience: Duration) -> Vec<WorkCompletion> {
    let deadline = Instant::now() + patience;
    let mut out = Vec::new();
    let mut wc = [WorkCompletion::default(); 8];
    while out.len() < n && Instant::now() < deadline {
        let got = cq.poll(&mut wc).unwrap();
        out.extend_from_slice(&wc[..got]);
        if got == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    out
}

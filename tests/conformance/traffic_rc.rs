//! RC traffic: every operation type, data checked byte for byte.

use portverbs::prelude::*;

use super::env::{Backend, Env};
use super::util::*;

fn rc_send_with_imm_delivers_data_and_immediate(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let data = pattern(1, 3000);
    p.a.buf.write(0, &data).unwrap();
    p.b.post_recv(77, 8192, 4096);
    p.a.qp
        .post_send(&[SendWr::new(5, SendOp::SendWithImm { imm: 0xabcd })
            .sges(&[p.a.sge(0, 3000)])
            .signaled()])
        .unwrap();
    let sent = env.poll(&p.a.cq, 1);
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].status, WcStatus::Success);
    assert_eq!(sent[0].wr_id, 5);
    assert_eq!(sent[0].opcode, WcOpcode::Send);
    let got = env.poll(&p.b.cq, 1);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].wr_id, 77);
    assert_eq!(got[0].status, WcStatus::Success);
    assert_eq!(got[0].opcode, WcOpcode::Recv);
    assert_eq!(got[0].byte_len, 3000);
    assert_eq!(got[0].imm(), Some(0xabcd));
    assert_eq!(got[0].qp_num, p.b.qp.qp_num());
    assert_eq!(p.b.buf.to_vec(8192, 3000).unwrap(), data);
}

cases!(rc_send_with_imm_delivers_data_and_immediate);

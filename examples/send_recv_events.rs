//! SEND with immediate data from one RC queue pair to another; the receiver sleeps on a
//! completion channel between messages (`ibv_req_notify_cq`, `ibv_get_cq_event`,
//! `ibv_ack_cq_events`), blocking in the OS's own mechanism: an eventfd in poll(2) on Linux.
//!
//!     cargo run --example send_recv_events [-- DEVICE_A DEVICE_B]    (default: soft0 soft1)
use std::time::Duration;

use portverbs::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const MESSAGES: u32 = 3;
const SLOT: usize = 64;

fn device(name: Option<String>, default: &str) -> Result<Context> {
    let name = name.unwrap_or_else(|| default.into());
    Ok(portverbs::open(portverbs::device(&name)?)?)
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (ctx_a, ctx_b) = (device(args.next(), "soft0")?, device(args.next(), "soft1")?);

    // Sender: busy-polls its CQ.
    let pd_a = ctx_a.alloc_pd_blocking()?;
    let cq_a = ctx_a.create_cq_blocking(CqInit {
        entries: 16,
        ..CqInit::default()
    })?;
    let qp_a = pd_a.create_qp_blocking(QpInit::new(QpType::Rc, &cq_a))?;
    let mr_a = pd_a.reg_vec_blocking(vec![0; SLOT], AccessFlags::empty())?;

    // Receiver: its CQ reports to a completion channel.
    let channel = ctx_b.create_comp_channel()?;
    let init = CqInit {
        entries: 16,
        channel: Some(&channel),
        ..CqInit::default()
    };
    let cq_b = ctx_b.create_cq_blocking(init)?;
    let pd_b = ctx_b.alloc_pd_blocking()?;
    let qp_b = pd_b.create_qp_blocking(QpInit::new(QpType::Rc, &cq_b))?;
    let mr_b =
        pd_b.reg_vec_blocking(vec![0; SLOT * MESSAGES as usize], AccessFlags::LOCAL_WRITE)?;

    // As ibv_rc_pingpong: INIT, post the receives, then connect.
    let opts = ConnectOptions::default();
    qp_b.init_blocking(&opts)?;
    for i in 0..MESSAGES {
        let sges = [mr_b.sge(i as usize * SLOT, SLOT)?];
        qp_b.post_recv(&[RecvWr {
            wr_id: u64::from(i),
            sges: &sges,
        }])?;
    }
    let (to_a, to_b) = (
        qp_a.endpoint_blocking(&opts)?,
        qp_b.endpoint_blocking(&opts)?,
    );
    qp_a.connect_rc_blocking(&to_b, &opts)?;
    qp_b.connect_rc_blocking(&to_a, &opts)?;

    cq_b.req_notify(false); // arm before anything can arrive
    for i in 0..MESSAGES {
        let text = format!("message {i}");
        mr_a.write(0, text.as_bytes())?;
        let sges = [mr_a.sge(0, text.len())?];
        let send = SendWr::new(u64::from(i), SendOp::SendWithImm { imm: 100 + i }).sges(&sges);
        qp_a.post_send(&[send.flags(SendFlags::SIGNALED)])?;
        let mut wc = [WorkCompletion::default()];
        while cq_a.poll(&mut wc)? == 0 {}
        assert_eq!(wc[0].status, WcStatus::Success, "send {i}");

        // Sleep until the channel has an event, acknowledge it, re-arm, then drain the CQ:
        // re-arming before draining means no completion can slip by unnoticed.
        let cq = channel.wait_cq_event(Some(Duration::from_secs(10)))?;
        cq.ack_events(1);
        cq.req_notify(false);
        while cq.poll(&mut wc)? > 0 {
            let c = &wc[0];
            assert_eq!((c.status, c.opcode), (WcStatus::Success, WcOpcode::Recv));
            let mut got = vec![0; c.byte_len as usize];
            mr_b.read(c.wr_id as usize * SLOT, &mut got)?;
            println!(
                "received {:?} with immediate {}",
                String::from_utf8(got)?,
                c.imm_data
            );
        }
    }

    // Teardown: QPs, then CQs (a CQ with unacknowledged events would refuse), then the
    // channel (refused while a CQ reports to it); MRs and PDs go when dropped.
    qp_a.destroy()?;
    qp_b.destroy()?;
    cq_a.destroy()?;
    cq_b.destroy()?;
    channel.destroy()?;
    Ok(())
}

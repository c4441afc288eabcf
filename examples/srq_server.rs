//! A server whose RC queue pairs share one receive queue (SRQ): three clients send to it,
//! every message lands in a buffer of the shared pool, and when the pool runs low the SRQ
//! limit event tells the server to post more (`IBV_EVENT_SRQ_LIMIT_REACHED`).
//!
//!     cargo run --example srq_server [-- CLIENT_DEVICE SERVER_DEVICE]    (default: soft0 soft1)
use std::time::Duration;

use portverbs::prelude::*;
use portverbs::verbs::AsyncEventKind;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const CLIENTS: usize = 3;
const POOL: u32 = 4;
const SLOT: usize = 64;

fn open(name: Option<String>, default: &str) -> Result<Context> {
    let name = name.unwrap_or_else(|| default.into());
    Ok(portverbs::open(portverbs::device(&name)?)?)
}

fn poll_one(cq: &Cq) -> Result<WorkCompletion> {
    let mut wc = [WorkCompletion::default()];
    while cq.poll(&mut wc)? == 0 {
        std::hint::spin_loop();
    }
    match wc[0].status {
        WcStatus::Success => Ok(wc[0]),
        status => Err(format!("work request {} failed: {status}", wc[0].wr_id).into()),
    }
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (client, server) = (open(args.next(), "soft0")?, open(args.next(), "soft1")?);
    let opts = ConnectOptions::default();

    // The server: one CQ, one SRQ with a pool of POOL receive buffers, limit armed at 2.
    let pd = server.alloc_pd_blocking()?;
    let cq = server.create_cq_blocking(CqInit {
        entries: 32,
        ..CqInit::default()
    })?;
    let srq = pd.create_srq_blocking(SrqInit {
        max_wr: POOL,
        max_sge: 1,
        limit: 0,
    })?;
    let pool = pd.reg_vec_blocking(vec![0; SLOT * POOL as usize], AccessFlags::LOCAL_WRITE)?;
    let post = |slot: u32| -> Result<()> {
        let sges = [pool.sge(slot as usize * SLOT, SLOT)?];
        Ok(srq.post_recv(&[RecvWr {
            wr_id: u64::from(slot),
            sges: &sges,
        }])?)
    };
    (0..POOL).try_for_each(post)?;
    srq.arm_limit_blocking(2)?; // an event once fewer than 2 receives are left

    // The clients, each with its own QP connected to a server QP on the SRQ.
    let cpd = client.alloc_pd_blocking()?;
    let ccq = client.create_cq_blocking(CqInit {
        entries: 32,
        ..CqInit::default()
    })?;
    let mut pairs = Vec::new();
    for _ in 0..CLIENTS {
        let init = QpInit::new(QpType::Rc, &ccq);
        let caps = QpCaps {
            max_inline_data: 64,
            ..init.caps
        }; // the messages go inline
        let cqp = cpd.create_qp_blocking(QpInit { caps, ..init })?;
        let sqp = pd.create_qp_blocking(QpInit {
            srq: Some(&srq),
            ..QpInit::new(QpType::Rc, &cq)
        })?;
        let (to_c, to_s) = (cqp.endpoint_blocking(&opts)?, sqp.endpoint_blocking(&opts)?);
        cqp.connect_rc_blocking(&to_s, &opts)?;
        sqp.connect_rc_blocking(&to_c, &opts)?;
        pairs.push((cqp, sqp));
    }

    for (i, (cqp, sqp)) in pairs.iter().enumerate() {
        let text = format!("hello from client {i}");
        let send = SendWr::new(i as u64, SendOp::Send).inline(text.as_bytes());
        cqp.post_send(&[send.flags(SendFlags::SIGNALED)])?;
        poll_one(&ccq)?;
        let wc = poll_one(&cq)?;
        assert_eq!(
            wc.qp_num,
            sqp.qp_num(),
            "the completion names the QP it came through"
        );
        let mut got = vec![0; wc.byte_len as usize];
        pool.read(wc.wr_id as usize * SLOT, &mut got)?;
        println!(
            "QP {:#x}, buffer {}: {}",
            wc.qp_num,
            wc.wr_id,
            String::from_utf8(got)?
        );
    }

    // Three of four buffers are used: below the limit, so the event came (it names the SRQ).
    let event = server.wait_async_event(Some(Duration::from_secs(10)))?;
    assert_eq!(event.kind, AsyncEventKind::SrqLimitReached);
    println!(
        "{:?} on {:?}: refilling the pool",
        event.kind, event.element
    );
    (0..CLIENTS as u32).try_for_each(post)?;

    for (cqp, sqp) in pairs {
        cqp.destroy()?;
        sqp.destroy()?;
    }
    srq.destroy()?;
    Ok(())
}

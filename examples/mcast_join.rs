//! rdma_cm-style multicast: a UD QP on each of two devices joins the IP multicast group
//! 239.1.2.3 through the connection manager (`CmDevice::join_multicast`, librdmacm's
//! `rdma_join_multicast`), which attaches it to the group's MGID and returns what sends to
//! the group: the address handle's attributes, QPN 0xFFFFFF and rdma_cm's Q_Key. One QP sends
//! a datagram to the group, the other receives it; then both leave.
//!
//! `cargo run --example mcast_join [SENDER_DEVICE RECEIVER_DEVICE]` (defaults: soft0 soft1).

use std::net::{IpAddr, Ipv4Addr};
use std::thread;

use portverbs::cm::{CmDevice, RDMA_UDP_QKEY};
use portverbs::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Opens `name` and its CM on the IP address of GID entry 0.
fn open(name: &str) -> Result<CmDevice<portverbs::AnyDevice>> {
    let ctx = portverbs::open(portverbs::device(name)?)?;
    let ip = ctx.gid_table_blocking(1)?[0].1.gid.to_ip();
    Ok(CmDevice::open_blocking(&ctx, ip)?)
}

/// A UD QP with rdma_cm's Q_Key for `RDMA_PS_UDP`, its PD, CQ and a registered buffer.
fn ud_qp(cm: &CmDevice<portverbs::AnyDevice>) -> Result<(Pd, Cq, Qp, Mr)> {
    let ctx = cm.context();
    let pd = ctx.alloc_pd_blocking()?;
    let cq = ctx.create_cq_blocking(CqInit {
        entries: 16,
        ..CqInit::default()
    })?;
    let qp = pd.create_qp_blocking(QpInit::new(QpType::Ud, &cq))?;
    qp.ready_ud_blocking(&ConnectOptions {
        qkey: RDMA_UDP_QKEY,
        ..ConnectOptions::default()
    })?;
    let mr = pd.reg_vec_blocking(vec![0; 256], AccessFlags::LOCAL_WRITE)?;
    Ok((pd, cq, qp, mr))
}

fn wait(cq: &Cq) -> Result<WorkCompletion> {
    let mut wc = [WorkCompletion::default()];
    while cq.poll(&mut wc)? == 0 {
        thread::yield_now();
    }
    Ok(wc[0])
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let a = open(&args.next().unwrap_or_else(|| "soft0".into()))?;
    let b = open(&args.next().unwrap_or_else(|| "soft1".into()))?;
    let group = IpAddr::V4(Ipv4Addr::new(239, 1, 2, 3));

    // The receiver joins and posts a receive (40 bytes of GRH area, then the payload).
    let (_rpd, rcq, rqp, rmr) = ud_qp(&b)?;
    let joined = b.join_multicast_blocking(&rqp, group)?;
    println!(
        "receiver joined {group}: MGID {}, send to QPN {:#x} with Q_Key {:#x}",
        std::net::Ipv6Addr::from(joined.mgid.0),
        joined.remote_qpn,
        joined.qkey
    );
    rqp.post_recv(&[RecvWr {
        wr_id: 1,
        sges: &[rmr.sge(0, 256)?],
    }])?;

    // The sender joins too, and sends with what its join returned.
    let (spd, scq, sqp, smr) = ud_qp(&a)?;
    let join = a.join_multicast_blocking(&sqp, group)?;
    let ah = spd.create_ah_blocking(join.av)?;
    smr.write(0, b"hello, group")?;
    let sges = [smr.sge(0, 12)?];
    let dest = UdDest {
        ah_pd: None,
        av: ah.av(),
        remote_qpn: join.remote_qpn,
        remote_qkey: join.qkey,
    };
    sqp.post_send(&[SendWr::new(2, SendOp::Send).sges(&sges).ud(dest).signaled()])?;
    println!("sender: send completed with {}", wait(&scq)?.status);

    let wc = wait(&rcq)?;
    let mut got = vec![0; wc.byte_len as usize - 40];
    rmr.read(40, &mut got)?;
    println!(
        "receiver: {:?} from QP {}",
        String::from_utf8_lossy(&got),
        if wc.src_qp == sqp.qp_num() {
            "the sender's"
        } else {
            "another"
        }
    );

    b.leave_multicast_blocking(&rqp, group)?;
    a.leave_multicast_blocking(&sqp, group)?;
    println!("both left {group}");
    Ok(())
}

//! Datagrams between two UD queue pairs: an address handle names the destination port (on
//! RoCE with a GRH, from GID index 0), every send names the destination QP and Q_Key, and
//! every receive buffer starts with 40 bytes for the GRH.
//!
//!     cargo run --example ud_send [-- DEVICE_A DEVICE_B]    (default: soft0 soft1)
use portverbs::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Bytes before the payload in a UD receive buffer: the GRH (IBA 11.4.1.2).
const GRH: usize = 40;
const PAYLOAD: usize = 256;

struct End {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

fn open(name: &str, opts: &ConnectOptions) -> Result<End> {
    let ctx = portverbs::open(portverbs::device(name)?)?;
    let pd = ctx.alloc_pd_blocking()?;
    let cq = ctx.create_cq_blocking(CqInit {
        entries: 16,
        ..CqInit::default()
    })?;
    let qp = pd.create_qp_blocking(QpInit::new(QpType::Ud, &cq))?;
    let mr = pd.reg_vec_blocking(vec![0; GRH + PAYLOAD], AccessFlags::LOCAL_WRITE)?;
    qp.ready_ud_blocking(opts)?; // RESET → INIT (Q_Key) → RTR → RTS
    Ok(End { pd, cq, qp, mr })
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
    let opts = ConnectOptions::default(); // Q_Key 0x11111111 on both sides
    let a = open(&args.next().unwrap_or_else(|| "soft0".into()), &opts)?;
    let b = open(&args.next().unwrap_or_else(|| "soft1".into()), &opts)?;

    let sges = [b.mr.sge(0, GRH + PAYLOAD)?];
    b.qp.post_recv(&[RecvWr {
        wr_id: 7,
        sges: &sges,
    }])?;

    // The sender learns b's endpoint out of band and makes an address handle toward it.
    let to_b = b.qp.endpoint_blocking(&opts)?;
    let ah =
        a.pd.create_ah_blocking(a.qp.address_vector_blocking(&to_b, &opts)?)?;
    let text = b"a datagram";
    a.mr.write(0, text)?;
    let sges = [a.mr.sge(0, text.len())?];
    let send = SendWr::new(1, SendOp::Send)
        .sges(&sges)
        .ud(ah.dest(to_b.qpn, opts.qkey));
    a.qp.post_send(&[send.flags(SendFlags::SIGNALED)])?;
    poll_one(&a.cq)?;

    let wc = poll_one(&b.cq)?;
    assert!(
        wc.wc_flags.contains(WcFlags::GRH),
        "RoCE datagrams carry a GRH"
    );
    let mut got = vec![0; wc.byte_len as usize - GRH];
    b.mr.read(GRH, &mut got)?;
    println!(
        "b got {:?} from QP {:#x} ({} bytes with the GRH)",
        String::from_utf8_lossy(&got),
        wc.src_qp,
        wc.byte_len
    );
    assert_eq!((got.as_slice(), wc.src_qp), (&text[..], a.qp.qp_num()));

    ah.destroy()?; // before its PD
    for end in [a, b] {
        end.qp.destroy()?;
        end.cq.destroy()?;
        end.mr.dereg()?;
        end.pd.dealloc()?;
    }
    Ok(())
}

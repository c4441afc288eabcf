//! An RDMA WRITE from one RC queue pair to another, completion found by busy polling.
//!
//!     cargo run --example rc_write [-- DEVICE_A DEVICE_B]    (default: soft0 soft1)
use portverbs::prelude::*;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// One end: a PD, a CQ, an RC QP and 4 KiB of the application's memory, registered.
struct End {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

impl End {
    fn open(name: &str) -> Result<Self> {
        let ctx = portverbs::open(portverbs::device(name)?)?;
        let pd = ctx.alloc_pd_blocking()?;
        let cq = ctx.create_cq_blocking(CqInit {
            entries: 16,
            ..CqInit::default()
        })?;
        let qp = pd.create_qp_blocking(QpInit::new(QpType::Rc, &cq))?;
        let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
        let mr = pd.reg_vec_blocking(vec![0; 4096], access)?;
        Ok(Self { pd, cq, qp, mr })
    }

    /// Tears down in dependency order and hands the memory back.
    fn close(self) -> Result<Vec<u8>> {
        self.qp.destroy()?;
        self.cq.destroy()?;
        let memory = self.mr.into_vec()?;
        self.pd.dealloc()?;
        Ok(memory)
    }
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let a = End::open(&args.next().unwrap_or_else(|| "soft0".into()))?;
    let b = End::open(&args.next().unwrap_or_else(|| "soft1".into()))?;

    // Each side's endpoint goes to the other out of band (here: in memory).
    let opts = ConnectOptions::default();
    let (to_a, to_b) = (
        a.qp.endpoint_blocking(&opts)?,
        b.qp.endpoint_blocking(&opts)?,
    );
    a.qp.connect_rc_blocking(&to_b, &opts)?;
    b.qp.connect_rc_blocking(&to_a, &opts)?;

    let message = b"written by RDMA";
    a.mr.write(0, message)?;
    let remote = RemoteAddr {
        addr: b.mr.addr(),
        rkey: b.mr.rkey().ok_or("no rkey")?,
    };
    let sges = [a.mr.sge(0, message.len())?];
    let write = SendWr::new(1, SendOp::RdmaWrite { remote }).sges(&sges);
    a.qp.post_send(&[write.flags(SendFlags::SIGNALED)])?;

    let mut wc = [WorkCompletion::default()];
    while a.cq.poll(&mut wc)? == 0 {
        std::hint::spin_loop();
    }
    if wc[0].status != WcStatus::Success {
        return Err(format!("RDMA WRITE failed: {}", wc[0].status).into());
    }

    a.close()?;
    let landed = b.close()?;
    println!(
        "b holds: {}",
        String::from_utf8_lossy(&landed[..message.len()])
    );
    assert_eq!(&landed[..message.len()], message);
    Ok(())
}

//! The UD side of the CM's service resolution (SIDR, `RDMA_PS_UDP`), shared by `cm_sidr.rs`
//! and `cm_matrix.rs` (each declares `mod mcast_util;` and includes this file as
//! `mod sidr_util;`): a UD QP as rdma_cm brings one up, a datagram sent and received with its
//! GRH, and a listener thread that serves one request.

#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::thread;
use std::time::Duration;

use portverbs::AnyDevice;
use portverbs::cm::service::{CmDevice, Listener, RDMA_UDP_QKEY, ServiceError, UdParam};
use portverbs::prelude::*;
use portverbs::verbs::GRH_LEN;

use crate::mcast_util::{self, Ud, completions};

type Dev = CmDevice<AnyDevice>;

const T: Option<Duration> = Some(Duration::from_secs(20));
const PATIENCE: Duration = Duration::from_secs(20);

/// A UD QP as rdma_cm brings up a `RDMA_PS_UDP` id's QP (Q_Key 0x01234567), a receive posted.
pub fn ud(cm: &Dev) -> Ud {
    let u = mcast_util::ud(cm.context(), RDMA_UDP_QKEY);
    u.post_recv(0);
    u
}

/// Sends `payload` from `from` through `ah` to QP `qpn` with `qkey`, its own QPN as immediate
/// data (as udaddy does), and waits for the send's completion.
pub fn send(from: &Ud, ah: &AddressHandle, qpn: u32, qkey: u32, payload: &[u8]) {
    from.mr.write(0, payload).unwrap();
    let sge = [from.mr.sge(0, payload.len()).unwrap()];
    let imm = from.qp.qp_num();
    let wr = SendWr::new(1, SendOp::SendWithImm { imm })
        .sges(&sge)
        .ud(ah.dest(qpn, qkey))
        .signaled();
    from.qp.post_send(&[wr]).unwrap();
    let wc = completions(&from.cq, 1, PATIENCE);
    assert_eq!(wc.len(), 1, "send completion");
    assert_eq!(
        (wc[0].opcode, wc[0].status),
        (WcOpcode::Send, WcStatus::Success)
    );
}

/// The next datagram `on` receives: its completion, GRH area and payload. Posts the next
/// receive.
pub fn recv(on: &Ud) -> (WorkCompletion, [u8; GRH_LEN], Vec<u8>) {
    let wc = completions(&on.cq, 1, PATIENCE);
    assert_eq!(wc.len(), 1, "no datagram came");
    let wc = wc[0];
    assert_eq!((wc.opcode, wc.status), (WcOpcode::Recv, WcStatus::Success));
    let mut grh = [0u8; GRH_LEN];
    on.mr.read(0, &mut grh).unwrap();
    let mut payload = vec![0u8; wc.byte_len as usize - GRH_LEN];
    on.mr.read(GRH_LEN, &mut payload).unwrap();
    on.post_recv(0);
    (wc, grh, payload)
}

/// What the passive side learnt from the request.
pub struct Asked {
    pub remote: SocketAddr,
    pub local: SocketAddr,
    pub private_data: Vec<u8>,
}

/// What [`serve_one`]'s thread hands back: the listener and QP, the request, the reply's
/// outcome.
pub type Served = (Listener<AnyDevice>, Ud, Asked, Result<(), ServiceError>);

/// Serves one request on `listener` with `server`'s QP and `param`.
pub fn serve_one(
    listener: Listener<AnyDevice>,
    server: Ud,
    param: UdParam,
) -> thread::JoinHandle<Served> {
    thread::spawn(move || {
        let req = listener.get_service_request_blocking(T).unwrap();
        let asked = Asked {
            remote: req.remote_addr(),
            local: req.local_addr(),
            private_data: req.private_data().to_vec(),
        };
        let r = req.reply_with(&server.qp, &param);
        (listener, server, asked, r)
    })
}

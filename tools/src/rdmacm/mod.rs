//! Counterparts of librdmacm's example programs (rdma-core `librdmacm/examples/`), each
//! connected by Portverbs' connection manager so that either end can be the C program:
//!
//! * [`ucmatose`]: `ucmatose` (`cmatose.c`): RC connections, messages both ways, the
//!   server disconnects.
//! * [`udaddy`]: `udaddy` (`udaddy.c`): UD service resolution (SIDR), datagrams both ways.
//! * [`pair`]: `rdma_server` / `rdma_client` (`rdma_server.c`, `rdma_client.c`): one RC
//!   connection, one 16-byte message each way.
//!
//! What they share is here: one connection's verbs objects ([`Node`]) and the waits for its
//! completions, which sleep in a completion channel and give up when the peer stays silent
//! for `--timeout`.

pub(crate) mod pair;
pub(crate) mod ucmatose;
pub(crate) mod udaddy;

use std::io::Write as _;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use portverbs::AnyDevice;
use portverbs::cm::service::{CmDevice, ServiceError};
use portverbs::prelude::*;

use crate::cmdev;
use crate::error::{CliError, Context as _};
use crate::events::{EventChannel, SLICE};
use crate::verbs;

/// Bytes in front of a UD receive: the GRH (IBA 11.4.1.2), or on RoCEv2 over IPv4 20
/// reserved bytes and the IPv4 header.
pub(crate) const GRH_LEN: usize = 40;

/// One line on stdout, flushed (the C programs `printf` theirs; a test reads them as they
/// come).
pub(crate) fn say(line: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

/// Runs one end of a librdmacm example as the C programs do: `<name>: starting client` (a
/// server address given) or `<name>: starting server`, the device picked as they pick it
/// (`-b`, or the first device that reaches the server), the role, then `test complete` and
/// `return status 0|1`.
pub(crate) fn run_role(
    name: &str,
    device: Option<&str>,
    bind: Option<IpAddr>,
    server: Option<IpAddr>,
    client: impl FnOnce(&CmDevice<AnyDevice>, IpAddr) -> Result<(), CliError>,
    serve: impl FnOnce(&CmDevice<AnyDevice>) -> Result<(), CliError>,
) -> Result<(), CliError> {
    let result = match server {
        Some(dst) => {
            say(format_args!("{name}: starting client"));
            let dev = cmdev::client_device(device, bind, Some(dst))?;
            client(&cmdev::cm_device(dev)?, dst)
        }
        None => {
            say(format_args!("{name}: starting server"));
            let dev = cmdev::server_device(device, bind)?;
            cmdev::reachable_server(&dev, "")?;
            serve(&cmdev::cm_device(dev)?)
        }
    };
    say("test complete");
    say(format_args!(
        "return status {}",
        if result.is_ok() { 0 } else { 1 }
    ));
    result
}

/// librdmacm's name of the event a failed connect or resolution ends with, and its status
/// as the C programs print it (`rdma_event_str`, `event->status`).
pub(crate) fn event_of(e: &ServiceError) -> Option<(&'static str, i32)> {
    match e {
        ServiceError::Rejected { reason, .. } => {
            Some(("RDMA_CM_EVENT_REJECTED", i32::from(reason.to_u16())))
        }
        ServiceError::Unreachable => Some(("RDMA_CM_EVENT_UNREACHABLE", -110)),
        ServiceError::ServiceRejected(status) => {
            Some(("RDMA_CM_EVENT_UNREACHABLE", i32::from(status.to_u8())))
        }
        ServiceError::ConnectError(_) => Some(("RDMA_CM_EVENT_CONNECT_ERROR", -22)),
        _ => None,
    }
}

/// One connection's verbs objects, as the C programs' `cmatest_node`: a PD, a send and a
/// receive CQ (the same CQ for UD, as `udaddy` has it), the QP, and one message buffer
/// every send and receive uses.
pub(crate) struct Node {
    pub(crate) pd: Pd,
    pub(crate) send_cq: Cq,
    pub(crate) recv_cq: Cq,
    pub(crate) qp: Qp,
    pub(crate) mr: Mr,
    channel: EventChannel,
    limit: Option<Duration>,
}

/// What a [`Node`] is made for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NodeSpec {
    /// RC or UD.
    pub(crate) qp_type: QpType,
    /// Send and receive WRs (and CQ entries per queue).
    pub(crate) depth: u32,
    /// The message buffer's length (UD: message and GRH).
    pub(crate) buf_len: usize,
    /// How long a wait for a completion lasts (None: for ever).
    pub(crate) limit: Option<Duration>,
}

impl Node {
    /// Makes the objects on `ctx` and takes the QP to where receives may be posted: an RC QP
    /// to INIT (the CM takes it on from there when connecting or accepting), a UD QP to RTS
    /// with rdma_cm's Q_Key `qkey`.
    pub(crate) fn new(ctx: &Context, spec: NodeSpec, qkey: u32) -> Result<Self, CliError> {
        let pd = ctx.alloc_pd_blocking().ctx("ibv_alloc_pd failed")?;
        let channel = EventChannel::new(ctx)?;
        let depth = spec.depth.max(1);
        let cq = |entries: u32| {
            ctx.create_cq_blocking(CqInit {
                entries,
                comp_vector: 0,
                channel: Some(channel.channel()),
            })
            .ctx("ibv_create_cq failed")
        };
        let (send_cq, recv_cq) = if spec.qp_type == QpType::Ud {
            let one = cq(2 * depth)?;
            (one.clone(), one)
        } else {
            (cq(depth)?, cq(depth)?)
        };
        let caps = QpCaps {
            max_send_wr: depth,
            max_recv_wr: depth,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        };
        let qp = pd
            .create_qp_blocking(QpInit {
                caps,
                send_cq: &send_cq,
                ..QpInit::new(spec.qp_type, &recv_cq)
            })
            .ctx("rdma_create_qp")?;
        let opts = ConnectOptions {
            port: 1,
            qkey,
            ..ConnectOptions::default()
        };
        if spec.qp_type == QpType::Ud {
            verbs::connect(&qp, &QpEndpoint::default(), &opts)?;
        } else {
            verbs::init(&qp, &opts)?;
        }
        let mr = pd
            .reg_vec_blocking(vec![0u8; spec.buf_len.max(1)], AccessFlags::LOCAL_WRITE)
            .ctx("failed to reg MR")?;
        Ok(Self {
            pd,
            send_cq,
            recv_cq,
            qp,
            mr,
            channel,
            limit: spec.limit,
        })
    }

    /// Posts `n` receives of `len` bytes into the message buffer.
    pub(crate) fn post_recvs(&self, n: u32, len: usize) -> Result<(), CliError> {
        let sge = [self.mr.sge(0, len).ctx("the message buffer")?];
        for _ in 0..n {
            self.qp
                .post_recv(&[RecvWr {
                    wr_id: 0,
                    sges: &sge,
                }])
                .ctx("failed to post receives")?;
        }
        Ok(())
    }

    /// Posts `n` sends of `len` bytes of the message buffer, `wr` finishing each request
    /// (the opcode's immediate, a UD destination, the flags).
    pub(crate) fn post_sends<'a>(
        &'a self,
        n: u32,
        len: usize,
        op: SendOp,
        flags: SendFlags,
        dest: Option<portverbs::verbs::UdDest<'a>>,
    ) -> Result<(), CliError> {
        let sge = [self.mr.sge(0, len).ctx("the message buffer")?];
        for _ in 0..n {
            let mut wr = SendWr::new(0, op).sges(&sge).flags(flags);
            if let Some(d) = dest {
                wr = wr.ud(d);
            }
            self.qp.post_send(&[wr]).ctx("failed to post sends")?;
        }
        Ok(())
    }

    /// Waits for `n` successful completions of `cq` that `counts` accepts (others are passed
    /// over); calls `each` with every one counted. An error completion ends the wait.
    pub(crate) fn complete(
        &self,
        cq: &Cq,
        n: u32,
        counts: impl Fn(&WorkCompletion) -> bool,
        mut each: impl FnMut(&WorkCompletion) -> Result<(), CliError>,
    ) -> Result<(), CliError> {
        let mut done = 0;
        let mut since = Instant::now();
        let mut wcs = [WorkCompletion::default(); 8];
        // Polls once: how many completions came.
        let mut drain = |done: &mut u32| -> Result<usize, CliError> {
            let got = cq
                .poll(&mut wcs)
                .map_err(|e| CliError::Failed(format!("failed polling CQ: {e}")))?;
            for wc in &wcs[..got] {
                if wc.status != WcStatus::Success {
                    return Err(CliError::Failed(format!(
                        "completion with status {} ({:?}), opcode {:?}",
                        wc.status as u32, wc.status, wc.opcode
                    )));
                }
                if counts(wc) {
                    *done += 1;
                    each(wc)?;
                }
            }
            Ok(got)
        };
        while done < n {
            if drain(&mut done)? > 0 {
                since = Instant::now();
                continue;
            }
            if let Some(limit) = self.limit {
                if since.elapsed() >= limit {
                    return Err(CliError::Failed(format!(
                        "{done} of {n} completions, then none for {} s: the peer stopped \
                         responding (--timeout)",
                        limit.as_secs_f64()
                    )));
                }
            }
            // Arm, look once more (a completion before the arm raises no event), sleep.
            cq.req_notify(false);
            if drain(&mut done)? > 0 {
                since = Instant::now();
                continue;
            }
            self.channel.sleep(SLICE)?;
        }
        Ok(())
    }
}

/// Waits up to `limit` for the end of a disconnect (`RDMA_CM_EVENT_DISCONNECTED`), then lets
/// the CM's last MADs leave before the process does. Whether the event came.
pub(crate) fn linger(
    cm: &CmDevice<AnyDevice>,
    conn: &portverbs::cm::service::Connector<AnyDevice>,
    limit: Duration,
) -> bool {
    let came = conn.notify_disconnect_blocking(Some(limit)).is_ok();
    let _ = cm.flush(Duration::from_secs(1));
    came
}

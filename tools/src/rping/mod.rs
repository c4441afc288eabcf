//! `portverbs rping`: librdmacm's rping, whose ping loop ([`engine`]) runs over a connected RC
//! QP and whose buffers follow rping's own formats ([`proto`]), so either end can be the C
//! tool once the connection manager connects them.

// The ping loop is wired to the `rping` subcommand with the connection manager's Connector
// and Listener (cm-core); until then its tests connect the QPs out of band.
#![allow(
    dead_code,
    reason = "wired to the CLI with the CM's Listener and Connector"
)]

pub(crate) mod engine;
pub(crate) mod proto;

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    use portverbs::prelude::*;

    use super::engine::{CAPS, Link, Rping, Step};
    use super::proto::{self, RdmaInfo};
    use crate::error::CliError;
    use crate::verbs;

    /// Polls a CQ; the peer's "disconnect" is a flag (the CM's event in the real tool).
    struct PollLink<'a> {
        cq: Cq,
        disconnected: &'a AtomicBool,
        deadline: Instant,
    }

    impl Link for PollLink<'_> {
        fn next(&mut self) -> Result<Step, CliError> {
            loop {
                let mut wc = [WorkCompletion::default()];
                if self
                    .cq
                    .poll(&mut wc)
                    .map_err(|e| CliError::Failed(e.to_string()))?
                    == 1
                {
                    return Ok(Step::Completion(wc[0]));
                }
                if self.disconnected.load(Ordering::Acquire) {
                    return Ok(Step::Disconnected);
                }
                if Instant::now() > self.deadline {
                    return Err(CliError::Failed("no completion within 20 s".into()));
                }
                std::thread::yield_now();
            }
        }
    }

    struct Side {
        _ctx: Context,
        pd: Pd,
        cq: Cq,
        qp: Qp,
        opts: ConnectOptions,
        me: QpEndpoint,
    }

    fn side(name: &str) -> Side {
        let ctx = verbs::open(verbs::pick_device(Some(name)).unwrap()).unwrap();
        let port = verbs::port_info(&ctx, 1, None).unwrap();
        let pd = ctx.alloc_pd_blocking().unwrap();
        let cq = ctx
            .create_cq_blocking(CqInit {
                entries: 32,
                ..CqInit::default()
            })
            .unwrap();
        let qp = pd
            .create_qp_blocking(QpInit {
                caps: CAPS,
                ..QpInit::new(QpType::Rc, &cq)
            })
            .unwrap();
        let opts = ConnectOptions {
            access: AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            ..verbs::options(&port)
        };
        let me = verbs::endpoint(&port, &qp, verbs::random_psn());
        Side {
            _ctx: ctx,
            pd,
            cq,
            qp,
            opts: ConnectOptions {
                psn: me.psn,
                ..opts
            },
            me,
        }
    }

    /// A client on soft0 and a server on soft1, their QPs connected out of band; returns
    /// the client's and the server's results and output.
    fn run(
        client_size: usize,
        server_size: usize,
        count: u64,
    ) -> (Result<u64, CliError>, Result<u64, CliError>, String, String) {
        let _alone = crate::perf::DEVICE_TRAFFIC
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (c, s) = (side("soft0"), side("soft1"));
        verbs::connect(&c.qp, &s.me, &c.opts).unwrap();
        verbs::connect(&s.qp, &c.me, &s.opts).unwrap();
        let client = Rping::new(&c.pd, c.qp.clone(), client_size, true).unwrap();
        let server = Rping::new(&s.pd, s.qp.clone(), server_size, false).unwrap();
        client.post_recv().unwrap();
        server.post_recv().unwrap();
        // Each side's end reaches the other as a disconnect.
        let (client_done, server_done) = (AtomicBool::new(false), AtomicBool::new(false));
        let deadline = Instant::now() + Duration::from_secs(20);
        std::thread::scope(|scope| {
            let srv = scope.spawn(|| {
                let mut link = PollLink {
                    cq: s.cq.clone(),
                    disconnected: &client_done,
                    deadline,
                };
                let mut out = Vec::new();
                let r = server.serve(&mut link, true, &mut out);
                server_done.store(true, Ordering::Release);
                (r, String::from_utf8(out).unwrap())
            });
            let mut link = PollLink {
                cq: c.cq.clone(),
                disconnected: &server_done,
                deadline,
            };
            let mut out = Vec::new();
            let r = client.ping(&mut link, count, true, true, &mut out);
            client_done.store(true, Ordering::Release);
            let (sr, sout) = srv.join().unwrap();
            (r, sr, String::from_utf8(out).unwrap(), sout)
        })
    }

    #[test]
    fn pings_travel_and_come_back_as_rping_prints_them() {
        let (c, s, cout, sout) = run(64, 64, 3);
        assert_eq!(c.unwrap(), 3);
        assert_eq!(
            s.unwrap(),
            3,
            "the server echoed every ping, then saw the disconnect"
        );
        let mut expect = String::new();
        for n in 0..3 {
            let mut buf = vec![0u8; 64];
            proto::fill_ping(&mut buf, n);
            let text = String::from_utf8(proto::c_str(&buf).to_vec()).unwrap();
            expect += &format!("ping data: {text}\n");
        }
        assert_eq!(cout, expect);
        assert_eq!(sout, expect.replace("ping data", "server ping data"));
        assert!(cout.starts_with(
            "ping data: rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr\n"
        ));
    }

    #[test]
    fn a_ping_larger_than_the_servers_buffer_is_refused_by_the_server() {
        let (_, s, _, _) = run(128, 64, 1);
        let e = s.unwrap_err();
        assert!(
            e.to_string().contains("larger than this server's 64"),
            "{e}"
        );
    }

    #[test]
    fn the_largest_ping_travels() {
        let (c, s, _, _) = run(proto::MAX_SIZE, proto::MAX_SIZE, 2);
        assert_eq!((c.unwrap(), s.unwrap()), (2, 2));
        assert!(RdmaInfo::from_bytes(&[0; 16]).is_ok());
    }
}

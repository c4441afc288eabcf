//! The two ends of a cmtime run, each driven without blocking so that thousands of
//! connections are in flight at once from one thread: the client starts its connects (and
//! later its disconnects) and collects each outcome as the device reports it
//! ([`CmDevice::take_ready`]); the server accepts every request as it is queued and answers
//! every DREQ. [`pump`] drives the devices of whichever ends run in this process.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use portverbs::AnyDevice;
use portverbs::cm::CmId;
use portverbs::cm::service::{CmDevice, ConnParam, Connector, Listener};
use portverbs::prelude::*;

use crate::error::{CliError, Context as _};

type Cm = CmDevice<AnyDevice>;

/// An RC QP with one of everything (cmtime's), on `cq`.
pub(crate) fn rc_qp(pd: &Pd, cq: &Cq) -> Result<Qp, CliError> {
    let mut init = QpInit::new(QpType::Rc, cq);
    init.caps = QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
    };
    pd.create_qp_blocking(init).ctx("ibv_create_qp")
}

/// A PD and a CQ for the QPs of one end.
pub(crate) fn pd_cq(cm: &Cm) -> Result<(Pd, Cq), CliError> {
    let ctx = cm.context();
    let pd = ctx.alloc_pd_blocking().ctx("ibv_alloc_pd")?;
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 16,
            ..CqInit::default()
        })
        .ctx("ibv_create_cq")?;
    Ok((pd, cq))
}

/// The server: a listener that accepts every request on a QP of its own and answers every
/// disconnect.
pub(crate) struct Server {
    pub(crate) cm: Cm,
    listener: Listener<AnyDevice>,
    pd: Pd,
    cq: Cq,
    conns: Vec<(Connector<AnyDevice>, Qp, Instant, bool)>,
    /// QPs made ahead of the requests ([`Server::pool_qps`]), taken last first.
    pool: Vec<Qp>,
    index: HashMap<CmId, usize>,
    ready: Vec<CmId>,
    /// The address of the client whose request came last (what a failure names).
    pub(crate) peer: Option<std::net::SocketAddr>,
    /// Connections established, and disconnected, so far.
    pub(crate) established: usize,
    pub(crate) disconnected: usize,
    /// Per connection: accept → RTU, and DREQ → DREP, in µs since `t0`.
    pub(crate) connect_spans: Vec<(u64, u64)>,
    pub(crate) disconnect_spans: Vec<(u64, u64)>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("conns", &self.conns.len())
            .field("established", &self.established)
            .field("disconnected", &self.disconnected)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Listens on `addr` with room for `backlog` requests.
    pub(crate) fn new(cm: Cm, addr: SocketAddr, backlog: usize) -> Result<Self, CliError> {
        let mut listener = Listener::bind(&cm, addr).ctx("rdma_bind_addr")?;
        listener.listen(backlog).ctx("rdma_listen")?;
        let (pd, cq) = pd_cq(&cm)?;
        let mut ready = Vec::new();
        cm.take_ready(&mut ready);
        Ok(Self {
            cm,
            listener,
            pd,
            cq,
            conns: Vec::new(),
            pool: Vec::new(),
            index: HashMap::new(),
            ready,
            peer: None,
            established: 0,
            disconnected: 0,
            connect_spans: Vec::new(),
            disconnect_spans: Vec::new(),
        })
    }

    /// Makes `n` QPs now, for the requests to come: what the client does in its `create qp`
    /// step, so that `cm connect` times the CM alone on both ends.
    pub(crate) fn pool_qps(&mut self, n: usize) -> Result<(), CliError> {
        self.pool.reserve(n);
        for _ in 0..n {
            self.pool.push(rc_qp(&self.pd, &self.cq)?);
        }
        Ok(())
    }

    /// Accepts what is queued and handles what the device reported; true when anything
    /// happened.
    pub(crate) fn step(&mut self, t0: Instant) -> Result<bool, CliError> {
        let mut busy = false;
        while let Some(req) = self.listener.try_get_request() {
            self.peer = Some(req.remote_addr());
            let start = Instant::now();
            let qp = match self.pool.pop() {
                Some(qp) => qp,
                None => rc_qp(&self.pd, &self.cq)?,
            };
            let conn = req
                .accept_nowait(&qp, &ConnParam::default())
                .ctx("rdma_accept")?;
            self.index.insert(conn.cm_id(), self.conns.len());
            self.conns.push((conn, qp, start, false));
            busy = true;
        }
        self.cm.take_ready(&mut self.ready);
        for id in std::mem::take(&mut self.ready) {
            let Some(&i) = self.index.get(&id) else {
                continue;
            };
            busy = true;
            let (conn, qp, start, up) = &mut self.conns[i];
            if !*up {
                match conn.try_connected() {
                    Some(r) => {
                        r.ctx("rdma_accept")?;
                        *up = true;
                        self.established += 1;
                        self.connect_spans
                            .push((micros(t0, *start), micros(t0, Instant::now())));
                    }
                    None => continue,
                }
            }
            if conn.try_disconnected() {
                let a = Instant::now();
                conn.disconnect(qp).ctx("rdma_disconnect")?;
                self.disconnected += 1;
                self.disconnect_spans
                    .push((micros(t0, a), micros(t0, Instant::now())));
            }
        }
        Ok(busy)
    }

    /// The CM table bytes per connection held.
    pub(crate) fn state_per_conn(&self) -> usize {
        self.cm.state_bytes() / self.conns.len().max(1)
    }
}

/// Microseconds from `t0` to `t`.
pub(crate) fn micros(t0: Instant, t: Instant) -> u64 {
    t.duration_since(t0).as_micros() as u64
}

/// The client's connections: one endpoint and QP each, resolved to the server.
pub(crate) struct Client {
    pub(crate) cm: Cm,
    pub(crate) ids: Vec<Connector<AnyDevice>>,
    pub(crate) qps: Vec<Qp>,
    index: HashMap<CmId, usize>,
    ready: Vec<CmId>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("ids", &self.ids.len())
            .finish_non_exhaustive()
    }
}

/// What the client waits for in [`Client::run_step`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Await {
    Connect,
    Disconnect,
}

impl Client {
    pub(crate) fn new(cm: Cm) -> Self {
        let mut ready = Vec::new();
        cm.take_ready(&mut ready);
        Self {
            cm,
            ids: Vec::new(),
            qps: Vec::new(),
            index: HashMap::new(),
            ready,
        }
    }

    pub(crate) fn push(&mut self, id: Connector<AnyDevice>) {
        self.index.insert(id.cm_id(), self.ids.len());
        self.ids.push(id);
    }

    /// Starts the connects (or disconnects) of every connection, at most `window` at once,
    /// and drives `server` (when it runs in this process) and both devices until every one
    /// has completed; `span(i, start, end)` records each. Fails after `limit` without
    /// progress.
    pub(crate) fn run_step(
        &mut self,
        what: Await,
        window: usize,
        mut server: Option<&mut Server>,
        t0: Instant,
        span: &mut dyn FnMut(usize, u64, u64),
        limit: Duration,
    ) -> Result<(), CliError> {
        let n = self.ids.len();
        let mut started = vec![0u64; n];
        let (mut next, mut done) = (0usize, 0usize);
        let mut last = Instant::now();
        while done < n {
            let mut busy = false;
            while next < n && next - done < window {
                started[next] = micros(t0, Instant::now());
                match what {
                    Await::Connect => self.ids[next]
                        .connect_nowait(&self.qps[next], &ConnParam::default())
                        .ctx("rdma_connect")?,
                    Await::Disconnect => self.ids[next]
                        .disconnect(&self.qps[next])
                        .ctx("rdma_disconnect")?,
                }
                next += 1;
                busy = true;
            }
            self.cm.progress().ctx("driving the client's CM")?;
            if let Some(s) = server.as_deref_mut() {
                s.cm.progress().ctx("driving the server's CM")?;
                busy |= s.step(t0)?;
            }
            self.cm.take_ready(&mut self.ready);
            for id in std::mem::take(&mut self.ready) {
                let Some(&i) = self.index.get(&id) else {
                    continue;
                };
                let finished = match what {
                    Await::Connect => match self.ids[i].try_connected() {
                        Some(r) => r.map(|_| true).ctx("rdma_connect")?,
                        None => false,
                    },
                    Await::Disconnect => self.ids[i].try_disconnected(),
                };
                if finished {
                    span(i, started[i], micros(t0, Instant::now()));
                    done += 1;
                    busy = true;
                }
            }
            if busy {
                last = Instant::now();
            } else if last.elapsed() > limit {
                return Err(CliError::Failed(format!(
                    "{} of {n} connections did not complete within {limit:?}",
                    n - done
                )));
            } else {
                super::idle_pause(last.elapsed());
            }
        }
        Ok(())
    }
}

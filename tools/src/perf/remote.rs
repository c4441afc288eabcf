//! `portverbs perf` across processes: one side of the test here, the other in another process
//! (another `portverbs perf`, or perftest's own `ib_write_bw` …), the QP information exchanged
//! over TCP in perftest's format ([`super::channel`]).
//!
//! Flow, as perftest's: connect (client) or accept one client (server); exchange versions,
//! system data and MTU; build this side ([`super::setup::side`]); print the banner; exchange the
//! destinations and connect the QPs, in the order of hand shakes the test's perftest program
//! uses; print the address lines and the table header; run. Write and read BW: the client runs
//! and prints its rows, then sends its last row to the server, which prints it (perftest's
//! server posts nothing). Send BW: the server counts the arrivals and prints its own rows.
//! Latency: both sides ping-pong and both print their rows.
//!
//! With `-R` ([`PeerLink::CmConnect`], [`PeerLink::CmAccept`]) the side channel is an RC QP
//! connected by the CM and the test QPs are connected by the CM too, as perftest's rdma_cm
//! mode does it ([`super::cm`] has the wire facts): after the parameters a hand shake, the
//! test QPs' connections, another hand shake, then the same exchanges as over TCP (without
//! the transitions the CM made); at the end the CM disconnects the test QPs and the side
//! channel.

use std::io::Write;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use portverbs::cm::service::RDMA_UDP_QKEY;
use portverbs::oob::perftest::{BwReport, Dest};
use portverbs::prelude::*;

use super::bw::{self, RecvState};
use super::channel::Channel;
use super::cm::{self, CommQp, DataConns};
use super::config::{PEAK_WARNING, PerfConfig, RunMode, Sizes};
use super::json_file::JsonFile;
use super::lat;
use super::ops::PeerQp;
use super::output;
use super::recorder::LatOutcome;
use super::setup::{self, Side};
use super::tracker::Tracker;
use crate::error::{CliError, IoContext as _};
use crate::report::perftest::{BannerRole, JsonResults, PerftestBanner};
use crate::report::{
    AddressSide, BwResult, TestKind, Verb, bw_header, bw_results, bw_row, format_address,
    format_banner, json_document, lat_duration_header, lat_duration_results, lat_duration_row,
    lat_header, lat_results, lat_row, latency_stats, result_rule,
};
use crate::verbs;
use crate::wait::PeerWatch;

/// How long the client tries to connect.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// perftest's banner on a server before a client connects.
const WAITING: &str = "\n************************************\n\
                       * Waiting for client to connect... *\n\
                       ************************************\n";

/// How this side reaches its peer.
#[derive(Debug)]
pub(crate) enum PeerLink<'a> {
    /// Client: connect to `host:port`.
    Connect {
        /// Server name or address.
        host: &'a str,
        /// TCP port.
        port: u16,
    },
    /// Server: accept one client on the listener (giving up when the flag is set).
    Accept(&'a TcpListener, &'a AtomicBool),
    /// `-R` client: connect through the CM to `host:port` (RDMA_PS_TCP port space).
    CmConnect {
        /// Server name or address.
        host: &'a str,
        /// The CM port.
        port: u16,
    },
    /// `-R` server: listen through the CM on `port`, accept one client (giving up when the
    /// flag is set).
    CmAccept {
        /// The CM port.
        port: u16,
        /// Set to give up waiting.
        abort: &'a AtomicBool,
        /// Set once the listener is up (a client in this process waits for it: a request
        /// sent before the peer's CM is open is lost, and the CM resends it only seconds
        /// later).
        listening: Option<&'a AtomicBool>,
    },
}

/// Runs one side of a cross-process test, writing what perftest prints to `out`.
pub(crate) fn run(
    cfg: PerfConfig,
    link: PeerLink<'_>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    if cfg.peak_warning {
        emit(out, &format!("{PEAK_WARNING}\n"))?;
    }
    let json_file = cfg.json.as_deref().map(JsonFile::open).transpose()?;
    let ctx = verbs::open(verbs::pick_device(cfg.device.as_deref())?)?;
    let port = verbs::port_info(&ctx, cfg.ib_port, cfg.gid_index)?;
    let mut res = setup::resolve(&cfg, &ctx, &ctx, &port, &port)?;
    let client = matches!(link, PeerLink::Connect { .. } | PeerLink::CmConnect { .. });
    let gid_index = port.gid_index.map_or(0, u32::from);
    // With -R: the CM of the device, the server's listener (the side channel's and the test
    // QPs' requests come to it) and the address the client connects to.
    let mut cm_link = None;
    // Every wait on the peer gives up after --timeout without a sign of it.
    let watch = PeerWatch::new(cfg.peer_timeout, ctx.device().clone());
    let mut chan = match link {
        PeerLink::Connect { host, port } => {
            Channel::connect(host, port, CONNECT_TIMEOUT, watch).map_err(|e| e.with_peer(host))?
        }
        PeerLink::Accept(listener, abort) => {
            emit(out, WAITING)?;
            Channel::accept(listener, abort, watch)?
        }
        PeerLink::CmConnect { host, port: p } => {
            let dev = cm::open(&ctx, port.gid)?;
            let dst = cm::resolve_host(&dev, host, p)?;
            let comm = CommQp::connect(&dev, dst)?;
            cm_link = Some((dev, CmPeer::Server(dst)));
            Channel::over_cm(comm, true, dst.to_string(), gid_index, watch)
        }
        PeerLink::CmAccept {
            port: p,
            abort,
            listening,
        } => {
            let dev = cm::open(&ctx, port.gid)?;
            let listener = cm::listen(&dev, p)?;
            // UD test QPs are resolved on the UDP port space at the same port (SIDR).
            let ud = (cfg.conn == QpType::Ud)
                .then(|| cm::listen_udp(&dev, p))
                .transpose()?;
            if let Some(up) = listening {
                up.store(true, Ordering::Release);
            }
            emit(out, WAITING)?;
            let (comm, peer) = CommQp::accept(&dev, &listener, abort)?;
            cm_link = Some((dev, CmPeer::Client(listener, ud)));
            Channel::over_cm(comm, false, peer.to_string(), gid_index, watch)
        }
    };
    let r = run_on(
        &cfg, ctx, port, &mut res, client, &mut chan, cm_link, json_file, out,
    )
    .map_err(|e| e.with_peer(chan.peer()));
    chan.finish(r.is_ok());
    r
}

/// `-R` on the embedded fabric: a server thread on the other device of the pair, the client
/// on `cfg`'s device, both through the CM on `port` as two processes would be; the client's
/// lines go to `out`, the server's to `server_out`.
pub(crate) fn run_cm_pair(
    cfg: PerfConfig,
    port: u16,
    out: &mut dyn Write,
    server_out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let (cdev, sdev) = verbs::pick_devices(cfg.device.as_deref())?;
    let server_ip = {
        let ctx = verbs::open(sdev.clone())?;
        let gid_index = cfg.gid_index;
        verbs::port_info(&ctx, 1, gid_index)?.gid.to_ip()
    };
    let server_cfg = PerfConfig {
        device: Some(sdev.info().name.clone()),
        ib_port: 1,
        json: None,
        ..cfg.clone()
    };
    let client_cfg = PerfConfig {
        device: Some(cdev.info().name.clone()),
        ..cfg
    };
    let host = server_ip.to_string();
    let (done, up) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let link = PeerLink::CmAccept {
                port,
                abort: &done,
                listening: Some(&up),
            };
            run(server_cfg, link, server_out)
        });
        // The client starts once the server listens (or has failed).
        while !up.load(Ordering::Acquire) && !server.is_finished() {
            std::thread::sleep(Duration::from_millis(1));
        }
        let link = PeerLink::CmConnect { host: &host, port };
        let r = run(client_cfg, link, out);
        done.store(true, Ordering::Release);
        let served = server
            .join()
            .map_err(|_| CliError::Failed("the server thread panicked".into()))?;
        CliError::merge(r, served)
    })
}

/// A cross-process run on the embedded fabric: a server thread on the other device of the
/// pair, the client on `cfg`'s device, over a TCP connection on loopback as two processes
/// would be (-b and --run_infinitely, which need both sides' own loops); the client's lines
/// go to `out`, the server's to `server_out`.
pub(crate) fn run_tcp_pair(
    cfg: PerfConfig,
    out: &mut dyn Write,
    server_out: &mut (dyn Write + Send),
) -> Result<(), CliError> {
    let (cdev, sdev) = verbs::pick_devices(cfg.device.as_deref())?;
    let server_cfg = PerfConfig {
        device: Some(sdev.info().name.clone()),
        ib_port: 1,
        json: None,
        ..cfg.clone()
    };
    let client_cfg = PerfConfig {
        device: Some(cdev.info().name.clone()),
        ..cfg
    };
    let listener =
        TcpListener::bind(("127.0.0.1", 0)).io_ctx("listening on a loopback TCP port")?;
    let port = listener
        .local_addr()
        .io_ctx("reading the loopback port")?
        .port();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let server = s.spawn(|| run(server_cfg, PeerLink::Accept(&listener, &done), server_out));
        let link = PeerLink::Connect {
            host: "127.0.0.1",
            port,
        };
        let r = run(client_cfg, link, out);
        done.store(true, Ordering::Release);
        let served = server
            .join()
            .map_err(|_| CliError::Failed("the server thread panicked".into()))?;
        CliError::merge(r, served)
    })
}

/// Where the CM finds the peer's test QPs: the server's address (client role), or the
/// listener their requests come to (server role), with the `RDMA_PS_UDP` one of UD tests.
enum CmPeer {
    Server(std::net::SocketAddr),
    Client(
        portverbs::cm::service::Listener<portverbs::AnyDevice>,
        Option<portverbs::cm::service::Listener<portverbs::AnyDevice>>,
    ),
}

/// [`run`] once the side channel is up.
#[allow(clippy::too_many_arguments)]
fn run_on(
    cfg: &PerfConfig,
    ctx: Context,
    port: crate::verbs::PortInfo,
    res: &mut setup::Resolved,
    client: bool,
    chan: &mut Channel,
    cm_link: Option<(
        portverbs::cm::service::CmDevice<portverbs::AnyDevice>,
        CmPeer,
    )>,
    json_file: Option<JsonFile>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    chan.drive(&ctx);
    let params = chan.params(res.mtu as u8)?;
    res.mtu = Mtu::from_code(params.mtu_enum).unwrap_or(res.mtu);
    if cfg.conn == QpType::Ud {
        // A UD message is one packet: no size above the path MTU both sides agreed on.
        let limit = u64::from(res.mtu.bytes());
        res.sizes.retain(|&s| s <= limit);
        if res.sizes.is_empty() {
            res.sizes.push(limit);
        }
    }
    let slot = setup::slot_size(cfg, res, u64::from(params.cycle_buffer))?;
    let mut side = setup::side(cfg, ctx, port, slot)?;
    let mut copts = setup::connect_options(cfg, res, &side.port);
    let ud_by_cm = cm_link.is_some() && cfg.conn == QpType::Ud;
    if ud_by_cm {
        // rdma_cm's UD QPs of RDMA_PS_UDP receive with its Q_Key, which SIDR names.
        copts.qkey = RDMA_UDP_QKEY;
    }
    for qp in &side.qps {
        verbs::init(qp, &copts)?;
    }
    // -R: the test QPs' connections, between two hand shakes (perftest sends zeros in them).
    let mut ud_peers = None;
    let data = match &cm_link {
        None => None,
        Some((dev, peer)) => {
            let nothing = Dest::default();
            chan.hand_shake(&nothing)?;
            // perftest's rdma_cm asks for responder resources for reads and atomics.
            let outs = matches!(cfg.test.verb, Verb::Read | Verb::Atomic).then_some(res.outs);
            let param = cm::data_param(outs, res.mtu);
            let conns = if ud_by_cm {
                // UD: ready to send and receive, then SIDR per QP; the server learns the
                // client's QPs only where it sends too (latency, -b).
                for qp in &side.qps {
                    verbs::connect(qp, &QpEndpoint::default(), &copts)?;
                }
                let qpn_message = cfg.test.kind == TestKind::Lat || cfg.bidirectional;
                let mut peers = match peer {
                    CmPeer::Server(dst) => cm::UdPeers::resolve(
                        dev,
                        &side,
                        &copts,
                        *dst,
                        qpn_message,
                        cfg.peer_timeout,
                    )?,
                    CmPeer::Client(_, ud) => {
                        let ud = ud.as_ref().ok_or_else(|| {
                            CliError::Failed("no listener on the UDP port space".into())
                        })?;
                        cm::UdPeers::answer(dev, ud, &side, &copts, qpn_message, cfg.peer_timeout)?
                    }
                };
                side.ah = peers.ah.take();
                ud_peers = Some(peers);
                None
            } else {
                Some(match peer {
                    CmPeer::Server(dst) => {
                        DataConns::connect(dev, &side.qps, &copts, *dst, &param)?
                    }
                    CmPeer::Client(listener, _) => {
                        DataConns::accept(listener, &side.qps, &param, cfg.peer_timeout)?
                    }
                })
            };
            chan.hand_shake(&nothing)?;
            conns
        }
    };
    let r = run_test(
        cfg,
        res,
        &mut side,
        &copts,
        client,
        chan,
        cm_link.is_some(),
        ud_peers.as_ref().map(|p| &p.qps[..]),
        json_file,
        out,
    );
    if let Some(conns) = data {
        conns.close(&side.qps, r.is_ok());
    }
    r
}

/// The test on connected (with -R) or INIT (without) QPs: the exchanges of destinations, the
/// QPs' connection (without -R), the rows.
#[allow(clippy::too_many_arguments)]
fn run_test(
    cfg: &PerfConfig,
    res: &setup::Resolved,
    side: &mut Side,
    copts: &ConnectOptions,
    client: bool,
    chan: &mut Channel,
    by_cm: bool,
    ud_by_cm: Option<&[(u32, u32)]>,
    json_file: Option<JsonFile>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let mine: Vec<Dest> = (0..side.qps.len())
        .map(|i| Dest {
            lid: side.port.lid,
            out_reads: u16::from(res.outs),
            qpn: side.qps[i].qp_num(),
            psn: side.psns[i],
            rkey: side.mr.rkey().unwrap_or(0),
            vaddr: side.mr.addr() + side.recv_off(i) as u64,
            gid: side.port.gid_index.map(|_| side.port.gid),
            srqn: 0,
        })
        .collect();
    let mut banner = output::banner_of(cfg, res, side);
    banner.role = if client {
        BannerRole::Client
    } else {
        BannerRole::Server
    };
    banner.bidirectional = cfg.bidirectional;
    banner.rdma_cm_qps = by_cm;
    banner.data_ex_rdma_cm = by_cm;
    emit(out, &format_banner(&banner))?;

    let verb = cfg.test.verb;
    let (kind, send) = (cfg.test.kind, verb == Verb::Send);
    let all = |chan: &mut Channel| -> Result<Vec<Dest>, CliError> {
        mine.iter().map(|m| chan.hand_shake(m)).collect()
    };
    // The hand shakes before the QPs connect.
    if kind == TestKind::Lat && !send {
        chan.hand_shake(&mine[0])?;
    }
    super::mismatch::mark(cfg, client, side, &res.sizes)?;
    let remote = all(chan)?;
    // The CM connected the QPs (and checked the addresses) already.
    if !by_cm {
        connect_qps(side, copts, res, &mine[0], &remote)?;
    }
    if cfg.conn == QpType::Ud && ud_by_cm.is_none() {
        // UD sends name the peer in every request: an address handle toward its GID (or LID),
        // and the QPN it sent; the Q_Key is perftest's.
        let r = &remote[0];
        let endpoint = QpEndpoint {
            lid: r.lid,
            qpn: r.qpn,
            psn: r.psn,
            gid: r.gid.unwrap_or_default(),
        };
        side.ah = Some(setup::ah(side, copts, &endpoint)?);
    }
    let side = &*side;
    if send {
        chan.hand_shake(&mine[0])?;
    }
    let mut text = String::new();
    for i in 0..side.qps.len() {
        let off = side.recv_off(i);
        text += &format_address(
            AddressSide::Local,
            &output::dest_at(verb, res.outs, side, i, off),
        );
    }
    let remote = all(chan)?;
    for r in &remote {
        text += &format_address(AddressSide::Remote, &output::remote_dest(verb, r));
    }
    if !send {
        chan.hand_shake(&mine[0])?;
    }
    // perftest's read and atomic latency servers post nothing and print no table.
    let solo = kind == TestKind::Lat && matches!(verb, Verb::Read | Verb::Atomic);
    let duration = matches!(cfg.mode, RunMode::Duration { .. });
    text += &match (kind, duration) {
        (TestKind::Lat, _) if solo && !client => String::new(),
        (TestKind::Bw, _) => bw_header(cfg.units, false),
        (TestKind::Lat, false) => lat_header(false),
        (TestKind::Lat, true) => lat_duration_header(false),
    };
    emit(out, &text)?;

    let peer: Vec<PeerQp> = remote
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let at = RemoteAddr {
                addr: r.vaddr,
                rkey: r.rkey,
            };
            // UD through the CM: the QPN and Q_Key SIDR (or the QPN message) named, as
            // perftest's rdma_cm sends to.
            let (qpn, qkey) = ud_by_cm
                .and_then(|u| u.get(i).copied())
                .unwrap_or((r.qpn, crate::verbs::QKEY));
            PeerQp {
                qpn,
                write_to: at,
                read_from: at,
                qkey,
            }
        })
        .collect();
    let run = Run {
        cfg,
        side,
        peer: &peer,
        mine: &mine[0],
        client,
        sizes: res.sizes.clone(),
    };
    let mut rows = Rows {
        out,
        banner,
        results: Vec::new(),
        json_file,
    };
    match (kind, verb) {
        (TestKind::Bw, Verb::Send) => run.send_bw(chan, &mut rows),
        (TestKind::Bw, _) => run.rdma_bw(chan, &mut rows),
        (TestKind::Lat, Verb::Read | Verb::Atomic) => run.solo_lat(chan, &mut rows),
        (TestKind::Lat, _) => run.lat(chan, &mut rows),
    }
}

/// RTR and RTS toward the peer's destinations (without -R), after perftest's GID check.
fn connect_qps(
    side: &Side,
    copts: &ConnectOptions,
    res: &setup::Resolved,
    mine: &Dest,
    remote: &[Dest],
) -> Result<(), CliError> {
    check_gids(mine, &remote[0])?;
    for (i, r) in remote.iter().enumerate() {
        let endpoint = QpEndpoint {
            lid: r.lid,
            qpn: r.qpn,
            psn: r.psn,
            gid: r.gid.unwrap_or_default(),
        };
        let opts = ConnectOptions {
            psn: side.psns[i],
            max_rd_atomic: res
                .outs
                .min(u8::try_from(r.out_reads).unwrap_or(u8::MAX).max(1)),
            ..*copts
        };
        verbs::connect(&side.qps[i], &endpoint, &opts)?;
    }
    Ok(())
}

/// Where the rows go: the output, and the `--out_json` document rewritten after every row.
struct Rows<'o> {
    out: &'o mut dyn Write,
    banner: PerftestBanner,
    results: Vec<JsonResults>,
    json_file: Option<JsonFile>,
}

impl Rows<'_> {
    fn row(&mut self, text: &str, json: JsonResults) -> Result<(), CliError> {
        emit(self.out, text)?;
        self.results.push(json);
        if let Some(file) = self.json_file.as_mut() {
            file.write(&json_document(&self.banner, &self.results))?;
        }
        Ok(())
    }

    fn text(&mut self, text: &str) -> Result<(), CliError> {
        emit(self.out, text)
    }
}

/// perftest's check that both GIDs are of the same IP version.
fn check_gids(mine: &Dest, theirs: &Dest) -> Result<(), CliError> {
    let v4 = |k: &Dest| k.gid.is_some_and(Gid::is_ipv4_mapped);
    if v4(mine) != v4(theirs) {
        return Err(CliError::Failed(
            "found incompatibility issue with GID types: one side uses an IPv4 address, the \
             other IPv6; use the same IP version on both"
                .into(),
        ));
    }
    Ok(())
}

/// What the test loops need.
struct Run<'a> {
    cfg: &'a PerfConfig,
    side: &'a Side,
    peer: &'a [PeerQp],
    mine: &'a Dest,
    client: bool,
    sizes: Vec<u64>,
}

impl Run<'_> {
    fn tracker(&self, per_size: u64) -> Tracker {
        match self.cfg.mode {
            RunMode::Iters(_) => {
                Tracker::new(self.cfg.test.name(), per_size * self.sizes.len() as u64)
            }
            RunMode::Duration { total, .. } => {
                Tracker::timed(self.cfg.test.name(), total.as_millis() as u64)
            }
        }
    }

    fn iters(&self) -> u64 {
        match self.cfg.mode {
            RunMode::Iters(n) => n,
            RunMode::Duration { .. } => 0,
        }
    }

    /// Write, read and atomic BW: the client runs every size; the server waits for its last
    /// row. With -b both run, as perftest's duplex mode: a hand shake before every size (and
    /// after it with -a), then each side's report to the other, each printing the sum.
    fn rdma_bw(&self, chan: &mut Channel, rows: &mut Rows<'_>) -> Result<(), CliError> {
        if self.cfg.infinite && (self.client || self.cfg.bidirectional) {
            return self.bw_for_ever(rows);
        }
        if self.cfg.bidirectional {
            return self.rdma_bw_both(chan, rows);
        }
        if !self.client {
            // perftest's server posts nothing: it waits for the client's end, then prints the
            // client's last row.
            chan.peer_runs();
            chan.hand_shake(self.mine)?;
            let r = chan.bw_reports(&BwReport::default())?;
            // The client's row is only right under this title if it ran this test.
            if let Err(e) = super::mismatch::check(self.cfg, false, self.side, &self.sizes) {
                let _ = chan.close(self.mine);
                return Err(e);
            }
            let row = BwResult {
                msg_size: r.size,
                iterations: r.iters,
                bw_peak: r.bw_peak,
                bw_average: r.bw_avg,
                msg_rate_mpps: r.msg_rate,
                units: self.cfg.units,
            };
            rows.row(&bw_row(&row, None), bw_results(&row, None))?;
            chan.close(self.mine)?;
            return rows.text(&result_rule());
        }
        let per_size = self.iters() * self.side.qps.len() as u64;
        let mut tracker = self.tracker(per_size);
        let mut last = None;
        for &size in &self.sizes {
            let r = bw::run_sender(self.cfg, self.side, self.peer, size, &mut tracker)?;
            tracker.clear();
            rows.row(&bw_row(&r, None), bw_results(&r, None))?;
            tracker.next_size(per_size);
            last = Some(r);
        }
        tracker.clear();
        rows.text(&result_rule())?;
        chan.hand_shake(self.mine)?;
        let r = last.as_ref().map_or_else(BwReport::default, report_of);
        chan.bw_reports(&r)?;
        chan.close(self.mine)
    }

    /// `--run_infinitely`: one row per interval, until the process is stopped (or fails).
    fn bw_for_ever(&self, rows: &mut Rows<'_>) -> Result<(), CliError> {
        let size = self.sizes.first().copied().unwrap_or(8);
        // No progress line: the rows are the progress.
        let mut tracker = Tracker::new(self.cfg.test.name(), 0);
        bw::run_sender_for_ever(
            self.cfg,
            self.side,
            self.peer,
            size,
            &mut tracker,
            &mut |r| rows.text(&bw_row(r, None)),
        )
    }

    /// `send_bw --run_infinitely`: the server posts its receives, a hand shake starts the
    /// client; both print a row every interval until stopped (perftest refuses it with -b).
    fn send_for_ever(&self, chan: &mut Channel, rows: &mut Rows<'_>) -> Result<(), CliError> {
        let size = self.sizes.first().copied().unwrap_or(8);
        let mut tracker = Tracker::new(self.cfg.test.name(), 0);
        let mine = self.mine;
        let mut report = |r: &BwResult| rows.text(&bw_row(r, None));
        if self.client {
            chan.hand_shake(mine)?;
            return bw::run_sender_for_ever(
                self.cfg,
                self.side,
                self.peer,
                size,
                &mut tracker,
                &mut report,
            );
        }
        let mut recv = RecvState::new(self.side.qps.len());
        bw::run_receiver_for_ever(
            self.cfg,
            self.side,
            &mut recv,
            size,
            || chan.hand_shake(mine).map(|_| ()),
            &mut report,
        )
    }

    /// -b of write, read and atomic BW: both sides run every size at once.
    fn rdma_bw_both(&self, chan: &mut Channel, rows: &mut Rows<'_>) -> Result<(), CliError> {
        let per_size = self.iters() * self.side.qps.len() as u64;
        let mut tracker = self.tracker(per_size);
        let every_size = matches!(self.cfg.sizes, Sizes::All);
        for &size in &self.sizes {
            chan.peer_runs();
            chan.hand_shake(self.mine)?;
            let r = bw::run_sender(self.cfg, self.side, self.peer, size, &mut tracker)?;
            tracker.clear();
            // perftest (4.6 and later) hand-shakes again after each size of -a.
            if every_size {
                chan.peer_runs();
                chan.hand_shake(self.mine)?;
            }
            chan.peer_runs();
            let theirs = chan.bw_reports(&report_of(&r))?;
            let sum = summed(&r, &theirs);
            rows.row(&bw_row(&sum, None), bw_results(&sum, None))?;
            tracker.next_size(per_size);
        }
        tracker.clear();
        rows.text(&result_rule())?;
        chan.close(self.mine)
    }

    /// Send BW: per size, the server posts its receives, a hand shake starts the client, each
    /// side prints its own row; with `-a` a hand shake after every size. With -b both sides
    /// send and receive at once and print the sum of both rows (with -D each its own row).
    fn send_bw(&self, chan: &mut Channel, rows: &mut Rows<'_>) -> Result<(), CliError> {
        if self.cfg.infinite {
            return self.send_for_ever(chan, rows);
        }
        let per_size = self.iters() * self.side.qps.len() as u64;
        let mut tracker = self.tracker(per_size);
        let mut recv = RecvState::new(self.side.qps.len());
        let every_size = matches!(self.cfg.sizes, Sizes::All);
        let duration = matches!(self.cfg.mode, RunMode::Duration { .. });
        for &size in &self.sizes {
            if self.cfg.bidirectional {
                // perftest's duplex send: both sides post receives, hand-shake, send and
                // receive at once, then print the sum of both sides' rows (with -D: both run
                // for the duration, each counting its sends between the margins).
                let mine = self.mine;
                let r = bw::run_both(
                    self.cfg,
                    self.side,
                    self.peer,
                    &mut recv,
                    size,
                    &mut tracker,
                    || chan.hand_shake(mine).map(|_| ()),
                )?;
                tracker.clear();
                if duration {
                    // perftest's send_bw.c exchanges the reports only in iterations mode:
                    // with -D each side prints its own row.
                    rows.row(&bw_row(&r, None), bw_results(&r, None))?;
                } else {
                    chan.peer_runs();
                    let theirs = chan.bw_reports(&report_of(&r))?;
                    let sum = summed(&r, &theirs);
                    rows.row(&bw_row(&sum, None), bw_results(&sum, None))?;
                }
                tracker.next_size(per_size);
                if every_size {
                    chan.hand_shake(self.mine)?;
                }
                continue;
            }
            let r = if self.client {
                chan.hand_shake(self.mine)?;
                bw::run_sender(self.cfg, self.side, self.peer, size, &mut tracker)?
            } else {
                let mine = self.mine;
                bw::run_receiver(self.cfg, self.side, &mut recv, size, || {
                    chan.hand_shake(mine).map(|_| ())
                })?
            };
            tracker.clear();
            rows.row(&bw_row(&r, None), bw_results(&r, None))?;
            tracker.next_size(per_size);
            if every_size {
                chan.hand_shake(self.mine)?;
            }
        }
        tracker.clear();
        rows.text(&result_rule())?;
        chan.close(self.mine)
    }

    /// Read and atomic latency: the client runs every size alone and prints its rows; the
    /// server posts nothing, closes the connection at once (the close completes when the
    /// client closes after its run) and prints the closing rule.
    fn solo_lat(&self, chan: &mut Channel, rows: &mut Rows<'_>) -> Result<(), CliError> {
        if !self.client {
            chan.peer_runs();
            chan.close(self.mine)?;
            return rows.text(&result_rule());
        }
        let per_size = self.iters();
        let mut tracker = self.tracker(per_size);
        for &size in &self.sizes {
            let outcome = lat::run_solo(self.cfg, self.side, self.peer, size, &mut tracker)?;
            tracker.clear();
            self.lat_row(rows, size, outcome)?;
            tracker.next_size(per_size);
        }
        tracker.clear();
        rows.text(&result_rule())?;
        chan.close(self.mine)
    }

    /// The row of one latency size, iterations or duration mode.
    fn lat_row(&self, rows: &mut Rows<'_>, size: u64, outcome: LatOutcome) -> Result<(), CliError> {
        match outcome {
            LatOutcome::Samples(samples) => {
                let stats = latency_stats(&samples);
                let iters = samples.len() as u64;
                rows.row(
                    &lat_row(size, iters, &stats, None),
                    lat_results(size, iters, &stats, None),
                )
            }
            LatOutcome::Duration(d) => rows.row(
                &lat_duration_row(size, &d, None),
                lat_duration_results(size, &d, None),
            ),
        }
    }

    /// Latency: both sides ping-pong every size and print their rows; send tests post their
    /// receives and hand-shake before every size and close the connection at the end.
    fn lat(&self, chan: &mut Channel, rows: &mut Rows<'_>) -> Result<(), CliError> {
        let send = self.cfg.test.verb == Verb::Send;
        let per_size = self.iters();
        let mut tracker = self.tracker(per_size);
        let mut recv = RecvState::new(self.side.qps.len());
        for &size in &self.sizes {
            let mine = self.mine;
            let outcome = lat::run_remote(
                self.cfg,
                self.side,
                self.peer,
                size,
                self.client,
                &mut recv,
                &mut tracker,
                || {
                    if send {
                        chan.hand_shake(mine)?;
                    }
                    Ok(())
                },
            )?;
            tracker.clear();
            self.lat_row(rows, size, outcome)?;
            tracker.next_size(per_size);
        }
        tracker.clear();
        rows.text(&result_rule())?;
        if send {
            chan.close(self.mine)?;
        }
        Ok(())
    }
}

/// A -b row: this side's size and iterations, both sides' bandwidths and message rates
/// added, as perftest's `print_full_bw_report` adds the peer's report.
fn summed(r: &BwResult, theirs: &BwReport) -> BwResult {
    BwResult {
        bw_peak: r.bw_peak + theirs.bw_peak,
        bw_average: r.bw_average + theirs.bw_avg,
        msg_rate_mpps: r.msg_rate_mpps + theirs.msg_rate,
        ..*r
    }
}

/// The report message of a row.
fn report_of(r: &BwResult) -> BwReport {
    BwReport {
        size: r.msg_size,
        iters: r.iterations,
        bw_peak: r.bw_peak,
        bw_avg: r.bw_average,
        msg_rate: r.msg_rate_mpps,
    }
}

fn emit(out: &mut dyn Write, text: &str) -> Result<(), CliError> {
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .io_ctx("writing to stdout")
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;
    use crate::perf::args::PerfArgs;
    use portverbs::oob::perftest;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: PerfArgs,
    }

    fn cfg(line: &[&str]) -> PerfConfig {
        use clap::Parser as _;
        let argv = std::iter::once("perf").chain(line.iter().copied());
        PerfConfig::from_args(&Cli::try_parse_from(argv).expect("flags parse").args)
            .expect("valid flags")
    }

    /// Runs `perf <line> -d soft1` as a server in one thread and `perf <line> -d soft0` as its
    /// client in another (both devices are on the in-process fabric, so their QPs can talk),
    /// over a real TCP connection on 127.0.0.1; returns the client's and the server's output.
    fn pair(line: &[&str]) -> (String, String) {
        pair_on(line, "soft1", "soft0")
    }

    /// [`pair`] with the server on `server` and the client on `client`.
    fn pair_on(line: &[&str], server: &'static str, client: &'static str) -> (String, String) {
        let (c, s, _) = pair_recorded(line, server, client);
        (c, s)
    }

    /// What passed through the TCP connection, each direction.
    struct Transcript {
        to_server: Vec<u8>,
        to_client: Vec<u8>,
    }

    /// Copies `from` to `to` until `from` ends, keeping a copy; then ends `to`'s writing half.
    fn relay(mut from: std::net::TcpStream, mut to: std::net::TcpStream) -> Vec<u8> {
        use std::io::Read as _;
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            seen.extend_from_slice(&buf[..n]);
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
        seen
    }

    /// [`pair_on`], the connection going through a relay that records it.
    fn pair_recorded(
        line: &[&str],
        server: &'static str,
        client: &'static str,
    ) -> (String, String, Transcript) {
        let _alone = crate::perf::DEVICE_TRAFFIC
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let port = listener.local_addr().expect("bound").port();
        let relay_listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
        let relay_port = relay_listener.local_addr().expect("bound").port();
        let client_done = AtomicBool::new(false);
        let with = |dev: &'static str| {
            let mut v = line.to_vec();
            v.extend(["-d", dev]);
            cfg(&v)
        };
        let (server_cfg, client_cfg) = (with(server), with(client));
        std::thread::scope(|s| {
            let server = s.spawn(|| {
                let mut out = Vec::new();
                let r = run(
                    server_cfg,
                    PeerLink::Accept(&listener, &client_done),
                    &mut out,
                );
                (r, out)
            });
            let relay = s.spawn(move || {
                let (c, _) = relay_listener.accept().expect("the client connects");
                let to_server = std::net::TcpStream::connect(("127.0.0.1", port)).expect("server");
                let (c2, s2) = (
                    c.try_clone().expect("clone"),
                    to_server.try_clone().expect("clone"),
                );
                let up = std::thread::spawn(move || relay(c, to_server));
                let to_client = relay(s2, c2);
                Transcript {
                    to_server: up.join().expect("relay"),
                    to_client,
                }
            });
            let mut out = Vec::new();
            let link = PeerLink::Connect {
                host: "127.0.0.1",
                port: relay_port,
            };
            let r = run(client_cfg, link, &mut out);
            client_done.store(true, Ordering::Release);
            let (sr, sout) = server.join().expect("the server thread ends");
            let (cout, sout) = (
                String::from_utf8(out).expect("UTF-8"),
                String::from_utf8(sout).expect("UTF-8"),
            );
            assert!(r.is_ok(), "client: {r:?}\n{cout}\nserver:\n{sout}");
            assert!(sr.is_ok(), "server: {sr:?}\n{sout}\nclient:\n{cout}");
            (cout, sout, relay.join().expect("the relay ends"))
        })
    }

    /// One message of perftest's side channel.
    #[derive(Debug, Clone, Copy)]
    enum Msg {
        /// Version, cycle buffer, cache line, MTU.
        Params,
        /// A destination with GID (the soft devices are RoCE).
        Dest,
        /// The five BW report messages.
        Report,
        /// `done`.
        Done,
    }

    /// Splits one direction of a transcript by `script` (perftest 4.5-0.20's order, read off
    /// its programs' main functions) and checks every message's form; nothing may be left.
    fn follows(stream: &[u8], script: &[Msg]) {
        let mut at = 0;
        let mut take = |n: usize| {
            let part = stream.get(at..at + n).unwrap_or_else(|| {
                panic!("the transcript ends at {at}, {n} more bytes expected for {script:?}")
            });
            at += n;
            part
        };
        for m in script {
            match m {
                Msg::Params => {
                    assert_eq!(take(16), &perftest::version_msg(perftest::PROTOCOL_VERSION));
                    assert_eq!(take(4), &perftest::int_msg(perftest::PAGE_SIZE));
                    assert_eq!(take(4), &perftest::int_msg(perftest::CACHE_LINE_SIZE));
                    assert!(perftest::parse_mtu([take(1)[0], take(1)[0]]).is_ok());
                }
                Msg::Dest => {
                    let k = take(perftest::TEXT_LEN_GID);
                    assert!(Dest::decode_text(k, true).is_ok(), "{k:?}");
                }
                Msg::Report => {
                    take(40);
                }
                Msg::Done => assert_eq!(take(5), perftest::DONE),
            }
        }
        assert_eq!(at, stream.len(), "bytes left after {script:?}");
    }

    /// Both directions of each test carry perftest's messages in perftest's order.
    #[test]
    fn the_exchange_follows_perftests_order() {
        use Msg::{Dest as H, Done as D, Params as P, Report as R};
        let cases: [(&[&str], &[Msg]); 8] = [
            // write_bw, read_bw: dests, dests (printed), the post-RTR hand shake; at the end a
            // hand shake, the report, the closing hand shake and done.
            (
                &["write_bw", "-q", "2", "-n", "20"],
                &[P, H, H, H, H, H, H, R, H, D],
            ),
            (&["read_bw", "-n", "20"], &[P, H, H, H, H, R, H, D]),
            // send_bw: dests, a hand shake, dests (printed); a hand shake per size (and one
            // after every size with -a); the closing hand shake and done.
            (&["send_bw", "-n", "20"], &[P, H, H, H, H, H, D]),
            // write_lat: a hand shake, dests, dests (printed), the post-RTR hand shake; no
            // closing.
            (&["write_lat", "-n", "20"], &[P, H, H, H, H]),
            // send_lat: as send_bw without the -a hand shakes.
            (&["send_lat", "-n", "20"], &[P, H, H, H, H, H, D]),
            // atomic_bw: as read_bw.
            (&["atomic_bw", "-n", "20"], &[P, H, H, H, H, R, H, D]),
            // read_lat, atomic_lat: as write_lat, then the closing hand shake and done (the
            // server's at once, the client's after its run).
            (&["read_lat", "-n", "20"], &[P, H, H, H, H, H, D]),
            (&["atomic_lat", "-n", "20"], &[P, H, H, H, H, H, D]),
        ];
        for (line, script) in cases {
            let (_, _, t) = pair_recorded(line, "soft1", "soft0");
            follows(&t.to_server, script);
            follows(&t.to_client, script);
        }
        let (_, _, t) = pair_recorded(&["send_bw", "-a", "-n", "5"], "soft1", "soft0");
        let mut script = vec![P, H, H, H];
        for _ in 0..23 {
            script.extend([H, H]);
        }
        script.extend([H, D]);
        follows(&t.to_server, &script);
        follows(&t.to_client, &script);
    }

    /// The result rows of an output (the lines between the header and the closing rule that
    /// start with a size).
    fn rows(out: &str) -> Vec<Vec<f64>> {
        out.lines()
            .filter(|l| {
                l.starts_with(' ') && l.trim_start().starts_with(|c: char| c.is_ascii_digit())
            })
            .map(|l| {
                l.split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn write_bw_server_prints_the_clients_row() {
        let (client, server) = pair(&["write_bw", "-s", "4096", "-n", "200"]);
        assert!(
            server.contains("* Waiting for client to connect... *"),
            "{server}"
        );
        for out in [&client, &server] {
            assert!(out.contains("RDMA_Write BW Test"), "{out}");
            assert!(out.contains(" local address: LID"), "{out}");
            assert!(out.contains(" remote address: LID"), "{out}");
            assert!(out.contains("BW average[MiB/sec]"), "{out}");
        }
        let (c, s) = (rows(&client), rows(&server));
        assert_eq!(c.len(), 1, "{client}");
        assert_eq!(c[0][..2], [4096.0, 200.0], "{client}");
        // The server prints the row the client sent it.
        assert_eq!(c, s, "{client}\n{server}");
    }

    #[test]
    fn read_bw_and_send_bw_run_across_the_connection() {
        let (client, server) = pair(&["read_bw", "-s", "1024", "-n", "100"]);
        assert_eq!(rows(&client), rows(&server), "{client}\n{server}");
        assert!(client.contains("RDMA_Read BW Test"), "{client}");
        // Send BW: each side prints its own row; with -a a row per size on both.
        let (client, server) = pair(&["send_bw", "-a", "-n", "5"]);
        let (c, s) = (rows(&client), rows(&server));
        assert_eq!(c.len(), 23, "{client}");
        assert_eq!(s.len(), 23, "{server}");
        for (c, s) in c.iter().zip(&s) {
            // Same size, and every message arrived.
            assert_eq!(c[..2], s[..2], "{client}\n{server}");
            assert_eq!(c[1], 5.0);
        }
    }

    #[test]
    fn latency_tests_report_on_both_sides() {
        for test in ["write_lat", "send_lat"] {
            let (client, server) = pair(&[test, "-s", "64", "-n", "100"]);
            for out in [&client, &server] {
                let r = rows(out);
                assert_eq!(r.len(), 1, "{out}");
                assert_eq!(r[0][..2], [64.0, 100.0], "{out}");
                assert!(r[0][2] > 0.0, "{out}");
            }
        }
    }

    /// Read and atomic tests: the client runs, the server posts nothing; BW servers print
    /// the client's row, latency servers only the closing rule.
    #[test]
    fn read_and_atomic_tests_run_across_the_connection() {
        for line in [
            &["atomic_bw", "-n", "50"][..],
            &["atomic_bw", "-n", "50", "-A", "CMP_AND_SWAP", "-q", "2"],
        ] {
            let (client, server) = pair(line);
            let c = rows(&client);
            assert_eq!(c.len(), 1, "{client}");
            let qps = if line.contains(&"-q") { 2.0 } else { 1.0 };
            assert_eq!(c[0][..2], [8.0, 50.0 * qps], "{client}");
            assert_eq!(c, rows(&server), "{client}\n{server}");
            assert!(client.contains("Atomic"), "{client}");
        }
        for line in [
            &["read_lat", "-s", "64", "-n", "40"][..],
            &["atomic_lat", "-n", "40"],
            &["atomic_lat", "-n", "40", "-A", "CMP_AND_SWAP"],
            &["read_lat", "-a", "-n", "5"],
        ] {
            let (client, server) = pair(line);
            let c = rows(&client);
            if line.contains(&"-a") {
                assert_eq!(c.len(), 23, "{client}");
            } else {
                let size = if line[0] == "read_lat" { 64.0 } else { 8.0 };
                assert_eq!(c.len(), 1, "{client}");
                assert_eq!(c[0][..2], [size, 40.0], "{client}");
            }
            assert!(rows(&server).is_empty(), "{server}");
            assert!(server.contains(" remote address: LID"), "{server}");
        }
    }

    /// UC (write and send) and UD (send) across the connection.
    #[test]
    fn uc_and_ud_run_across_the_connection() {
        for line in [
            &["write_bw", "-c", "UC", "-s", "4096", "-n", "60"][..],
            &["send_bw", "-c", "UC", "-s", "4096", "-n", "60"],
            &["send_bw", "-c", "UD", "-s", "512", "-n", "60"],
        ] {
            let (client, server) = pair(line);
            let size: f64 = line[4].parse().unwrap();
            assert_eq!(rows(&client)[0][..2], [size, 60.0], "{client}");
            assert_eq!(rows(&server)[0][..2], [size, 60.0], "{server}");
            assert!(
                client.contains(&format!("Connection type : {}", line[2])),
                "{client}"
            );
        }
        for line in [
            &["write_lat", "-c", "UC", "-s", "64", "-n", "40"][..],
            &["send_lat", "-c", "UC", "-s", "64", "-n", "40"],
            &["send_lat", "-c", "UD", "-s", "64", "-n", "40"],
        ] {
            let (client, server) = pair(line);
            for out in [&client, &server] {
                assert_eq!(rows(out)[0][..2], [64.0, 40.0], "{out}");
            }
        }
        // UD's default BW size is cut to the MTU, as perftest does.
        let (client, _) = pair(&["send_bw", "-c", "UD", "-n", "20"]);
        assert!(rows(&client)[0][0] <= 4096.0, "{client}");
    }

    /// Duration mode of the one-sided tests: the client runs for -D seconds.
    #[test]
    fn duration_mode_runs_one_sided_tests() {
        let (client, server) = pair(&["write_bw", "-s", "1024", "-D", "1"]);
        assert!(
            client.contains("WARNING: BW peak won't be measured"),
            "{client}"
        );
        let c = rows(&client);
        assert_eq!(c.len(), 1, "{client}");
        assert_eq!(c[0][0], 1024.0, "{client}");
        assert!(c[0][1] > 0.0, "{client}");
        assert_eq!(c, rows(&server), "{server}");
        // send_bw: the server's clock starts at the first arrival, as perftest's.
        let (client, server) = pair(&["send_bw", "-s", "1024", "-D", "1"]);
        for out in [&client, &server] {
            assert_eq!(rows(out).len(), 1, "{out}");
            assert!(rows(out)[0][1] > 0.0, "{out}");
        }
        for test in ["read_lat", "write_lat", "send_lat"] {
            let (client, server) = pair(&[test, "-s", "64", "-D", "1"]);
            assert!(client.contains("t_avg[usec]"), "{client}");
            assert_eq!(rows(&client).len(), 1, "{client}");
            assert!(rows(&client)[0][1] > 0.0, "{client}");
            if test != "read_lat" {
                assert_eq!(rows(&server).len(), 1, "{server}");
            }
        }
    }

    /// -b: both sides run and print the sum of both directions, after perftest's order of
    /// exchanges (a hand shake before each size, and after it with -a; the reports).
    #[test]
    fn bidirectional_bw_runs_both_ways() {
        use Msg::{Dest as H, Done as D, Params as P, Report as R};
        let (_, _, t) = pair_recorded(&["write_bw", "-b", "-n", "30"], "soft1", "soft0");
        for stream in [&t.to_server, &t.to_client] {
            follows(stream, &[P, H, H, H, H, R, H, D]);
        }
        for line in [
            &["write_bw", "-b", "-s", "4096", "-n", "50"][..],
            &["read_bw", "-b", "-s", "1024", "-n", "50"],
            &["atomic_bw", "-b", "-n", "50"],
            &["send_bw", "-b", "-s", "2048", "-n", "50"],
        ] {
            let (client, server) = pair(line);
            for out in [&client, &server] {
                assert!(out.contains("Bidirectional BW Test"), "{out}");
                assert_eq!(rows(out).len(), 1, "{out}");
                assert_eq!(rows(out)[0][1], 50.0, "{out}");
            }
        }
        let (client, server) = pair(&["read_bw", "-b", "-a", "-n", "5"]);
        assert_eq!(rows(&client).len(), 23, "{client}");
        assert_eq!(rows(&server).len(), 23, "{server}");
    }

    /// In one process (-b needs both sides' loops): a server thread over loopback TCP.
    #[test]
    fn bidirectional_runs_in_one_process_over_loopback() {
        let _alone = crate::perf::DEVICE_TRAFFIC
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        let r = run_tcp_pair(
            cfg(&["atomic_bw", "-b", "-n", "40", "-d", "soft0"]),
            &mut out,
            &mut std::io::sink(),
        );
        let out = String::from_utf8(out).expect("UTF-8");
        assert!(r.is_ok(), "{r:?}\n{out}");
        assert!(out.contains("Bidirectional BW Test"), "{out}");
        assert_eq!(rows(&out)[0][..2], [8.0, 40.0], "{out}");
    }

    /// The emulated ConnectX-3s (the mlx4 driver over its model) run it too.
    #[test]
    fn mlx4_devices_run_across_the_connection() {
        let (client, server) = pair_on(&["write_bw", "-s", "512", "-n", "50"], "mlx4_1", "mlx4_0");
        assert_eq!(rows(&client), rows(&server), "{client}\n{server}");
        assert!(client.contains("Device         : mlx4_0"), "{client}");
    }

    /// `send_bw -b -D`: both sides send and receive for the duration and each prints its own
    /// row; no reports are exchanged, as perftest's send_bw.c exchanges them only in
    /// iterations mode.
    #[test]
    fn bidirectional_send_runs_for_a_duration() {
        use Msg::{Dest as H, Done as D, Params as P};
        let line = ["send_bw", "-b", "-s", "1024", "-D", "1"];
        let (client, server, t) = pair_recorded(&line, "soft1", "soft0");
        for out in [&client, &server] {
            assert!(out.contains("Bidirectional BW Test"), "{out}");
            assert_eq!(rows(out).len(), 1, "{out}");
            assert_eq!(rows(out)[0][0], 1024.0, "{out}");
            assert!(rows(out)[0][1] > 0.0, "{out}");
        }
        for stream in [&t.to_server, &t.to_client] {
            follows(stream, &[P, H, H, H, H, H, D]);
        }
    }

    /// `perf <line> -R` with the client on soft0 and the server on soft1, through the CM on
    /// `port` (one per test: the tests run at the same time); the client's and the server's
    /// output.
    fn cm_pair(line: &[&str], port: u16) -> (String, String) {
        let _alone = crate::perf::DEVICE_TRAFFIC
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut v = line.to_vec();
        v.extend(["-R", "-d", "soft0"]);
        let (mut out, mut sout) = (Vec::new(), Vec::new());
        let r = run_cm_pair(cfg(&v), port, &mut out, &mut sout);
        let (out, sout) = (
            String::from_utf8(out).expect("UTF-8"),
            String::from_utf8(sout).expect("UTF-8"),
        );
        assert!(r.is_ok(), "{r:?}\nclient:\n{out}\nserver:\n{sout}");
        (out, sout)
    }

    #[test]
    fn rdma_cm_write_bw_connects_every_qp_through_the_cm() {
        let (client, server) = cm_pair(&["write_bw", "-s", "4096", "-n", "100", "-q", "2"], 18601);
        for out in [&client, &server] {
            assert!(out.contains(" rdma_cm QPs\t : ON\n"), "{out}");
            assert!(out.contains(" Data ex. method : rdma_cm\n"), "{out}");
            assert_eq!(out.matches(" local address: LID").count(), 2, "{out}");
            assert_eq!(out.matches(" remote address: LID").count(), 2, "{out}");
        }
        assert!(
            server.contains(" Waiting for client rdma_cm QP to connect\n"),
            "{server}"
        );
        let (c, s) = (rows(&client), rows(&server));
        assert_eq!(c.len(), 1, "{client}");
        assert_eq!(c[0][..2], [4096.0, 200.0], "two QPs of 100: {client}");
        assert!(c[0][3] > 0.0, "{client}");
        assert_eq!(
            c, s,
            "the server prints the client's row: {client}\n{server}"
        );
    }

    #[test]
    fn rdma_cm_runs_read_send_and_latency_tests() {
        let (client, server) = cm_pair(&["read_bw", "-s", "1024", "-n", "50"], 18602);
        assert_eq!(rows(&client), rows(&server), "{client}\n{server}");
        assert_eq!(rows(&client)[0][..2], [1024.0, 50.0], "{client}");
        let (client, server) = cm_pair(&["send_bw", "-s", "512", "-n", "40"], 18603);
        for out in [&client, &server] {
            assert_eq!(rows(out)[0][..2], [512.0, 40.0], "{out}");
        }
        for (test, port) in [("write_lat", 18604), ("send_lat", 18605)] {
            let (client, server) = cm_pair(&[test, "-s", "64", "-n", "30"], port);
            for out in [&client, &server] {
                let r = rows(out);
                assert_eq!(r.len(), 1, "{out}");
                assert_eq!(r[0][..2], [64.0, 30.0], "{out}");
                assert!(r[0][2] > 0.0, "{out}");
            }
        }
    }

    #[test]
    fn rdma_cm_runs_atomic_and_read_latency_tests() {
        let (client, server) = cm_pair(&["atomic_bw", "-n", "30"], 18607);
        assert_eq!(rows(&client)[0][..2], [8.0, 30.0], "{client}");
        assert_eq!(rows(&client), rows(&server), "{server}");
        for (test, port) in [("atomic_lat", 18608), ("read_lat", 18609)] {
            let (client, server) = cm_pair(&[test, "-n", "30"], port);
            assert_eq!(rows(&client)[0][1], 30.0, "{client}");
            assert!(rows(&server).is_empty(), "{server}");
        }
    }

    /// UD through the CM on the soft pair: SIDR per QP, and for latency and -b the client's
    /// QPN message that the server addresses its sends by.
    #[test]
    fn rdma_cm_resolves_ud_qps_by_sidr() {
        let (client, server) = cm_pair(&["send_lat", "-c", "UD", "-s", "32", "-n", "30"], 18620);
        for out in [&client, &server] {
            assert_eq!(rows(out)[0][..2], [32.0, 30.0], "{out}");
        }
        let line = [
            "send_bw", "-c", "UD", "-s", "256", "-n", "30", "-q", "2", "-b",
        ];
        let (client, _) = cm_pair(&line, 18621);
        assert_eq!(rows(&client)[0][..2], [256.0, 60.0], "{client}");
    }

    #[test]
    fn rdma_cm_client_without_a_server_is_refused() {
        let _alone = crate::perf::DEVICE_TRAFFIC
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        // soft1's CM is up and driven (so its REJ answers the request) but listens on
        // nothing.
        let ctx = verbs::open(verbs::pick_device(Some("soft1")).expect("soft1")).expect("open");
        let gid = verbs::port_info(&ctx, 1, None).expect("port").gid;
        let their_cm = cm::open(&ctx, gid).expect("the CM on soft1");
        let host = gid.to_ip().to_string();
        let done = AtomicBool::new(false);
        let err = std::thread::scope(|s| {
            s.spawn(|| {
                while !done.load(Ordering::Acquire) {
                    their_cm.progress().expect("soft1's CM runs");
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
            });
            let link = PeerLink::CmConnect {
                host: &host,
                port: 18606,
            };
            let r = run(
                cfg(&["write_bw", "-R", "-d", "soft0"]),
                link,
                &mut Vec::new(),
            );
            done.store(true, Ordering::Release);
            r.expect_err("nobody listens")
        });
        assert!(err.to_string().contains("rejected the connection"), "{err}");
    }
}

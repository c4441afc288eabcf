//! `portverbs perf`: perftest's bandwidth and latency tests, both ends in this process, or one
//! end here and the other in another process ([`remote`]: client of a HOST, or server).
//!
//! Flow: check the flags ([`config`]) and open the `--out_json` file ([`json_file`]), open both
//! devices and connect the QPs ([`setup`]), print the banner and the address lines, then run
//! every size ([`bw`] or [`lat`]) and print its row as soon as it is measured (rewriting the
//! JSON report with every result so far), then the closing rule.

mod args;
mod bw;
mod channel;
mod cm;
mod config;
mod json_file;
mod lat;
mod mismatch;
mod ops;
mod output;
mod recorder;
mod remote;
mod setup;
mod tracker;

use std::io::Write;
use std::net::TcpListener;
use std::sync::atomic::AtomicBool;

pub(crate) use args::PerfArgs;

use bw::RecvState;
use config::{PEAK_WARNING, PerfConfig, RunMode};
use json_file::JsonFile;
use recorder::LatOutcome;
use remote::PeerLink;
use setup::Setup;
use tracker::Tracker;

use crate::error::{CliError, IoContext as _};
use crate::report::{
    AddressSide, TestKind, bw_header, bw_results, bw_row, format_address, format_banner,
    json_document, lat_duration_header, lat_duration_results, lat_duration_row, lat_header,
    lat_results, lat_row, latency_stats, result_rule,
};
use crate::verbs;

/// Serializes the unit tests that drive traffic through the in-process devices: some read a
/// device's engine counters and must see only their own traffic.
#[cfg(test)]
pub(crate) static DEVICE_TRAFFIC: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `portverbs perf`, printing to stdout as results arrive.
pub(crate) fn run(args: &PerfArgs) -> Result<(), CliError> {
    let cfg = PerfConfig::from_args(args)?;
    if cross_process(args) {
        return run_cross_process(args, cfg);
    }
    if cfg.bidirectional || cfg.infinite {
        // Both sides run as two processes would, over a TCP connection on loopback (or the
        // CM with -R); the client's lines are printed.
        let mut out = std::io::stdout().lock();
        let mut sink = std::io::sink();
        if cfg.rdma_cm {
            return remote::run_cm_pair(cfg, args.port, &mut out, &mut sink);
        }
        return remote::run_tcp_pair(cfg, &mut out, &mut sink);
    }
    if cfg.rdma_cm {
        // Both ends in this process, connected by the CM as two processes would be.
        let mut out = std::io::stdout().lock();
        return remote::run_cm_pair(cfg, args.port, &mut out, &mut std::io::sink());
    }
    // Before anything runs: a report file that cannot be written fails the command now.
    let mut json_file = cfg.json.as_deref().map(JsonFile::open).transpose()?;
    if cfg.peak_warning {
        emit(&format!("{PEAK_WARNING}\n"))?;
    }
    let setup = Setup::new(cfg)?;
    let cfg = &setup.cfg;
    let banner = output::banner(&setup);
    let mut text = format_banner(&banner);
    let nqp = setup.client.qps.len();
    for i in 0..nqp {
        text += &format_address(AddressSide::Local, &output::dest(&setup, &setup.client, i));
    }
    for i in 0..nqp {
        text += &format_address(AddressSide::Remote, &output::dest(&setup, &setup.server, i));
    }
    let duration = matches!(cfg.mode, RunMode::Duration { .. });
    text += &match (cfg.test.kind, duration) {
        (TestKind::Bw, _) => bw_header(cfg.units, false),
        (TestKind::Lat, false) => lat_header(false),
        (TestKind::Lat, true) => lat_duration_header(false),
    };
    emit(&text)?;

    let sizes = setup.res.sizes.clone();
    let (per_size, mut tracker) = match cfg.mode {
        RunMode::Iters(n) => {
            let per_size = match cfg.test.kind {
                TestKind::Bw => n * u64::from(cfg.qps),
                TestKind::Lat => n,
            };
            let total = per_size * sizes.len() as u64;
            (per_size, Tracker::new(cfg.test.name(), total))
        }
        // Duration mode runs one size; the progress line counts its seconds.
        RunMode::Duration { total, .. } => {
            let ms = total.as_millis() as u64;
            (ms, Tracker::timed(cfg.test.name(), ms))
        }
    };
    let mut bw_recv = RecvState::new(nqp);
    let mut lat_recv = [RecvState::new(nqp), RecvState::new(nqp)];
    let mut results = Vec::with_capacity(sizes.len());
    for size in sizes {
        let mut note = None;
        let row = match cfg.test.kind {
            TestKind::Bw => {
                let run = bw::run(&setup, size, &mut bw_recv, &mut tracker)?;
                note = run.lost.map(|lost| loss_note(cfg, size, lost));
                results.push(bw_results(&run.result, None));
                bw_row(&run.result, None)
            }
            TestKind::Lat => match lat::run(&setup, size, &mut lat_recv, &mut tracker)? {
                LatOutcome::Samples(samples) => {
                    let stats = latency_stats(&samples);
                    let iters = samples.len() as u64;
                    results.push(lat_results(size, iters, &stats, None));
                    lat_row(size, iters, &stats, None)
                }
                LatOutcome::Duration(d) => {
                    results.push(lat_duration_results(size, &d, None));
                    lat_duration_row(size, &d, None)
                }
            },
        };
        tracker.clear();
        if let Some(note) = note {
            eprintln!("{note}");
        }
        emit(&row)?;
        if let Some(file) = json_file.as_mut() {
            file.write(&json_document(&banner, &results))?;
        }
        tracker.next_size(per_size);
    }
    tracker.clear();
    emit(&result_rule())
}

/// Whether this run is one side of a cross-process test: a HOST is given (client), the
/// server role is forced, or the device can be reached from other processes (server).
fn cross_process(args: &PerfArgs) -> bool {
    args.host.is_some()
        || args.server
        || verbs::pick_device(args.device.as_deref()).is_ok_and(|d| !verbs::in_process(&d))
}

/// One side of a cross-process test: a client of HOST, or a server listening on every
/// address (as perftest's server does).
fn run_cross_process(args: &PerfArgs, cfg: PerfConfig) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    let never = AtomicBool::new(false);
    if cfg.rdma_cm {
        let link = match &args.host {
            Some(host) => PeerLink::CmConnect {
                host,
                port: args.port,
            },
            None => PeerLink::CmAccept {
                port: args.port,
                abort: &never,
                listening: None,
            },
        };
        return remote::run(cfg, link, &mut out);
    }
    match &args.host {
        Some(host) => remote::run(
            cfg,
            PeerLink::Connect {
                host,
                port: args.port,
            },
            &mut out,
        ),
        None => {
            let listener = TcpListener::bind(("0.0.0.0", args.port))
                .io_ctx(format_args!("couldn't listen to port {}", args.port))?;
            remote::run(cfg, PeerLink::Accept(&listener, &never), &mut out)
        }
    }
}

/// The stderr note of a send test whose receiver got fewer messages than were sent.
fn loss_note(cfg: &PerfConfig, size: u64, lost: bw::Loss) -> String {
    format!(
        " Note: {} of {} messages of {size} bytes arrived ({} drops a send that finds no \
         receive posted; -r sets how many are posted); the row counts the arrived ones",
        lost.arrived, lost.sent, cfg.conn
    )
}

/// Writes `text` to stdout and flushes (rows appear as they are measured).
fn emit(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .io_ctx("writing to stdout")
}

//! `portverbs perf`: perftest's bandwidth and latency tests, both ends in this process.
//!
//! Flow: check the flags ([`config`]), open both devices and connect the QPs ([`setup`]),
//! print the banner and the address lines, then run every size ([`bw`] or [`lat`]) and print
//! its row as soon as it is measured, then the closing rule and the JSON document.

mod args;
mod bw;
mod config;
mod lat;
mod ops;
mod output;
mod recorder;
mod setup;
mod tracker;

use std::io::Write;

pub(crate) use args::PerfArgs;

use bw::RecvState;
use config::{PerfConfig, RunMode};
use recorder::LatOutcome;
use setup::Setup;
use tracker::Tracker;

use crate::error::{CliError, IoContext as _};
use crate::report::{
    AddressSide, TestKind, bw_header, bw_json, bw_row, format_address, format_banner,
    lat_duration_header, lat_duration_json, lat_duration_row, lat_header, lat_json, lat_row,
    latency_stats, result_rule,
};

/// Runs `portverbs perf`, printing to stdout as results arrive.
pub(crate) fn run(args: &PerfArgs) -> Result<(), CliError> {
    let cfg = PerfConfig::from_args(args)?;
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

    let per_size = match cfg.mode {
        RunMode::Iters(n) if cfg.test.kind == TestKind::Bw => n * u64::from(cfg.qps),
        RunMode::Iters(n) => n,
        RunMode::Duration { total, .. } => total.as_millis() as u64,
    };
    let sizes = setup.res.sizes.clone();
    let mut tracker = Tracker::new(cfg.test.name(), per_size * sizes.len() as u64);
    let mut bw_recv = RecvState::new(nqp);
    let mut lat_recv = [RecvState::new(nqp), RecvState::new(nqp)];
    let mut json = None;
    for size in sizes {
        let mut note = None;
        let row = match cfg.test.kind {
            TestKind::Bw => {
                let run = bw::run(&setup, size, &mut bw_recv, &mut tracker)?;
                note = run.lost.map(|lost| loss_note(cfg, size, lost));
                json = Some(bw_json(&banner, &run.result, None));
                bw_row(&run.result, None)
            }
            TestKind::Lat => match lat::run(&setup, size, &mut lat_recv, &mut tracker)? {
                LatOutcome::Samples(samples) => {
                    let stats = latency_stats(&samples);
                    let iters = samples.len() as u64;
                    json = Some(lat_json(&banner, size, iters, &stats, None));
                    lat_row(size, iters, &stats, None)
                }
                LatOutcome::Duration(d) => {
                    json = Some(lat_duration_json(&banner, size, &d, None));
                    lat_duration_row(size, &d, None)
                }
            },
        };
        tracker.clear();
        if let Some(note) = note {
            eprintln!("{note}");
        }
        emit(&row)?;
        tracker.next_size(per_size);
    }
    tracker.clear();
    emit(&result_rule())?;
    match (&cfg.json, json) {
        (Some(Some(path)), Some(doc)) => std::fs::write(path, doc).io_ctx(format_args!(
            "writing the JSON report to {}",
            path.display()
        ))?,
        (Some(None), Some(doc)) => emit(&doc)?,
        _ => {}
    }
    Ok(())
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

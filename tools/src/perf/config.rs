//! Turning `perf` flags into a checked configuration, with perftest's defaults and the
//! combinations perftest refuses.
//!
//! Checks that need the device (inline size, outstanding reads, MTU, queue limits) are in
//! [`super::setup`]; everything here depends on the flags alone.

use std::path::PathBuf;
use std::time::Duration;

use portverbs::prelude::QpType;

use super::args::PerfArgs;
use crate::error::CliError;
use crate::report::{AtomicOp, BwUnits, TestKind, Verb};

/// Largest size of `-a` (perftest's 2^23).
pub(crate) const ALL_MAX_SIZE: u64 = 1 << 23;

/// Fewest iterations perftest accepts.
const MIN_ITERS: u64 = 5;

/// Which test: the verb and bandwidth or latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Test {
    /// Send, RDMA write, RDMA read or atomic.
    pub(crate) verb: Verb,
    /// Bandwidth or latency.
    pub(crate) kind: TestKind,
}

impl Test {
    /// Parses `write_bw` or `ib_write_bw` (and the other seven).
    pub(crate) fn parse(name: &str) -> Result<Self, CliError> {
        let short = name.strip_prefix("ib_").unwrap_or(name);
        let (verb, kind) = short.rsplit_once('_').ok_or_else(|| unknown_test(name))?;
        let verb = match verb {
            "write" => Verb::Write,
            "read" => Verb::Read,
            "send" => Verb::Send,
            "atomic" => Verb::Atomic,
            _ => return Err(unknown_test(name)),
        };
        let kind = match kind {
            "bw" => TestKind::Bw,
            "lat" => TestKind::Lat,
            _ => return Err(unknown_test(name)),
        };
        Ok(Self { verb, kind })
    }

    /// The short name (`write_bw`), used as the progress label.
    pub(crate) fn name(self) -> &'static str {
        match (self.verb, self.kind) {
            (Verb::Write, TestKind::Bw) => "write_bw",
            (Verb::Write, TestKind::Lat) => "write_lat",
            (Verb::Read, TestKind::Bw) => "read_bw",
            (Verb::Read, TestKind::Lat) => "read_lat",
            (Verb::Send, TestKind::Bw) => "send_bw",
            (Verb::Send, TestKind::Lat) => "send_lat",
            (Verb::Atomic, TestKind::Bw) => "atomic_bw",
            (Verb::Atomic, TestKind::Lat) => "atomic_lat",
        }
    }
}

fn unknown_test(name: &str) -> CliError {
    CliError::usage(format_args!(
        "unknown test '{name}': expected write_bw, write_lat, read_bw, read_lat, send_bw, \
         send_lat, atomic_bw or atomic_lat (the ib_ prefix is optional)"
    ))
}

/// Message sizes to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sizes {
    /// One size; `explicit` when given with `-s`.
    One {
        /// Bytes.
        size: u64,
        /// Given on the command line.
        explicit: bool,
    },
    /// `-a`: powers of two from 2 up to the limit.
    All,
}

/// Iterations or duration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunMode {
    /// A fixed number of iterations per size.
    Iters(u64),
    /// `-D`: run for `total`, measure all but `margin` at each end.
    Duration {
        /// Whole run.
        total: Duration,
        /// Left out at the start and at the end.
        margin: Duration,
    },
}

/// The checked `perf` configuration.
#[derive(Debug, Clone)]
pub(crate) struct PerfConfig {
    /// The test.
    pub(crate) test: Test,
    /// Transport.
    pub(crate) conn: QpType,
    /// Sizes.
    pub(crate) sizes: Sizes,
    /// Iterations or duration.
    pub(crate) mode: RunMode,
    /// QPs (BW tests).
    pub(crate) qps: u32,
    /// Requests outstanding per QP.
    pub(crate) tx_depth: u32,
    /// Receive queue depth (send tests).
    pub(crate) rx_depth: u32,
    /// Completion every this many requests.
    pub(crate) cq_mod: u32,
    /// Requests per post call.
    pub(crate) post_list: u32,
    /// Largest inline message.
    pub(crate) inline: u32,
    /// `-m` in bytes.
    pub(crate) mtu: Option<u32>,
    /// `-x`.
    pub(crate) gid_index: Option<u32>,
    /// `-S`.
    pub(crate) sl: u8,
    /// `-u`.
    pub(crate) timeout: u8,
    /// `-A`.
    pub(crate) atomic: AtomicOp,
    /// `-o`.
    pub(crate) outs: Option<u32>,
    /// Peak bandwidth wanted (not `-N`).
    pub(crate) peak: bool,
    /// Bandwidth unit.
    pub(crate) units: BwUnits,
    /// `--out_json`: `None` = no JSON, `Some(None)` = stdout, `Some(Some(f))` = file.
    pub(crate) json: Option<Option<PathBuf>>,
    /// `-d`.
    pub(crate) device: Option<String>,
    /// `-i`.
    pub(crate) ib_port: u8,
}

impl PerfConfig {
    /// Checks the flags and applies perftest's defaults.
    pub(crate) fn from_args(a: &PerfArgs) -> Result<Self, CliError> {
        let test = Test::parse(&a.test)?;
        let bw = test.kind == TestKind::Bw;
        let conn = parse_connection(&a.connection)?;
        check_transport(test.verb, conn)?;
        if a.histogram {
            return Err(CliError::usage(
                "-H/--report-histogram (latency histogram) is not implemented",
            ));
        }
        let atomic = match a.atomic_type.as_str() {
            "CMP_AND_SWAP" => AtomicOp::CmpAndSwap,
            "FETCH_AND_ADD" => AtomicOp::FetchAndAdd,
            other => {
                return Err(CliError::usage(format_args!(
                    "invalid atomic type '{other}': use CMP_AND_SWAP or FETCH_AND_ADD"
                )));
            }
        };
        let sizes = sizes(a, test)?;
        let mode = run_mode(a, test)?;
        if a.qps == 0 {
            return Err(CliError::usage("the number of QPs (-q) must be at least 1"));
        }
        if !bw && a.qps > 1 {
            return Err(CliError::usage(
                "multiple QPs (-q) are only available in BW tests",
            ));
        }
        if !bw && a.post_list > 1 {
            return Err(CliError::usage(
                "a post list (-l) is only available in BW tests",
            ));
        }
        if a.post_list == 0 {
            return Err(CliError::usage("the post list (-l) must be at least 1"));
        }
        let iters = match mode {
            RunMode::Iters(n) => Some(n),
            RunMode::Duration { .. } => None,
        };
        let clamp_to_iters = |v: u32| iters.map_or(v, |n| v.min(u32::try_from(n).unwrap_or(v)));
        let tx_depth = match a.tx_depth {
            Some(0) => return Err(CliError::usage("the TX depth (-t) must be at least 1")),
            Some(t) => t,
            None if bw => 128,
            None => 1,
        };
        let tx_depth = if bw {
            clamp_to_iters(tx_depth)
        } else {
            tx_depth
        };
        if bw && a.post_list > tx_depth {
            return Err(CliError::usage(format_args!(
                "the post list ({}) cannot exceed the TX depth ({tx_depth})",
                a.post_list
            )));
        }
        let cq_mod = match a.cq_mod {
            Some(0) => return Err(CliError::usage("the CQ moderation (-Q) must be at least 1")),
            Some(q) => q,
            None if a.post_list > 1 => a.post_list,
            None => 100,
        };
        let rx_depth = match a.rx_depth {
            Some(0) => return Err(CliError::usage("the RX depth (-r) must be at least 1")),
            Some(r) => r,
            None => 512,
        };
        let inline = match (a.inline_size, test.verb) {
            (Some(i), Verb::Read | Verb::Atomic) if i > 0 => {
                return Err(CliError::usage(
                    "inline data (-I) is not supported with RDMA read or atomics",
                ));
            }
            (Some(i), _) => i,
            (None, Verb::Write) if !bw => 220,
            (None, Verb::Send) if !bw && conn == QpType::Ud => 188,
            (None, Verb::Send) if !bw => 236,
            (None, _) => 0,
        };
        if let Some(m) = a.mtu {
            if !matches!(m, 256 | 512 | 1024 | 2048 | 4096) {
                return Err(CliError::usage(format_args!(
                    "invalid MTU {m}: use 256, 512, 1024, 2048 or 4096"
                )));
            }
        }
        if a.qp_timeout > 31 {
            return Err(CliError::usage("the QP timeout (-u) must be 0..=31"));
        }
        if a.sl > 15 {
            return Err(CliError::usage("the service level (-S) must be 0..=15"));
        }
        if a.outs == Some(0) {
            return Err(CliError::usage("outstanding reads (-o) must be at least 1"));
        }
        let json = match (&a.out_json_file, a.out_json) {
            (Some(f), _) => Some(Some(f.clone())),
            (None, true) => Some(None),
            (None, false) => None,
        };
        Ok(Self {
            test,
            conn,
            sizes,
            mode,
            qps: a.qps,
            tx_depth,
            rx_depth: clamp_to_iters(rx_depth),
            cq_mod: cq_mod.min(tx_depth),
            post_list: a.post_list,
            inline,
            mtu: a.mtu,
            gid_index: a.gid_index,
            sl: a.sl,
            timeout: a.qp_timeout,
            atomic,
            outs: a.outs,
            peak: !a.no_peak,
            units: if a.report_gbits {
                BwUnits::Gbps
            } else {
                BwUnits::MiBps
            },
            json,
            device: a.device.clone(),
            ib_port: a.ib_port,
        })
    }
}

fn parse_connection(text: &str) -> Result<QpType, CliError> {
    match text.to_ascii_uppercase().as_str() {
        "RC" => Ok(QpType::Rc),
        "UC" => Ok(QpType::Uc),
        "UD" => Ok(QpType::Ud),
        "XRC" | "DC" | "SRD" | "RAW_PACKET" => Err(CliError::usage(format_args!(
            "connection type {text} is not supported: use RC, UC or UD"
        ))),
        _ => Err(CliError::usage(format_args!(
            "invalid connection type '{text}': use RC, UC or UD"
        ))),
    }
}

/// perftest's transport rules: read and atomics need RC; RDMA write needs RC or UC.
fn check_transport(verb: Verb, conn: QpType) -> Result<(), CliError> {
    let ok = match verb {
        Verb::Read | Verb::Atomic => conn == QpType::Rc,
        Verb::Write => conn != QpType::Ud,
        Verb::Send => true,
    };
    if ok {
        Ok(())
    } else {
        Err(CliError::usage(format_args!(
            "{} is not supported over {conn} (read and atomics need RC; RDMA write needs RC \
             or UC)",
            verb.name()
        )))
    }
}

fn sizes(a: &PerfArgs, test: Test) -> Result<Sizes, CliError> {
    if test.verb == Verb::Atomic {
        if a.all || a.size.is_some_and(|s| s != 8) {
            return Err(CliError::usage(
                "the message size of atomic tests is fixed at 8 bytes (-s and -a are not \
                 allowed)",
            ));
        }
        return Ok(Sizes::One {
            size: 8,
            explicit: false,
        });
    }
    match (a.all, a.size) {
        (true, Some(_)) => Err(CliError::usage("-a/--all and -s/--size cannot be combined")),
        (true, None) => Ok(Sizes::All),
        (false, Some(0)) => Err(CliError::usage("the message size (-s) must be at least 1")),
        (false, Some(s)) if s > 1 << 31 => Err(CliError::usage(format_args!(
            "message size {s} is too large (at most 2^31 bytes)"
        ))),
        (false, Some(s)) => Ok(Sizes::One {
            size: s,
            explicit: true,
        }),
        (false, None) => Ok(Sizes::One {
            size: if test.kind == TestKind::Bw { 65536 } else { 2 },
            explicit: false,
        }),
    }
}

fn run_mode(a: &PerfArgs, test: Test) -> Result<RunMode, CliError> {
    match (a.duration, a.iters) {
        (Some(_), Some(_)) => Err(CliError::usage(
            "-D/--duration and -n/--iters cannot be combined",
        )),
        (Some(_), None) if a.all => Err(CliError::usage(
            "duration mode (-D) cannot run all sizes (-a)",
        )),
        (Some(0), None) => Err(CliError::usage("the duration (-D) must be at least 1 s")),
        (Some(d), None) => {
            // perftest's 2 s margin, shortened for runs too short to keep it.
            let margin = a.margin.unwrap_or(if d > 4 { 2 } else { (d - 1) / 2 });
            if 2 * margin >= d {
                return Err(CliError::usage(format_args!(
                    "the duration ({d} s) must exceed twice the margin ({margin} s): increase \
                     -D or decrease -f"
                )));
            }
            Ok(RunMode::Duration {
                total: Duration::from_secs(d),
                margin: Duration::from_secs(margin),
            })
        }
        (None, Some(n)) if n < MIN_ITERS => Err(CliError::usage(format_args!(
            "at least {MIN_ITERS} iterations are needed (-n {n})"
        ))),
        (None, Some(n)) => Ok(RunMode::Iters(n)),
        (None, None) => Ok(RunMode::Iters(
            if test.verb == Verb::Write && test.kind == TestKind::Bw {
                5000
            } else {
                1000
            },
        )),
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

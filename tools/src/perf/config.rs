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

/// Largest `-s` perftest accepts (`UINT_MAX / 2`).
pub(crate) const MAX_MSG_SIZE: u64 = u32::MAX as u64 / 2;

/// Where `--out_json` writes when no `--out_json_file` is given (perftest's default, in the
/// working directory).
pub(crate) const DEFAULT_JSON_FILE: &str = "perftest_out.json";

/// perftest's warning for a BW run whose peak it does not measure (duration mode), on stdout
/// before the banner.
pub(crate) const PEAK_WARNING: &str = " WARNING: BW peak won't be measured in this run.";

/// Fewest iterations perftest accepts.
const MIN_ITERS: u64 = 5;

/// Most iterations perftest accepts (2^32).
const MAX_ITERS: u64 = 1 << 32;

/// perftest's ranges of the queue flags: `-t`, `-r`, `-Q`, `-q`, `-I`.
const MAX_TX_DEPTH: u32 = 15_000;
const MAX_RX_DEPTH: u32 = 16_384;
const MAX_CQ_MOD: u32 = 1024;
const MAX_QPS: u32 = 16_384;
const MAX_INLINE: u32 = 1024;

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
    /// Peak bandwidth wanted: a BW test in iterations mode without `-N`.
    pub(crate) peak: bool,
    /// A BW test in duration mode without `-N`: perftest warns that the peak is not measured.
    pub(crate) peak_warning: bool,
    /// Bandwidth unit.
    pub(crate) units: BwUnits,
    /// `--out_json` / `--out_json_file`: the file the JSON report goes to.
    pub(crate) json: Option<PathBuf>,
    /// `-d`.
    pub(crate) device: Option<String>,
    /// `-i`.
    pub(crate) ib_port: u8,
    /// `-R`: the CM connects the QPs and carries the exchange.
    pub(crate) rdma_cm: bool,
    /// `--timeout`: how long the peer may show no sign of life (`None`: for ever).
    pub(crate) peer_timeout: Option<Duration>,
    /// `-b`: both sides send at once.
    pub(crate) bidirectional: bool,
    /// `--run_infinitely`: `mode` is the report interval (a duration without margin),
    /// repeated until the process is stopped.
    pub(crate) infinite: bool,
}

impl PerfConfig {
    /// Checks the flags and applies perftest's defaults. The refusals are perftest's (its
    /// argument parser and `force_dependecies`), worded as perftest words them where it has a
    /// message, plus a few of our own for values the tool cannot run.
    pub(crate) fn from_args(a: &PerfArgs) -> Result<Self, CliError> {
        let test = Test::parse(&a.test)?;
        let bw = test.kind == TestKind::Bw;
        check_flags_apply(a, test)?;
        let conn = parse_connection(&a.connection)?;
        check_transport(test.verb, conn)?;
        if a.rdma_cm && conn == QpType::Uc {
            // perftest's words.
            return Err(CliError::usage("UC is not supported in librdmacm"));
        }
        let atomic = match a.atomic_type.as_deref() {
            None | Some("FETCH_AND_ADD") => AtomicOp::FetchAndAdd,
            Some("CMP_AND_SWAP") => AtomicOp::CmpAndSwap,
            Some(other) => {
                return Err(CliError::usage(format_args!(
                    "invalid atomic type '{other}' (-A): Invalid Atomic type! please choose from \
                     {{CMP_AND_SWAP,FETCH_AND_ADD}}"
                )));
            }
        };
        if a.ib_port == 0 {
            return Err(CliError::usage("IB Port can't be less than 1 (-i)"));
        }
        let sizes = sizes(a, test)?;
        let mode = if a.run_infinitely {
            infinite_mode(a, test)?
        } else {
            run_mode(a, test)?
        };
        in_range("num of Qps", "-q", a.qps, 1, MAX_QPS)?;
        if a.post_list == 0 {
            return Err(CliError::usage("the post list (-l) must be at least 1"));
        }
        let iters = match mode {
            RunMode::Iters(n) => Some(n),
            RunMode::Duration { .. } => None,
        };
        let clamp_to_iters = |v: u32| iters.map_or(v, |n| v.min(u32::try_from(n).unwrap_or(v)));
        let tx_depth = match a.tx_depth {
            Some(t) => in_range("Tx depth", "-t", t, 1, MAX_TX_DEPTH)?,
            None if bw => 128,
            None => 1,
        };
        let tx_depth = if bw {
            clamp_to_iters(tx_depth)
        } else {
            tx_depth
        };
        if let Some(q) = a.cq_mod {
            in_range("CQ moderation", "-Q", q, 1, MAX_CQ_MOD)?;
        }
        if a.post_list > 1 {
            if let Some(n) = iters.filter(|n| n % u64::from(a.post_list) != 0) {
                return Err(CliError::usage(format_args!(
                    "Number of iterations must be a multiple of post list size (-n {n}, -l {})",
                    a.post_list
                )));
            }
            if let Some(q) = a.cq_mod.filter(|q| a.post_list % q != 0) {
                return Err(CliError::usage(format_args!(
                    "Post list size must be a multiple of CQ moderation (-l {}, -Q {q})",
                    a.post_list
                )));
            }
        }
        if bw && a.post_list > tx_depth {
            return Err(CliError::usage(format_args!(
                "the post list ({}) cannot exceed the TX depth ({tx_depth})",
                a.post_list
            )));
        }
        let cq_mod = match a.cq_mod {
            Some(q) => q,
            None if a.post_list > 1 => a.post_list,
            None => 100,
        };
        let rx_depth = match a.rx_depth {
            Some(r) => in_range("Rx depth", "-r", r, 1, MAX_RX_DEPTH)?,
            None => 512,
        };
        let inline = match (a.inline_size, test.verb) {
            (Some(i), _) => in_range("Max inline", "-I", i, 0, MAX_INLINE)?,
            (None, Verb::Write) if !bw => 220,
            (None, Verb::Send) if !bw && conn == QpType::Ud => 188,
            (None, Verb::Send) if !bw => 236,
            (None, _) => 0,
        };
        if let Some(m) = a.mtu {
            if !matches!(m, 256 | 512 | 1024 | 2048 | 4096) {
                return Err(CliError::usage(format_args!(
                    "Invalid MTU - {m} (-m): please choose mtu from {{256,512,1024,2048,4096}}"
                )));
            }
        }
        if a.qp_timeout > 31 {
            return Err(CliError::usage("the QP timeout (-u) must be 0..=31"));
        }
        if a.sl > 15 {
            return Err(CliError::usage("Only 15 Service levels (-S)"));
        }
        if a.outs == Some(0) {
            return Err(CliError::usage("outstanding reads (-o) must be at least 1"));
        }
        let json = match (&a.out_json_file, a.out_json) {
            (Some(f), _) => Some(f.clone()),
            (None, true) => Some(PathBuf::from(DEFAULT_JSON_FILE)),
            (None, false) => None,
        };
        // perftest's duration mode never measures the peak (and says so when -N is not given).
        let duration = matches!(mode, RunMode::Duration { .. });
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
            peak: bw && !a.no_peak && !duration,
            peak_warning: bw && !a.no_peak && duration,
            units: if a.report_gbits {
                BwUnits::Gbps
            } else {
                BwUnits::MiBps
            },
            json,
            device: a.device.clone(),
            ib_port: a.ib_port,
            rdma_cm: a.rdma_cm,
            peer_timeout: crate::wait::timeout_arg(a.peer_timeout),
            bidirectional: a.bidirectional,
            infinite: a.run_infinitely,
        })
    }
}

/// The flags perftest accepts only for some tests: refused for the others, with perftest's
/// words.
fn check_flags_apply(a: &PerfArgs, test: Test) -> Result<(), CliError> {
    let bw = test.kind == TestKind::Bw;
    let reads = matches!(test.verb, Verb::Read | Verb::Atomic);
    let refuse = |flag: &str, why: &str| Err(CliError::usage(format_args!("{flag}: {why}")));
    if a.atomic_type.is_some() && test.verb != Verb::Atomic {
        return refuse(
            "-A/--atomic_type",
            "You are not running the atomic_lat/bw test! To change the atomic action type, \
             you must run one of the atomic tests",
        );
    }
    if a.outs.is_some() && !reads {
        return refuse(
            "-o/--outs",
            "Setting Outstanding reads only available on READ verb (and atomics): it has no \
             meaning for send and write tests",
        );
    }
    if a.inline_size.is_some() && reads {
        return refuse(
            "-I/--inline_size",
            "Inline feature not available on READ/Atomic verbs",
        );
    }
    if a.rx_depth.is_some_and(|r| r > 1) && reads {
        return refuse("-r/--rx-depth", "On RDMA verbs rx depth can be only 1");
    }
    if a.qps > 1 && !bw {
        return refuse("-q/--qp", "Multiple QPs only available on bw tests");
    }
    if a.post_list > 1 && !bw {
        return refuse("-l/--post_list", "Post list is supported in BW tests only");
    }
    if a.bidirectional && !bw {
        return refuse(
            "-b/--bidirectional",
            "Bidirectional is only available in BW test",
        );
    }
    if a.no_peak && !bw {
        return refuse("-N/--noPeak", "NoPeak only valid for BW tests");
    }
    if a.histogram {
        return if bw {
            refuse("-H/--report-histogram", "Available only on Latency tests")
        } else {
            refuse(
                "-H/--report-histogram",
                "the latency histogram is not implemented",
            )
        };
    }
    Ok(())
}

/// perftest's range check of a numeric flag (`<name> should be between <min> and <max>`).
fn in_range(name: &str, flag: &str, value: u32, min: u32, max: u32) -> Result<u32, CliError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(CliError::usage(format_args!(
            "{name} should be between {min} and {max} ({flag} {value})"
        )))
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
            "Invalid Connection type '{text}' (-c): please choose from {{RC,UC,UD}}"
        ))),
    }
}

/// perftest's transport rules: UD only for send; UC not for read and atomics.
fn check_transport(verb: Verb, conn: QpType) -> Result<(), CliError> {
    match (verb, conn) {
        (Verb::Read | Verb::Atomic, QpType::Uc) => Err(CliError::usage(
            "-c UC: UC connection not possible in READ/ATOMIC verbs",
        )),
        (Verb::Read | Verb::Atomic | Verb::Write, QpType::Ud) => Err(CliError::usage(
            "-c UD: UD connection only possible in SEND verb",
        )),
        _ => Ok(()),
    }
}

/// Parses a message size the way perftest's `-s` does (`strtol` with base 0 and a `K` or `M`
/// suffix): decimal, `0x` hex or `0`-prefixed octal digits, times 1024 with `K` and 1048576
/// with `M`, 1 ..= [`MAX_MSG_SIZE`]. Anything else is refused (perftest's `strtol` would
/// silently read `64k` as 64 and `abc` as 0).
pub(crate) fn parse_size(text: &str) -> Result<u64, CliError> {
    let garbage = || {
        CliError::usage(format_args!(
            "invalid message size '{text}' (-s): use a number of bytes (decimal, 0x hex or \
             0-prefixed octal), optionally followed by K (KiB) or M (MiB), e.g. 4096, 64K, 1M, \
             0x1000"
        ))
    };
    let (digits, factor) = if let Some(d) = text.strip_suffix('K') {
        (d, 1 << 10)
    } else if let Some(d) = text.strip_suffix('M') {
        (d, 1 << 20)
    } else {
        (text, 1)
    };
    let (digits, radix) = if let Some(hex) = digits
        .strip_prefix("0x")
        .or_else(|| digits.strip_prefix("0X"))
    {
        (hex, 16)
    } else if digits.len() > 1 && digits.starts_with('0') {
        (&digits[1..], 8)
    } else {
        (digits, 10)
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(garbage());
    }
    let out_of_range = || {
        CliError::usage(format_args!(
            "Message Size should be between 1 and {MAX_MSG_SIZE} (-s {text})"
        ))
    };
    let value = u64::from_str_radix(digits, radix).map_err(|_| out_of_range())?;
    match value.checked_mul(factor) {
        Some(size @ 1..=MAX_MSG_SIZE) => Ok(size),
        _ => Err(out_of_range()),
    }
}

fn sizes(a: &PerfArgs, test: Test) -> Result<Sizes, CliError> {
    let size = a.size.as_deref().map(parse_size).transpose()?;
    if test.verb == Verb::Atomic {
        if a.all || size.is_some_and(|s| s != 8) {
            return Err(CliError::usage(
                "Message size cannot be changed for Atomic tests (it is 8 bytes: -s and -a \
                 are not allowed)",
            ));
        }
        return Ok(Sizes::One {
            size: 8,
            explicit: false,
        });
    }
    match (a.all, size) {
        (true, Some(_)) => Err(CliError::usage(
            "-a/--all and -s/--size cannot be combined (perftest ignores -s with -a)",
        )),
        (true, None) => Ok(Sizes::All),
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

/// `--run_infinitely`: a row every `-D` seconds (perftest's default duration, 5 s), with no
/// margin, for ever; BW tests only, as perftest's.
fn infinite_mode(a: &PerfArgs, test: Test) -> Result<RunMode, CliError> {
    if test.kind != TestKind::Bw {
        return Err(CliError::usage(
            "--run_infinitely: run_infinitely exists only in BW tests for now.",
        ));
    }
    if a.bidirectional && test.verb == Verb::Send {
        return Err(CliError::usage(
            "--run_infinitely: run_infinitely mode is not supported in SEND Bidirectional BW \
             test",
        ));
    }
    if a.all || a.iters.is_some() {
        return Err(CliError::usage(
            "--run_infinitely cannot be combined with -a or -n (it runs one size until \
             stopped; -D sets the report interval)",
        ));
    }
    match a.duration {
        Some(0) => Err(CliError::usage("Duration period must be positive (-D 0)")),
        d => Ok(RunMode::Duration {
            total: Duration::from_secs(d.unwrap_or(5)),
            margin: Duration::ZERO,
        }),
    }
}

fn run_mode(a: &PerfArgs, test: Test) -> Result<RunMode, CliError> {
    match (a.duration, a.iters) {
        (Some(_), Some(_)) => Err(CliError::usage(
            "-D/--duration and -n/--iters cannot be combined (perftest ignores -n in duration \
             mode)",
        )),
        (Some(_), None) if a.all => Err(CliError::usage(
            "Duration mode currently doesn't support running on all sizes (-D with -a)",
        )),
        (Some(0), None) => Err(CliError::usage("Duration period must be positive (-D 0)")),
        (Some(d), None) => {
            // perftest's default margin: a quarter of the duration, in whole seconds
            // (perftest_parameters.c, force_dependecies).
            let margin = a.margin.unwrap_or(d / 4);
            if 2 * margin >= d {
                return Err(CliError::usage(format_args!(
                    "please check that DURATION > 2*MARGIN (-D {d}, -f {margin}): increase -D \
                     or decrease -f"
                )));
            }
            Ok(RunMode::Duration {
                total: Duration::from_secs(d),
                margin: Duration::from_secs(margin),
            })
        }
        (None, Some(n)) if !(MIN_ITERS..=MAX_ITERS).contains(&n) => Err(CliError::usage(
            format_args!("Iteration num should be between {MIN_ITERS} and {MAX_ITERS} (-n {n})"),
        )),
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

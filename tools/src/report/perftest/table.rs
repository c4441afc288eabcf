//! perftest's result tables: the 87-dash rule, the column headers and the result rows.
//!
//! Column texts, spacing and number formats are those perftest prints (including its tabs and
//! the trailing space of the latency header), so that scripts which split perftest output on
//! whitespace or grep the header keep working:
//!
//! * BW rows: size and iterations left-aligned in 7 and 10 columns, bandwidths `%.2f`, message
//!   rate `%.6f`. With `--report_gbits` and an average under 0.1 Gb/s perftest switches to its
//!   "extended accuracy" row, where the bandwidths are printed with six decimals.
//! * Latency rows: all times `%.2f` in microseconds.
//! * `--cpu_util` adds a `CPU_Util[%]` column.

use std::fmt::Write as _;

use crate::report::numfmt::finite_or_zero;
use crate::report::stats::{BwResult, BwUnits, DurationLatency, LatencyStats};

/// The rule perftest prints around the banner and the tables (87 dashes, no newline).
pub(crate) const RESULT_RULE: &str =
    "---------------------------------------------------------------------------------------";

/// The rule as a whole line (with `\n`), e.g. to close a table.
pub(crate) fn result_rule() -> String {
    format!("{RESULT_RULE}\n")
}

/// Ends a header line: either a newline or the CPU utilisation column.
fn header_end(cpu_util: bool) -> &'static str {
    if cpu_util { "    CPU_Util[%]\n" } else { "\n" }
}

/// Ends a row: either a newline or the CPU utilisation value.
fn row_end(out: &mut String, cpu_util: Option<f64>) {
    match cpu_util {
        Some(cpu) => {
            let _ = writeln!(out, "\t    {:<3.2}", finite_or_zero(cpu));
        }
        None => out.push('\n'),
    }
}

/// The rule and the BW column header (two lines).
///
/// `#bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]`, or the
/// `[Gb/sec]` variant.
pub(crate) fn bw_header(units: BwUnits, cpu_util: bool) -> String {
    let unit = match units {
        BwUnits::MiBps => "MiB/sec",
        BwUnits::Gbps => "Gb/sec",
    };
    format!(
        "{RESULT_RULE}\n #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   \
         MsgRate[Mpps]{}",
        header_end(cpu_util)
    )
}

/// Whether perftest would print this row with six-decimal bandwidths.
pub(crate) fn bw_extended_accuracy(result: &BwResult) -> bool {
    result.units == BwUnits::Gbps && finite_or_zero(result.bw_average) < 0.1
}

/// One BW result row (ends with `\n`).
pub(crate) fn bw_row(result: &BwResult, cpu_util: Option<f64>) -> String {
    let peak = finite_or_zero(result.bw_peak);
    let avg = finite_or_zero(result.bw_average);
    let rate = finite_or_zero(result.msg_rate_mpps);
    let mut o = if bw_extended_accuracy(result) {
        format!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            result.msg_size, result.iterations, peak, avg, rate
        )
    } else {
        format!(
            " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t     {:<7.6}",
            result.msg_size, result.iterations, peak, avg, rate
        )
    };
    row_end(&mut o, cpu_util);
    o
}

/// The rule and the latency column header (two lines; the header ends with a space).
pub(crate) fn lat_header(cpu_util: bool) -> String {
    format!(
        "{RESULT_RULE}\n #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    \
         t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] {}",
        header_end(cpu_util)
    )
}

/// One latency result row (ends with `\n`). `iterations` is the configured iteration count
/// (`-n`), which perftest prints even though statistics use fewer samples.
pub(crate) fn lat_row(
    msg_size: u64,
    iterations: u64,
    stats: &LatencyStats,
    cpu_util: Option<f64>,
) -> String {
    let f = finite_or_zero;
    let mut o = format!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t\
         {:<7.2} \t\t{:<7.2}",
        msg_size,
        iterations,
        f(stats.t_min),
        f(stats.t_max),
        f(stats.t_typical),
        f(stats.t_avg),
        f(stats.t_stdev),
        f(stats.p99),
        f(stats.p99_9),
    );
    row_end(&mut o, cpu_util);
    o
}

/// The rule and the duration-mode (`-D`) latency header (two lines).
pub(crate) fn lat_duration_header(cpu_util: bool) -> String {
    format!(
        "{RESULT_RULE}\n #bytes        #iterations       t_avg[usec]    tps average{}",
        header_end(cpu_util)
    )
}

/// One duration-mode latency row (ends with `\n`).
pub(crate) fn lat_duration_row(
    msg_size: u64,
    result: &DurationLatency,
    cpu_util: Option<f64>,
) -> String {
    let mut o = format!(
        " {:<7}       {}            {:<7.2}        {:<7.2}",
        msg_size,
        result.iterations,
        finite_or_zero(result.t_avg),
        finite_or_zero(result.tps)
    );
    row_end(&mut o, cpu_util);
    o
}

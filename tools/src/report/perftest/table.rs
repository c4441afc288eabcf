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
//!
//! perftest pads a value to a minimum width (`%-7.2f`) and follows it with fixed spaces and
//! tabs, so a wider value pushes the rest of its row to the right (its tabs absorb a little of
//! that, its spaces none). Rows here are built with [`Line`]: a value that fits the width of
//! its format (or the slack of the tabs after it) gives perftest's bytes; after a wider one,
//! spaces run up to the column where the next value starts in a normal row, so every value
//! starts in the same column whatever the widths and stays under its header. perftest would
//! print one more space after an 8-character peak such as `11586.21` (the average one column
//! further right); scripts that split rows on whitespace see no difference. Only a value wider
//! than its whole column still shifts the rest of its row, with at least one space before the
//! next value: 18 characters for the BW peak (15 digits before the point), 20 for the average,
//! 16 digits of iterations, 12 characters for the narrowest latency column (t_max).

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

/// Tab stops of the terminals the tables are read on.
const TAB: usize = 8;

/// The display column after `text` is written from column `col` (tabs to the next multiple of
/// [`TAB`]).
fn advance(mut col: usize, text: &str) -> usize {
    for c in text.chars() {
        col = if c == '\t' {
            (col / TAB + 1) * TAB
        } else {
            col + 1
        };
    }
    col
}

/// One table row, written value by value so that the columns line up whatever a value's
/// width.
#[derive(Debug)]
struct Line {
    text: String,
    col: usize,
}

impl Line {
    /// A row starting with perftest's leading space.
    fn new() -> Self {
        Self {
            text: " ".to_owned(),
            col: 1,
        }
    }

    /// Writes `value` left-aligned in `width` (perftest's `%-<width>`), then `gap` (the spaces
    /// and tabs perftest puts before the next column). When the value is wider than `width`
    /// and `gap` would then end further right than after a `width`-wide value, spaces up to
    /// that column replace `gap` (at least one). An empty `gap` ends the row's values.
    fn field(&mut self, value: &str, width: usize, gap: &str) {
        let _ = write!(self.text, "{value:<width$}");
        let end = advance(self.col, value).max(self.col + width);
        let normal = advance(self.col + width, gap);
        if gap.is_empty() {
            self.col = end;
        } else if advance(end, gap) == normal {
            self.text.push_str(gap);
            self.col = normal;
        } else {
            let pad = normal.saturating_sub(end).max(1);
            self.text.extend(std::iter::repeat_n(' ', pad));
            self.col = end + pad;
        }
    }

    /// Ends the row: the CPU utilisation value when there is one (the last value wrote the
    /// gap before it, see [`last_field`]), then a newline.
    fn end(mut self, cpu_util: Option<f64>) -> String {
        if let Some(cpu) = cpu_util {
            let _ = write!(self.text, "{:<3.2}", finite_or_zero(cpu));
        }
        self.text.push('\n');
        self.text
    }
}

/// The gap perftest prints before the CPU utilisation value.
const CPU_GAP: &str = "\t    ";

/// Writes the last value of a row: `gap`-separated from a CPU utilisation value when there
/// is one, else padded to `width` and nothing more.
fn last_field(line: &mut Line, value: &str, width: usize, cpu: Option<f64>) {
    let gap = if cpu.is_some() { CPU_GAP } else { "" };
    line.field(value, width, gap);
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
    let mut o = Line::new();
    o.field(&result.msg_size.to_string(), 7, "    ");
    if bw_extended_accuracy(result) {
        // perftest prints the count unpadded here; four digits put the next value under its
        // header, as perftest's default 1000 iterations do.
        // `%-7.6f` never prints fewer than 8 characters: 8 is the width these columns have
        // in perftest's output.
        o.field(&result.iterations.to_string(), 4, "           ");
        o.field(&format!("{peak:.6}"), 8, "            ");
        o.field(&format!("{avg:.6}"), 8, "            ");
    } else {
        o.field(&result.iterations.to_string(), 10, "       ");
        o.field(&format!("{peak:.2}"), 7, "            ");
        o.field(&format!("{avg:.2}"), 7, "\t\t     ");
    }
    last_field(&mut o, &format!("{rate:.6}"), 8, cpu_util);
    o.end(cpu_util)
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
    let f = |v: f64| format!("{:.2}", finite_or_zero(v));
    let mut o = Line::new();
    o.field(&msg_size.to_string(), 7, " ");
    // Unpadded in perftest; four digits (its default 1000) put t_min under its header.
    o.field(&iterations.to_string(), 4, "          ");
    o.field(&f(stats.t_min), 7, "        ");
    o.field(&f(stats.t_max), 7, "      ");
    o.field(&f(stats.t_typical), 7, "  \t       ");
    o.field(&f(stats.t_avg), 7, "     \t");
    o.field(&f(stats.t_stdev), 7, "\t\t");
    o.field(&f(stats.p99), 7, " \t\t");
    last_field(&mut o, &f(stats.p99_9), 7, cpu_util);
    o.end(cpu_util)
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
    let mut o = Line::new();
    o.field(&msg_size.to_string(), 7, "       ");
    // Unpadded in perftest; seven digits (millions of iterations) put t_avg under its header.
    o.field(&result.iterations.to_string(), 7, "            ");
    o.field(
        &format!("{:.2}", finite_or_zero(result.t_avg)),
        7,
        "        ",
    );
    last_field(
        &mut o,
        &format!("{:.2}", finite_or_zero(result.tps)),
        7,
        cpu_util,
    );
    o.end(cpu_util)
}

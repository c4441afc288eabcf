//! cmtime's report (librdmacm's connection-setup benchmark), as facts of its output: the
//! connection and thread count lines, then one row per step of the connection's life with the
//! step's wall time over all connections (total and per connection) and the sum, maximum and
//! minimum of the per-connection times, in microseconds.

use std::fmt::Write as _;

/// The steps cmtime times, in its order and with its names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    FullConnect,
    CreateId,
    Bind,
    ResolveAddr,
    ResolveRoute,
    CreateQp,
    InitQpAttr,
    InitQp,
    RtrQpAttr,
    RtrQp,
    RtsQpAttr,
    RtsQp,
    Connect,
    Establish,
    Disconnect,
    DestroyId,
    DestroyQp,
}

impl Step {
    pub(crate) const ALL: [Self; 17] = [
        Self::FullConnect,
        Self::CreateId,
        Self::Bind,
        Self::ResolveAddr,
        Self::ResolveRoute,
        Self::CreateQp,
        Self::InitQpAttr,
        Self::InitQp,
        Self::RtrQpAttr,
        Self::RtrQp,
        Self::RtsQpAttr,
        Self::RtsQp,
        Self::Connect,
        Self::Establish,
        Self::Disconnect,
        Self::DestroyId,
        Self::DestroyQp,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::FullConnect => "full connect",
            Self::CreateId => "create id",
            Self::Bind => "bind addr",
            Self::ResolveAddr => "resolve addr",
            Self::ResolveRoute => "resolve route",
            Self::CreateQp => "create qp",
            Self::InitQpAttr => "init qp attr",
            Self::InitQp => "init qp",
            Self::RtrQpAttr => "rtr qp attr",
            Self::RtrQp => "rtr qp",
            Self::RtsQpAttr => "rts qp attr",
            Self::RtsQp => "rts qp",
            Self::Connect => "cm connect",
            Self::Establish => "establish",
            Self::Disconnect => "disconnect",
            Self::DestroyId => "destroy id",
            Self::DestroyQp => "destroy qp",
        }
    }
}

/// A span of time in microseconds since the run's start: `(start, end)`.
pub(crate) type Span = (u64, u64);

/// What one run measured: per step, the wall span over all connections and each connection's
/// own span (absent where a side does not do the step).
#[derive(Debug, Clone)]
pub(crate) struct Timings {
    conns: usize,
    wall: [Option<Span>; 17],
    per_conn: Vec<[Option<Span>; 17]>,
}

impl Timings {
    pub(crate) fn new(conns: usize) -> Self {
        Self {
            conns,
            wall: [None; 17],
            per_conn: vec![[None; 17]; conns],
        }
    }

    fn index(step: Step) -> usize {
        Step::ALL.iter().position(|&s| s == step).unwrap_or(0)
    }

    /// The wall span of `step` over every connection.
    pub(crate) fn wall(&mut self, step: Step, span: Span) {
        self.wall[Self::index(step)] = Some(span);
    }

    /// Connection `conn`'s span of `step`.
    pub(crate) fn conn(&mut self, conn: usize, step: Step, span: Span) {
        if let Some(c) = self.per_conn.get_mut(conn) {
            c[Self::index(step)] = Some(span);
        }
    }

    /// cmtime's table. `cm` says whether the connections were made through the CM (`cm_conn`)
    /// or QPs only (`qp_conn`); the sum of the full-connect step is printed as 0, as cmtime
    /// does (a sum of overlapping connects means nothing).
    pub(crate) fn render(&self, cm: bool, threads: usize) -> String {
        let n = self.conns.max(1) as u64;
        let mut out = String::new();
        let label = if cm { "cm_conn" } else { "qp_conn" };
        let _ = writeln!(out, "{label:<15}{:>10}", self.conns);
        let _ = writeln!(out, "{:<15}{threads:>10}", "threads");
        out.push_str(
            "step             avg/conn  total(us)    us/conn    sum(us)    max(us)    min(us)\n",
        );
        for (i, step) in Step::ALL.iter().enumerate() {
            let diffs: Vec<u64> = self
                .per_conn
                .iter()
                .filter_map(|c| c[i])
                .map(|(a, b)| b.saturating_sub(a))
                .collect();
            let sum = if *step == Step::FullConnect {
                0
            } else {
                diffs.iter().sum()
            };
            let max = diffs.iter().copied().max().unwrap_or(0);
            let min = diffs.iter().copied().min().unwrap_or(0);
            let total = self.wall[i].map_or(0, |(a, b)| b.saturating_sub(a));
            let _ = writeln!(
                out,
                "{:<13}  {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
                step.name(),
                total / n,
                total,
                sum / n,
                sum,
                max,
                min
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_cmtimes_lines_and_columns() {
        let mut t = Timings::new(2);
        t.wall(Step::Connect, (100, 300));
        t.conn(0, Step::Connect, (100, 200));
        t.conn(1, Step::Connect, (110, 290));
        t.wall(Step::FullConnect, (0, 400));
        t.conn(0, Step::FullConnect, (0, 350));
        t.conn(1, Step::FullConnect, (0, 400));
        let text = t.render(true, 1);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "cm_conn                 2");
        assert_eq!(lines[1], "threads                 1");
        assert_eq!(
            lines[2],
            "step             avg/conn  total(us)    us/conn    sum(us)    max(us)    min(us)"
        );
        assert_eq!(lines.len(), 3 + 17);
        assert_eq!(
            lines[3],
            "full connect          200        400          0          0        400        350"
        );
        let connect = lines.iter().find(|l| l.starts_with("cm connect")).unwrap();
        assert_eq!(
            *connect,
            "cm connect            100        200        140        280        180        100"
        );
        let bind = lines.iter().find(|l| l.starts_with("bind addr")).unwrap();
        assert!(bind.split_whitespace().skip(2).all(|f| f == "0"), "{bind}");
        assert!(Timings::new(1).render(false, 1).starts_with("qp_conn "));
    }
}

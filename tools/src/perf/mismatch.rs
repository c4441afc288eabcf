//! A write or read BW server's check that its client ran the same test.
//!
//! perftest's exchange carries no test type: the destinations of `ib_write_bw` and
//! `ib_read_bw` are alike, and their servers post nothing, so a write server facing a read
//! client would print the client's read row under its write title. The server's buffer
//! tells them apart without changing what goes on the wire: the server marks the start of
//! each QP's region (where the peer writes, and where it reads from) before the client learns
//! where it is; a write client overwrites the mark with its own data, a read client leaves it.

use super::config::PerfConfig;
use super::setup::Side;
use crate::error::{CliError, Context as _};
use crate::report::{TestKind, Verb};

/// The byte the regions are marked with.
const MARK: u8 = 0xA5;

/// The bytes marked at the start of each region: the client's largest message covers them
/// (its last, or only, size), and 64 random bytes of a perftest client's buffer do not
/// equal the mark by chance.
fn marked_len(sizes: &[u64]) -> usize {
    let largest = sizes.iter().copied().max().unwrap_or(0);
    usize::try_from(largest).unwrap_or(usize::MAX).min(64)
}

/// Whether this side checks: a server of a one-way write or read BW test that ends (the
/// bidirectional and endless runs have the server post too, or never end).
fn checks(cfg: &PerfConfig, client: bool) -> bool {
    !client
        && cfg.test.kind == TestKind::Bw
        && matches!(cfg.test.verb, Verb::Write | Verb::Read)
        && !cfg.bidirectional
        && !cfg.infinite
}

/// Marks the regions, before the destinations are exchanged.
pub(crate) fn mark(
    cfg: &PerfConfig,
    client: bool,
    side: &Side,
    sizes: &[u64],
) -> Result<(), CliError> {
    if !checks(cfg, client) {
        return Ok(());
    }
    let len = marked_len(sizes).min(side.slot);
    for i in 0..side.qps.len() {
        side.buf
            .fill(side.recv_off(i), len, MARK)
            .ctx("marking the buffer")?;
    }
    Ok(())
}

/// After the client's last row: refuses it when the marks say it ran the other test.
pub(crate) fn check(
    cfg: &PerfConfig,
    client: bool,
    side: &Side,
    sizes: &[u64],
) -> Result<(), CliError> {
    if !checks(cfg, client) {
        return Ok(());
    }
    let len = marked_len(sizes).min(side.slot);
    let mut untouched = true;
    for i in 0..side.qps.len() {
        let mut bytes = vec![0u8; len];
        side.buf
            .read(side.recv_off(i), &mut bytes)
            .ctx("reading the buffer")?;
        untouched &= bytes.iter().all(|&b| b == MARK);
    }
    match (cfg.test.verb, untouched) {
        (Verb::Write, true) => Err(CliError::Failed(
            "the client wrote nothing into this write_bw server's buffer: it runs another \
             test (read_bw?); both sides must run the same test, as with perftest"
                .into(),
        )),
        (Verb::Read, false) => Err(CliError::Failed(
            "the client wrote into this read_bw server's buffer: it runs another test \
             (write_bw?); both sides must run the same test, as with perftest"
                .into(),
        )),
        _ => Ok(()),
    }
}

//! `--progress manual|auto`: the progress mode of the UDP-bound devices `PORTVERBS_UDP` makes,
//! shared by every tool that opens devices.

use clap::Args;
use portverbs::hal::Progress;

/// The `--progress` option.
#[derive(Debug, Clone, Copy, Default, Args)]
pub(crate) struct ProgressArg {
    /// Progress of the UDP-bound devices (PORTVERBS_UDP): auto — one progress thread per
    /// device (the default) — or manual — no thread, this tool's calls drive the device. Over
    /// PORTVERBS_PROGRESS.
    #[arg(long = "progress", value_name = "MODE", value_parser = parse)]
    pub(crate) progress: Option<Progress>,
}

fn parse(s: &str) -> Result<Progress, String> {
    Progress::parse(s).ok_or_else(|| format!("{s:?} is not a progress mode: manual or auto"))
}

impl ProgressArg {
    /// Makes the choice before any device is made.
    pub(crate) fn apply(self) {
        #[cfg(any(target_os = "linux", windows))]
        if let Some(p) = self.progress {
            portverbs::set_udp_progress(p);
        }
    }
}

//! How an mlx4 device is opened.

use std::time::Duration;

use portverbs_hal::types::Gid;

use crate::cmd::CommandMode;

/// Options of [`crate::Mlx4Device::open`].
#[derive(Debug, Clone)]
pub struct Mlx4Config {
    /// Device name (`mlx4_0` …).
    pub name: String,
    /// GID table of each port (index = sgid_index), programmed into the HCA at bring-up. On RoCE
    /// the GIDs are the port's IP addresses; a userspace driver has no netdev to take them from,
    /// so the application says which.
    pub gids: Vec<Vec<Gid>>,
    /// How firmware commands complete once the command EQ exists.
    pub command_mode: CommandMode,
    /// Longest wait for one command (Linux uses 60 s).
    pub command_timeout: Duration,
    /// Use BlueFlame for single small inline sends when the HCA has it.
    pub blueflame: bool,
    /// Seed of the driver's memory key bytes and QP numbers (`portverbs_hal::rng`). `None`,
    /// the default: drawn from the OS, so that a peer cannot guess them. `Some` pins it (a
    /// test that must repeat them exactly).
    pub seed: Option<u64>,
}

impl Mlx4Config {
    /// Defaults: event-mode commands, 60 s timeout, BlueFlame on, identifiers seeded from the
    /// OS.
    pub fn new(name: impl Into<String>, gids: Vec<Vec<Gid>>) -> Self {
        Self {
            name: name.into(),
            gids,
            command_mode: CommandMode::Events,
            command_timeout: Duration::from_secs(60),
            blueflame: true,
            seed: None,
        }
    }
}

//! Ports (Linux `mlx4/port.c`, `mlx4/fw.c`): QUERY_PORT, INIT_PORT / CLOSE_PORT, and SET_PORT — the
//! Ethernet GID table, through which the driver's GIDs appear on the fabric.
//!
//! The GID-table form of SET_PORT follows Linux's mlx4_en/mlx4_ib
//! use (`MLX4_SET_PORT_GID_TABLE`): opmod 1 (Ethernet), in_mod = port | (5 << 8), and an inbox
//! of 128 entries of 16-byte GIDs, index = GID index. Every non-zero entry becomes a route to
//! this port; the engine's GID table of the port becomes the inbox's. Other SET_PORT forms
//! (IB "general", the other Ethernet tables) are accepted and ignored.

use portverbs_hal::event::{DeviceEvent, PortEventKind};
use portverbs_hal::types::Gid;
use portverbs_mlx4_layout::opcode as op;
use portverbs_mlx4_layout::status::Status;
use portverbs_transport::Engine;

use super::{CmdResult, Command, Ctx, Hw};
use crate::caps;

/// SET_PORT's Ethernet opmod.
const OPMOD_ETH: u8 = 1;
/// in_mod bits 15:8 of the GID-table form (`MLX4_SET_PORT_GID_TABLE`).
const GID_TABLE: u32 = 5;

/// True for the GID-table form of SET_PORT.
pub(super) fn is_gid_table(cmd: &Command) -> bool {
    cmd.opmod == OPMOD_ETH && (cmd.in_mod >> 8) & 0xff == GID_TABLE
}

impl Hw {
    fn port_of(&self, cmd: &Command) -> Result<u8, Status> {
        let port = (cmd.in_mod & 0xff) as u8;
        if (1..=self.ports).contains(&port) {
            Ok(port)
        } else {
            Err(Status::BadParam)
        }
    }

    pub(super) fn port_command(&mut self, engine: &mut Engine, cmd: &Command) -> CmdResult {
        let port = self.port_of(cmd)?;
        let i = usize::from(port - 1);
        match cmd.opcode {
            op::QUERY_PORT => {
                let out = caps::query_port(port, self.port_up[i], self.mtu);
                self.outbox(cmd.out_param, &out).map(|()| None)
            }
            op::INIT_PORT => {
                let was = std::mem::replace(&mut self.port_up[i], true);
                if let Some(p) = engine.ports_mut().get_mut(i) {
                    p.active = true;
                }
                if !was {
                    self.post_event(DeviceEvent::Port {
                        port,
                        kind: PortEventKind::Active,
                    });
                }
                Ok(None)
            }
            op::CLOSE_PORT => {
                self.port_up[i] = false;
                if let Some(p) = engine.ports_mut().get_mut(i) {
                    p.active = false;
                }
                Ok(None)
            }
            _ => Ok(None),
        }
    }
}

impl Hw {
    /// The link of `port` (1-based) goes down or comes back, with the PORT_CHANGE event a
    /// cable pull or reconnect produces. Ignored for ports that do not exist.
    pub(crate) fn set_link(&mut self, engine: &mut Engine, port: u8, up: bool) {
        let i = usize::from(port).wrapping_sub(1);
        let Some(state) = self.port_up.get_mut(i) else {
            return;
        };
        if *state == up {
            return;
        }
        *state = up;
        if let Some(p) = engine.ports_mut().get_mut(i) {
            p.active = up;
        }
        let kind = if up {
            PortEventKind::Active
        } else {
            PortEventKind::Down
        };
        self.post_event(DeviceEvent::Port { port, kind });
    }
}

/// SET_PORT with the GID table: re-routes the port's GIDs (all or nothing) and gives the
/// engine the new table.
pub(super) fn set_gid_table(ctx: &mut Ctx<'_>, cmd: &Command) -> CmdResult {
    let (port, table) = {
        let hw = &ctx.node.hw;
        let port = hw.port_of(cmd)?;
        let raw = hw
            .mailbox(cmd.in_param, caps::GIDS * 16)?
            .vec(0, caps::GIDS * 16)
            .ok_or(Status::BadParam)?;
        let table: Vec<Gid> = raw
            .chunks_exact(16)
            .map(|c| {
                let mut g = [0u8; 16];
                g.copy_from_slice(c);
                Gid(g)
            })
            .collect();
        (port, table)
    };
    let old: Vec<Gid> = ctx
        .routes()
        .into_iter()
        .filter(|&(p, _)| p == port)
        .map(|(_, g)| g)
        .collect();
    for g in &old {
        ctx.remove_route(*g);
    }
    let mut added = Vec::new();
    for g in table.iter().filter(|g| !g.is_zero()) {
        if ctx.add_route(port, *g).is_err() {
            for a in &added {
                ctx.remove_route(*a);
            }
            for g in &old {
                let _ = ctx.add_route(port, *g);
            }
            return Err(Status::BadParam);
        }
        added.push(*g);
    }
    if port == 1 {
        ctx.node.hw.gsi_gids.clone_from(&table);
    }
    if let Some(p) = ctx.node.engine.ports_mut().get_mut(usize::from(port - 1)) {
        p.gids = table;
    }
    Ok(None)
}

//! Device and port queries: the attributes bring-up cached, QUERY_PORT, the GID and P_Key
//! tables.

use portverbs_hal::caps::{DeviceAttr, GidEntry, GidType, PortAttr};
use portverbs_hal::error::CommandError;
use portverbs_hal::types::{LinkLayer, Mtu, PortState};

use super::Mlx4Device;
use super::commands::{invalid, no};
use crate::caps;
use crate::cmd::Cmd;
use crate::layout::opcode;

impl Mlx4Device {
    pub(super) async fn do_query_device(&self) -> Result<DeviceAttr, CommandError> {
        self.0.check_alive()?;
        Ok(self.0.attr.clone())
    }

    pub(super) async fn do_query_port(&self, port: u8) -> Result<PortAttr, CommandError> {
        if port == 0 || port > self.0.caps.num_ports {
            return Err(invalid(format!("port {port} does not exist")));
        }
        let mut out = vec![0u8; 64];
        self.cmd_out(
            Cmd::new(opcode::QUERY_PORT).in_mod(u32::from(port)),
            &mut out,
        )
        .await?;
        let p = caps::parse_port(&out).map_err(|e| invalid(e.to_string()))?;
        let max_mtu = Mtu::from_code(p.max_mtu).unwrap_or(Mtu::Mtu1024);
        Ok(PortAttr {
            state: if p.link_up {
                PortState::Active
            } else {
                PortState::Down
            },
            max_mtu,
            active_mtu: max_mtu,
            gid_tbl_len: p.gid_table_len.min(super::bringup::GID_TABLE_LEN as u32),
            // IB_PORT_CM_SUP | IB_PORT_IP_BASED_GIDS
            port_cap_flags: (1 << 16) | (1 << 26),
            max_msg_sz: 1u32 << self.0.caps.log_max_msg.min(31),
            pkey_tbl_len: 1,
            lid: 0,
            sm_lid: 0,
            lmc: 0,
            active_width: p.active_width,
            active_speed: p.active_speed,
            phys_state: if p.link_up { 5 } else { 3 },
            link_layer: LinkLayer::Ethernet,
            // Linux reads these from PortInfo through MAD_IFC, which this driver does not
            // issue: they read 0.
            bad_pkey_cntr: 0,
            qkey_viol_cntr: 0,
        })
    }

    pub(super) async fn do_query_gid(
        &self,
        port: u8,
        index: u32,
    ) -> Result<GidEntry, CommandError> {
        self.0.check_alive()?;
        if port == 0 || port > self.0.caps.num_ports {
            return Err(invalid(format!("port {port} does not exist")));
        }
        let len = super::bringup::GID_TABLE_LEN as u32;
        if index >= len {
            return Err(invalid(format!(
                "GID index {index} beyond a table of {len}"
            )));
        }
        self.0
            .gids
            .get(usize::from(port) - 1)
            .and_then(|g| g.get(index as usize))
            .map(|gid| GidEntry {
                gid: *gid,
                gid_type: GidType::RoceV2,
            })
            .ok_or_else(|| no("GID entry", index))
    }

    pub(super) async fn do_query_pkey(&self, port: u8, index: u16) -> Result<u16, CommandError> {
        self.0.check_alive()?;
        if port == 0 || port > self.0.caps.num_ports {
            return Err(invalid(format!("port {port} does not exist")));
        }
        match index {
            0 => Ok(0xffff),
            _ => Err(invalid(format!("P_Key index {index} beyond a table of 1"))),
        }
    }
}

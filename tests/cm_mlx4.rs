//! The connection manager with one end or both ends on the emulated ConnectX-3:
//! connect, data over the connected QP, disconnect, and reject, between the embedded
//! fabric's `mlx4_0` / `mlx4_1` (the mlx4 driver over the emulated HCA) and `soft0`. The mlx4
//! side's CM MADs leave its QP1 as MLX-transport WQEs whose headers the driver builds.
//!
//! What a real ConnectX-3 RoCE port would need that the emulation does not check. The driver
//! sends QP1 MADs as MLX-service WQEs (`hw/mlx4/qp.c`: an MLX control segment, then inline the
//! header software built, then the MAD); it builds the InfiniBand form, LRH + GRH + BTH +
//! DETH, and the emulated HCA checks that header (LRH DLID and SL against the control
//! segment) and routes the datagram by destination GID. On an Ethernet port the inline header
//! is the Ethernet frame's instead (destination and source MAC, optional VLAN tag, then the
//! GRH for RoCE v1), so the driver would have to resolve the peer's MAC from its GID (the
//! neighbour table) and pick the port's source MAC and VLAN; none of that is implemented
//! here, and RoCE v2 (IP/UDP framing, the IPv4-mapped GIDs these tests use) is a ConnectX-3
//! Pro feature, not a plain ConnectX-3 one. The emulation also takes the GID table from its
//! configuration without an Ethernet interface owning the addresses, and does not compute the
//! ICRC. The CM above the device depends on none of these: it sees QP1 datagrams and a GID.
#![cfg(target_os = "linux")]

#[path = "util/cm/mod.rs"]
mod cm_util;
use cm_util::{Dev, cm_dev, connect_send_disconnect, reject_with_data, settle_clean};

/// The CM devices of the whole process: a device's QP1 can be created once, so the tests
/// share one set and take turns.
fn devices() -> (std::sync::MutexGuard<'static, ()>, &'static [Dev; 3]) {
    use std::sync::{Mutex, OnceLock, PoisonError};
    static TURN: Mutex<()> = Mutex::new(());
    static DEVS: OnceLock<[Dev; 3]> = OnceLock::new();
    let turn = TURN.lock().unwrap_or_else(PoisonError::into_inner);
    let devs = DEVS.get_or_init(|| [cm_dev("mlx4_0"), cm_dev("mlx4_1"), cm_dev("soft0")]);
    (turn, devs)
}

#[test]
fn mlx4_active_soft_passive() {
    let (_turn, [m0, _, s0]) = devices();
    connect_send_disconnect(m0, s0, 7601);
}

#[test]
fn soft_active_mlx4_passive() {
    let (_turn, [m0, _, s0]) = devices();
    connect_send_disconnect(s0, m0, 7602);
}

#[test]
fn mlx4_to_mlx4() {
    let (_turn, [m0, m1, _]) = devices();
    connect_send_disconnect(m0, m1, 7603);
    connect_send_disconnect(m1, m0, 7604);
}

#[test]
fn mlx4_rejects_and_is_rejected() {
    let (_turn, [m0, m1, s0]) = devices();
    for (a, b, port) in [(s0, m0, 7605), (m0, s0, 7606), (m0, m1, 7607)] {
        reject_with_data(a, b, port);
        settle_clean(&[a, b]);
    }
}

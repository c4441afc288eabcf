//! UD reception: the Q_Key check, the 40-byte GRH area, one packet per message.

use std::net::IpAddr;

use portverbs_hal::wc::{WcOpcode, WcStatus};

use super::super::Core;
use super::super::hca::{Hca, RecvSource};
use super::super::packet::Packet;
use super::super::qp::QpCtx;
use super::recv::{complete_recv, scatter_bytes, scatter_recv, take_recv};
use crate::wire::Position;

/// Size of the GRH area at the start of a UD receive buffer.
pub(super) const GRH_LEN: usize = 40;

/// UD: Q_Key check, GRH area, one packet per message; errors never change the QP state.
pub(super) fn on_ud<H: Hca + ?Sized>(qp: &mut QpCtx, core: &mut Core, hca: &mut H, pkt: &Packet) {
    let Some(deth) = pkt.hdr.deth else {
        core.stats.dropped += 1;
        return;
    };
    if deth.qkey != qp.attr.qkey {
        core.stats.dropped += 1;
        core.stats.bad_qkey += 1;
        core.violations_mut(qp.attr.port_num).bad_qkey += 1;
        return;
    }
    if !matches!(pkt.hdr.bth.opcode.position(), Some(Position::Only) | None) {
        core.stats.dropped += 1;
        return;
    }
    match take_recv(qp, hca) {
        Ok(true) => {}
        _ => {
            core.stats.dropped += 1;
            return;
        }
    }
    qp.resp.offset = 0;
    if (GRH_LEN + pkt.payload.len()) as u64 > qp.resp.recv.capacity() {
        // Checked before a byte is written: on a QP's own receive queue the buffer is left
        // untouched as well as posted.
        drop_too_long(qp, core, hca, pkt);
        return;
    }
    let grh = grh_area(pkt);
    let mut status = scatter_bytes(qp, core, 0, GRH_LEN as u64, |span, src, len| {
        use portverbs_hal::DmaMemory;
        span.mem
            .write(span.offset, &grh[src..src + len])
            .map_err(|_| WcStatus::LocProtErr)
    });
    if status.is_ok() {
        status = scatter_recv(qp, core, pkt, GRH_LEN as u64);
    }
    let len = (GRH_LEN + pkt.payload.len()) as u32;
    match status {
        Ok(()) => complete_recv(qp, core, hca, WcStatus::Success, WcOpcode::Recv, pkt, len),
        Err(s) => complete_recv(qp, core, hca, s, WcOpcode::Recv, pkt, 0),
    }
}

/// A UD or UC message that does not fit the receive it would land in. The QP's state does
/// not change. On the QP's own receive queue this is IBA class D: the message is dropped and
/// the receive stays posted (held here, unchanged in the queue's order) for the next message,
/// as rxe does. A receive from an SRQ was already taken from the shared queue when its size
/// became known, so it completes with `LOC_LEN_ERR` (class E; rxe reports `REM_INV_REQ_ERR`
/// there, hardware the local length error).
pub(super) fn drop_too_long<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    pkt: &Packet,
) {
    core.stats.dropped += 1;
    qp.resp.msg = None;
    qp.resp.offset = 0;
    if let RecvSource::Srq { .. } = qp.recv_source() {
        complete_recv(qp, core, hca, WcStatus::LocLenErr, WcOpcode::Recv, pkt, 0);
    }
}

/// The 40-byte area a UD receive starts with: the IPv6 header, or for RoCEv2 over IPv4 20
/// reserved bytes followed by the IPv4 header (as Linux and rdma-core present it).
pub(super) fn grh_area(pkt: &Packet) -> [u8; GRH_LEN] {
    let mut g = [0u8; GRH_LEN];
    let payload_len =
        pkt.payload.len() + pkt.hdr.len() + usize::from(pkt.hdr.bth.pad_count) + 4 + 8;
    match (pkt.src_gid.to_ip(), pkt.dst_gid.to_ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let total = (20 + payload_len) as u16;
            let h = &mut g[20..];
            h[0] = 0x45;
            h[1] = pkt.traffic_class;
            h[2..4].copy_from_slice(&total.to_be_bytes());
            h[6] = 0x40;
            h[8] = pkt.hop_limit;
            h[9] = 17;
            h[12..16].copy_from_slice(&s.octets());
            h[16..20].copy_from_slice(&d.octets());
            let mut sum = 0u32;
            for w in h.chunks_exact(2) {
                sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
            }
            while sum > 0xffff {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            h[10..12].copy_from_slice(&(!(sum as u16)).to_be_bytes());
        }
        _ => {
            let vtf =
                (6u32 << 28) | (u32::from(pkt.traffic_class) << 20) | (pkt.flow_label & 0xf_ffff);
            g[0..4].copy_from_slice(&vtf.to_be_bytes());
            g[4..6].copy_from_slice(&(payload_len as u16).to_be_bytes());
            g[6] = 17;
            g[7] = pkt.hop_limit;
            g[8..24].copy_from_slice(&pkt.src_gid.0);
            g[24..40].copy_from_slice(&pkt.dst_gid.0);
        }
    }
    g
}

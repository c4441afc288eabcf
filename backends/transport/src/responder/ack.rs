//! ACK and NAK generation (IBA chapter 9, as Linux `rxe_resp.c`): ACKs coalesced until the end of a
//! burst, RNR NAKs, fatal NAKs that move the QP to ERR, and the response packet itself.

use portverbs_hal::attr::rnr_timer_ns;
use portverbs_hal::event::{DeviceEvent, QpEventKind};
use portverbs_hal::types::QpState;

use super::super::Core;
use super::super::hca::Hca;
use super::super::modify::set_state;
use super::super::packet::{Packet, PayloadData, psn};
use super::super::qp::QpCtx;
use crate::wire::{Aeth, AethSyndrome, Bth, NakCode, Opcode, TransportHdr};

/// The packet was executed: advance the expected PSN and owe an ACK if asked for.
#[inline]
pub(super) fn accept(qp: &mut QpCtx, core: &mut Core, pkt: &Packet) {
    let last = psn::add(pkt.hdr.bth.psn, pkt.psn_count() - 1);
    qp.resp.epsn = psn::add(last, 1);
    if pkt.hdr.bth.ack_req {
        owe_ack(qp, core, last);
    }
}

/// Owes an ACK for everything through PSN `p`, sent when the current burst ends (one for
/// the whole burst, however many packets asked).
#[inline]
pub(super) fn owe_ack(qp: &mut QpCtx, core: &mut Core, p: u32) {
    qp.resp.pending_ack = Some(p);
    if !qp.ack_scheduled {
        qp.ack_scheduled = true;
        core.acks.push(qp.qpn);
    }
}

/// Sends the coalesced ACK, if one is owed and no READ or atomic response before it is still
/// owed (then it goes out behind them: `read::respond`).
pub(crate) fn flush_ack(qp: &mut QpCtx, core: &mut Core, out: &mut Vec<Packet>) {
    qp.ack_scheduled = false;
    if qp.resp.responding {
        return;
    }
    if let Some(p) = qp.resp.pending_ack.take() {
        send_aeth(qp, core, out, p, AethSyndrome::Ack { credits: 0x1f });
    }
}

/// Sends an ACK, a sequence NAK or an RNR NAK for PSN `p` — or, while READ or atomic
/// responses for earlier PSNs are still owed, holds it until they are out: responses leave in
/// PSN order (a requester such as rxe's takes a response beyond a READ it is still receiving
/// as the READ's responses lost, and asks for the READ again). Only the latest of each is
/// kept; the QP's state does not change in between (ACKs are cumulative, and a NAK's PSN is
/// the expected PSN, which stays put until it arrives).
pub(super) fn send_or_hold(
    qp: &mut QpCtx,
    core: &mut Core,
    out: &mut Vec<Packet>,
    p: u32,
    syndrome: AethSyndrome,
) {
    if !qp.resp.responding {
        send_aeth(qp, core, out, p, syndrome);
    } else if let AethSyndrome::Ack { .. } = syndrome {
        qp.resp.pending_ack = Some(p);
    } else {
        qp.resp.held_nak = Some((p, syndrome));
    }
}

pub(super) fn rnr(qp: &mut QpCtx, core: &mut Core, out: &mut Vec<Packet>, p: u32) {
    core.stats.rnr_naks += 1;
    let timer = qp.attr.min_rnr_timer & 0x1f;
    let _ = rnr_timer_ns(timer);
    send_or_hold(qp, core, out, p, AethSyndrome::RnrNak { timer });
}

/// A remote access violation: NAK, QP to ERR, and an access-error event on this side.
pub(super) fn access_error<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    out: &mut Vec<Packet>,
    p: u32,
) {
    hca.post_event(DeviceEvent::Qp {
        qpn: qp.qpn,
        kind: QpEventKind::AccessError,
    });
    nak_fatal(qp, core, hca, out, p, NakCode::RemoteAccessError);
}

/// A NAK that ends the connection: the QP goes to ERR (IBA 9.9.3 class C errors).
pub(super) fn nak_fatal<H: Hca + ?Sized>(
    qp: &mut QpCtx,
    core: &mut Core,
    hca: &mut H,
    out: &mut Vec<Packet>,
    p: u32,
    code: NakCode,
) {
    if code == NakCode::InvalidRequest {
        hca.post_event(DeviceEvent::Qp {
            qpn: qp.qpn,
            kind: QpEventKind::RequestError,
        });
    }
    send_aeth(qp, core, out, p, AethSyndrome::Nak(code));
    set_state(qp, core, hca, QpState::Err);
}

pub(super) fn bth(qp: &QpCtx, opcode: Opcode, p: u32) -> Bth {
    Bth::new(opcode, qp.attr.dest_qp_num, p)
}

pub(super) fn send_aeth(
    qp: &mut QpCtx,
    core: &mut Core,
    out: &mut Vec<Packet>,
    p: u32,
    syndrome: AethSyndrome,
) {
    let mut hdr = TransportHdr::new(bth(qp, Opcode::Acknowledge, p));
    hdr.aeth = Some(Aeth {
        syndrome,
        msn: qp.resp.msn,
    });
    if qp.resp.pending_ack.is_some_and(|a| psn::diff(a, p) <= 0) {
        qp.resp.pending_ack = None;
    }
    out.push(reply(qp, core, hdr, PayloadData::Empty));
}

/// A response packet back to the connected peer.
pub(super) fn reply(
    qp: &QpCtx,
    core: &mut Core,
    hdr: TransportHdr,
    payload: PayloadData,
) -> Packet {
    core.stats.tx_packets += 1;
    let av = &qp.attr.ah_attr;
    Packet {
        flow_label: av.flow_label,
        traffic_class: av.traffic_class,
        hop_limit: av.hop_limit,
        udp_sport: crate::wire::udp_source_port(av.flow_label, qp.qpn, qp.attr.dest_qp_num),
        ..Packet::new(
            core.sgid(qp.attr.port_num, av.sgid_index),
            av.dgid,
            hdr,
            payload,
        )
    }
}

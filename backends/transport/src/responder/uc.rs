//! UC reception: no ACKs, no NAKs; a gap drops the rest of the message.

use portverbs_hal::wc::{WcOpcode, WcStatus};

use super::super::Core;
use super::super::hca::Hca;
use super::super::packet::{Packet, psn};
use super::super::qp::{InMsg, QpCtx};
use super::recv::{complete_recv, scatter_recv, take_recv};
use super::ud::drop_too_long;
use super::write::{open_write, place_write};
use super::{ends, length_ok, sequence_ok};
use crate::wire::Position;

/// UC: no ACKs, no NAKs; a gap drops the rest of the message (as Linux `rxe_resp.c`).
pub(super) fn on_uc<H: Hca + ?Sized>(qp: &mut QpCtx, core: &mut Core, hca: &mut H, pkt: &Packet) {
    let p = pkt.hdr.bth.psn;
    let k = pkt.psn_count();
    let op = pkt.hdr.bth.opcode;
    let starts = matches!(op.position(), Some(Position::First | Position::Only));
    if p != qp.resp.epsn || qp.resp.drop_msg {
        if starts {
            qp.resp.drop_msg = false;
            qp.resp.msg = None;
        } else {
            qp.resp.drop_msg = true;
            qp.resp.epsn = psn::add(p, k);
            core.stats.dropped += 1;
            return;
        }
    }
    if !sequence_ok(qp, op) || !length_ok(qp, core, pkt) {
        qp.resp.msg = None;
        qp.resp.drop_msg = true;
        qp.resp.epsn = psn::add(p, k);
        return;
    }
    if op.is_send() {
        if starts && !matches!(take_recv(qp, hca), Ok(true)) {
            qp.resp.drop_msg = !ends(pkt);
            qp.resp.epsn = psn::add(p, k);
            core.stats.dropped += 1;
            return;
        }
        if starts {
            qp.resp.msg = Some(InMsg::Send);
            qp.resp.offset = 0;
        }
        match scatter_recv(qp, core, pkt, 0) {
            Ok(()) => {
                qp.resp.offset += pkt.payload.len() as u64;
                if ends(pkt) {
                    let len = qp.resp.offset as u32;
                    complete_recv(qp, core, hca, WcStatus::Success, WcOpcode::Recv, pkt, len);
                    qp.resp.msg = None;
                }
            }
            Err(WcStatus::LocLenErr) => {
                drop_too_long(qp, core, hca, pkt);
                qp.resp.drop_msg = !ends(pkt);
            }
            Err(status) => {
                complete_recv(qp, core, hca, status, WcOpcode::Recv, pkt, 0);
                qp.resp.msg = None;
                qp.resp.drop_msg = true;
            }
        }
        qp.resp.epsn = psn::add(p, k);
    } else if op.is_write() {
        let ends_msg = ends(pkt);
        if ends_msg && pkt.train_last.has_imm() && !matches!(take_recv(qp, hca), Ok(true)) {
            qp.resp.msg = None;
            qp.resp.epsn = psn::add(p, k);
            return;
        }
        if starts && open_write(qp, core, pkt).is_err() {
            // UC: silently dropped.
            qp.resp.drop_msg = !ends_msg;
            qp.resp.epsn = psn::add(p, k);
            core.stats.dropped += 1;
            return;
        }
        if place_write(qp, core, hca, pkt, ends_msg).is_err() {
            // UC: a message that does not fit its RETH length is silently dropped.
            qp.resp.msg = None;
            qp.resp.drop_msg = !ends_msg;
            core.stats.dropped += 1;
        }
        qp.resp.epsn = psn::add(p, k);
    }
}

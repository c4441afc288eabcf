//! `destroy`: what Linux sends when a cm_id is destroyed in each state (`cm.c`'s
//! `cm_destroy_id`), then the
//! endpoint is freed at once or after TIMEWAIT. Nothing is ever left behind: a destroyed
//! endpoint either is free or holds a TIMEWAIT timer that frees it.

use super::{CmAgent, CmId, CmState};
use crate::CmError;
use crate::wire::{CmMessage, MsgKind, Rej, RejReason, SidrStatus};

impl CmAgent {
    /// Destroys an endpoint in any state: REJ Timeout (active, waiting for REP), REJ consumer
    /// reject (passive before RTU), a single DREQ (connected), a DREP (DREQ received) or a
    /// SIDR_REP "rejected", as Linux does. No event is delivered for it afterwards.
    pub fn destroy(&mut self, now: u64, id: CmId) -> Result<(), CmError> {
        let index = self.table.by_handle(id).ok_or(CmError::UnknownId(id))?;
        let Some(c) = self.table.conn_mut(index) else {
            return Err(CmError::UnknownId(id));
        };
        c.user = false;
        c.outcome_pending = false;
        let state = c.state;
        match state {
            CmState::Idle | CmState::Listen => self.release(index),
            CmState::ReqSent | CmState::MraReqRcvd => {
                self.cancel(index);
                let mut ari = [0u8; 72];
                ari[..8].copy_from_slice(&self.cfg.ca_guid.to_be_bytes());
                self.send_rej(index, id.0, MsgKind::Other, RejReason::Timeout, 8, ari);
                self.set_state(index, CmState::Idle);
            }
            CmState::ReqRcvd | CmState::MraReqSent => {
                let local = if state == CmState::ReqRcvd { 0 } else { id.0 };
                self.send_rej(
                    index,
                    local,
                    MsgKind::Req,
                    RejReason::ConsumerReject,
                    0,
                    [0; 72],
                );
                self.set_state(index, CmState::Idle);
            }
            CmState::RepSent | CmState::MraRepRcvd => {
                self.cancel(index);
                self.send_rej(
                    index,
                    id.0,
                    MsgKind::Other,
                    RejReason::ConsumerReject,
                    0,
                    [0; 72],
                );
                self.enter_timewait(index, now);
            }
            CmState::RepRcvd | CmState::MraRepSent => {
                self.send_rej(
                    index,
                    id.0,
                    MsgKind::Rep,
                    RejReason::ConsumerReject,
                    0,
                    [0; 72],
                );
                self.set_state(index, CmState::Idle);
            }
            CmState::Established => {
                // One DREQ, no retransmission, straight to TIMEWAIT.
                self.send_dreq(index, now, [0; 220], false);
                self.enter_timewait(index, now);
            }
            CmState::DreqSent => {
                self.cancel(index);
                self.enter_timewait(index, now);
            }
            CmState::DreqRcvd => {
                self.send_drep(index, [0; 224]);
                self.enter_timewait(index, now);
            }
            // Freed when TIMEWAIT ends.
            CmState::Timewait => {}
            CmState::SidrReqSent => {
                self.cancel(index);
                self.set_state(index, CmState::Idle);
            }
            CmState::SidrReqRcvd => {
                self.send_sidr_rep(index, SidrStatus::Rejected, 0, 0, [0; 136]);
                self.set_state(index, CmState::Idle);
            }
        }
        Ok(())
    }

    /// Sends a REJ for endpoint `index` to its peer, with the connection's TID.
    pub(super) fn send_rej(
        &mut self,
        index: u32,
        local: u32,
        msg: MsgKind,
        reason: RejReason,
        ari_len: u8,
        ari: [u8; 72],
    ) {
        let Some(c) = self.table.conn(index) else {
            return;
        };
        let rej = Rej {
            local_comm_id: local,
            remote_comm_id: c.remote_id,
            msg_rejected: msg,
            ari_len,
            reason,
            ari,
            private_data: [0; 148],
        };
        let (to, tid) = (c.path.remote_gid, c.tid);
        self.send(to, tid, CmMessage::Rej(rej));
    }
}

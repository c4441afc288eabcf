//! QP1's MAD transport: the receive buffers posted on the GSI QP (each read into the agent
//! and posted again), the MADs posted from the send slots, an address handle per peer, and
//! the traffic counters ([`MadCounts`](super::MadCounts)).
//!
//! It must not decide what is sent or when: the agent makes the MADs, the pacer and the
//! transition gate hold them, and this file posts what reaches `State::unsent`, in order. Nor
//! does it interpret a MAD: a receive goes to the agent as exactly the datagram that arrived.

use std::time::Duration;

use portverbs_hal::Device;
use portverbs_verbs::{
    AddressVector, RecvWr, SendOp, SendWr, SpecialQp, UdDest, WcStatus, WorkCompletion,
};

use super::{CmDevice, State, lock};
use crate::{RdmaCmEvent, ServiceError, addr};
use portverbs_cm::OutMad;
use portverbs_cm::wire::MAD_LEN;

/// Receive buffers on QP1: as many as Linux's MAD layer keeps posted (512). A UD datagram
/// that finds none is dropped, and a burst of CM messages (a client disconnecting hundreds of
/// connections at once) is then recovered only by the sender's retransmissions, seconds
/// later; with 128, 300 DREQs at once took 20 s to 60 s to settle.
pub(super) const RECV_SLOTS: usize = 512;
/// Send buffers on QP1.
pub(super) const SEND_SLOTS: usize = 64;
/// The GRH area in front of a UD receive.
const GRH: usize = 40;
const RECV_SLOT: usize = GRH + MAD_LEN;
pub(super) const SEND_BASE: usize = RECV_SLOTS * RECV_SLOT;

impl<D: Device> CmDevice<D> {
    /// Drives the device until every MAD it has queued or posted has left QP1 (each send
    /// completed), or `timeout` passes; `Ok(true)` when everything left. This layer has no
    /// thread, so a process about to exit calls it: a DREP or REJ its last call queued would
    /// otherwise go with the process.
    ///
    /// # Errors
    /// QP1 failed (the device is gone).
    pub fn flush(&self, timeout: Duration) -> Result<bool, ServiceError> {
        // The wait every blocking call uses: on QP1's CQ, driving the device on each wake.
        let sent = |st: &mut State<D>| {
            (st.pacer.held() == 0 && st.unsent.is_empty() && st.free_send.len() == SEND_SLOTS)
                .then_some(())
        };
        match self.wait_blocking(Some(timeout), sent) {
            Ok(()) => Ok(true),
            Err(ServiceError::TimedOut) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Address handles QP1's sends keep (one per recent peer, at most 256: see the crate
    /// docs, "What is bounded").
    pub fn address_handles(&self) -> usize {
        lock(&self.shared.state).ahs.len()
    }

    pub(super) fn post_recv(&self, slot: usize) -> Result<(), ServiceError> {
        let sge = self
            .shared
            .mr
            .sge(slot * RECV_SLOT, RECV_SLOT)
            .map_err(|e| ServiceError::verbs("QP1 receive buffer", e))?;
        self.shared
            .qp1
            .post_recv(&[RecvWr {
                wr_id: slot as u64,
                sges: &[sge],
            }])
            .map_err(|e| ServiceError::verbs("posting a QP1 receive", e))
    }

    pub(super) fn completion(
        &self,
        st: &mut State<D>,
        now: u64,
        wc: &WorkCompletion,
    ) -> Result<(), ServiceError> {
        let slot = usize::try_from(wc.wr_id).unwrap_or(usize::MAX);
        if slot >= RECV_SLOTS {
            if wc.status != WcStatus::Success {
                st.send_errors += 1;
            }
            st.free_send.push(slot - RECV_SLOTS);
            return Ok(());
        }
        match wc.status {
            WcStatus::Success => {
                // Only the bytes that arrived: a UD receive's byte count covers the GRH area
                // and the datagram. The rest of the buffer is what an earlier MAD left there.
                let len = usize::try_from(wc.byte_len).map_or(RECV_SLOT, |n| n.min(RECV_SLOT));
                let mut buf = [0u8; RECV_SLOT];
                self.shared
                    .mr
                    .read(slot * RECV_SLOT, &mut buf[..len])
                    .map_err(|e| ServiceError::verbs("reading a MAD", e))?;
                st.mads_in += 1;
                let mut grh = [0u8; GRH];
                grh.copy_from_slice(&buf[..GRH]);
                if wc.src_qp == SpecialQp::GSI_QPN {
                    // Exactly the datagram: anything but a whole 256-byte MAD is malformed,
                    // counted by the agent and dropped.
                    let _ = st.agent.handle_mad(
                        now,
                        addr::source_gid(&grh),
                        buf.get(GRH..len).unwrap_or_default(),
                    );
                } else {
                    st.not_from_qp1 += 1;
                }
                // Nothing of this MAD stays for the next one to be read with.
                self.shared
                    .mr
                    .write(slot * RECV_SLOT, &[0u8; RECV_SLOT][..len])
                    .map_err(|e| ServiceError::verbs("clearing a QP1 receive buffer", e))?;
            }
            WcStatus::WrFlushErr => {
                // QP1 went to ERR: the device is gone (or failed). Every endpoint hears it
                // once, and every wait returns.
                if !st.removed {
                    st.removed = true;
                    for q in st.events.values_mut() {
                        q.push_back(RdmaCmEvent::DeviceRemoval);
                    }
                }
                return Ok(());
            }
            other => {
                st.recv_errors += 1;
                tracing::debug!(?other, "QP1 receive failed");
            }
        }
        self.post_recv(slot)
    }

    pub(super) fn flush_unsent(&self, st: &mut State<D>) -> Result<(), ServiceError> {
        if st.unsent.is_empty() && st.unsent.capacity() > SEND_SLOTS {
            // A burst of answers (a flood of DREQs from strangers) leaves no lasting
            // footprint.
            st.unsent.shrink_to(SEND_SLOTS);
        }
        let mut posted = false;
        while !st.unsent.is_empty() {
            let Some(slot) = st.free_send.pop() else {
                break;
            };
            let Some(m) = st.unsent.pop_front() else {
                st.free_send.push(slot);
                break;
            };
            if let Err(e) = self.send_mad(st, slot, &m) {
                st.free_send.push(slot);
                return Err(e);
            }
            posted = true;
        }
        if posted && self.shared.ctx.progress() == portverbs_hal::Progress::Manual {
            // A manual device may hold what a post produced for its caller's next poll: the
            // MADs leave now, whether or not the application calls again (a DREP, a REJ).
            self.shared.ctx.dispatch();
        }
        Ok(())
    }

    fn send_mad(&self, st: &mut State<D>, slot: usize, m: &OutMad) -> Result<(), ServiceError> {
        let ah = st.ahs.get(m.to, || {
            self.shared
                .pd
                .create_ah_blocking(AddressVector {
                    dgid: m.to,
                    is_global: true,
                    sgid_index: self.shared.gid_index,
                    hop_limit: 64,
                    port_num: self.shared.port,
                    ..AddressVector::default()
                })
                .map_err(|e| ServiceError::verbs("address handle to a CM peer", e))
        })?;
        let at = SEND_BASE + slot * MAD_LEN;
        self.shared
            .mr
            .write(at, &m.mad)
            .map_err(|e| ServiceError::verbs("writing a MAD", e))?;
        let sge = [self
            .shared
            .mr
            .sge(at, MAD_LEN)
            .map_err(|e| ServiceError::verbs("QP1 send buffer", e))?];
        let dest = UdDest {
            ah_pd: None,
            av: ah.av(),
            remote_qpn: SpecialQp::GSI_QPN,
            remote_qkey: SpecialQp::GSI_QKEY,
        };
        let wr = SendWr::new((RECV_SLOTS + slot) as u64, SendOp::Send)
            .sges(&sge)
            .ud(dest)
            .signaled();
        self.shared
            .qp1
            .post_send(&[wr])
            .map_err(|e| ServiceError::verbs("posting a MAD", e))?;
        st.mads_out += 1;
        Ok(())
    }
}

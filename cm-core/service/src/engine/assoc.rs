//! Which QP belongs to which connection: the association made when the application hands
//! the CM a QP (and its INIT transition), undone when the connection ends, and the QPs the
//! application destroyed noticed and their connections aborted.
//!
//! It must not hold a QP alive: the CM keeps weak handles only, so `Qp::destroy` is never
//! refused because of an association. Nor may a QP stay associated once its endpoint is
//! gone, or a released QP's move to ERR be waited for (it runs in the background).

use std::time::Duration;

use portverbs_hal::Device;
use portverbs_verbs::{Qp, QpState, WeakQp};

use super::{CmDevice, State, lock};
use crate::transition::{self, Transition};
use crate::{RdmaCmEvent, ServiceError};
use portverbs_cm::{CmId, CmState};

/// The longest a destroyed QP goes unnoticed when the context's QP count alone does not
/// show it ([`CmDevice::reap_due`]).
pub(super) const REAP_EVERY: Duration = Duration::from_millis(100);

impl<D: Device> CmDevice<D> {
    /// QPs associated with a connection.
    pub fn associated_qps(&self) -> usize {
        lock(&self.shared.state).qps.len()
    }

    /// Associates `qp` with connection `id` (atomic with respect to every other
    /// association of this device) and takes it to INIT if it is in RESET; a QP associated
    /// with `id` already is left as it is. The INIT command
    /// runs outside the device lock, so other connections' progress does not wait for it;
    /// if it fails, the association is undone.
    pub(crate) async fn associate(&self, id: CmId, qp: &Qp<D>) -> Result<(), ServiceError> {
        let qpn = qp.qp_num();
        if qp.qp_type() != portverbs_hal::types::QpType::Rc {
            return Err(ServiceError::NotRc(qpn));
        }
        {
            let mut st = self.state();
            if let Some((owner, weak)) = st.qps.get(&qpn) {
                if weak.upgrade().is_some() {
                    if *owner == id && st.qp_of.get(&id) == Some(&qpn) {
                        // Associated already ([`crate::Connector::init_qp`]).
                        return Ok(());
                    }
                    return Err(ServiceError::QpInUse(qpn));
                }
                // The QP number of a destroyed QP, reused: that connection is over.
                self.reap_dead(&mut st);
            }
            if let Some(&other) = st.qp_of.get(&id) {
                // The endpoint has another QP, alive ([`crate::Connector::init_qp`]).
                let live =
                    |(owner, weak): &(CmId, WeakQp<D>)| *owner == id && weak.upgrade().is_some();
                if other != qpn && st.qps.get(&other).is_some_and(live) {
                    return Err(ServiceError::WrongQp(qpn));
                }
            }
            st.qps.insert(qpn, (id, qp.downgrade()));
            st.qp_of.insert(id, qpn);
        }
        if qp.state() != QpState::Reset {
            return Ok(());
        }
        let (attr, mask) = transition::init(self.shared.port);
        if let Err(e) = qp.modify(&attr, mask).await {
            let mut st = self.state();
            if st.qps.get(&qpn).is_some_and(|(owner, _)| *owner == id) {
                st.qps.remove(&qpn);
                st.qp_of.remove(&id);
            }
            return Err(ServiceError::ConnectError(e.to_string()));
        }
        Ok(())
    }

    /// Ends the association of `id`'s QP: forgotten, and moved to ERR without waiting.
    pub(crate) fn release_qp(&self, st: &mut State<D>, id: CmId) {
        let qpn = st
            .qp_of
            .remove(&id)
            .filter(|qpn| st.qps.get(qpn).is_some_and(|(owner, _)| *owner == id));
        let Some(qp) = qpn
            .and_then(|qpn| st.qps.remove(&qpn))
            .and_then(|(_, weak)| weak.upgrade())
        else {
            return;
        };
        if let Some((attr, mask)) = transition::error(&qp) {
            st.background.push(Transition::start(id, qp, attr, mask));
            self.poll_background(st);
        }
    }

    /// Aborts the connections whose QP the application destroyed (the CM holds only weak handles):
    /// the endpoint is destroyed in the agent, which sends the REJ or DREQ its state calls
    /// for, and the application's endpoint gets DISCONNECTED (it was connected) or
    /// CONNECT_ERROR (it was being set up). True when an event was queued.
    pub(super) fn reap_dead(&self, st: &mut State<D>) -> bool {
        let dead: Vec<(u32, CmId)> = st
            .qps
            .iter()
            .filter(|(_, (_, weak))| weak.upgrade().is_none())
            .map(|(qpn, (id, _))| (*qpn, *id))
            .collect();
        let now = self.now();
        for &(qpn, id) in &dead {
            st.qps.remove(&qpn);
            if st.qp_of.get(&id) == Some(&qpn) {
                st.qp_of.remove(&id);
            }
            let connected = matches!(
                st.agent.state(id),
                Some(CmState::Established | CmState::DreqSent | CmState::DreqRcvd)
            );
            let _ = st.agent.destroy(now, id);
            if let Some(q) = st.events.get_mut(&id) {
                q.push_back(if connected {
                    RdmaCmEvent::Disconnected
                } else {
                    RdmaCmEvent::ConnectError {
                        detail: format!("QP {qpn:#x} was destroyed"),
                    }
                });
                if let Some(r) = st.ready.as_mut() {
                    r.push(id);
                }
            }
        }
        !dead.is_empty()
    }

    /// Whether [`CmDevice::reap_dead`] should look at every association now: when the
    /// context has fewer live QPs than at the last look (one was destroyed), and at least
    /// every [`REAP_EVERY`] besides (a QP destroyed and another created between two looks
    /// leave the count as it was). Checking all of them on every progress made each call
    /// cost as much as the connections held.
    pub(super) fn reap_due(&self, st: &mut State<D>, now: u64) -> bool {
        let live = self.shared.ctx.object_counts().qps;
        let fewer = live < st.qps_seen;
        st.qps_seen = live;
        if fewer || now.saturating_sub(st.reaped_at) >= REAP_EVERY.as_nanos() as u64 {
            st.reaped_at = now;
            return !st.qps.is_empty();
        }
        false
    }
}

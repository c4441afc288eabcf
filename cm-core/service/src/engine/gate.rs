//! The transition gate: the RTR, RTS and ERR transitions the agent asks for, started on the
//! connection's QP; one the device has not finished is parked in `State::gate` and polled on
//! every progress, and the agent's later outputs wait behind it. Released QPs' moves to ERR
//! are polled here too, gating nothing.
//!
//! It must not wait for a device command (a transition is polled, never blocked on), nor let
//! an output pass a transition still in flight. How a transition is built and polled is
//! `crate::transition`'s.

use std::task::{Poll, Waker};

use portverbs_hal::Device;

use super::{CmDevice, State};
use crate::RdmaCmEvent;
use crate::transition::{self, Transition};
use portverbs_cm::{CmId, QpAction, QpTarget};

impl<D: Device> State<D> {
    /// Whether a QP transition for `id` is still in flight on the device.
    pub(crate) fn transition_pending(&self, id: CmId) -> bool {
        self.gate.as_ref().is_some_and(|t| t.id == id)
    }
}

impl<D: Device> CmDevice<D> {
    /// Starts the QP transition the agent asked for on the QP associated with its
    /// connection; one the device does not finish at once becomes the gate.
    pub(super) fn apply(&self, st: &mut State<D>, a: QpAction) {
        let Some((id, weak)) = st.qps.get(&a.qpn) else {
            return;
        };
        if *id != a.id {
            return;
        }
        // A QP already destroyed is reaped (and its connection aborted) by progress.
        let Some(qp) = weak.upgrade() else {
            return;
        };
        let (attr, mask) = match a.target {
            QpTarget::Rtr(r) => transition::rtr(&r, self.shared.port, self.shared.gid_index),
            QpTarget::Rts(r) => transition::rts(&r),
            QpTarget::Error => match transition::error(&qp) {
                Some(x) => x,
                None => return,
            },
        };
        let mut t = Transition::start(a.id, qp, attr, mask);
        match t.poll(self.waker()) {
            Poll::Ready(r) => {
                self.transition_done(st, a.id, r);
            }
            Poll::Pending => {
                st.deferred += 1;
                st.gate = Some(t);
            }
        }
    }

    /// A transition for `id` finished: a failure is the connection's CONNECT_ERROR. True
    /// when an event was queued.
    pub(super) fn transition_done(
        &self,
        st: &mut State<D>,
        id: CmId,
        r: Result<(), portverbs_verbs::ModifyQpError>,
    ) -> bool {
        let Err(e) = r else {
            return false;
        };
        tracing::debug!(?id, error = %e, "QP transition for the CM failed");
        let Some(q) = st.events.get_mut(&id) else {
            return false;
        };
        q.push_back(RdmaCmEvent::ConnectError {
            detail: e.to_string(),
        });
        if let Some(r) = st.ready.as_mut() {
            r.push(id);
        }
        true
    }

    /// Polls the released QPs' moves to ERR.
    pub(super) fn poll_background(&self, st: &mut State<D>) {
        if st.background.is_empty() {
            return;
        }
        let waker = self.waker();
        st.background.retain_mut(|t| match t.poll(waker) {
            Poll::Pending => true,
            Poll::Ready(r) => {
                if let Err(e) = r {
                    tracing::debug!(qpn = t.qpn(), error = %e, "moving a released QP to ERR");
                }
                false
            }
        });
    }

    /// A waker that wakes this device's async waiters (for device commands in flight).
    pub(super) fn waker(&self) -> &Waker {
        &self.shared.waker
    }
}

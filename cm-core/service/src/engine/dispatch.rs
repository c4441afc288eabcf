//! The agent's outputs acted on, in the order the agent made them: MADs offered to the
//! pacer and queued for QP1, QP transitions handed to the gate, and events routed to the
//! application's endpoints and listeners (a listener's admission checks included).
//!
//! It must not reorder outputs or take one past a transition still in flight (the gate holds
//! them in the agent), and must not post to QP1 or modify a QP itself: `qp1` and `gate` do.

use std::net::{IpAddr, SocketAddr};
use std::task::Poll;

use portverbs_hal::Device;

use super::{CmDevice, ListenState, Pending, State};
use crate::{RdmaCmEvent, ServiceError};
use portverbs_cm::wire::CmaHeader;
use portverbs_cm::{CmEvent, CmId, CmOutput};

impl<D: Device> CmDevice<D> {
    /// Destroys the endpoints `ids` in whatever state (the agent sends the REJ, DREQ or DREP
    /// Linux would), forgets their QP associations and queued events, and acts on the agent's
    /// outputs. For handles being dropped: nothing is reported, as a drop cannot report.
    pub(crate) fn destroy_endpoints(&self, st: &mut State<D>, ids: impl IntoIterator<Item = CmId>) {
        let now = self.now();
        for id in ids {
            let _ = st.agent.destroy(now, id);
            self.release_qp(st, id);
            st.events.remove(&id);
        }
        let _ = self.drain(st);
    }

    /// Acts on the agent's outputs in order; true when an application event was queued.
    /// Outputs after a transition still in flight stay queued in the agent until it is done.
    pub(crate) fn drain(&self, st: &mut State<D>) -> Result<bool, ServiceError> {
        let mut woke = false;
        // The agent moved (a call, MADs, timers): answered requests free window places.
        st.pacer.agent_moved();
        st.pacer.release(&st.agent, &mut st.unsent);
        loop {
            if let Some(mut t) = st.gate.take() {
                match t.poll(self.waker()) {
                    Poll::Ready(r) => woke |= self.transition_done(st, t.id, r),
                    Poll::Pending => {
                        st.gate = Some(t);
                        break;
                    }
                }
            }
            let Some(out) = st.agent.poll_output() else {
                break;
            };
            match out {
                CmOutput::Send(m) => {
                    if let Some(m) = st.pacer.offer(&st.agent, m) {
                        st.unsent.push_back(m);
                    }
                }
                CmOutput::Qp(a) => {
                    self.flush_unsent(st)?;
                    self.apply(st, a);
                }
                CmOutput::Event(e) => {
                    self.route(st, e);
                    woke = true;
                }
            }
        }
        self.flush_unsent(st)?;
        Ok(woke)
    }

    /// Puts an agent event where the application finds it.
    fn route(&self, st: &mut State<D>, e: CmEvent) {
        let now = self.now();
        let (id, ev) = match e {
            CmEvent::ConnectRequest { id, request } => {
                let admitted = st
                    .listeners
                    .get(&request.listener)
                    .and_then(|l| admit(l, &request));
                match (admitted, st.listeners.get_mut(&request.listener)) {
                    (Some(p), Some(l)) => l.pending.push_back(Pending { id, ..p }),
                    // What a Linux passive side does when its checks fail: the new ID is
                    // destroyed in REQ_RCVD, which sends REJ 28 with no private data.
                    _ => {
                        let _ = st.agent.destroy(now, id);
                    }
                }
                return;
            }
            CmEvent::SidrRequest {
                id,
                listener,
                private_data,
                ..
            } => {
                let admitted = st
                    .listeners
                    .get(&listener)
                    .and_then(|l| crate::api::admit_sidr(l, id, &private_data));
                match (admitted, st.listeners.get_mut(&listener)) {
                    (Some(p), Some(l)) => l.sidr.push_back(p),
                    // Not a UDP listener, its backlog full, or its CMA header refused: the
                    // endpoint goes, which answers SIDR_REP "rejected" as Linux does.
                    _ => {
                        let _ = st.agent.destroy(now, id);
                    }
                }
                return;
            }
            CmEvent::SidrResolved {
                id,
                status,
                qpn,
                qkey,
                private_data,
            } => (
                id,
                RdmaCmEvent::ServiceResolved {
                    status,
                    qpn,
                    qkey,
                    private_data,
                },
            ),
            CmEvent::Established { id, private_data } => {
                (id, RdmaCmEvent::Established { private_data })
            }
            CmEvent::Rejected {
                id,
                reason,
                private_data,
            } => (
                id,
                RdmaCmEvent::Rejected {
                    reason,
                    private_data,
                },
            ),
            CmEvent::Unreachable { id } => (id, RdmaCmEvent::Unreachable),
            CmEvent::Disconnected { id } => (id, RdmaCmEvent::Disconnected),
            CmEvent::TimewaitExit { id } => (id, RdmaCmEvent::TimewaitExit),
        };
        if matches!(ev, RdmaCmEvent::Rejected { .. }) && !st.events.contains_key(&id) {
            // A request still in a listener's queue (the application never took it) that its
            // sender withdrew, or that the agent withdrew once its sender must have given up:
            // it leaves the backlog, and its endpoint goes.
            let mut queued = false;
            for l in st.listeners.values_mut() {
                let before = l.pending.len() + l.sidr.len();
                l.pending.retain(|p| p.id != id);
                l.sidr.retain(|s| s.id != id);
                queued |= l.pending.len() + l.sidr.len() != before;
            }
            if queued {
                let _ = st.agent.destroy(now, id);
                return;
            }
        }
        if matches!(
            ev,
            RdmaCmEvent::Rejected { .. } | RdmaCmEvent::Unreachable | RdmaCmEvent::TimewaitExit
        ) {
            // The connection is over: its QP is flushed and free for another.
            self.release_qp(st, id);
        }
        if let Some(q) = st.events.get_mut(&id) {
            q.push_back(ev);
            if let Some(r) = st.ready.as_mut() {
                r.push(id);
            }
        }
    }
}

/// The passive side's checks on a REQ (as Linux `cma.c`'s `cma_ib_req_handler`): a CMA header
/// of version 0 with IP
/// version 4 or 6, whose destination matches the listener's bound address and family, a
/// source address that is not unspecified or multicast, and room in the backlog.
fn admit(l: &ListenState, r: &portverbs_cm::ConnectRequest) -> Option<Pending> {
    let h = CmaHeader::parse(&r.private_data).ok()?;
    if l.pending.len() >= l.backlog {
        return None;
    }
    let bound = l.bound.ip();
    if h.src.is_ipv4() != h.dst.is_ipv4() || bound.is_ipv4() != h.dst.is_ipv4() {
        return None;
    }
    if !bound.is_unspecified() && bound != h.dst {
        return None;
    }
    if h.src.is_unspecified() || h.src.is_multicast() {
        return None;
    }
    if let IpAddr::V4(v4) = h.src {
        if v4.is_broadcast() {
            return None;
        }
    }
    Some(Pending {
        id: r.listener,
        remote: SocketAddr::new(h.src, h.src_port),
        local: SocketAddr::new(h.dst, l.bound.port()),
        private_data: r.private_data[portverbs_cm::wire::CMA_HEADER_LEN..].to_vec(),
        responder_resources: r.responder_resources,
        initiator_depth: r.initiator_depth,
    })
}

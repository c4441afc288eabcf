//! Per-endpoint state: one fixed-size [`Conn`] per slot of the agent's table, no heap
//! allocation of its own (the two MAD buffers are inline: about 0.6 KiB per endpoint).

use portverbs_hal::Gid;

use super::types::CmState;
use crate::wire::MAD_LEN;

/// Which timer an endpoint runs (at most one at a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TimerKind {
    /// Retransmit `retx` (REQ, REP, DREQ or SIDR_REQ) or give up.
    Retransmit,
    /// Leave TIMEWAIT.
    Timewait,
    /// Withdraw a connection request nobody answered: its sender has given up by now.
    Withdraw,
}

/// What the passive side keeps from the REQ until `accept`, and both sides keep for the QP.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PathState {
    pub(crate) local_gid: Gid,
    pub(crate) remote_gid: Gid,
    pub(crate) flow_label: u32,
    pub(crate) traffic_class: u8,
    pub(crate) hop_limit: u8,
    pub(crate) sl: u8,
    pub(crate) path_mtu: u8,
    pub(crate) pkey: u16,
}

/// One connection endpoint.
#[derive(Debug, Clone)]
pub(crate) struct Conn {
    pub(crate) state: CmState,
    /// The application still holds the handle (not destroyed).
    pub(crate) user: bool,
    /// `connect`/`accept` called and its outcome not delivered yet.
    pub(crate) outcome_pending: bool,
    /// Established was delivered (so a teardown delivers Disconnected).
    pub(crate) connected: bool,
    /// Disconnected was delivered.
    pub(crate) disconnect_reported: bool,
    /// The peer's communication ID (0 until known).
    pub(crate) remote_id: u32,
    pub(crate) remote_guid: u64,
    pub(crate) remote_qpn: u32,
    pub(crate) local_qpn: u32,
    pub(crate) service_id: u64,
    /// Transaction ID of the connection's messages (the REQ's).
    pub(crate) tid: u64,
    /// Transaction ID of the DREQ we answer.
    pub(crate) dreq_tid: u64,
    /// Keys under which the endpoint sits in the agent's lookup maps.
    pub(crate) in_remote_map: bool,
    pub(crate) in_qpn_map: bool,
    pub(crate) in_sidr_map: bool,
    pub(crate) listener: bool,
    pub(crate) path: PathState,
    /// Our starting PSN / the peer's.
    pub(crate) rq_psn: u32,
    pub(crate) sq_psn: u32,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry: u8,
    pub(crate) max_cm_retries: u8,
    pub(crate) packet_life_time: u8,
    /// The local ACK timeout of the path (QP timeout, TIMEWAIT length).
    pub(crate) av_timeout: u8,
    /// The application's QP ACK timeout, in place of `av_timeout` for the QP only.
    pub(crate) qp_timeout: Option<u8>,
    /// The peer's "local CM response timeout" (passive: REP retransmission interval).
    pub(crate) peer_response_timeout: u8,
    pub(crate) retx_interval_ns: u64,
    pub(crate) retries_left: u8,
    /// When the outstanding request is given up at the latest ([`crate::time::MAX_WAIT_NS`]
    /// after it first left, plus what an MRA asked for).
    pub(crate) give_up_at: u64,
    /// The application's limit on an outstanding REQ ([`crate::ConnectParams::give_up_at`];
    /// `u64::MAX`: none): `give_up_at` never passes it, an MRA notwithstanding. Lifted when
    /// the connect has its outcome.
    pub(crate) req_deadline: u64,
    /// A received request's withdrawal was pushed out once for the MRA we sent.
    pub(crate) mra_extended: bool,
    pub(crate) timer: Option<(u64, TimerKind)>,
    /// Bumped on every timer change and kept across reuse: heap entries carry it.
    pub(crate) timer_seq: u32,
    /// The retransmitted MAD.
    pub(crate) retx: [u8; MAD_LEN],
    /// The last sent-once MAD re-sent on a duplicate (MRA, RTU, DREP).
    pub(crate) reply: [u8; MAD_LEN],
    pub(crate) has_reply: bool,
}

impl Default for Conn {
    fn default() -> Self {
        Self {
            state: CmState::Idle,
            user: false,
            outcome_pending: false,
            connected: false,
            disconnect_reported: false,
            remote_id: 0,
            remote_guid: 0,
            remote_qpn: 0,
            local_qpn: 0,
            service_id: 0,
            tid: 0,
            dreq_tid: 0,
            in_remote_map: false,
            in_qpn_map: false,
            in_sidr_map: false,
            listener: false,
            path: PathState::default(),
            rq_psn: 0,
            sq_psn: 0,
            responder_resources: 0,
            initiator_depth: 0,
            retry_count: 0,
            rnr_retry: 0,
            max_cm_retries: 0,
            packet_life_time: 0,
            av_timeout: 0,
            qp_timeout: None,
            peer_response_timeout: 0,
            retx_interval_ns: 0,
            retries_left: 0,
            give_up_at: 0,
            req_deadline: u64::MAX,
            mra_extended: false,
            timer: None,
            timer_seq: 0,
            retx: [0; MAD_LEN],
            reply: [0; MAD_LEN],
            has_reply: false,
        }
    }
}

impl Conn {
    /// A fresh endpoint in a reused slot: everything reset but the timer sequence.
    pub(crate) fn reset(&mut self) {
        let seq = self.timer_seq;
        *self = Self::default();
        self.timer_seq = seq.wrapping_add(1);
    }
}

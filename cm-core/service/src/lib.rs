//! # Portverbs CM service
//!
//! The CM for applications: the sans-IO
//! [`CmAgent`](portverbs_cm::CmAgent) of `portverbs-cm` driven over a device's QP1, with
//! rdma_cm's IP addressing and an application API. The protocol lives in the core; this
//! crate adds what the core must not do: I/O through verbs-core and a monotonic clock.
//!
//! * [`CmDevice`]: one per opened [`Context`] and local IP address, on the port whose GID
//!   table holds that address. It owns QP1 ([`QpInit::gsi`]) with receive buffers posted,
//!   an address handle per peer GID, the agent, and which QP belongs to which connection.
//!   Every call and every wait drives it ([`CmDevice::progress`]): QP1's completions feed the
//!   agent, the agent's outputs are acted on in order (MADs posted on QP1, QP transitions
//!   applied through verbs-core, events queued per connection), and expired CM timers fire
//!   from a monotonic clock read here.
//!   It has no thread of its own, and needs none: it attaches that same work to its verbs
//!   device as a progress agent ([`Context::attach_agent`],
//!   [`portverbs_hal::ProgressAgent`]), which the device runs whenever it progresses — on its
//!   one progress thread in auto progress, inside the application's calls on the device
//!   (any poll, wait or dispatch) in manual progress — after rounds with work and at the
//!   CM's next timer. So a server that computes and makes no call still rejects a REQ for a
//!   service nobody listens on (REJ reason 8, at once), answers a repeated REQ with an MRA,
//!   completes its own disconnects and retransmits; the application still decides what
//!   only it can (accept, reject, disconnect: the DREP to a peer's DREQ goes with the
//!   application's `disconnect`, as with rdma_cm). A device that cannot run agents (a
//!   stepped test fabric, hardware behind VFIO; [`CmDevice::served_by_device`]) leaves the
//!   driving to the calls, as before. The agent never blocks the device's thread: it skips a
//!   round while an application thread holds the CM, and asks to run again a millisecond
//!   later.
//! * [`Listener`] / [`Connector`]: rdma_cm's passive and active sides for RC
//!   (`RDMA_PS_TCP`), each call async with a `_blocking` twin.
//! * [`addr`]: IP ↔ GID for RoCEv2.
//!
//! Waiting: a blocking wait sleeps in [`Cq::wait_notify`] on QP1's CQ, at most until the next
//! CM timer and never more than [`MAX_SLEEP`] (several threads may wait on one device and
//! one of them may consume the completion another is waiting for; the cap bounds that).
//! An async wait awaits QP1's CQ notification or a wake from another waiter's progress, and
//! the next CM timer (retransmissions, TIMEWAIT) through the [`CmTimer`] the application
//! lends with [`CmDevice::set_timer`] (e.g. its runtime's `sleep_until`): this layer has no
//! clock to wake a task with, no thread, and names no runtime or platform. Without a timer,
//! CM timers in async code fire only when something wakes the task (a MAD, another call);
//! [`CmDevice::next_deadline`] then says when an event loop should call
//! [`CmDevice::progress`]. [`CmDevice::run`] is the async driver of a device nobody else
//! waits on.
//!
//! QP transitions: the RTR, RTS and ERR transitions the agent asks for
//! are started as verbs-core's async `modify` and polled, never waited for inside progress.
//! Where the device has not finished (mlx4 in event mode, firmware taking its time), the
//! transition is parked and polled on every progress, its command's completion wakes the
//! async waiters, and the agent's later outputs wait behind it (the REP does not leave before
//! RTR, ESTABLISHED is not reported before RTS). [`Connector::disconnect`] returns once the
//! QP is in ERR. The INIT transition of `accept`/`connect` (or of
//! [`Connector::init_qp`] / [`ConnectionRequest::init_qp`], which take the QP to INIT
//! beforehand, as librdmacm's `rdma_create_qp` does, so that receives can be posted before
//! the connection is up) is part of the caller's own operation: awaited in the async forms,
//! waited for in the blocking ones, and never under the device lock.
//! While a transition is in flight the CM holds the QP, so the application's
//! `Qp::destroy` is refused as busy for that time.
//!
//! What a connection's QP gets: the port's active MTU as path MTU, as Linux's rdma_cm takes
//! the netdev's (the active side's REQ carries it; the passive side takes the smaller of the
//! REQ's and its own port's, so a peer never gets it a larger MTU than its port carries),
//! remote WRITE always and remote READ and atomics only when the QP has responder resources
//! (as Linux `cm.c` grants them), and `max_rd_atomic`/`max_dest_rd_atomic` from the depths
//! negotiated in REQ and REP (by default the device's maximums, as `rdma_connect(id, NULL)`).
//! A side that grants no responder resources leaves its peer an initiator depth of 0: a READ
//! or atomic posted there completes in error without reaching the wire (on the soft device
//! with `LOC_QP_OP_ERR`), never as a silent success.
//!
//! The QP ↔ connection association is one map entry per QP, made and cleared under the
//! device lock. The CM keeps only a weak handle ([`portverbs_verbs::WeakQp`]), so the
//! application may destroy a QP at any time: the next progress finds it gone and destroys
//! the endpoint (REJ during setup, DREQ when connected). A failed device (QP1 flushed) gives
//! every endpoint `DEVICE_REMOVAL` and ends every wait.
//!
//! Many connections in flight from one thread: [`Connector::connect_nowait`],
//! [`ConnectionRequest::accept_nowait`] and [`Listener::try_get_request`] start and return
//! at once, [`Connector::try_connected`] / [`Connector::try_disconnected`] collect the
//! outcome, and [`CmDevice::take_ready`] says which endpoints got an event, so that a
//! caller driving [`CmDevice::progress`] looks only at those (`portverbs cmtime` does this).
//!
//! Pacing: QP1 is UD, and a MAD that finds no receive posted at the peer is lost until a
//! retransmission seconds later. The device therefore keeps at most a window of its own
//! requests (REQ, REP, DREQ, SIDR_REQ, LAP) unanswered on the wire per peer (128 per
//! destination GID, a quarter of a QP1's 512 receives) and holds the rest, in order, until
//! that peer's answers free places (`pacing`); [`MadCounts::paced`] counts what waited. A
//! peer that never answers (a stranger whose forged requests the application accepted)
//! fills only its own window: other peers' REQs and REPs leave at once.
//! A QP the application destroyed is noticed when the context's QP count drops, and at
//! least every 100 ms.
//!
//! What is bounded, against a peer that lies and forges its source address (the agent's own
//! clamps and bounds are in `portverbs-cm`'s crate docs):
//!
//! * A QP1 receive is read up to its completion's byte count (GRH area and datagram), and
//!   the agent gets exactly the datagram: anything but a 256-byte MAD is dropped as
//!   malformed. The buffer is zeroed before it is posted again, so no MAD is ever read with
//!   an earlier one's bytes. A datagram whose source QP is not 1 is dropped
//!   ([`MadCounts::not_from_qp1`]). (Linux's MAD layer takes any IB MAD as 256 bytes, in a
//!   freshly zeroed buffer; dropping is stricter.)
//! * Address handles for QP1's sends: at most 256, the least recently used dropped first
//!   ([`CmDevice::address_handles`]).
//! * Endpoints made for strangers' requests: at most one poll batch (32) at once beyond each
//!   listener's backlog; a queued request its sender withdrew, or that the agent withdrew
//!   once its sender must have given up, leaves the backlog and is freed.
//! * MADs waiting for a send slot: back to 64 after a burst.
//! * MADs waiting for a peer's window: at most 2^17 in all (the application's own requests,
//!   one per endpoint it connects, accepts or disconnects), of which at most 1024 answers
//!   (what a peer's repeated messages can queue behind a waiting request); beyond either, a
//!   MAD is dropped as if lost on the wire and counted ([`MadCounts::pace_dropped`]), and a
//!   retransmission recovers it. A peer's window and queue are freed once they are empty:
//!   within a second, or sooner when the number of peers with one has doubled.
//!
//! Measured (`tests/attacks/cm_liar.rs`): 4096 DREQs and 4096 REQs, each from an address of its
//! own, leave 256 address handles and about 125 KiB of CM state
//! ([`CmDevice::state_bytes`]), and nothing but the listener once the requests' senders have
//! given up.
//!
//! UD services (`RDMA_PS_UDP`): [`Listener::bind_udp`] and [`Listener::get_service_request`]
//! on the passive side ([`ServiceRequest`]: the requester's address and private data, answered
//! with [`ServiceRequest::reply_with`] and [`UdParam`], Q_Key [`RDMA_UDP_QKEY`] by default),
//! [`Connector::resolve_service`] (SIDR) on the active side ([`UdService`]: QPN, Q_Key, the
//! reply's private data and a ready address vector, hop limit [`ROUTE_HOP_LIMIT`]). A UD
//! service answers each datagram's sender with `Pd::create_ah_from_wc` (verbs-core).
//!
//! Multicast (`RDMA_PS_UDP`): [`CmDevice::join_multicast`] attaches a UD QP to an IP
//! multicast group and returns what sends to it ([`McastJoin`]: the MGID as rdma_cm maps the
//! group on RoCEv2, the address handle's attributes, QPN 0xFFFFFF and [`RDMA_UDP_QKEY`]);
//! [`CmDevice::leave_multicast`] detaches. Nothing goes on the wire for either: on Ethernet
//! the IP group membership of the port is what brings a group's datagrams.
//!
//! Not here yet: IPv6 link-local scope handling, and choosing
//! among several devices by IP ([`CmDevice::open`] takes the context whose GID table holds
//! the IP).
//!
//! What this layer must never do: spawn a thread, name a backend or platform crate, use
//! `unsafe`, or leave a connection's QP associated after its endpoint is gone. What may run
//! on which thread: every call on the application's thread; the device agent on the
//! device's progress thread (auto) or inside any application call on the device (manual),
//! concurrently with calls on other threads (one lock, the device's, orders them).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod addr;
mod ahcache;
mod api;
mod engine;
mod error;
mod events;
mod mcast;
mod pacing;
mod timer;
mod transition;

pub use api::{
    AcceptParams, ConnParam, ConnectParams, ConnectionRequest, Connector, Listener, RDMA_UDP_QKEY,
    REQ_USER_DATA, ROUTE_HOP_LIMIT, SIDR_REP_USER_DATA, SIDR_REQ_USER_DATA, ServiceRequest,
    UdParam, UdService,
};
pub use engine::{CmDevice, MAX_SLEEP, MadCounts};
pub use error::ServiceError;
pub use events::RdmaCmEvent;
pub use mcast::{MCAST_HOP_LIMIT, MCAST_QPN, McastJoin, mgid_of};
pub use timer::{CmTimer, Sleep};

#[cfg(doc)]
use portverbs_verbs::{Context, Cq, QpInit};

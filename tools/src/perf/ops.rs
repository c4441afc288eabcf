//! The work requests a side posts: built once per size, stamped with a `wr_id` per post.
//!
//! A `wr_id` carries the QP index in its top bits and the request's 1-based sequence number on
//! that QP below, so one completion tells how far that QP's requests have completed (a
//! signalled completion retires every earlier unsignalled request of its QP).

use portverbs::hal::{Payload, UdDest};
use portverbs::prelude::*;

use super::setup::Side;
use crate::error::CliError;
use crate::report::{AtomicOp, Verb};
use crate::verbs::QKEY;

/// Bits of a `wr_id` holding the sequence number.
const SEQ_BITS: u32 = 40;

/// A `wr_id` for request `seq` of QP `qp`.
#[inline]
pub(crate) fn wr_id(qp: usize, seq: u64) -> u64 {
    ((qp as u64) << SEQ_BITS) | (seq & ((1 << SEQ_BITS) - 1))
}

/// The QP index and sequence number of a `wr_id`.
#[inline]
pub(crate) fn split_wr_id(id: u64) -> (usize, u64) {
    ((id >> SEQ_BITS) as usize, id & ((1 << SEQ_BITS) - 1))
}

/// What a side's requests need to know about one QP of the peer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerQp {
    /// The peer QP's number.
    pub(crate) qpn: u32,
    /// Where RDMA writes and atomics go.
    pub(crate) write_to: RemoteAddr,
    /// Where RDMA reads read from.
    pub(crate) read_from: RemoteAddr,
    /// UD: the Q_Key its QP receives with.
    pub(crate) qkey: u32,
}

/// The peer view of every QP of an in-process side: writes and atomics into its receive
/// regions, reads from its send regions.
pub(crate) fn peer_of(side: &Side) -> Vec<PeerQp> {
    side.qps
        .iter()
        .enumerate()
        .map(|(i, qp)| PeerQp {
            qpn: qp.qp_num(),
            write_to: side.remote(side.recv_off(i)),
            read_from: side.remote(side.send_off(i)),
            qkey: QKEY,
        })
        .collect()
}

/// The requests one side posts toward its peer.
#[derive(Debug)]
pub(crate) struct OpPlan<'a> {
    sges: Vec<[Sge; 1]>,
    ops: Vec<SendOp>,
    remote_qpns: Vec<u32>,
    remote_qkeys: Vec<u32>,
    av: Option<&'a AddressVector>,
    inline: Option<Vec<u8>>,
}

impl<'a> OpPlan<'a> {
    /// Requests of `size` bytes from `from` to `to` for `verb`, inline when `size` is at most
    /// `inline_max` (sends and writes only).
    ///
    /// # Errors
    /// A request's range does not fit the registered buffer.
    pub(crate) fn new(
        from: &'a Side,
        to: &[PeerQp],
        verb: Verb,
        atomic: AtomicOp,
        size: u64,
        inline_max: u32,
    ) -> Result<Self, CliError> {
        let n = from.qps.len();
        if to.len() < n {
            return Err(CliError::Failed(format!(
                "the peer described {} QPs, this side has {n}",
                to.len()
            )));
        }
        let mut sges = Vec::with_capacity(n);
        let mut ops = Vec::with_capacity(n);
        for (i, peer) in to.iter().enumerate().take(n) {
            let (sge, op) = match verb {
                Verb::Read => (
                    from.sge(from.recv_off(i), size)?,
                    SendOp::RdmaRead {
                        remote: peer.read_from,
                    },
                ),
                Verb::Atomic => {
                    let remote = peer.write_to;
                    let op = match atomic {
                        AtomicOp::FetchAndAdd => SendOp::AtomicFetchAdd { remote, add: 1 },
                        AtomicOp::CmpAndSwap => SendOp::AtomicCmpSwp {
                            remote,
                            compare: 0,
                            swap: 0,
                        },
                    };
                    (from.sge(from.recv_off(i), 8)?, op)
                }
                Verb::Write => (
                    from.sge(from.send_off(i), size)?,
                    SendOp::RdmaWrite {
                        remote: peer.write_to,
                    },
                ),
                Verb::Send => (from.sge(from.send_off(i), size)?, SendOp::Send),
            };
            sges.push([sge]);
            ops.push(op);
        }
        let can_inline = matches!(verb, Verb::Write | Verb::Send);
        let inline = (can_inline && size <= u64::from(inline_max)).then(|| vec![0; size as usize]);
        Ok(Self {
            sges,
            ops,
            remote_qpns: to.iter().take(n).map(|p| p.qpn).collect(),
            remote_qkeys: to.iter().take(n).map(|p| p.qkey).collect(),
            av: from.ah.as_ref().map(AddressHandle::av),
            inline,
        })
    }

    /// Whether requests carry their data inline.
    pub(crate) fn is_inline(&self) -> bool {
        self.inline.is_some()
    }

    /// Sets the last byte of the inline data (write latency's iteration counter).
    pub(crate) fn set_inline_last(&mut self, value: u8) {
        if let Some(last) = self.inline.as_mut().and_then(|d| d.last_mut()) {
            *last = value;
        }
    }

    /// The request for QP `qp` with sequence number `seq`.
    #[inline]
    pub(crate) fn wr(&self, qp: usize, seq: u64, signaled: bool) -> SendWr<'_> {
        let (payload, mut flags) = match &self.inline {
            Some(data) => (Payload::Inline(data), SendFlags::INLINE),
            None => (Payload::Sges(&self.sges[qp]), SendFlags::empty()),
        };
        if signaled {
            flags |= SendFlags::SIGNALED;
        }
        SendWr {
            wr_id: wr_id(qp, seq),
            op: self.ops[qp],
            payload,
            flags,
            ud: self.av.map(|av| UdDest {
                ah_pd: None,
                av,
                remote_qpn: self.remote_qpns[qp],
                remote_qkey: self.remote_qkeys[qp],
            }),
        }
    }
}

/// The receive requests of one side: one per QP over its whole receive region.
#[derive(Debug)]
pub(crate) struct RecvPlan {
    sges: Vec<[Sge; 1]>,
}

impl RecvPlan {
    /// Receives into each QP's receive region of `side`.
    ///
    /// # Errors
    /// A region does not fit the registered buffer.
    pub(crate) fn new(side: &Side) -> Result<Self, CliError> {
        let sges = (0..side.qps.len())
            .map(|i| Ok([side.sge(side.recv_off(i), side.slot as u64)?]))
            .collect::<Result<_, CliError>>()?;
        Ok(Self { sges })
    }

    /// The receive request of QP `qp`.
    #[inline]
    pub(crate) fn wr(&self, qp: usize) -> RecvWr<'_> {
        RecvWr {
            wr_id: wr_id(qp, 0),
            sges: &self.sges[qp],
        }
    }
}

/// Fails on an unsuccessful completion.
#[inline]
pub(crate) fn check_wc(wc: &WorkCompletion) -> Result<(), CliError> {
    if wc.is_ok() {
        Ok(())
    } else {
        Err(wc_error(wc))
    }
}

#[cold]
fn wc_error(wc: &WorkCompletion) -> CliError {
    CliError::Failed(format!(
        "completion with error on QP {:#x}: {} (status {}, vendor error {:#x}, wr_id {:#x})",
        wc.qp_num, wc.status, wc.status as u8, wc.vendor_err, wc.wr_id
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_ids_round_trip() {
        for (qp, seq) in [(0, 1), (3, 5000), (1023, (1 << SEQ_BITS) - 1)] {
            assert_eq!(split_wr_id(wr_id(qp, seq)), (qp, seq));
        }
    }
}

//! What a QP's send queue accepts: the opcode for its transport, the destination (an address
//! handle exactly for UD, of the QP's protection domain), and the payload against its
//! capacities.
//!
//! [`SendRules`] is computed once when the QP is created so that the post path admits a
//! well-formed request with a handful of compares; a request it does not admit goes through
//! [`check`], off the hot path, for the precise error. The two agree on every request (tested
//! exhaustively below).

use portverbs_hal::attr::QpCaps;
use portverbs_hal::types::QpType;
use portverbs_hal::wr::{Payload, SendFlags, SendOp, SendOps, SendWr};

use crate::error::PostErrorKind;

/// A QP's send rules, precomputed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendRules {
    /// Operations allowed with an empty gather list.
    ops: SendOps,
    /// Operations allowed with gather entries (not the local ones: bind, local invalidate).
    sge_ops: SendOps,
    /// Operations allowed with inline data (no READ or atomics).
    inline_ops: SendOps,
    ud: bool,
    /// The QP's protection domain: a UD send's address handle must belong to it.
    pdn: u32,
    max_sge: u32,
    max_inline: u32,
}

impl SendRules {
    pub(crate) fn new(t: QpType, caps: &QpCaps, pdn: u32) -> Self {
        let ops = SendOps::of_transport(t);
        let sge_ops = ops - SendOps::LOCAL;
        Self {
            ops,
            sge_ops,
            inline_ops: sge_ops - SendOps::READ_OR_ATOMIC,
            ud: t == QpType::Ud,
            pdn,
            max_sge: caps.max_send_sge,
            max_inline: caps.max_inline_data,
        }
    }

    /// True when [`check`] would accept `wr`.
    #[inline(always)]
    pub(crate) fn admits(&self, wr: &SendWr<'_>) -> bool {
        let k = wr.op.kind();
        let dest_ok = match wr.ud {
            None => !self.ud,
            Some(ud) => self.ud && ud.ah_pd.is_none_or(|pd| pd == self.pdn),
        };
        if !dest_ok {
            return false;
        }
        match wr.payload {
            Payload::Inline(bytes) => {
                self.inline_ops.contains(k) && bytes.len() <= self.max_inline as usize
            }
            Payload::Sges(sges) => {
                let ops = if sges.is_empty() {
                    self.ops
                } else {
                    self.sge_ops
                };
                ops.contains(k)
                    && sges.len() <= self.max_sge as usize
                    && (sges.is_empty() || !wr.flags.contains(SendFlags::INLINE))
            }
        }
    }
}

/// Checks `wr` for a QP of type `t` with capacities `caps` in protection domain `pdn`, naming
/// the first rule it breaks.
#[cold]
pub(crate) fn check(
    t: QpType,
    caps: &QpCaps,
    pdn: u32,
    wr: &SendWr<'_>,
) -> Result<(), PostErrorKind> {
    // The same table the fast rules use; hal's tests pin it to the spec.
    let ok = SendOps::of_transport(t).contains(wr.op.kind());
    if !ok {
        return Err(PostErrorKind::OpNotSupported {
            op: wr.op.name(),
            qp_type: t,
        });
    }
    match (t, wr.ud.is_some()) {
        (QpType::Ud, false) => {
            return Err(PostErrorKind::BadDestination(
                "a UD send needs an address handle",
            ));
        }
        (QpType::Rc | QpType::Uc, true) => {
            return Err(PostErrorKind::BadDestination(
                "connected QPs take no address handle",
            ));
        }
        _ => {}
    }
    // The address handle must be of the QP's domain (IBA 10.2.3). rxe makes the same check
    // when it executes the request (`rxe_get_av` in Linux's `drivers/infiniband/sw/rxe/
    // rxe_av.c`, completing with LOC_QP_OP_ERR); here it is refused before anything is queued.
    if let Some(ah_pd) = wr.ud.and_then(|ud| ud.ah_pd).filter(|&pd| pd != pdn) {
        return Err(PostErrorKind::AhOfAnotherPd { ah_pd, qp_pd: pdn });
    }
    let has_payload = match wr.payload {
        Payload::Sges(sges) => !sges.is_empty(),
        Payload::Inline(_) => true,
    };
    if has_payload && matches!(wr.op, SendOp::BindMw { .. } | SendOp::LocalInv { .. }) {
        return Err(PostErrorKind::PayloadNotAllowed { op: wr.op.name() });
    }
    match wr.payload {
        Payload::Sges(sges) => {
            if wr.flags.contains(SendFlags::INLINE) && !sges.is_empty() {
                return Err(PostErrorKind::InlineFromSges);
            }
            if sges.len() > caps.max_send_sge as usize {
                return Err(PostErrorKind::TooManySges {
                    given: sges.len(),
                    max: caps.max_send_sge,
                });
            }
        }
        Payload::Inline(bytes) => {
            if wr.op.is_read_or_atomic() {
                return Err(PostErrorKind::OpNotSupported {
                    op: "inline data with RDMA READ or atomics",
                    qp_type: t,
                });
            }
            if bytes.len() > caps.max_inline_data as usize {
                return Err(PostErrorKind::InlineTooLarge {
                    given: bytes.len(),
                    max: caps.max_inline_data,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use portverbs_hal::attr::AddressVector;
    use portverbs_hal::types::{AccessFlags, MwType};
    use portverbs_hal::wr::{MwBind, RemoteAddr, Sge, UdDest};

    use super::*;

    /// The QP's protection domain in these tests.
    const PDN: u32 = 4;

    /// Every opcode, QP type, destination, payload shape and size around the limits: the
    /// fast rules and the precise check agree.
    #[test]
    fn rules_agree_with_the_precise_check() {
        let remote = RemoteAddr::default();
        let bind = MwBind {
            new_rkey: 2,
            mw_type: MwType::Type2,
            mr_lkey: 3,
            addr: 0,
            length: 8,
            access: AccessFlags::REMOTE_WRITE,
        };
        let ops = SendOp::one_of_each(remote, bind);
        let av = AddressVector::default();
        let dest = UdDest {
            ah_pd: None,
            av: &av,
            remote_qpn: 5,
            remote_qkey: 6,
        };
        let own = UdDest {
            ah_pd: Some(PDN),
            ..dest
        };
        let foreign = UdDest {
            ah_pd: Some(PDN + 1),
            ..dest
        };
        let caps = QpCaps {
            max_send_sge: 2,
            max_inline_data: 16,
            ..QpCaps::default()
        };
        let sges = [Sge::default(); 3];
        let bytes = [0u8; 17];
        let mut checked = 0;
        for t in [QpType::Rc, QpType::Uc, QpType::Ud] {
            let rules = SendRules::new(t, &caps, PDN);
            for op in ops {
                for ud in [None, Some(dest), Some(own), Some(foreign)] {
                    for flags in [SendFlags::empty(), SendFlags::INLINE | SendFlags::SIGNALED] {
                        let payloads = (0..=3)
                            .map(|n| Payload::Sges(&sges[..n]))
                            .chain([0, 16, 17].map(|n| Payload::Inline(&bytes[..n])));
                        for payload in payloads {
                            let wr = SendWr {
                                wr_id: 0,
                                op,
                                payload,
                                flags,
                                ud,
                            };
                            assert_eq!(
                                rules.admits(&wr),
                                check(t, &caps, PDN, &wr).is_ok(),
                                "{t:?} {wr:?}"
                            );
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert_eq!(checked, 3 * 10 * 4 * 2 * 7);
    }

    #[test]
    fn ud_send_through_a_handle_of_another_pd_is_refused() {
        let av = AddressVector::default();
        let caps = QpCaps {
            max_send_sge: 2,
            ..QpCaps::default()
        };
        let rules = SendRules::new(QpType::Ud, &caps, PDN);
        let dest = |ah_pd| UdDest {
            ah_pd,
            av: &av,
            remote_qpn: 5,
            remote_qkey: 6,
        };
        for (ah_pd, ok) in [(None, true), (Some(PDN), true), (Some(PDN + 1), false)] {
            let wr = SendWr::new(1, SendOp::Send).ud(dest(ah_pd));
            assert_eq!(rules.admits(&wr), ok, "{ah_pd:?}");
            let expect = if ok {
                Ok(())
            } else {
                Err(PostErrorKind::AhOfAnotherPd {
                    ah_pd: PDN + 1,
                    qp_pd: PDN,
                })
            };
            assert_eq!(check(QpType::Ud, &caps, PDN, &wr), expect);
        }
    }

    #[test]
    fn local_operations_refuse_a_payload() {
        let bind = MwBind {
            new_rkey: 2,
            mw_type: MwType::Type2,
            mr_lkey: 3,
            addr: 0,
            length: 8,
            access: AccessFlags::REMOTE_WRITE,
        };
        let caps = QpCaps {
            max_send_sge: 2,
            max_inline_data: 16,
            ..QpCaps::default()
        };
        let rules = SendRules::new(QpType::Rc, &caps, PDN);
        let sge = [Sge::default()];
        for op in [SendOp::BindMw { bind }, SendOp::LocalInv { rkey: 2 }] {
            let bare = SendWr::new(1, op);
            assert!(rules.admits(&bare));
            for wr in [bare.sges(&sge), bare.inline(b"x")] {
                assert!(!rules.admits(&wr), "{op:?}");
                assert_eq!(
                    check(QpType::Rc, &caps, PDN, &wr),
                    Err(PostErrorKind::PayloadNotAllowed { op: op.name() })
                );
            }
        }
    }
}

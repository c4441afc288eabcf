//! The opcode table against Linux `ib_pack.h` and `rxe_opcode.c`, one test per group, plus builders
//! and predicates.

use crate::*;

const PAY: HeaderSet = HeaderSet::PAYLOAD;
const IMM: HeaderSet = HeaderSet::IMM;
const RETH: HeaderSet = HeaderSet::RETH;
const AETH: HeaderSet = HeaderSet::AETH;

/// Checks byte, service, header set, position and name of each row.
fn check(rows: &[(u8, Service, HeaderSet, Option<Position>, &str)]) {
    for &(b, service, headers, position, name) in rows {
        let op = Opcode::from_u8(b);
        assert!(op.is_known(), "{b:#x}");
        assert_eq!(op.to_u8(), b, "{name}");
        assert_eq!(op.service(), service, "{name}");
        assert_eq!(op.headers(), headers, "{name}");
        assert_eq!(op.position(), position, "{name}");
        assert_eq!(op.name(), name);
        assert_eq!(op.to_string(), name);
    }
}

use Position::{First, Last, Middle, Only};

#[test]
fn rc_send_group() {
    let s = Service::Rc;
    check(&[
        (0x00, s, PAY, Some(First), "RC SEND_FIRST"),
        (0x01, s, PAY, Some(Middle), "RC SEND_MIDDLE"),
        (0x02, s, PAY, Some(Last), "RC SEND_LAST"),
        (
            0x03,
            s,
            IMM | PAY,
            Some(Last),
            "RC SEND_LAST_WITH_IMMEDIATE",
        ),
        (0x04, s, PAY, Some(Only), "RC SEND_ONLY"),
        (
            0x05,
            s,
            IMM | PAY,
            Some(Only),
            "RC SEND_ONLY_WITH_IMMEDIATE",
        ),
        (
            0x16,
            s,
            HeaderSet::IETH | PAY,
            Some(Last),
            "RC SEND_LAST_WITH_INVALIDATE",
        ),
        (
            0x17,
            s,
            HeaderSet::IETH | PAY,
            Some(Only),
            "RC SEND_ONLY_WITH_INVALIDATE",
        ),
    ]);
    assert_eq!(Opcode::from_u8(0x04), Opcode::SendOnly);
    assert_eq!(Opcode::from_u8(0x17), Opcode::SendOnlyWithInvalidate);
}

#[test]
fn rc_write_group() {
    let s = Service::Rc;
    check(&[
        (0x06, s, RETH | PAY, Some(First), "RC RDMA_WRITE_FIRST"),
        (0x07, s, PAY, Some(Middle), "RC RDMA_WRITE_MIDDLE"),
        (0x08, s, PAY, Some(Last), "RC RDMA_WRITE_LAST"),
        (
            0x09,
            s,
            IMM | PAY,
            Some(Last),
            "RC RDMA_WRITE_LAST_WITH_IMMEDIATE",
        ),
        (0x0A, s, RETH | PAY, Some(Only), "RC RDMA_WRITE_ONLY"),
        (
            0x0B,
            s,
            RETH | IMM | PAY,
            Some(Only),
            "RC RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        ),
    ]);
}

#[test]
fn rc_read_group() {
    let s = Service::Rc;
    check(&[
        (0x0C, s, RETH, None, "RC RDMA_READ_REQUEST"),
        (
            0x0D,
            s,
            AETH | PAY,
            Some(First),
            "RC RDMA_READ_RESPONSE_FIRST",
        ),
        (0x0E, s, PAY, Some(Middle), "RC RDMA_READ_RESPONSE_MIDDLE"),
        (
            0x0F,
            s,
            AETH | PAY,
            Some(Last),
            "RC RDMA_READ_RESPONSE_LAST",
        ),
        (
            0x10,
            s,
            AETH | PAY,
            Some(Only),
            "RC RDMA_READ_RESPONSE_ONLY",
        ),
    ]);
    assert_eq!(Opcode::from_u8(0x0C), Opcode::ReadRequest);
    assert_eq!(Opcode::from_u8(0x0E), Opcode::ReadResponseMiddle);
}

#[test]
fn rc_ack_and_atomic_group() {
    let s = Service::Rc;
    let atomic = HeaderSet::ATOMIC_ETH;
    check(&[
        (0x11, s, AETH, None, "RC ACKNOWLEDGE"),
        (
            0x12,
            s,
            AETH | HeaderSet::ATOMIC_ACK_ETH,
            None,
            "RC ATOMIC_ACKNOWLEDGE",
        ),
        (0x13, s, atomic, None, "RC COMPARE_SWAP"),
        (0x14, s, atomic, None, "RC FETCH_ADD"),
    ]);
    assert_eq!(Opcode::from_u8(0x11), Opcode::Acknowledge);
    assert_eq!(Opcode::from_u8(0x12), Opcode::AtomicAcknowledge);
    assert_eq!(Opcode::from_u8(0x13), Opcode::CompareSwap);
    assert_eq!(Opcode::from_u8(0x14), Opcode::FetchAdd);
}

#[test]
fn uc_group_mirrors_rc_sends_and_writes() {
    for b in 0x20..=0x2Bu8 {
        let uc = Opcode::from_u8(b);
        let rc = Opcode::from_u8(b - 0x20);
        assert_eq!(uc.service(), Service::Uc);
        assert_eq!(uc.headers(), rc.headers(), "{uc}");
        assert_eq!(uc.position(), rc.position());
        assert_eq!(uc.kind(), rc.kind());
        assert_eq!(uc.name().strip_prefix("UC "), rc.name().strip_prefix("RC "));
    }
    assert_eq!(Opcode::from_u8(0x20), Opcode::UcSendFirst);
    assert_eq!(Opcode::from_u8(0x2B), Opcode::UcWriteOnlyWithImmediate);
    for b in [0x2C, 0x2D, 0x30, 0x31, 0x36, 0x37] {
        assert!(!Opcode::from_u8(b).is_known(), "{b:#x}");
    }
}

#[test]
fn ud_and_cnp_group() {
    let deth = HeaderSet::DETH;
    check(&[
        (0x64, Service::Ud, deth | PAY, Some(Only), "UD SEND_ONLY"),
        (
            0x65,
            Service::Ud,
            deth | IMM | PAY,
            Some(Only),
            "UD SEND_ONLY_WITH_IMMEDIATE",
        ),
        (0x81, Service::Cnp, HeaderSet::CNP_RESERVED, None, "CNP"),
    ]);
    assert_eq!(Opcode::from_u8(0x64), Opcode::UdSendOnly);
    assert_eq!(Opcode::Cnp.header_len(), 28);
    assert_eq!(Opcode::UdSendOnlyWithImmediate.header_len(), 24);
}

#[test]
fn unknown_opcodes_are_preserved() {
    let known: Vec<u8> = Opcode::all_known().map(Opcode::to_u8).collect();
    assert_eq!(known.len(), 23 + 12 + 2 + 1);
    for b in 0..=u8::MAX {
        let op = Opcode::from_u8(b);
        assert_eq!(op.to_u8(), b);
        assert_eq!(u8::from(Opcode::from(b)), b);
        if known.contains(&b) {
            assert!(op.is_known());
            assert!(op.is_known());
        } else {
            assert!(!op.is_known());
            assert!(!op.is_known());
            assert_eq!(op.headers(), HeaderSet::empty());
            assert_eq!(op.service(), Service::Other);
            assert_eq!((op.position(), op.kind()), (None, None));
            assert!(!op.is_request() && !op.is_response());
            assert_eq!(op.to_string(), format!("UNKNOWN(0x{b:02x})"));
        }
    }
    // RESYNC, FLUSH, ATOMIC_WRITE, RD and vendor opcodes are not supported.
    for b in [0x15, 0x1C, 0x1D, 0x40, 0x60, 0x66, 0x80, 0xC0, 0xFF] {
        assert!(!Opcode::from_u8(b).is_known());
    }
}

#[test]
fn predicates() {
    use Opcode as O;
    let sends = [
        O::SendFirst,
        O::SendOnlyWithInvalidate,
        O::UcSendLast,
        O::UdSendOnly,
    ];
    for op in sends {
        assert!(op.is_send() && op.is_request() && !op.is_write() && !op.is_response());
    }
    for op in [O::WriteFirst, O::WriteOnlyWithImmediate, O::UcWriteMiddle] {
        assert!(op.is_write() && op.is_request() && !op.is_send());
    }
    assert!(O::ReadRequest.is_read_request() && O::ReadRequest.is_request());
    for op in [
        O::ReadResponseFirst,
        O::ReadResponseMiddle,
        O::ReadResponseOnly,
    ] {
        assert!(op.is_read_response() && !op.is_request() && op.is_response());
    }
    for op in [O::CompareSwap, O::FetchAdd] {
        assert!(op.is_atomic() && op.is_request() && !op.is_ack());
    }
    for op in [O::Acknowledge, O::AtomicAcknowledge] {
        assert!(op.is_ack() && !op.is_request() && !op.is_atomic());
    }
    assert!(!O::Cnp.is_request() && !O::Cnp.is_response());
    assert_eq!(O::Cnp.kind(), Some(OpKind::Cnp));
    let imm = [
        O::SendLastWithImmediate,
        O::WriteOnlyWithImmediate,
        O::UdSendOnlyWithImmediate,
    ];
    for op in imm {
        assert!(op.has_imm() && !op.has_inv());
    }
    assert!(O::SendLastWithInvalidate.has_inv() && !O::SendLastWithInvalidate.has_imm());
    assert!(!O::SendOnly.has_imm() && !O::SendOnly.has_inv());
    let requests = Opcode::all_known().filter(|o| o.is_request()).count();
    assert_eq!(requests, 8 + 6 + 1 + 2 + 12 + 2);
}

#[test]
fn builders_find_existing_opcodes() {
    use Service::{Rc, Uc, Ud};
    assert_eq!(Opcode::send(Rc, Only, false, false), Some(Opcode::SendOnly));
    assert_eq!(
        Opcode::send(Rc, Last, true, false),
        Some(Opcode::SendLastWithImmediate)
    );
    assert_eq!(
        Opcode::send(Rc, Only, false, true),
        Some(Opcode::SendOnlyWithInvalidate)
    );
    assert_eq!(
        Opcode::send(Uc, First, false, false),
        Some(Opcode::UcSendFirst)
    );
    assert_eq!(
        Opcode::send(Ud, Only, true, false),
        Some(Opcode::UdSendOnlyWithImmediate)
    );
    assert_eq!(Opcode::write(Rc, First, false), Some(Opcode::WriteFirst));
    assert_eq!(
        Opcode::write(Uc, Only, true),
        Some(Opcode::UcWriteOnlyWithImmediate)
    );
    assert_eq!(
        Opcode::read_response(Middle),
        Some(Opcode::ReadResponseMiddle)
    );
    assert_eq!(Opcode::read_response(Only), Some(Opcode::ReadResponseOnly));

    // Every known SEND / WRITE / READ response is found from its own properties.
    for op in Opcode::all_known() {
        let Some(pos) = op.position() else { continue };
        let found = if op.is_send() {
            Opcode::send(op.service(), pos, op.has_imm(), op.has_inv())
        } else if op.is_write() {
            Opcode::write(op.service(), pos, op.has_imm())
        } else {
            Opcode::read_response(pos)
        };
        assert_eq!(found, Some(op));
    }
}

#[test]
fn builders_reject_impossible_combinations() {
    use Service::{Cnp, Other, Rc, Uc, Ud};
    assert_eq!(Opcode::send(Ud, First, false, false), None);
    assert_eq!(Opcode::send(Ud, Only, false, true), None);
    assert_eq!(Opcode::send(Uc, Only, false, true), None);
    assert_eq!(Opcode::send(Uc, Last, false, true), None);
    assert_eq!(Opcode::send(Rc, Last, true, true), None);
    assert_eq!(Opcode::send(Rc, First, true, false), None);
    assert_eq!(Opcode::send(Rc, Middle, false, true), None);
    assert_eq!(Opcode::send(Cnp, Only, false, false), None);
    assert_eq!(Opcode::send(Other, Only, false, false), None);
    assert_eq!(Opcode::write(Ud, Only, false), None);
    assert_eq!(Opcode::write(Rc, First, true), None);
    assert_eq!(Opcode::write(Uc, Middle, true), None);
}

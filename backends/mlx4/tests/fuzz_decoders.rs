//! The stable-Rust counterpart of `fuzz/` (the rule "the driver never trusts the device"):
//! arbitrary and structured-but-random CQEs, EQEs and mailbox contents fed to the decoders on
//! every `cargo test`.
//!
//! Properties:
//! * nothing panics, whatever the bytes;
//! * every `Ok` is internally consistent: an error CQE never decodes to `Success`, decoded
//!   numbers fit their hardware fields, a port event names a port;
//! * unknown opcodes are `CqeError::BadOpcode` naming the opcode and direction;
//! * decode ∘ encode is the identity on every portable completion and event the encoders
//!   accept, and decode ∘ encode ∘ decode = decode on every entry the decoders accept;
//! * mailbox readers return `Some` exactly when the bytes are long enough, and then return the
//!   bytes unchanged; page-list chunks are aligned powers of two;
//! * the validated capability parsers (`caps::parse_fw`, `parse_dev_cap`, `parse_port`) refuse
//!   short outboxes, and whatever they accept — from random bytes or from a plausible outbox
//!   with a few bytes overwritten — keeps the promises the driver relies on (reserved counts
//!   below the maxima, power-of-two entry sizes, 1–2 ports, RC and UD present, …).

use portverbs_hal::error::{CqeError, EqeError};
use portverbs_hal::event::{
    CqErrorSyndrome, DeviceEvent, PortEventKind, QpEventKind, SrqEventKind,
};
use portverbs_hal::wc::{Cqe, WcFlags, WcOpcode, WcStatus, WorkCompletion, WqeRef};
use portverbs_mlx4::caps::{self, DevCaps};
use portverbs_mlx4::layout::ctx::{CqContext, EqContext, Mpt, QpMailbox, SrqContext};
use portverbs_mlx4::layout::mailbox::dev_flag;
use portverbs_mlx4::layout::mailbox::{DevCap, PageListEntry, QueryFw, QueryPort};
use portverbs_mlx4::layout::{self, cqe, eqe};
use proptest::prelude::*;
use proptest::sample::select;
use zerocopy::{FromBytes, FromZeros, IntoBytes};

const QPN_MAX: u32 = 0xff_ffff;

/// Send opcodes this driver posts, hence accepts in a CQE (`MLX4_OPCODE_*`).
const SEND_OPCODES: [u8; 10] = [0x01, 0x08, 0x09, 0x0a, 0x0b, 0x10, 0x11, 0x12, 0x18, 0x1b];
/// Receive opcodes (`MLX4_RECV_OPCODE_*`).
const RECV_OPCODES: [u8; 4] = [0x00, 0x01, 0x02, 0x03];
/// Syndromes with their own completion status (rdma-core `providers/mlx4/cq.c`).
const SYNDROMES: [u8; 13] = [
    0x01, 0x02, 0x04, 0x05, 0x06, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x22,
];
/// Event types (Linux `enum mlx4_event`) the generators favour.
const EVENT_TYPES: [u8; 18] = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0e, 0x0f, 0x10, 0x11, 0x12,
    0x13, 0x14,
];
/// The ones the EQE decoder turns into their own variants (ECC_DETECT 0x0e and EQ_OVERFLOW
/// 0x0f come back as `Unknown`).
const DECODED_TYPES: [u8; 16] = [
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x10, 0x11, 0x12, 0x13, 0x14,
];

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// CQE

/// What any successful or failed decode must satisfy, given the raw entry.
fn check_cqe(raw: &[u8], res: &Result<Cqe, CqeError>) -> Result<(), TestCaseError> {
    const CQN: u32 = 0x85;
    const INDEX: u32 = 7;
    if raw.len() < cqe::CQE_SIZE {
        prop_assert!(
            matches!(
                res,
                Err(CqeError::Malformed {
                    cqn: CQN,
                    index: INDEX,
                    ..
                })
            ),
            "short entry: {res:?}"
        );
        return Ok(());
    }
    let osr = raw[31];
    let opcode = osr & cqe::OPCODE_MASK;
    let is_send = osr & cqe::IS_SEND_MASK != 0;
    match res {
        Ok(c) => {
            prop_assert_eq!(c.wqe.is_send, is_send);
            prop_assert!(c.wc.qp_num <= QPN_MAX);
            prop_assert_eq!(
                c.wc.qp_num,
                u32::from_be_bytes(raw[0..4].try_into().unwrap()) & QPN_MAX
            );
            prop_assert_eq!(c.wqe.index, u16::from_be_bytes([raw[24], raw[25]]));
            if opcode == cqe::OPCODE_ERROR {
                prop_assert_ne!(
                    c.wc.status,
                    WcStatus::Success,
                    "error CQE completed as Success"
                );
                prop_assert_eq!(c.wc.status, cqe::status_of(raw[27]));
                prop_assert_eq!(c.wc.vendor_err, u32::from(raw[26]));
            } else {
                prop_assert_eq!(c.wc.status, WcStatus::Success);
                let known: &[u8] = if is_send {
                    &SEND_OPCODES
                } else {
                    &RECV_OPCODES
                };
                prop_assert!(known.contains(&opcode), "accepted opcode {opcode:#x}");
            }
            prop_assert!(c.wc.src_qp <= QPN_MAX);
            prop_assert!(c.wc.dlid_path_bits <= 0x7f);
            prop_assert!(c.wc.sl <= 0xf);
            prop_assert!(c.wc.pkey_index <= 0x7f);
            if c.wqe.is_send {
                prop_assert!(!matches!(
                    c.wc.opcode,
                    WcOpcode::Recv | WcOpcode::RecvRdmaWithImm
                ));
            } else if c.wc.status == WcStatus::Success {
                prop_assert!(matches!(
                    c.wc.opcode,
                    WcOpcode::Recv | WcOpcode::RecvRdmaWithImm
                ));
            }
            // Stable under re-encoding, with either owner bit.
            for owner in [false, true] {
                let again = cqe::encode(c, owner);
                prop_assert_eq!(cqe::owner(&again), owner);
                prop_assert_eq!(&cqe::decode(&again, CQN, INDEX).unwrap(), c);
            }
        }
        Err(CqeError::BadOpcode {
            cqn,
            index,
            dir,
            opcode: o,
        }) => {
            prop_assert_eq!((*cqn, *index, *o), (CQN, INDEX, opcode));
            prop_assert_ne!(opcode, cqe::OPCODE_ERROR);
            if is_send {
                prop_assert_eq!(*dir, "send");
                prop_assert!(!SEND_OPCODES.contains(&opcode));
            } else {
                prop_assert_eq!(*dir, "receive");
                prop_assert!(!RECV_OPCODES.contains(&opcode));
            }
        }
        Err(e) => prop_assert!(false, "unexpected error for a full entry: {e:?}"),
    }
    Ok(())
}

/// A raw CQE with a chosen owner bit, direction, opcode and syndrome, the rest random.
fn raw_cqe() -> impl Strategy<Value = [u8; 32]> {
    (
        any::<[u8; 32]>(),
        any::<bool>(),
        any::<bool>(),
        prop_oneof![
            select(SEND_OPCODES.to_vec()),
            select(RECV_OPCODES.to_vec()),
            Just(cqe::OPCODE_ERROR),
            Just(cqe::OPCODE_RESIZE),
            0u8..32,
        ],
        prop_oneof![select(SYNDROMES.to_vec()), any::<u8>()],
    )
        .prop_map(|(mut b, owner, send, opcode, syndrome)| {
            b[31] = if owner { cqe::OWNER_MASK } else { 0 }
                | if send { cqe::IS_SEND_MASK } else { 0 }
                | opcode
                | (b[31] & 0x20); // the PRM's "is" bit: ignored by the decoder
            b[27] = syndrome;
            b
        })
}

fn error_status() -> impl Strategy<Value = WcStatus> {
    prop_oneof![
        select(SYNDROMES.to_vec()).prop_map(cqe::status_of),
        Just(WcStatus::GeneralErr),
    ]
}

/// A portable completion the mlx4 CQE can carry exactly.
fn portable_cqe() -> impl Strategy<Value = Cqe> {
    let error = (
        0..=QPN_MAX,
        any::<bool>(),
        any::<u16>(),
        error_status(),
        any::<u8>(),
    )
        .prop_map(|(qpn, is_send, wqe_index, status, vendor_err)| Cqe {
            wc: WorkCompletion {
                qp_num: qpn,
                status,
                vendor_err: u32::from(vendor_err),
                ..WorkCompletion::default()
            },
            wqe: WqeRef {
                is_send,
                index: wqe_index,
            },
        });
    let send = (
        0..=QPN_MAX,
        any::<u16>(),
        any::<u32>(),
        select(vec![
            (WcOpcode::Send, WcFlags::empty()),
            (WcOpcode::Send, WcFlags::WITH_IMM),
            (WcOpcode::RdmaWrite, WcFlags::empty()),
            (WcOpcode::RdmaWrite, WcFlags::WITH_IMM),
            (WcOpcode::RdmaRead, WcFlags::empty()),
            (WcOpcode::CompSwap, WcFlags::empty()),
            (WcOpcode::FetchAdd, WcFlags::empty()),
            (WcOpcode::BindMw, WcFlags::empty()),
            (WcOpcode::LocalInv, WcFlags::empty()),
        ]),
    )
        .prop_map(|(qpn, wqe_index, len, (opcode, flags))| Cqe {
            wc: WorkCompletion {
                qp_num: qpn,
                opcode,
                wc_flags: flags,
                byte_len: match opcode {
                    WcOpcode::RdmaRead => len,
                    WcOpcode::CompSwap | WcOpcode::FetchAdd => 8,
                    _ => 0,
                },
                ..WorkCompletion::default()
            },
            wqe: WqeRef {
                is_send: true,
                index: wqe_index,
            },
        });
    let recv = (
        (0..=QPN_MAX, any::<u16>(), any::<u32>(), any::<u32>()),
        (
            0..=QPN_MAX,
            0u8..=0x7f,
            any::<u16>(),
            0u8..=0xf,
            0u16..=0x7f,
        ),
        any::<bool>(),
        select(vec![
            (WcOpcode::Recv, WcFlags::empty()),
            (WcOpcode::Recv, WcFlags::WITH_IMM),
            (WcOpcode::Recv, WcFlags::WITH_INV),
            (WcOpcode::RecvRdmaWithImm, WcFlags::WITH_IMM),
        ]),
    )
        .prop_map(
            |((qpn, wqe_index, byte_len, imm), (src_qp, path, slid, sl, pkey), grh, (op, f))| {
                let carries_imm = f.intersects(WcFlags::WITH_IMM | WcFlags::WITH_INV);
                Cqe {
                    wc: WorkCompletion {
                        qp_num: qpn,
                        opcode: op,
                        wc_flags: if grh { f | WcFlags::GRH } else { f },
                        byte_len,
                        imm_data: if carries_imm { imm } else { 0 },
                        src_qp,
                        dlid_path_bits: path,
                        slid,
                        sl,
                        pkey_index: if carries_imm { 0 } else { pkey },
                        ..WorkCompletion::default()
                    },
                    wqe: WqeRef {
                        is_send: false,
                        index: wqe_index,
                    },
                }
            },
        );
    prop_oneof![error, send, recv]
}

proptest! {
    #![proptest_config(config(8192))]

    #[test]
    fn cqe_arbitrary_bytes(raw in proptest::collection::vec(any::<u8>(), 0..128)) {
        let res = cqe::decode(&raw, 0x85, 7);
        check_cqe(&raw, &res)?;
        prop_assert_eq!(cqe::owner(&raw), raw.len() >= 32 && raw[31] & 0x80 != 0);
    }

    #[test]
    fn cqe_structured(raw in raw_cqe()) {
        let res = cqe::decode(&raw, 0x85, 7);
        check_cqe(&raw, &res)?;
        let opcode = raw[31] & cqe::OPCODE_MASK;
        let known = if raw[31] & cqe::IS_SEND_MASK != 0 {
            SEND_OPCODES.contains(&opcode)
        } else {
            RECV_OPCODES.contains(&opcode)
        };
        prop_assert_eq!(res.is_ok(), known || opcode == cqe::OPCODE_ERROR);
        // A longer buffer (a 64-byte CQE slot read from its start) decodes the same way.
        let mut long = raw.to_vec();
        long.extend_from_slice(&[0xa5; 32]);
        prop_assert_eq!(cqe::decode(&long, 0x85, 7), res);
    }

    #[test]
    fn cqe_round_trip(c in portable_cqe(), owner in any::<bool>()) {
        let raw = cqe::encode(&c, owner);
        prop_assert_eq!(cqe::owner(&raw), owner);
        prop_assert_eq!(cqe::decode(&raw, 1, 0), Ok(c));
    }
}

// ---------------------------------------------------------------------------------------------
// EQE

fn check_eqe(raw: &[u8], res: &Result<DeviceEvent, EqeError>) -> Result<(), TestCaseError> {
    if raw.len() < eqe::EQE_SIZE {
        prop_assert!(
            matches!(
                res,
                Err(EqeError::Malformed {
                    eqn: 3,
                    index: 9,
                    ..
                })
            ),
            "short entry: {res:?}"
        );
        return Ok(());
    }
    let event_type = raw[1];
    match res {
        Ok(ev) => {
            match *ev {
                DeviceEvent::Completion { cqn } => {
                    prop_assert_eq!(event_type, eqe::event_type::COMP);
                    prop_assert!(cqn <= QPN_MAX);
                }
                DeviceEvent::Qp { qpn, .. } => prop_assert!(qpn <= QPN_MAX),
                DeviceEvent::Srq { srqn, .. } => prop_assert!(srqn <= QPN_MAX),
                DeviceEvent::CqError { cqn, syndrome } => {
                    prop_assert!(cqn <= QPN_MAX);
                    if let CqErrorSyndrome::Unknown(s) = syndrome {
                        prop_assert!(s != 1 && s != 2);
                    }
                }
                DeviceEvent::Port { port, .. } => {
                    prop_assert_eq!(event_type, eqe::event_type::PORT_CHANGE);
                    prop_assert!((1..=15).contains(&port));
                }
                DeviceEvent::CommandDone {
                    token,
                    status,
                    out_param,
                } => {
                    prop_assert_eq!(event_type, eqe::event_type::CMD);
                    prop_assert_eq!(token, u16::from_be_bytes([raw[6], raw[7]]));
                    prop_assert_eq!(status, raw[15]);
                    prop_assert_eq!(
                        out_param,
                        u64::from_be_bytes(raw[16..24].try_into().unwrap())
                    );
                }
                DeviceEvent::DeviceFatal => {}
                DeviceEvent::Unknown {
                    event_type: t,
                    subtype,
                } => {
                    prop_assert_eq!((t, subtype), (event_type, raw[3]));
                    // Known types decode to their own variants, except a port change with an
                    // unknown subtype.
                    prop_assert!(!DECODED_TYPES.contains(&t) || t == eqe::event_type::PORT_CHANGE);
                }
            }
            // Stable under re-encoding. Not for a port change with an unknown subtype: the
            // portable `Unknown` keeps type and subtype but not the port, so its encoding
            // names port 0, which the decoder refuses.
            let lossy = matches!(
                ev,
                DeviceEvent::Unknown { event_type: t, .. } if *t == eqe::event_type::PORT_CHANGE
            );
            if !lossy {
                for owner in [false, true] {
                    let again = eqe::encode(ev, owner);
                    prop_assert_eq!(eqe::owner(&again), owner);
                    prop_assert_eq!(&eqe::decode(&again, 3, 9).unwrap(), ev);
                }
            }
        }
        Err(EqeError::Malformed { eqn, index, .. }) => {
            prop_assert_eq!((*eqn, *index), (3, 9));
            // The only refusal of a full entry: a port event without a port.
            prop_assert_eq!(event_type, eqe::event_type::PORT_CHANGE);
            prop_assert_eq!(raw[12] >> 4, 0);
        }
        Err(e) => prop_assert!(false, "unexpected error: {e:?}"),
    }
    Ok(())
}

fn raw_eqe() -> impl Strategy<Value = [u8; 32]> {
    (
        any::<[u8; 32]>(),
        any::<bool>(),
        prop_oneof![select(EVENT_TYPES.to_vec()), any::<u8>()],
        prop_oneof![select(vec![1u8, 4, 0x14]), any::<u8>()],
    )
        .prop_map(|(mut b, owner, t, sub)| {
            b[1] = t;
            b[3] = sub;
            b[31] = if owner { 0x80 } else { 0 } | (b[31] & 0x7f);
            b
        })
}

fn qp_kind() -> impl Strategy<Value = QpEventKind> {
    select(vec![
        QpEventKind::Fatal,
        QpEventKind::RequestError,
        QpEventKind::AccessError,
        QpEventKind::CommEstablished,
        QpEventKind::SqDrained,
        QpEventKind::PathMigrated,
        QpEventKind::PathMigrationError,
        QpEventKind::LastWqeReached,
    ])
}

/// A portable event the mlx4 EQE can carry exactly.
fn portable_event() -> impl Strategy<Value = DeviceEvent> {
    prop_oneof![
        (0..=QPN_MAX).prop_map(|cqn| DeviceEvent::Completion { cqn }),
        (0..=QPN_MAX, qp_kind()).prop_map(|(qpn, kind)| DeviceEvent::Qp { qpn, kind }),
        (
            0..=QPN_MAX,
            select(vec![SrqEventKind::LimitReached, SrqEventKind::Catastrophic])
        )
            .prop_map(|(srqn, kind)| DeviceEvent::Srq { srqn, kind }),
        (
            0..=QPN_MAX,
            prop_oneof![
                Just(CqErrorSyndrome::Overrun),
                Just(CqErrorSyndrome::AccessViolation),
                any::<u8>()
                    .prop_filter("1 and 2 have names", |s| *s != 1 && *s != 2)
                    .prop_map(CqErrorSyndrome::Unknown),
            ]
        )
            .prop_map(|(cqn, syndrome)| DeviceEvent::CqError { cqn, syndrome }),
        (
            1u8..=15,
            select(vec![
                PortEventKind::Active,
                PortEventKind::Down,
                PortEventKind::GidChange
            ])
        )
            .prop_map(|(port, kind)| DeviceEvent::Port { port, kind }),
        Just(DeviceEvent::DeviceFatal),
        (any::<u16>(), any::<u8>(), any::<u64>()).prop_map(|(token, status, out_param)| {
            DeviceEvent::CommandDone {
                token,
                status,
                out_param,
            }
        }),
        (
            any::<u8>().prop_filter("unknown types only", |t| !DECODED_TYPES.contains(t)),
            any::<u8>()
        )
            .prop_map(|(event_type, subtype)| DeviceEvent::Unknown {
                event_type,
                subtype
            }),
    ]
}

proptest! {
    #![proptest_config(config(8192))]

    #[test]
    fn eqe_arbitrary_bytes(raw in proptest::collection::vec(any::<u8>(), 0..128)) {
        let res = eqe::decode(&raw, 3, 9);
        check_eqe(&raw, &res)?;
        prop_assert_eq!(eqe::owner(&raw), raw.len() >= 32 && raw[31] & 0x80 != 0);
    }

    #[test]
    fn eqe_structured(raw in raw_eqe()) {
        let res = eqe::decode(&raw, 3, 9);
        check_eqe(&raw, &res)?;
    }

    #[test]
    fn eqe_round_trip(ev in portable_event(), owner in any::<bool>()) {
        let raw = eqe::encode(&ev, owner);
        prop_assert_eq!(eqe::owner(&raw), owner);
        prop_assert_eq!(eqe::decode(&raw, 3, 9), Ok(ev));
    }
}

// ---------------------------------------------------------------------------------------------
// Mailboxes and contexts

/// `layout::read::<T>` returns the bytes unchanged when there are enough, nothing otherwise.
fn check_read<T: FromBytes + IntoBytes + zerocopy::Immutable>(
    raw: &[u8],
) -> Result<Option<T>, TestCaseError> {
    let v = layout::read::<T>(raw);
    let n = size_of::<T>();
    prop_assert_eq!(
        v.is_some(),
        raw.len() >= n,
        "{}",
        std::any::type_name::<T>()
    );
    if let Some(v) = &v {
        prop_assert_eq!(v.as_bytes(), &raw[..n]);
    }
    Ok(v)
}

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn mailbox_readers(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
        check_read::<QueryFw>(&raw)?;
        check_read::<DevCap>(&raw)?;
        check_read::<QueryPort>(&raw)?;
        check_read::<QpMailbox>(&raw)?;
        check_read::<Mpt>(&raw)?;
        check_read::<CqContext>(&raw)?;
        check_read::<EqContext>(&raw)?;
        check_read::<SrqContext>(&raw)?;
        if let Some(e) = check_read::<PageListEntry>(&raw)? {
            if let Some((pa, bytes)) = e.chunk() {
                prop_assert!(bytes.is_power_of_two() && bytes >= 4096);
                prop_assert_eq!(pa % bytes, 0);
                prop_assert_eq!(pa, e.pa_log.get() & !0xfff);
            }
        }
    }

    #[test]
    fn page_list_chunks(virt in any::<u64>(), page in any::<u64>(), log in 0u8..64) {
        // Aligned chunks always come back; misaligned ones never do.
        let pa = page & !0xfff;
        let e = PageListEntry::new(virt, pa, log);
        prop_assert_eq!(e.virt.get(), virt);
        match 1u64.checked_shl(12 + u32::from(log)) {
            Some(bytes) if pa % bytes == 0 => prop_assert_eq!(e.chunk(), Some((pa, bytes))),
            _ => prop_assert_eq!(e.chunk(), None),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Validated capability parsers

fn check_fw(raw: &[u8]) -> Result<(), TestCaseError> {
    match caps::parse_fw(raw) {
        Ok(f) => {
            prop_assert!(raw.len() >= size_of::<QueryFw>());
            prop_assert!((1..=1 << 14).contains(&f.fw_pages));
            prop_assert!(f.cmd_if_rev >= 3);
            prop_assert!(f.max_cmds.is_power_of_two() && f.max_cmds <= 256);
        }
        Err(e) => prop_assert!(!e.field.is_empty()),
    }
    Ok(())
}

fn check_dev_caps(c: &DevCaps) -> Result<(), TestCaseError> {
    for (what, reserved, log_max) in [
        ("QPs", c.reserved_qps, c.log_max_qp),
        ("SRQs", c.reserved_srqs, c.log_max_srq),
        ("CQs", c.reserved_cqs, c.log_max_cq),
        ("MPTs", c.reserved_mpts, c.log_max_mpt),
        ("MTTs", c.reserved_mtts, c.log_max_mtt),
    ] {
        prop_assert!(log_max <= 30, "log max {what} = {log_max}");
        prop_assert!(
            u64::from(reserved) < 1u64 << log_max,
            "{reserved} reserved {what} of 2^{log_max}"
        );
    }
    prop_assert!(c.log_max_eq <= 10);
    prop_assert!(c.reserved_eqs < (1u32 << c.log_max_eq).max(1));
    prop_assert!(c.reserved_uars >= 1 && c.reserved_uars < c.num_uars);
    prop_assert!((1..=2).contains(&c.num_ports));
    prop_assert!(c.flags & dev_flag::RC != 0 && c.flags & dev_flag::UD != 0);
    for (what, sz, min) in [
        ("qpc", c.qpc_entry_sz, 256),
        ("aux", c.aux_entry_sz, 1),
        ("altc", c.altc_entry_sz, 1),
        ("rdmarc", c.rdmarc_entry_sz, 1),
        ("eqc", c.eqc_entry_sz, 64),
        ("cqc", c.cqc_entry_sz, 64),
        ("srqc", c.srq_entry_sz, 48),
        ("cmpt", c.cmpt_entry_sz, 1),
        ("mtt", c.mtt_entry_sz, 8),
        ("dmpt", c.dmpt_entry_sz, 64),
    ] {
        prop_assert!(
            sz.is_power_of_two() && (min..=4096).contains(&sz),
            "{what} entry size {sz}"
        );
    }
    if c.bf_reg_size != 0 {
        prop_assert!(c.bf_reg_size.is_power_of_two() && c.bf_reg_size >= 64);
        prop_assert!(c.bf_regs_per_page.is_power_of_two());
        prop_assert!(u64::from(c.bf_reg_size) * u64::from(c.bf_regs_per_page) <= 4096);
    } else {
        prop_assert_eq!(c.bf_regs_per_page, 0);
    }
    prop_assert!(c.max_desc_sz_sq >= 64 && c.max_desc_sz_rq >= 16);
    prop_assert!(c.max_sg_sq >= 1 && c.max_sg_rq >= 1);
    prop_assert!(c.log_max_pd <= 24);
    Ok(())
}

fn check_dev_cap(raw: &[u8]) -> Result<(), TestCaseError> {
    match caps::parse_dev_cap(raw) {
        Ok(c) => {
            prop_assert!(raw.len() >= size_of::<DevCap>());
            check_dev_caps(&c)?;
        }
        Err(e) => prop_assert!(!e.field.is_empty()),
    }
    Ok(())
}

fn check_port(raw: &[u8]) -> Result<(), TestCaseError> {
    match caps::parse_port(raw) {
        Ok(p) => {
            prop_assert!(raw.len() >= size_of::<QueryPort>());
            prop_assert!((1..=5).contains(&p.max_mtu));
            prop_assert!(p.gid_table_len.is_power_of_two() && p.pkey_table_len.is_power_of_two());
        }
        Err(e) => prop_assert!(!e.field.is_empty()),
    }
    Ok(())
}

/// A QUERY_DEV_CAP outbox a ConnectX-3 could plausibly return.
fn plausible_dev_cap() -> DevCap {
    let mut d = DevCap::new_zeroed();
    d.log_max_srq_sz = 16;
    d.log_max_qp_sz = 16;
    d.log_rsvd_qp = 6;
    d.log_max_qp = 17;
    d.log_max_srq = 16;
    d.log_max_cq_sz = 22;
    d.log_max_cq = 16;
    d.log_max_mpt = 17;
    d.rsvd_eq = 4;
    d.log_max_eq = 6;
    d.log_rsvd_mtt = 0x10;
    d.log_max_mrw_sz = 40;
    d.log_rsvd_mrw = 1;
    d.log_max_mtt = 20;
    d.log_max_ra_req_qp = 4;
    d.log_max_ra_res_qp = 4;
    d.ack_delay = 15;
    d.vl_ports = 0x82;
    d.log_max_msg = 30;
    d.flags_lo = ((dev_flag::RC | dev_flag::UC | dev_flag::UD | dev_flag::SRQ) as u32).into();
    d.rsvd_uar = 0x80;
    d.uar_size = 3;
    d.bf = 0x80;
    d.log_bf_reg_sz = 9;
    d.log_max_bf_per_page = 3;
    d.max_sg_sq = 32;
    d.max_desc_sz_sq = 1008.into();
    d.max_sg_rq = 32;
    d.max_desc_sz_rq = 512.into();
    d.rsvd_pd = 0x40;
    d.log_max_pd = 17;
    d.qpc_entry_sz = 256.into();
    d.aux_entry_sz = 64.into();
    d.altc_entry_sz = 32.into();
    d.rdmarc_entry_sz = 32.into();
    d.eqc_entry_sz = 64.into();
    d.cqc_entry_sz = 64.into();
    d.srq_entry_sz = 64.into();
    d.cmpt_entry_sz = 64.into();
    d.mtt_entry_sz = 8.into();
    d.dmpt_entry_sz = 64.into();
    d.max_icm_sz = (1u64 << 36).into();
    d
}

#[test]
fn plausible_dev_cap_is_accepted() {
    let c = caps::parse_dev_cap(plausible_dev_cap().as_bytes()).unwrap();
    assert_eq!((c.num_ports, c.reserved_qps, c.bf_reg_size), (2, 64, 512));
}

proptest! {
    #![proptest_config(config(2048))]

    #[test]
    fn caps_arbitrary_bytes(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
        check_fw(&raw)?;
        check_dev_cap(&raw)?;
        check_port(&raw)?;
    }

    #[test]
    fn dev_cap_with_bytes_overwritten(
        pokes in proptest::collection::vec((0..size_of::<DevCap>(), any::<u8>()), 1..6),
    ) {
        let mut raw = plausible_dev_cap().as_bytes().to_vec();
        for (at, b) in pokes {
            raw[at] = b;
        }
        check_dev_cap(&raw)?;
    }

    #[test]
    fn fw_and_port_with_bytes_overwritten(
        pokes in proptest::collection::vec((0..0x40usize, any::<u8>()), 1..6),
    ) {
        let mut fw = QueryFw::new_zeroed();
        fw.fw_pages = 0x200.into();
        fw.cmd_if_rev = 3.into();
        fw.log_max_cmds = 4;
        let mut raw = fw.as_bytes().to_vec();
        let mut port = QueryPort::new_zeroed();
        port.link = 0x81;
        port.ib_mtu = 5;
        port.log_gid_pkey = 0x77;
        let mut praw = port.as_bytes().to_vec();
        for (at, b) in pokes {
            raw[at] = b;
            if let Some(p) = praw.get_mut(at) {
                *p = b;
            }
        }
        check_fw(&raw)?;
        check_port(&praw)?;
    }
}

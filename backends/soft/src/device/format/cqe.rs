//! The CQE: encoded by the device, decoded by the host.

use portverbs_hal::error::CqeError;
use portverbs_hal::wc::{Cqe, WcFlags, WcOpcode, WcStatus, WorkCompletion, WqeRef};
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, IntoBytes};

use super::{CQE_SIZE, SoftCqe};

/// The CQE format.
#[derive(Debug, Clone, Copy)]
pub struct CqeCodec;

impl CqeCodec {
    /// Device side: encodes a completion with the given owner bit.
    #[inline]
    pub fn encode(cqe: &Cqe, owner: bool) -> [u8; CQE_SIZE] {
        let e = SoftCqe {
            qpn: U32::new(cqe.wc.qp_num),
            byte_len: U32::new(cqe.wc.byte_len),
            imm: U32::new(cqe.wc.imm_data),
            src_qp: U32::new(cqe.wc.src_qp),
            wqe_index: U16::new(cqe.wqe.index),
            status: cqe.wc.status as u8,
            opcode: cqe.wc.opcode as u8,
            flags: cqe.wc.wc_flags.bits() as u8,
            sl: cqe.wc.sl,
            slid: U16::new(cqe.wc.slid),
            pkey_index: U16::new(cqe.wc.pkey_index),
            is_send: u8::from(cqe.wqe.is_send),
            dlid_path_bits: cqe.wc.dlid_path_bits,
            vendor_err: U16::new(cqe.wc.vendor_err as u16),
            reserved: 0,
            owner: u8::from(owner),
        };
        let mut b = [0u8; CQE_SIZE];
        b.copy_from_slice(e.as_bytes());
        b
    }
}

impl CqeCodec {
    /// The owner bit of a raw entry.
    pub fn owner_bit(entry: &[u8]) -> bool {
        entry.get(CQE_SIZE - 1).is_some_and(|b| b & 1 == 1)
    }

    /// Host side: decodes a raw entry whose ownership was already checked; `cqn` and `index`
    /// only label errors.
    ///
    /// # Errors
    /// Contents that make no sense.
    pub fn decode(entry: &[u8], cqn: u32, index: u32) -> Result<Cqe, CqeError> {
        let e = SoftCqe::read_from_bytes(entry.get(..CQE_SIZE).ok_or(CqeError::Malformed {
            cqn,
            index,
            what: "short entry",
        })?)
        .map_err(|_| CqeError::Malformed {
            cqn,
            index,
            what: "unreadable entry",
        })?;
        let is_send = match e.is_send {
            0 => false,
            1 => true,
            _ => {
                return Err(CqeError::Malformed {
                    cqn,
                    index,
                    what: "is_send is neither 0 nor 1",
                });
            }
        };
        if e.status > WcStatus::GeneralErr as u8 {
            return Err(CqeError::Malformed {
                cqn,
                index,
                what: "status out of range",
            });
        }
        let status = WcStatus::from_u8(e.status);
        let opcode = match (is_send, e.opcode) {
            (true, 0) => WcOpcode::Send,
            (true, 1) => WcOpcode::RdmaWrite,
            (true, 2) => WcOpcode::RdmaRead,
            (true, 3) => WcOpcode::CompSwap,
            (true, 4) => WcOpcode::FetchAdd,
            (true, 5) => WcOpcode::BindMw,
            (true, 6) => WcOpcode::LocalInv,
            (false, 128) => WcOpcode::Recv,
            (false, 129) => WcOpcode::RecvRdmaWithImm,
            (_, op) if status != WcStatus::Success => {
                // Opcodes of error completions are undefined; keep a harmless value.
                let _ = op;
                if is_send {
                    WcOpcode::Send
                } else {
                    WcOpcode::Recv
                }
            }
            (_, op) => {
                return Err(CqeError::BadOpcode {
                    cqn,
                    index,
                    dir: if is_send { "send" } else { "receive" },
                    opcode: op,
                });
            }
        };
        Ok(Cqe {
            wc: WorkCompletion {
                qp_num: e.qpn.get() & 0x00ff_ffff,
                status,
                vendor_err: u32::from(e.vendor_err.get()),
                opcode,
                byte_len: e.byte_len.get(),
                imm_data: e.imm.get(),
                wc_flags: WcFlags::from_bits_truncate(u32::from(e.flags)),
                src_qp: e.src_qp.get() & 0x00ff_ffff,
                slid: e.slid.get(),
                sl: e.sl,
                dlid_path_bits: e.dlid_path_bits,
                pkey_index: e.pkey_index.get(),
                ..WorkCompletion::default()
            },
            wqe: WqeRef {
                is_send,
                index: e.wqe_index.get(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cqe_round_trips_and_rejects_nonsense() {
        let cqe = Cqe {
            wc: WorkCompletion {
                qp_num: 0x11,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: 100,
                imm_data: 0xabcd,
                wc_flags: WcFlags::WITH_IMM,
                src_qp: 0x22,
                ..WorkCompletion::default()
            },
            wqe: WqeRef {
                is_send: false,
                index: 3,
            },
        };
        let raw = CqeCodec::encode(&cqe, true);
        assert!(CqeCodec::owner_bit(&raw));
        assert_eq!(CqeCodec::decode(&raw, 1, 0).unwrap(), cqe);
        let mut bad = raw;
        bad[19] = 77; // receive opcode 77
        assert!(matches!(
            CqeCodec::decode(&bad, 1, 0),
            Err(CqeError::BadOpcode { opcode: 77, .. })
        ));
        bad = raw;
        bad[26] = 9;
        assert!(CqeCodec::decode(&bad, 1, 0).is_err());
        assert!(CqeCodec::decode(&raw[..8], 1, 0).is_err());
    }
}

//! The error type shared by every parser and emitter of the wire module.
//!
//! Parsers never panic on malformed input: every problem with the bytes is reported as one of
//! these variants, each carrying enough detail to say what was wrong.

/// Why a packet or header could not be parsed or emitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The input ends before a header (or the packet) is complete.
    #[error("truncated input: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes required to continue parsing.
        need: usize,
        /// Bytes actually available.
        have: usize,
    },
    /// The BTH opcode byte is not one this stack understands.
    #[error("unknown transport opcode 0x{0:02x}")]
    UnknownOpcode(u8),
    /// The BTH transport header version is not 0.
    #[error("unsupported BTH transport header version {0} (only 0 is defined)")]
    BadVersion(u8),
    /// On emit: the opcode requires an extension header that is `None`.
    #[error("opcode requires a {0} header that is missing")]
    MissingHeader(&'static str),
    /// On emit: an extension header is present that the opcode does not carry.
    #[error("opcode does not carry a {0} header, but one was given")]
    UnexpectedHeader(&'static str),
    /// The BTH pad count does not fit the payload.
    #[error("bad pad count {pad} for a payload of {payload} bytes")]
    BadPad {
        /// The BTH PadCnt value.
        pad: u8,
        /// The payload length the pad was checked against (pad bytes included when parsing).
        payload: usize,
    },
    /// Bytes follow the headers of an opcode that carries no payload.
    #[error("payload present on an opcode that carries none")]
    UnexpectedPayload,
    /// The output buffer cannot hold what is being emitted.
    #[error("output buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall {
        /// Bytes required.
        need: usize,
        /// Bytes available in the buffer.
        have: usize,
    },
    /// The IP header is malformed or not supported (the text says why).
    #[error("bad IP header: {0}")]
    BadIpHeader(&'static str),
    /// The UDP header is malformed or not RoCEv2 (the text says why).
    #[error("bad UDP header: {0}")]
    BadUdpHeader(&'static str),
    /// The invariant CRC does not match the packet contents.
    #[error("bad ICRC: computed 0x{computed:08x}, found 0x{found:08x}")]
    BadIcrc {
        /// CRC value computed over the received bytes.
        computed: u32,
        /// CRC value carried by the packet.
        found: u32,
    },
}

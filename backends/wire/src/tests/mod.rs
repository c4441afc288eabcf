//! Unit tests of the wire module, grouped by layer.

mod frame;
mod headers;
mod opcode;
mod prop;
mod transport;

/// Decodes a whitespace-separated hex string such as `"04 b0 ff ff"`.
fn hex(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .map(|b| u8::from_str_radix(b, 16).expect("test vector is valid hex"))
        .collect()
}

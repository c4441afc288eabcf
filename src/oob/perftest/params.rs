//! The fixed-size messages: version, system data, MTU and the bandwidth report.

use super::{DecodeError, VERSION_LEN};
use crate::oob::c_text;

/// What the peer announced before the test ([`negotiate`](super::negotiate)).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PeerParams {
    /// The peer's protocol version.
    pub version: f64,
    /// The larger of both sides' cycle buffers (page sizes), at most 16 MiB.
    pub cycle_buffer: u32,
    /// The smaller of both sides' MTUs, as an `ibv_mtu` value (1 ..= 5).
    pub mtu_enum: u8,
}

/// The version message: `version` NUL-padded to [`VERSION_LEN`] bytes (cut to 15 bytes).
pub fn version_msg(version: &str) -> [u8; VERSION_LEN] {
    let mut msg = [0u8; VERSION_LEN];
    let n = version.len().min(VERSION_LEN - 1);
    msg[..n].copy_from_slice(&version.as_bytes()[..n]);
    msg
}

/// The peer's version as perftest compares it (C's `atof`: the leading decimal number, after
/// white space), read from the first [`VERSION_LEN`] bytes of `msg` up to a NUL.
///
/// # Errors
/// [`DecodeError::Version`]: the text does not start with a number.
pub fn parse_version(msg: &[u8]) -> Result<f64, DecodeError> {
    let text = c_text(&msg[..msg.len().min(VERSION_LEN)]);
    let t = text.trim_start();
    let mut dot = false;
    let len = t
        .bytes()
        .take_while(|&b| match b {
            b'0'..=b'9' => true,
            b'.' if !dot => {
                dot = true;
                true
            }
            _ => false,
        })
        .count();
    t[..len]
        .parse::<f64>()
        .map_err(|_| DecodeError::Version(text.into_owned()))
}

/// A 4-byte big-endian integer message (perftest's `hton_int`).
pub fn int_msg(value: i32) -> [u8; 4] {
    value.to_be_bytes()
}

/// Reads a 4-byte big-endian integer message.
pub fn parse_int(msg: [u8; 4]) -> i32 {
    i32::from_be_bytes(msg)
}

/// The MTU message: the `ibv_mtu` value as one decimal digit and a NUL (values above 9 as
/// `9`).
pub fn mtu_msg(mtu_enum: u8) -> [u8; 2] {
    [b'0' + mtu_enum.min(9), 0]
}

/// Reads the MTU message (C's `strtol`: the leading decimal digits).
///
/// # Errors
/// [`DecodeError::Mtu`]: not a value of 1 ..= 5.
pub fn parse_mtu(msg: [u8; 2]) -> Result<u8, DecodeError> {
    let digits = msg.iter().take_while(|b| b.is_ascii_digit()).count();
    match std::str::from_utf8(&msg[..digits]).map(str::parse::<u8>) {
        Ok(Ok(v @ 1..=5)) => Ok(v),
        _ => Err(DecodeError::Mtu(
            String::from_utf8_lossy(&msg)
                .trim_end_matches('\0')
                .to_owned(),
        )),
    }
}

/// A bandwidth report as `xchg_bw_reports` exchanges it (without the per-port fields).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BwReport {
    /// Message size.
    pub size: u64,
    /// Messages counted.
    pub iters: u64,
    /// Peak bandwidth, in the report's unit.
    pub bw_peak: f64,
    /// Average bandwidth, in the report's unit.
    pub bw_avg: f64,
    /// Message rate in Mpps.
    pub msg_rate: f64,
}

impl BwReport {
    /// The five messages, in order, each 8 bytes big-endian (the numbers as IEEE doubles).
    pub fn messages(&self) -> [[u8; 8]; 5] {
        [
            self.size.to_be_bytes(),
            self.iters.to_be_bytes(),
            self.bw_peak.to_bits().to_be_bytes(),
            self.bw_avg.to_bits().to_be_bytes(),
            self.msg_rate.to_bits().to_be_bytes(),
        ]
    }

    /// The report from its five messages. Any bytes are a report.
    pub fn from_messages(m: &[[u8; 8]; 5]) -> Self {
        let f = |b: [u8; 8]| f64::from_bits(u64::from_be_bytes(b));
        Self {
            size: u64::from_be_bytes(m[0]),
            iters: u64::from_be_bytes(m[1]),
            bw_peak: f(m[2]),
            bw_avg: f(m[3]),
            msg_rate: f(m[4]),
        }
    }
}

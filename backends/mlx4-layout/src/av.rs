//! The 32-byte address vector of UD WQEs (`struct mlx4_av`), shared with rdma-core's AH objects.

#![allow(missing_docs)]

use zerocopy::byteorder::big_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use super::layout;

/// Address vector.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Unaligned,
)]
#[repr(C)]
pub struct Av {
    /// bits 31:24 port, 23:0 PD.
    pub port_pd: U32,
    pub _r0: u8,
    /// bit7 GRH present, bits 6:0 source path bits.
    pub g_slid: u8,
    pub dlid: U16,
    pub _r1: u8,
    pub gid_index: u8,
    pub stat_rate: u8,
    pub hop_limit: u8,
    /// SL 31:28, traffic class 27:20, flow label 19:0.
    pub sl_tclass_flowlabel: U32,
    pub dgid: [u8; 16],
}
layout!(Av, 32, {
    port_pd: 0, g_slid: 5, dlid: 6, gid_index: 9, stat_rate: 10, hop_limit: 11,
    sl_tclass_flowlabel: 12, dgid: 16,
});

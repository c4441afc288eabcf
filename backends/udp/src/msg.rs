//! What a send is given and what a receive reports, the same on every OS: the `sys`
//! modules (Linux, Windows) take and fill these.

use std::net::SocketAddr;

/// One message for `sys::send_batch`: `bytes` to `dst`; with `segment`, several datagrams of
/// that many bytes each (the last may be shorter) sent as one segmentation-offload message
/// (GSO on Linux, USO on Windows).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outgoing<'a> {
    pub(crate) dst: SocketAddr,
    pub(crate) bytes: &'a [u8],
    pub(crate) segment: Option<u16>,
    /// The IP header's fields the packet asks for (what each OS applies: its `sys` module's
    /// docs).
    pub(crate) ip: IpFields,
}

/// The IP header fields a RoCEv2 packet carries from its path (GRH): put in the header on
/// send, as far as the OS lets a sender, and reported on receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IpFields {
    pub(crate) traffic_class: u8,
    pub(crate) hop_limit: u8,
    pub(crate) flow_label: u32,
}

impl IpFields {
    /// The fields as the wire crate builds a frame with them (for captures).
    pub(crate) fn frame_options(self, ipv4_id: u16) -> portverbs_wire::FrameOptions {
        portverbs_wire::FrameOptions {
            traffic_class: self.traffic_class,
            hop_limit: self.hop_limit,
            ipv4_id,
            flow_label: self.flow_label,
        }
    }
}

impl Default for IpFields {
    fn default() -> Self {
        Self {
            traffic_class: 0,
            hop_limit: 64,
            flow_label: 0,
        }
    }
}

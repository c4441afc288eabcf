//! UDP-bound devices for the CM tests (Linux): a device's CM on a loopback address, and a
//! peer that never answers.

use std::net::IpAddr;
use std::thread;
use std::time::{Duration, Instant};

use portverbs::cm::service::CmDevice;
use portverbs::cm::wire::{CmMessage, Mad, Req};
use portverbs::hal::Progress;
use portverbs::udp_port::UdpConfig;
use portverbs::{UdpDevice, udp_device};

use super::Dev;

/// A UDP-bound device named `name` on `ip`, in `progress`, and its CM on that address.
pub fn udp_cm(name: &str, ip: IpAddr, progress: Progress) -> (UdpDevice, Dev) {
    let mut config = UdpConfig::new(ip);
    config.progress = progress;
    let dev = udp_device(name, config).unwrap_or_else(|e| panic!("{name} on {ip}: {e}"));
    let ctx = portverbs::open(dev.any()).unwrap();
    let cm = CmDevice::open_blocking(&ctx, ip).unwrap();
    (dev, cm)
}

/// A peer that never answers: a plain UDP socket on the RoCEv2 port (4791) of an address,
/// reading what reaches it.
pub struct Silent(std::net::UdpSocket);

impl Silent {
    pub fn bind(ip: IpAddr) -> Self {
        let sock = std::net::UdpSocket::bind((ip, 4791))
            .unwrap_or_else(|e| panic!("a silent peer on {ip}: {e}"));
        sock.set_nonblocking(true).unwrap();
        Self(sock)
    }

    /// The datagrams received so far (each read once).
    pub fn count(&self) -> usize {
        let mut buf = [0u8; 2048];
        std::iter::from_fn(|| self.0.recv(&mut buf).ok()).count()
    }

    /// The next REQ that arrives (BTH and DETH in front of the MAD), waiting up to 20 s.
    pub fn req(&self) -> Req {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut buf = [0u8; 2048];
        loop {
            let Ok(n) = self.0.recv(&mut buf) else {
                assert!(Instant::now() < deadline, "no REQ reached the silent peer");
                thread::sleep(Duration::from_millis(1));
                continue;
            };
            let Some(bytes) = buf.get(20..276).filter(|_| n >= 276) else {
                continue;
            };
            if let Ok(Mad {
                msg: CmMessage::Req(r),
                ..
            }) = Mad::parse(bytes)
            {
                return r;
            }
        }
    }
}

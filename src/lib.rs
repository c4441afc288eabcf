//! # Portverbs
//!
//! A userspace RDMA stack in Rust that applications link directly, on Linux and on Windows.
//! This facade is where an application starts: list devices ([`devices`], [`device`]), open
//! one ([`open`], or by IP address as rdma_cm binds one: [`open_by_addr`]), and use the verbs of [`verbs`] (`portverbs-verbs`) through the type aliases
//! below, whatever the backend. The verbs follow libibverbs: a name there is the name here
//! without the `ibv_` prefix, as a method of the object it acts on.
//!
//! ## A first program
//! An RC queue pair on each embedded software device, connected, one RDMA WRITE:
//!
//! ```
//! use portverbs::prelude::*;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let open = |name| portverbs::open(portverbs::device(name).expect("embedded device"));
//! let (ctx_a, ctx_b) = (open("soft0")?, open("soft1")?);
//! let opts = ConnectOptions::default(); // rc_pingpong's defaults
//! let side = |ctx: &Context| -> Result<_, Box<dyn std::error::Error>> {
//!     let pd = ctx.alloc_pd_blocking()?;
//!     let cq = ctx.create_cq_blocking(CqInit { entries: 16, ..CqInit::default() })?;
//!     let qp = pd.create_qp_blocking(QpInit::new(QpType::Rc, &cq))?;
//!     let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
//!     let mr = pd.reg_vec_blocking(vec![0u8; 4096], access)?; // memory the application owns
//!     Ok((pd, cq, qp, mr))
//! };
//! let (_pd_a, cq_a, qp_a, mr_a) = side(&ctx_a)?;
//! let (_pd_b, _cq_b, qp_b, mr_b) = side(&ctx_b)?;
//! // Exchange endpoints out of band (here: in memory), then RESET→INIT→RTR→RTS in one call.
//! let (ep_a, ep_b) = (qp_a.endpoint_blocking(&opts)?, qp_b.endpoint_blocking(&opts)?);
//! qp_a.connect_rc_blocking(&ep_b, &opts)?;
//! qp_b.connect_rc_blocking(&ep_a, &opts)?;
//!
//! let remote = RemoteAddr { addr: mr_b.addr(), rkey: mr_b.rkey().expect("remote write") };
//! let sges = [mr_a.sge(0, 64)?];
//! let write = SendWr::new(1, SendOp::RdmaWrite { remote }).sges(&sges);
//! qp_a.post_send(&[write.flags(SendFlags::SIGNALED)])?;
//! let mut wc = [WorkCompletion::default(); 1];
//! while cq_a.poll(&mut wc)? == 0 {}
//! assert_eq!(wc[0].status, WcStatus::Success);
//! # Ok(()) }
//! ```
//!
//! The `examples/` directory of the repository has complete programs: `rc_write` (busy
//! polling), `send_recv_events` (sleeping on a completion channel), `tokio_echo` (async),
//! `ud_send` (address handles and the GRH), `srq_server` (a shared receive queue).
//!
//! ## Events: read, block or await
//! [`open`] opens a device with the OS's own interrupt mechanism ([`platform_sinks`]), so
//! each kind of event can be read without blocking, waited for, or awaited:
//!
//! | What | Read | Block | Await |
//! |---|---|---|---|
//! | CQ events of a completion channel (`ibv_get_cq_event`) | [`get_cq_event`](verbs::CompletionChannel::get_cq_event) | [`wait_cq_event`](verbs::CompletionChannel::wait_cq_event) | [`next_cq_event`](verbs::CompletionChannel::next_cq_event) |
//! | A CQ notify request (NetworkDirect `Notify`) | [`NotifyRequest::try_result`](verbs::NotifyRequest::try_result) | [`Cq::wait_notify`](verbs::Cq::wait_notify) | [`Cq::notified`](verbs::Cq::notified) |
//! | Asynchronous events (`ibv_get_async_event`) | [`get_async_event`](verbs::Context::get_async_event) | [`wait_async_event`](verbs::Context::wait_async_event) | [`next_async_event`](verbs::Context::next_async_event) |
//!
//! On Linux each has a pollable fd too (`CompletionChannel::as_fd`, `Context::async_fd`) for
//! an application's own epoll loop; see `portverbs::linux`. Awaiting works on any executor; with hardware behind VFIO it needs feature
//! `tokio` (the fds then sit in tokio's reactor). On Windows, blocking waits sleep on a
//! completion port (on a UDP-bound device in manual progress, on its receive event and an
//! event the event queue's raise signals, so that a datagram wakes them), and `portverbs::windows` (crate `portverbs-windows`) adds the Windows
//! ways to wait: OVERLAPPED requests completing to the application's completion port, to an
//! event, or to an APC.
//!
//! ## Backends
//! * **soft** — the software RDMA device ([`soft`]). [`devices`] lists the devices of an
//!   embedded in-process fabric (two devices, `soft0` at 10.0.0.1 and `soft1` at 10.0.0.2,
//!   driven by an engine thread); build your own [`soft::Fabric`] for other topologies or for
//!   deterministic stepped tests. On Linux a software device can be bound to an IP address
//!   (`udp_device`, `PORTVERBS_UDP`), in either progress mode.
//!
//! ## Progress: manual or auto
//! A UDP-bound device is made in one of two progress modes ([`hal::Progress`], after
//! libfabric's `FI_PROGRESS_AUTO` and `FI_PROGRESS_MANUAL`): **auto**, the default — one
//! progress thread per device receives, runs the transport, its timers and the connection
//! manager, and sends, so peers are answered whatever the application does (what a librdmacm
//! user expects) — or **manual** — no thread: a post sends on the posting thread, and every
//! poll, wait, await and [`verbs::Context::dispatch`] receives and runs the rest on the
//! caller's thread (polling any CQ of a device makes the whole device progress). Choose it
//! with `udp_port::UdpConfig::progress`, or for [`devices`] with `PORTVERBS_PROGRESS`
//! ([`progress_env`]) or `set_udp_progress`. The embedded fabric's devices are auto.
//! Congestion control (a window per destination path, ECN) is on unless
//! `udp_port::UdpConfig::congestion` or, for [`devices`], `PORTVERBS_CC=off` ([`cc_env`])
//! turns it off.
//! * **mlx4** — the mlx4 driver ([`mlx4`]). On the embedded fabric it drives two emulated
//!   ConnectX-3s ([`mlx4_model`]), `mlx4_0` at 10.0.0.3 and `mlx4_1` at 10.0.0.4; on Linux,
//!   functions bound to vfio-pci are listed too ([`hardware_env`] tells how the scan is
//!   steered).
//! * **udp** — a software device bound to an IP address, speaking RoCEv2 through the
//!   system's UDP sockets ([`udp_device`], and `PORTVERBS_UDP=<ip>[,<ip>…]` for [`devices`]),
//!   on Linux and Windows ([`udp_port`] says what each system puts on the wire).
//!
//! ## Packet capture
//! `PORTVERBS_PCAP=<path>` makes the embedded fabric write every packet its devices send to a
//! pcap file, as Ethernet + IP + UDP (port 4791) + InfiniBand frames with their ICRC, which
//! Wireshark and tshark decode as RoCEv2 ([`capture_env`]). A fabric of your own captures
//! with [`soft::FabricConfig::capture`] or [`soft::Fabric::start_capture`].
//!
//! ## Features
//! * `tokio` — Linux: the event queues' eventfds are registered with tokio's reactor the first
//!   time a task awaits them, so hardware interrupts wake tasks too.

#![warn(missing_docs)]

mod any;
mod any_queue;
mod by_addr;
mod cm_timer;
mod devices;
mod env;
pub mod oob;
mod open;
#[cfg(any(target_os = "linux", windows))]
mod udp;

pub use any::AnyDevice;
pub use any_queue::{AnyCq, AnyRq, AnySq, AnySrq};
pub use by_addr::{
    OpenByAddrError, cm_device_by_addr, cm_device_by_addr_async, device_by_addr, open_by_addr,
    open_by_addr_async,
};
pub use devices::{
    DeviceError, EMBEDDED_ADDRS, EMBEDDED_MLX4_ADDRS, EmulatedMlx4Error, SkipReason, SkippedDevice,
    device, devices, embedded_fabric, embedded_mlx4_models, emulated_mlx4, skipped_devices,
};
#[doc(hidden)]
pub use devices::{embedded_fabric_started, vfio_scanned};
pub use env::{EnvError, HardwareEnv, capture_env, cc_env, hardware_env, progress_env};
pub use open::{context_options, open, platform_sinks};
/// The connection manager: the sans-IO protocol core (`portverbs-cm`) and, as
/// [`cm::service`], the IB CM over QP1 with rdma_cm's IP addressing (`Listener`, `Connector`;
/// crate `portverbs-cm-service`), with ready-made timers to lend a CM device in async code
/// (`cm::TokioTimer` with feature `tokio`, `cm::PortTimer` on Windows).
pub mod cm {
    #[cfg(windows)]
    pub use crate::cm_timer::PortTimer;
    #[cfg(feature = "tokio")]
    pub use crate::cm_timer::TokioTimer;
    pub use portverbs_cm::*;
    pub use portverbs_cm_service as service;
}
pub use portverbs_hal as hal;
pub use portverbs_mlx4 as mlx4;
pub use portverbs_mlx4_model as mlx4_model;
pub use portverbs_soft as soft;
/// The UDP port: RoCEv2 over the system's UDP sockets (Linux and Windows).
#[cfg(any(target_os = "linux", windows))]
pub use portverbs_udp as udp_port;
pub use portverbs_verbs as verbs;
#[cfg(any(target_os = "linux", windows))]
pub use udp::{
    UdpDevice, UdpDeviceError, env_udp_device, in_process, set_udp_progress, udp_device,
    udp_device_on, udp_env, udp_progress,
};

/// The Linux platform layer: eventfds behind the event queues, for applications that run
/// their own poll or epoll loop.
#[cfg(target_os = "linux")]
pub use portverbs_linux as linux;

/// The Windows platform layer: OVERLAPPED requests completing to an I/O completion port, an
/// event or an APC.
#[cfg(windows)]
pub use portverbs_windows as windows;

/// An opened device.
pub type Context = portverbs_verbs::Context<AnyDevice>;
/// A protection domain.
pub type Pd = portverbs_verbs::Pd<AnyDevice>;
/// A memory region.
pub type Mr = portverbs_verbs::Mr<AnyDevice>;
/// A memory window.
pub type Mw = portverbs_verbs::Mw<AnyDevice>;
/// A completion queue.
pub type Cq = portverbs_verbs::Cq<AnyDevice>;
/// A queue pair.
pub type Qp = portverbs_verbs::Qp<AnyDevice>;
/// A shared receive queue.
pub type Srq = portverbs_verbs::Srq<AnyDevice>;
/// An address handle.
pub type AddressHandle = portverbs_verbs::AddressHandle<AnyDevice>;
/// A completion channel.
pub type CompletionChannel = portverbs_verbs::CompletionChannel<AnyDevice>;

/// Everything an application usually needs.
pub mod prelude {
    pub use crate::{
        AddressHandle, AnyDevice, CompletionChannel, Context, Cq, Mr, Mw, Pd, Qp, Srq,
    };
    pub use portverbs_hal::{BlockingDevice, Device};
    pub use portverbs_verbs::{
        AccessFlags, AddressVector, Buffer, ConnectOptions, CqInit, Gid, Mtu, MwType, NotifyKind,
        QpAttr, QpAttrMask, QpCaps, QpEndpoint, QpInit, QpState, QpType, RecvWr, RemoteAddr,
        SendFlags, SendOp, SendWr, Sge, SrqInit, UdDest, WaitError, WcFlags, WcOpcode, WcStatus,
        WorkCompletion,
    };
}

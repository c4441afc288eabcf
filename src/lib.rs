//! # Portverbs
//!
//! A userspace RDMA stack in Rust that applications link directly, on Linux and on Windows.
//! This facade is where an application starts: list devices ([`devices`], [`device`]), open
//! one ([`open`], or by IP address as rdma_cm binds one: [`open_by_addr`]), and use the verbs
//! of [`verbs`] through the type aliases below ([`Context`],
//! [`Pd`], [`Mr`], [`Cq`], [`Qp`] …), whatever the backend. The verbs follow libibverbs: a
//! name there is the name here without the `ibv_` prefix, as a method of the object it acts
//! on. Connections by IP address, as librdmacm makes them, are [`cm`]'s.
//!
//! ## What is where
//!
//! | Path | What |
//! |---|---|
//! | [`devices`], [`device`], [`AnyDevice`], [`DeviceError`] | the devices this process can open, whatever their backend |
//! | [`device_by_addr`], [`open_by_addr`], [`cm_device_by_addr`] (async: [`open_by_addr_async`], [`cm_device_by_addr_async`]) | the device whose port has an IP address, opened, or with the CM on it (`rdma_bind_addr`'s lookup) |
//! | [`open`] ([`context_options`], [`platform_sinks`] to open from `async` code) | `ibv_open_device`, with the OS's own interrupt mechanism |
//! | [`Context`], [`Pd`], [`Mr`], [`Mw`], [`Cq`], [`Qp`], [`Srq`], [`AddressHandle`], [`CompletionChannel`] | the verbs objects over [`AnyDevice`]: aliases of [`verbs`]' generic types, whose pages list their methods |
//! | [`verbs`] | the verbs: those types, their parameters (`QpInit`, `SendWr` …), completions, events, errors |
//! | [`prelude`] | the aliases and the plain types a program names most |
//! | [`cm`] | the connection manager: [`CmDevice`](cm::CmDevice), [`Listener`](cm::Listener), [`Connector`](cm::Connector), [`ConnParam`](cm::ConnParam), events and errors; the protocol agent underneath is [`cm::agent`] |
//! | [`oob`] | the out-of-band exchanges of the C test programs (`ibv_rc_pingpong`, perftest, `rping`) |
//! | `linux`, `windows` (each on its OS) | each OS's own ways to wait (an eventfd per event queue; completion ports, events, APCs) |
//! | [`env`](mod@env) | the `PORTVERBS_*` environment variables [`devices`] follows |
//! | [`testing`] | the embedded in-process fabric and emulated HCAs, for tests and examples |
//! | [`backends`] | the backends (`soft`, `mlx4`, `mlx4_model`, `udp`) for what goes beyond the verbs, and the HAL, for backend authors |
//!
//! The calls of a typical program, on these pages: [`Context::alloc_pd_blocking`](verbs::Context::alloc_pd_blocking),
//! [`Context::create_cq_blocking`](verbs::Context::create_cq_blocking),
//! [`Pd::create_qp_blocking`](verbs::Pd::create_qp_blocking),
//! [`Pd::reg_vec_blocking`](verbs::Pd::reg_vec_blocking),
//! [`Qp::endpoint_blocking`](verbs::Qp::endpoint_blocking),
//! [`Qp::connect_rc_blocking`](verbs::Qp::connect_rc_blocking),
//! [`Qp::post_send`](verbs::Qp::post_send), [`Qp::post_recv`](verbs::Qp::post_recv),
//! [`Cq::poll`](verbs::Cq::poll), [`Mr::sge`](verbs::Mr::sge); with the CM,
//! [`CmDevice::open_blocking`](cm::CmDevice::open_blocking),
//! [`Listener::get_request_blocking`](cm::Listener::get_request_blocking),
//! [`ConnectionRequest::accept_blocking`](cm::ConnectionRequest::accept_blocking),
//! [`Connector::resolve_blocking`](cm::Connector::resolve_blocking) and
//! [`Connector::connect_blocking`](cm::Connector::connect_blocking).
//!
//! ### No raw device commands
//! An application reaches a device only through the verbs, which check every QP state
//! transition against the IBTA table and keep the objects' bookkeeping. The HAL's command
//! interface (`Device::modify_qp` …) bypasses both, so the [`prelude`] does not bring its
//! traits and it is documented only as [`backends::hal`], for backend authors.
//! `Context::device`, which verbs-core keeps for the layers above it (the CM, the platform
//! crates, tests), is hidden from these pages; with the prelude alone the device it returns
//! offers no command (below), and [`AnyDevice::info`] says what a device is without the HAL's
//! traits. A program that imports them from `backends::hal` has opted out of the verbs'
//! checks by name.
//!
//! This is a boundary of the API, not of memory safety: the HAL's commands are safe
//! functions that every backend must keep memory-safe whatever their order (verbs-core itself
//! forbids `unsafe`), so a misplaced command corrupts a connection's state, never memory.
//! That is why they are hidden rather than made `unsafe fn`, which would claim a danger they
//! do not have and break every caller above verbs-core.
//!
//! ```compile_fail
//! use portverbs::prelude::*;
//!
//! let ctx = portverbs::open(portverbs::device("soft0").unwrap()).unwrap();
//! // No HAL trait in scope: a raw QP command on the opened device does not compile.
//! let _ = ctx.device().query_qp_blocking(0, QpAttr::default());
//! ```
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
//! `ud_send` (address handles and the GRH), `srq_server` (a shared receive queue),
//! `cm_connect` (the CM).
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
//! * **soft** — the software RDMA device ([`backends::soft`]). [`devices`] lists the devices
//!   of an embedded in-process fabric (two devices, `soft0` at 10.0.0.1 and `soft1` at
//!   10.0.0.2, driven by an engine thread; [`testing`]); build your own
//!   [`Fabric`](backends::soft::Fabric) for other topologies or for deterministic stepped
//!   tests.
//! * **mlx4** — the mlx4 driver ([`backends::mlx4`]). On the embedded fabric it drives two
//!   emulated ConnectX-3s ([`backends::mlx4_model`]), `mlx4_0` at 10.0.0.3 and `mlx4_1` at
//!   10.0.0.4; on Linux, functions bound to vfio-pci are listed too
//!   ([`env::hardware_env`] tells how the scan is steered).
//! * **udp** — a software device bound to an IP address, speaking RoCEv2 through the
//!   system's UDP sockets (`backends::udp::udp_device`, and `PORTVERBS_UDP=<ip>[,<ip>…]` for
//!   [`devices`]), on Linux and Windows (`backends::udp` says what each system puts on the
//!   wire).
//!
//! ## Progress: manual or auto
//! A UDP-bound device is made in one of two progress modes ([`env::Progress`], after
//! libfabric's `FI_PROGRESS_AUTO` and `FI_PROGRESS_MANUAL`): **auto**, the default — one
//! progress thread per device receives, runs the transport, its timers and the connection
//! manager, and sends, so peers are answered whatever the application does (what a librdmacm
//! user expects) — or **manual** — no thread: a post sends on the posting thread, and every
//! poll, wait, await and [`verbs::Context::dispatch`] receives and runs the rest on the
//! caller's thread (polling any CQ of a device makes the whole device progress). Choose it
//! with `backends::udp::UdpConfig::progress`, or for [`devices`] with `PORTVERBS_PROGRESS`
//! ([`env::progress_env`]) or `env::set_udp_progress`. The embedded fabric's devices are
//! auto. Congestion control (a window per destination path, ECN) is on unless
//! `backends::udp::UdpConfig::congestion` or, for [`devices`], `PORTVERBS_CC=off`
//! ([`env::cc_env`]) turns it off.
//!
//! ## Packet capture
//! `PORTVERBS_PCAP=<path>` makes the embedded fabric write every packet its devices send to a
//! pcap file, as Ethernet + IP + UDP (port 4791) + InfiniBand frames with their ICRC, which
//! Wireshark and tshark decode as RoCEv2 ([`env::capture_env`]). A fabric of your own
//! captures with [`FabricConfig::capture`](backends::soft::FabricConfig::capture) or
//! [`Fabric::start_capture`](backends::soft::Fabric::start_capture).
//!
//! ## Features
//! * `tokio` — Linux: the event queues' eventfds are registered with tokio's reactor the first
//!   time a task awaits them, so hardware interrupts wake tasks too.

#![warn(missing_docs)]
#![deny(rustdoc::broken_intra_doc_links)]

mod by_addr;
mod cm_timer;
mod devices;
pub mod env;
pub mod oob;
mod open;
#[cfg(any(target_os = "linux", windows))]
mod udp;

pub use by_addr::{
    OpenByAddrError, cm_device_by_addr, cm_device_by_addr_async, device_by_addr, open_by_addr,
    open_by_addr_async,
};
pub use devices::{DeviceError, device, devices};
#[doc(hidden)]
pub use devices::{embedded_fabric_started, vfio_scanned};
pub use open::{context_options, open, platform_sinks};
pub use portverbs_any::AnyDevice;

pub mod verbs {
    //! The verbs (crate `portverbs-verbs`): [`Context`], [`Pd`], [`Mr`], [`Mw`], [`Cq`],
    //! [`Qp`], [`Srq`], [`AddressHandle`] and [`CompletionChannel`], generic over the device,
    //! with their parameters, completions, events and errors. An application names them
    //! through the aliases at the crate root ([`crate::Context`], [`crate::Qp`] …), whose
    //! device is [`AnyDevice`](crate::AnyDevice); their methods are on these pages.
    //!
    //! Every modify of a QP is checked against the IBTA state transition table, every work
    //! request against the QP's type and state before the backend encodes it; memory the
    //! device may write is a [`Buffer`], only ever copied into and out of. Every slow
    //! operation (create, modify, register …) is an `async fn` with a `*_blocking` twin.
    //! Events can be read, waited for or awaited: [`CompletionChannel::get_cq_event`],
    //! [`CompletionChannel::wait_cq_event`], [`CompletionChannel::next_cq_event`],
    //! [`Cq::wait_notify`], [`Cq::notified`], [`Context::get_async_event`],
    //! [`Context::wait_async_event`], [`Context::next_async_event`].
    #[doc(inline)]
    pub use portverbs_verbs::error::*;
    // Every name of verbs-core but its `hal` (tests/facade_surface.rs keeps the list whole).
    #[doc(inline)]
    pub use portverbs_verbs::{
        AccessFlags, AddressHandle, AddressVector, AsyncEvent, AsyncEventKind, Buffer,
        CompletionChannel, ConnectError, ConnectOptions, Context, ContextOptions, Cq, CqInit,
        EventElement, EventQueueRef, GRH_LEN, Gid, GrhError, LatchSink, LatchSinks, Mr, Mtu, Mw,
        MwBind, MwType, NotifyKind, NotifyRequest, ObjectCounts, Payload, Pd, PollingSinks,
        PortState, Qp, QpAttr, QpAttrMask, QpCaps, QpEndpoint, QpInit, QpState, QpType,
        REPLY_HOP_LIMIT, ReceivedGrh, RecvWr, RemoteAddr, Rereg, SendFlags, SendOp, SendWr, Sge,
        SinkFactory, SpecialQp, Srq, SrqInit, UdDest, WcFlags, WcOpcode, WcStatus, WeakQp,
        WorkCompletion, bringup, error, events, inc_rkey, notify,
    };
    // The rest (its `hal`: the HAL is `backends::hal`, for backend authors) compiles, hidden.
    #[doc(hidden)]
    pub use portverbs_verbs::*;
}

/// The connection manager for applications (crate `portverbs-cm-service`): the IB CM over
/// QP1 with rdma_cm's IP addressing. A [`CmDevice`](cm::CmDevice) serves one opened device;
/// a [`Listener`](cm::Listener) takes connection requests, a [`Connector`](cm::Connector)
/// makes them, both with a [`ConnParam`](cm::ConnParam); [`RdmaCmEvent`](cm::RdmaCmEvent)
/// names what happens to a connection and [`ServiceError`](cm::ServiceError) what failed.
/// Ready-made timers lend a CM device's async calls their retransmissions: `cm::TokioTimer`
/// (feature `tokio`: `cm.set_timer(Arc::new(TokioTimer::default()))`; `cargo doc --features
/// tokio` documents it) and `cm::PortTimer` (Windows). A device that runs its own progress
/// ([`CmDevice::served_by_device`](cm::CmDevice::served_by_device): a UDP-bound or embedded
/// device in auto progress) needs none: its progress thread fires the CM's timers.
///
/// Connecting passes the peer what it needs for one-sided operations in the private data:
/// the passive side's [`ConnParam::private_data`](cm::ConnParam::private_data) on accept (up
/// to 196 bytes: an address and an rkey, say) is what the active side's
/// [`Connector::connect`](cm::Connector::connect) returns.
///
/// The sans-IO protocol agent underneath (crate `portverbs-cm`: CM MADs, the connection
/// state machine, Linux's timeout arithmetic) is [`cm::agent`], for tools that speak CM MADs
/// themselves.
pub mod cm {
    #[cfg(windows)]
    pub use crate::cm_timer::PortTimer;
    #[cfg(feature = "tokio")]
    pub use crate::cm_timer::TokioTimer;
    #[doc(inline)]
    pub use portverbs_cm_service::*;

    /// The sans-IO CM protocol agent (crate `portverbs-cm`): CM MADs in and out, the
    /// connection state machine of Linux's `drivers/infiniband/core/cm.c`, timers as data.
    /// [`CmDevice`] drives one over a device's QP1; use it directly only to speak CM MADs
    /// yourself.
    #[doc(inline)]
    pub use portverbs_cm as agent;

    /// Old paths of the agent's items, from when `cm` was the agent's crate.
    #[doc(hidden)]
    pub use portverbs_cm::{
        AgentConfig, AgentStats, CmAgent, CmError, CmEvent, CmId, CmOutput, CmState, CmaError,
        ConnectRequest, MadError, OutMad, PathParams, QpAction, QpTarget, RtrAttrs, RtsAttrs,
        SidrParams, Transport, time, wire,
    };
    /// Old path of this module's items (`cm::service::Listener` …).
    #[doc(hidden)]
    pub use portverbs_cm_service as service;
}

/// The backends behind [`AnyDevice`], for what goes beyond the verbs: fabrics of your own,
/// fault injection, a UDP port's settings, the HAL.
///
/// * [`soft`] — the software RDMA device and the in-process fabric it runs on.
/// * [`mlx4`] — the mlx4 (ConnectX-3) driver; [`mlx4_model`] — the emulated ConnectX-3 it
///   drives on a fabric.
/// * `udp` (Linux and Windows) — software devices bound to an IP address, speaking RoCEv2
///   through the system's UDP sockets.
/// * [`hal`] — the hardware abstraction layer: the command interface every backend
///   implements. **For backend authors**: a HAL command bypasses verbs-core's checks (the
///   QP state transition table, the object bookkeeping), so an application that calls one
///   on an opened device desynchronises verbs-core from the device. Applications use the
///   verbs.
/// * [`AnySq`], [`AnyRq`], [`AnySrq`], [`AnyCq`] — [`AnyDevice`]'s queue objects: an enum
///   over the backends' objects per kind, so that a post or poll costs a match, not an
///   indirect call.
pub mod backends {
    pub use portverbs_any::{AnyCq, AnyRq, AnySq, AnySrq};
    /// For backend authors: the command interface every backend implements. Its commands
    /// bypass verbs-core's checks (the QP state transition table, the objects' bookkeeping);
    /// an application calls the verbs instead.
    ///
    #[doc(inline)]
    pub use portverbs_hal as hal;
    #[doc(inline)]
    pub use portverbs_mlx4 as mlx4;
    #[doc(inline)]
    pub use portverbs_mlx4_model as mlx4_model;
    #[doc(inline)]
    pub use portverbs_soft as soft;

    #[cfg(any(target_os = "linux", windows))]
    pub mod udp {
        //! Software devices on a real network (Linux and Windows): [`udp_device`] binds a
        //! software device to an IP address, its UDP port speaking RoCEv2 through the
        //! system's sockets (crate `portverbs-udp`, re-exported here: [`UdpConfig`],
        //! [`UdpPort`] …).
        pub use crate::udp::{UdpDevice, UdpDeviceError, udp_device, udp_device_on};
        #[doc(inline)]
        pub use portverbs_udp::*;
    }
}

/// The embedded in-process fabric that [`devices`] lists, and emulated HCAs on fabrics of
/// your own: what tests and examples run on when no RDMA hardware is at hand.
pub mod testing {
    pub use crate::devices::{
        EMBEDDED_ADDRS, EMBEDDED_MLX4_ADDRS, EmulatedMlx4Error, embedded_fabric,
        embedded_mlx4_models, emulated_mlx4,
    };
    #[cfg(any(target_os = "linux", windows))]
    pub use crate::udp::in_process;
}

// The paths these items had before `backends`, `env` and `testing`: the repository's
// tests and tools still use them.
#[doc(hidden)]
pub use devices::{
    EMBEDDED_ADDRS, EMBEDDED_MLX4_ADDRS, EmulatedMlx4Error, SkipReason, SkippedDevice,
    embedded_fabric, embedded_mlx4_models, emulated_mlx4, skipped_devices,
};
#[doc(hidden)]
pub use env::{EnvError, HardwareEnv, capture_env, cc_env, hardware_env, progress_env};
#[doc(hidden)]
pub use portverbs_any::{AnyCq, AnyRq, AnySq, AnySrq};
#[doc(hidden)]
pub use portverbs_hal as hal;
#[doc(hidden)]
pub use portverbs_mlx4 as mlx4;
#[doc(hidden)]
pub use portverbs_mlx4_model as mlx4_model;
#[doc(hidden)]
pub use portverbs_soft as soft;
#[doc(hidden)]
#[cfg(any(target_os = "linux", windows))]
pub use portverbs_udp as udp_port;
#[doc(hidden)]
#[cfg(any(target_os = "linux", windows))]
pub use udp::{
    UdpDevice, UdpDeviceError, env_udp_device, in_process, set_udp_progress, udp_device,
    udp_device_on, udp_env, udp_progress,
};

/// The Linux platform layer: eventfds behind the event queues, for applications that run
/// their own poll or epoll loop.
#[cfg(target_os = "linux")]
#[doc(inline)]
pub use portverbs_linux as linux;

/// The Windows platform layer: OVERLAPPED requests completing to an I/O completion port, an
/// event or an APC.
#[cfg(windows)]
#[doc(inline)]
pub use portverbs_windows as windows;

/// An opened device: [`verbs::Context`] over [`AnyDevice`] (its methods are there).
pub type Context = portverbs_verbs::Context<AnyDevice>;
/// A protection domain: [`verbs::Pd`] over [`AnyDevice`] (its methods are there).
pub type Pd = portverbs_verbs::Pd<AnyDevice>;
/// A memory region: [`verbs::Mr`] over [`AnyDevice`] (its methods are there).
pub type Mr = portverbs_verbs::Mr<AnyDevice>;
/// A memory window: [`verbs::Mw`] over [`AnyDevice`] (its methods are there).
pub type Mw = portverbs_verbs::Mw<AnyDevice>;
/// A completion queue: [`verbs::Cq`] over [`AnyDevice`] (its methods are there).
pub type Cq = portverbs_verbs::Cq<AnyDevice>;
/// A queue pair: [`verbs::Qp`] over [`AnyDevice`] (its methods are there).
pub type Qp = portverbs_verbs::Qp<AnyDevice>;
/// A shared receive queue: [`verbs::Srq`] over [`AnyDevice`] (its methods are there).
pub type Srq = portverbs_verbs::Srq<AnyDevice>;
/// An address handle: [`verbs::AddressHandle`] over [`AnyDevice`] (its methods are there).
pub type AddressHandle = portverbs_verbs::AddressHandle<AnyDevice>;
/// A completion channel: [`verbs::CompletionChannel`] over [`AnyDevice`] (its methods are
/// there).
pub type CompletionChannel = portverbs_verbs::CompletionChannel<AnyDevice>;

/// Everything an application usually needs: the aliases and the verbs' plain types. Not the
/// HAL's device traits: an application reaches a device through the verbs.
pub mod prelude {
    pub use crate::verbs::{
        AccessFlags, AddressVector, Buffer, ConnectOptions, CqInit, Gid, Mtu, MwType, NotifyKind,
        QpAttr, QpAttrMask, QpCaps, QpEndpoint, QpInit, QpState, QpType, RecvWr, RemoteAddr,
        SendFlags, SendOp, SendWr, Sge, SrqInit, UdDest, WaitError, WcFlags, WcOpcode, WcStatus,
        WorkCompletion,
    };
    pub use crate::{
        AddressHandle, AnyDevice, CompletionChannel, Context, Cq, Mr, Mw, Pd, Qp, Srq,
    };
}

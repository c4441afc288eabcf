//! Connecting QPs out of band, the way `ibv_rc_pingpong` and perftest do: each side describes
//! its QP as a [`QpEndpoint`] (LID, QPN, first PSN, GID), the application carries it to the
//! peer however it likes (TCP, a file, the connection manager), and [`Qp::connect_rc`] /
//! [`Qp::connect_uc`] / [`Qp::ready_ud`] take the QP from RESET to RTS with the attribute masks
//! IBTA requires ([`crate::bringup`]) and rdma-core's usual values ([`ConnectOptions`]).
//! [`Qp::modify`] stays for whoever wants every attribute in hand.

use portverbs_hal::attr::AddressVector;
use portverbs_hal::block_on;
use portverbs_hal::device::Device;
use portverbs_hal::types::{AccessFlags, Gid, LinkLayer, Mtu, QpState, QpType, SpecialQp};
use thiserror::Error;

use crate::bringup::{self, InitStep, RtrStep, RtsStep};
use crate::error::{ModifyQpError, QueryError};
use crate::qp::Qp;

/// What a peer needs to know to reach a QP: exchanged out of band, as `ibv_rc_pingpong`'s
/// `LID QPN PSN GID` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QpEndpoint {
    /// LID of the port (0 on RoCE; InfiniBand routes by it when no GRH is used).
    pub lid: u16,
    /// QP number.
    pub qpn: u32,
    /// First packet sequence number the QP sends with (24 bits).
    pub psn: u32,
    /// GID of the port at the chosen index (RoCE: the IP address as a GID).
    pub gid: Gid,
}

/// How to connect a QP. [`Default`] gives the values `ibv_rc_pingpong` uses: port 1, GID index
/// 0 where the port needs a GRH (RoCE), a random first PSN, the port's active MTU, SL 0, hop
/// limit 1, local ACK timeout 14 (about 67 ms), 7 transport and 7 RNR retries (7 = infinite),
/// RNR timer 12 (0.64 ms), one outstanding READ/atomic each way, Q_Key 0x11111111 for UD, and
/// remote write, read and atomic access for RC (write for UC).
///
/// The PSN: every call of [`Default::default`] draws a new random 24-bit PSN from the OS's
/// randomness (`portverbs_hal::rng`), as `ibv_rc_pingpong` and perftest draw theirs with
/// `lrand48() & 0xffffff` and rdma_cm draws one per connection, so that a peer cannot guess the
/// sequence numbers of a connection it is not part of. Advertise and connect with the *same*
/// value (`let opts = ConnectOptions::default();`, then [`Qp::endpoint`] and
/// [`Qp::connect_rc`] with `&opts`): two calls of `default()` give two PSNs. Set `psn` yourself
/// when a run must repeat exactly (a test on a stepped fabric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Local port (from 1).
    pub port: u8,
    /// GID index to send from; `None` is index 0 on a port that needs a GRH (RoCE) and no GRH
    /// on an InfiniBand port.
    pub gid_index: Option<u8>,
    /// First PSN this QP sends with, and advertises in its [`QpEndpoint`] (24 bits); random
    /// in [`Default`].
    pub psn: u32,
    /// Path MTU; `None` is the port's active MTU.
    pub mtu: Option<Mtu>,
    /// Remote access the QP grants (RC; UC keeps only `REMOTE_WRITE`, UD none).
    pub access: AccessFlags,
    /// Service level.
    pub sl: u8,
    /// GRH hop limit.
    pub hop_limit: u8,
    /// GRH traffic class.
    pub traffic_class: u8,
    /// Local ACK timeout code (4.096 µs · 2^timeout; 0 = none). RC.
    pub timeout: u8,
    /// Transport retries. RC.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite). RC.
    pub rnr_retry: u8,
    /// RNR NAK timer code. RC.
    pub min_rnr_timer: u8,
    /// Outstanding READs/atomics as initiator. RC.
    pub max_rd_atomic: u8,
    /// Outstanding READs/atomics as responder. RC.
    pub max_dest_rd_atomic: u8,
    /// Q_Key. UD.
    pub qkey: u32,
    /// P_Key index.
    pub pkey_index: u16,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            port: 1,
            gid_index: None,
            psn: portverbs_hal::rng::random_psn(),
            mtu: None,
            access: AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
            sl: 0,
            hop_limit: 1,
            traffic_class: 0,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            qkey: 0x1111_1111,
            pkey_index: 0,
        }
    }
}

/// Why a connect failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The port or GID the options name could not be read.
    #[error("local addressing: {0}")]
    Query(#[from] QueryError),
    /// A transition was refused (the QP not in RESET, a value beyond the device's limits …).
    #[error(transparent)]
    Modify(#[from] ModifyQpError),
    /// The call does not fit the QP's transport (`connect_rc` on a UD QP …).
    #[error("{call} is for {wants} QPs; QP {qpn:#x} is {qp_type}")]
    WrongTransport {
        /// The call made.
        call: &'static str,
        /// The transport it is for.
        wants: QpType,
        /// The QP.
        qpn: u32,
        /// Its transport.
        qp_type: QpType,
    },
}

/// The local addressing of a port, resolved from the options.
#[derive(Debug, Clone, Copy)]
struct Local {
    lid: u16,
    gid: Gid,
    gid_index: Option<u8>,
    mtu: Mtu,
}

impl ConnectOptions {
    /// The address vector toward `remote` from this side: a GRH (hop limit, traffic class, the
    /// local GID index) when the local port uses a GID, the remote LID otherwise. Also what a
    /// UD sender's address handle needs.
    pub fn address_vector(&self, remote: &QpEndpoint, gid_index: Option<u8>) -> AddressVector {
        let mut av = AddressVector {
            dlid: remote.lid,
            sl: self.sl,
            port_num: self.port,
            ..AddressVector::default()
        };
        if let Some(index) = gid_index {
            av.is_global = true;
            av.hop_limit = self.hop_limit;
            av.traffic_class = self.traffic_class;
            av.dgid = remote.gid;
            av.sgid_index = index;
        }
        av
    }
}

impl<D: Device> Qp<D> {
    async fn local(&self, opts: &ConnectOptions) -> Result<Local, QueryError> {
        let ctx = self.pd().context();
        let port = ctx.query_port(opts.port).await?;
        let gid_index = match (opts.gid_index, port.link_layer) {
            (Some(i), _) => Some(i),
            (None, LinkLayer::Ethernet) => Some(0),
            (None, LinkLayer::InfiniBand) => None,
        };
        let gid = match gid_index {
            Some(i) => ctx.query_gid(opts.port, u32::from(i)).await?.gid,
            None => Gid::ZERO,
        };
        Ok(Local {
            lid: port.lid,
            gid,
            gid_index,
            mtu: opts.mtu.unwrap_or(port.active_mtu),
        })
    }

    /// This QP as its peer must know it: the port's LID and GID (at the options' index), the
    /// QP number and the first PSN it will send with (`opts.psn`).
    ///
    /// # Errors
    /// The port or the GID entry does not exist.
    pub async fn endpoint(&self, opts: &ConnectOptions) -> Result<QpEndpoint, QueryError> {
        let local = self.local(opts).await?;
        Ok(QpEndpoint {
            lid: local.lid,
            qpn: self.qp_num(),
            psn: opts.psn & 0x00ff_ffff,
            gid: local.gid,
        })
    }

    /// Blocking form of [`Qp::endpoint`].
    ///
    /// # Errors
    /// As [`Qp::endpoint`].
    pub fn endpoint_blocking(&self, opts: &ConnectOptions) -> Result<QpEndpoint, QueryError> {
        block_on(self.endpoint(opts))
    }

    /// The address vector this QP reaches `remote` with under `opts`: a GRH from the options'
    /// GID index (index 0 on a RoCE port when none is given), the remote LID otherwise. What
    /// a UD sender's address handle needs ([`crate::Pd::create_ah`]).
    ///
    /// # Errors
    /// The port or the GID entry does not exist.
    pub async fn address_vector(
        &self,
        remote: &QpEndpoint,
        opts: &ConnectOptions,
    ) -> Result<AddressVector, QueryError> {
        let local = self.local(opts).await?;
        Ok(opts.address_vector(remote, local.gid_index))
    }

    /// Blocking form of [`Qp::address_vector`].
    ///
    /// # Errors
    /// As [`Qp::address_vector`].
    pub fn address_vector_blocking(
        &self,
        remote: &QpEndpoint,
        opts: &ConnectOptions,
    ) -> Result<AddressVector, QueryError> {
        block_on(self.address_vector(remote, opts))
    }

    fn expect(&self, call: &'static str, wants: QpType) -> Result<(), ConnectError> {
        if self.qp_type() == wants {
            Ok(())
        } else {
            Err(ConnectError::WrongTransport {
                call,
                wants,
                qpn: self.qp_num(),
                qp_type: self.qp_type(),
            })
        }
    }

    /// Connects an RC QP to `remote`: RESET → INIT → RTR → RTS with the masks IBTA requires and
    /// the options' values (`ibv_rc_pingpong`'s sequence). The QP must be in RESET, or in INIT
    /// after [`Qp::init`] with the same options.
    ///
    /// ```no_run
    /// # async fn demo<D: portverbs_hal::Device>(qp: portverbs_verbs::Qp<D>, peer: portverbs_verbs::QpEndpoint) -> Result<(), Box<dyn std::error::Error>> {
    /// use portverbs_verbs::ConnectOptions;
    /// let opts = ConnectOptions { psn: 0x1234, ..ConnectOptions::default() };
    /// let mine = qp.endpoint(&opts).await?; // send this to the peer, receive `peer`
    /// qp.connect_rc(&peer, &opts).await?;
    /// # let _ = mine; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ConnectError`]: a UD or UC QP, a missing port or GID, a refused transition.
    pub async fn connect_rc(
        &self,
        remote: &QpEndpoint,
        opts: &ConnectOptions,
    ) -> Result<(), ConnectError> {
        self.expect("connect_rc", QpType::Rc)?;
        self.connect(remote, opts).await
    }

    /// Blocking form of [`Qp::connect_rc`].
    ///
    /// # Errors
    /// As [`Qp::connect_rc`].
    pub fn connect_rc_blocking(
        &self,
        remote: &QpEndpoint,
        opts: &ConnectOptions,
    ) -> Result<(), ConnectError> {
        block_on(self.connect_rc(remote, opts))
    }

    /// Connects a UC QP to `remote` (as [`Qp::connect_rc`], with UC's masks; only
    /// `REMOTE_WRITE` of the options' access is kept).
    ///
    /// # Errors
    /// As [`Qp::connect_rc`].
    pub async fn connect_uc(
        &self,
        remote: &QpEndpoint,
        opts: &ConnectOptions,
    ) -> Result<(), ConnectError> {
        self.expect("connect_uc", QpType::Uc)?;
        self.connect(remote, opts).await
    }

    /// Blocking form of [`Qp::connect_uc`].
    ///
    /// # Errors
    /// As [`Qp::connect_rc`].
    pub fn connect_uc_blocking(
        &self,
        remote: &QpEndpoint,
        opts: &ConnectOptions,
    ) -> Result<(), ConnectError> {
        block_on(self.connect_uc(remote, opts))
    }

    /// Makes a UD QP ready to send and receive: RESET → INIT (port, P_Key index, Q_Key — for
    /// the GSI QP always [`SpecialQp::GSI_QKEY`]) → RTR → RTS (first PSN). Its peers are reached through address handles
    /// ([`ConnectOptions::address_vector`]).
    ///
    /// # Errors
    /// As [`Qp::connect_rc`].
    pub async fn ready_ud(&self, opts: &ConnectOptions) -> Result<(), ConnectError> {
        self.expect("ready_ud", QpType::Ud)?;
        self.connect(&QpEndpoint::default(), opts).await
    }

    /// Blocking form of [`Qp::ready_ud`].
    ///
    /// # Errors
    /// As [`Qp::connect_rc`].
    pub fn ready_ud_blocking(&self, opts: &ConnectOptions) -> Result<(), ConnectError> {
        block_on(self.ready_ud(opts))
    }

    /// RESET → INIT with the options' port, P_Key index, access (RC, UC) or Q_Key (UD): for
    /// posting receives before the peer's endpoint is known, as `ibv_rc_pingpong` does. The
    /// connect calls then go on from INIT.
    ///
    /// # Errors
    /// The transition was refused (the QP not in RESET …).
    pub async fn init(&self, opts: &ConnectOptions) -> Result<(), ConnectError> {
        let (attr, mask) = bringup::init(&InitStep {
            qp_type: self.qp_type(),
            port: opts.port,
            pkey_index: opts.pkey_index,
            access: opts.access,
            // The GSI QP has one Q_Key (IBA 13.5.1.1), whatever the options say.
            qkey: match self.special() {
                Some(SpecialQp::Gsi) => SpecialQp::GSI_QKEY,
                None => opts.qkey,
            },
        });
        self.modify(&attr, mask).await?;
        Ok(())
    }

    /// Blocking form of [`Qp::init`].
    ///
    /// # Errors
    /// As [`Qp::init`].
    pub fn init_blocking(&self, opts: &ConnectOptions) -> Result<(), ConnectError> {
        block_on(self.init(opts))
    }

    /// The RESET (or INIT) → RTR → RTS ladder of any transport.
    async fn connect(
        &self,
        remote: &QpEndpoint,
        opts: &ConnectOptions,
    ) -> Result<(), ConnectError> {
        let t = self.qp_type();
        let local = self.local(opts).await?;
        if self.state() != QpState::Init {
            self.init(opts).await?;
        }
        let (attr, mask) = bringup::rtr(&RtrStep {
            qp_type: t,
            av: opts.address_vector(remote, local.gid_index),
            path_mtu: local.mtu,
            dest_qpn: remote.qpn,
            rq_psn: remote.psn & 0x00ff_ffff,
            max_dest_rd_atomic: opts.max_dest_rd_atomic,
            min_rnr_timer: opts.min_rnr_timer,
            access: None,
        });
        self.modify(&attr, mask).await?;
        let (attr, mask) = bringup::rts(&RtsStep {
            qp_type: t,
            sq_psn: opts.psn & 0x00ff_ffff,
            timeout: opts.timeout,
            retry_cnt: opts.retry_cnt,
            rnr_retry: opts.rnr_retry,
            max_rd_atomic: opts.max_rd_atomic,
        });
        self.modify(&attr, mask).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::ConnectOptions;

    #[test]
    fn each_default_draws_its_own_random_psn() {
        // Four 24-bit draws that all agree would mean the PSN is fixed (one chance in 2^72).
        let psns: Vec<u32> = (0..4).map(|_| ConnectOptions::default().psn).collect();
        assert!(psns.windows(2).any(|w| w[0] != w[1]), "{psns:x?}");
        assert!(psns.iter().all(|&p| p < 1 << 24), "{psns:x?}");
    }
}

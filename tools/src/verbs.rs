//! Verbs helpers shared by `perf` and `pingpong`: choosing the two devices, reading a port's
//! addressing, and bringing a QP from RESET to RTS with the library's connect calls
//! (`Qp::init_blocking`, then `connect_rc_blocking`, `connect_uc_blocking` or
//! `ready_ud_blocking`).

use portverbs::AnyDevice;
use portverbs::hal::LinkLayer;
use portverbs::prelude::*;
use portverbs::verbs::{ConnectError, QueryError};

use crate::error::{CliError, Context as _};

/// The Q_Key of the UD QPs the tools create (`ibv_ud_pingpong`'s, and the library's default).
pub(crate) const QKEY: u32 = 0x1111_1111;

/// The device a client runs on (`-d`, or the first one) and a different device for the
/// in-process server (the first device that is not the client's).
pub(crate) fn pick_devices(name: Option<&str>) -> Result<(AnyDevice, AnyDevice), CliError> {
    // The named device first, so that its own error (a UDP address that would not bind) wins.
    let named = name.map(portverbs::device).transpose()?;
    let all = portverbs::devices();
    let client = match named {
        Some(d) => d,
        None => all
            .first()
            .cloned()
            .ok_or_else(|| CliError::Failed("No IB devices found".into()))?,
    };
    let client_name = client.info().name.clone();
    let client_driver = client.info().driver;
    let others = || all.iter().filter(|d| d.info().name != client_name);
    // A peer of the same kind when there is one (mlx4 against mlx4), any other otherwise.
    let server = others()
        .find(|d| d.info().driver == client_driver)
        .or_else(|| others().next())
        .cloned()
        .ok_or_else(|| {
            CliError::Failed(format!(
                "the in-process server needs a second device besides {client_name}"
            ))
        })?;
    Ok((client, server))
}

/// The device named `name`, or the first device.
pub(crate) fn pick_device(name: Option<&str>) -> Result<AnyDevice, CliError> {
    match name {
        // Only that device is made (the embedded fabric stays off for `-d udp0`).
        Some(n) => Ok(portverbs::device(n)?),
        None => portverbs::devices()
            .into_iter()
            .next()
            .ok_or_else(|| CliError::Failed("No IB devices found".into())),
    }
}

/// Whether `dev` can only be reached from this process (a device of the embedded in-process
/// fabric): `perf` and `pingpong` then run both ends here unless told otherwise. UDP-bound
/// devices (`PORTVERBS_UDP`) and VFIO hardware are reachable from other processes.
pub(crate) fn in_process(dev: &AnyDevice) -> bool {
    #[cfg(any(target_os = "linux", windows))]
    {
        portverbs::in_process(dev)
    }
    #[cfg(not(any(target_os = "linux", windows)))]
    {
        let _ = dev;
        true
    }
}

/// Opens a device by handle.
pub(crate) fn open(dev: AnyDevice) -> Result<Context, CliError> {
    let name = dev.info().name.clone();
    portverbs::open(dev).ctx(format_args!("opening {name}"))
}

/// What the tools need to know about the local port.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PortInfo {
    /// Port number.
    pub(crate) port: u8,
    /// LID (0 on RoCE).
    pub(crate) lid: u16,
    /// The GID at the chosen index (zero when no GID is used).
    pub(crate) gid: Gid,
    /// The GID index, when a GRH is used.
    pub(crate) gid_index: Option<u8>,
    /// Link layer.
    pub(crate) link_layer: LinkLayer,
    /// Active MTU.
    pub(crate) active_mtu: Mtu,
    /// Largest MTU.
    pub(crate) max_mtu: Mtu,
}

/// Queries `port` of `ctx`; `gid_index` is the index asked for. On an Ethernet (RoCE) port a
/// GRH is mandatory, so index 0 is used when none was given.
pub(crate) fn port_info(
    ctx: &Context,
    port: u8,
    gid_index: Option<u32>,
) -> Result<PortInfo, CliError> {
    let name = ctx.name();
    let count = ctx.attr().phys_port_cnt;
    if port == 0 || port > count {
        return Err(CliError::usage(format_args!(
            "port {port} of {name} does not exist (the device has {count} port(s))"
        )));
    }
    let pa = ctx
        .query_port_blocking(port)
        .ctx(format_args!("querying port {port} of {name}"))?;
    let index = match (gid_index, pa.link_layer) {
        (Some(i), _) => Some(i),
        (None, LinkLayer::Ethernet) => Some(0),
        (None, LinkLayer::InfiniBand) => None,
    };
    let (gid, gid_index) = match index {
        Some(i) => {
            let entry = ctx.query_gid_blocking(port, i).map_err(|e| {
                gid_index_error(name, port, i, pa.gid_tbl_len, &GidProblem::Query(&e))
            })?;
            let small = u8::try_from(i).map_err(|_| {
                gid_index_error(name, port, i, pa.gid_tbl_len, &GidProblem::AboveU8)
            })?;
            (entry.gid, Some(small))
        }
        None => (Gid::ZERO, None),
    };
    Ok(PortInfo {
        port,
        lid: pa.lid,
        gid,
        gid_index,
        link_layer: pa.link_layer,
        active_mtu: pa.active_mtu,
        max_mtu: pa.max_mtu,
    })
}

/// Why a GID index cannot be used.
#[derive(Debug)]
enum GidProblem<'a> {
    /// The library refused the query.
    Query(&'a QueryError),
    /// The tools put the index in an 8-bit `sgid_index`.
    AboveU8,
}

/// The one wording of an unusable GID index (`perf -x`, `pingpong -g`, either side):
/// `invalid GID index <i> for <dev> port <p>: <why>`, the reason in the same words whatever
/// the device or the tool.
fn gid_index_error(
    dev: &str,
    port: u8,
    index: u32,
    table_len: u32,
    problem: &GidProblem<'_>,
) -> CliError {
    let beyond = |len: u32| {
        format!(
            "the GID table has {len} entries (0..={})",
            len.saturating_sub(1)
        )
    };
    let reason = match problem {
        _ if index >= table_len => beyond(table_len),
        GidProblem::Query(QueryError::IndexOutOfRange { len, .. }) => beyond(*len),
        GidProblem::Query(QueryError::EmptyGid { .. }) => "the entry is empty".to_owned(),
        GidProblem::Query(other) => other.to_string(),
        GidProblem::AboveU8 => "GID indexes above 255 cannot be used".to_owned(),
    };
    CliError::usage(format_args!(
        "invalid GID index {index} for {dev} port {port}: {reason}"
    ))
}

/// A random 24-bit packet sequence number, as perftest and `ibv_rc_pingpong` draw theirs
/// (`lrand48() & 0xffffff`): from the OS's randomness, the library's one source.
pub(crate) fn random_psn() -> u32 {
    portverbs::hal::rng::random_psn()
}

/// What the peer needs to reach `qp` on `port`, sending from `psn` (the GID is zero when the
/// port uses none).
pub(crate) fn endpoint(port: &PortInfo, qp: &Qp, psn: u32) -> QpEndpoint {
    QpEndpoint {
        lid: port.lid,
        qpn: qp.qp_num(),
        psn,
        gid: port.gid,
    }
}

/// The connection options on `port` (its number and GID index), with the Q_Key of the tools;
/// the caller sets the transport values.
pub(crate) fn options(port: &PortInfo) -> ConnectOptions {
    ConnectOptions {
        port: port.port,
        gid_index: port.gid_index,
        qkey: QKEY,
        ..ConnectOptions::default()
    }
}

/// RESET → INIT (`opts`' port, access or Q_Key), so that receives can be posted before the
/// peer's address is known.
pub(crate) fn init(qp: &Qp, opts: &ConnectOptions) -> Result<(), CliError> {
    qp.init_blocking(opts).ctx("modifying the QP to INIT")
}

/// INIT → RTR toward `remote` (UD QPs need no remote) → RTS, sending from `opts.psn`. A
/// failure names the step that failed, as the QP's state tells it.
pub(crate) fn connect(qp: &Qp, remote: &QpEndpoint, opts: &ConnectOptions) -> Result<(), CliError> {
    let r = match qp.qp_type() {
        QpType::Rc => qp.connect_rc_blocking(remote, opts),
        QpType::Uc => qp.connect_uc_blocking(remote, opts),
        QpType::Ud => qp.ready_ud_blocking(opts),
    };
    r.map_err(|e| {
        let context = match (&e, qp.state()) {
            (ConnectError::Query(_), _) => "reading the local port's addressing",
            (_, QpState::Reset) => "modifying the QP to INIT",
            (_, QpState::Init) => "modifying the QP to RTR",
            (_, QpState::Rtr) => "modifying the QP to RTS",
            _ => "connecting the QP",
        };
        CliError::Verbs {
            context: context.to_owned(),
            source: Box::new(e),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A refused connect names the transition that failed, as the hand-written ladder did.
    #[test]
    fn connect_failures_name_the_transition() {
        let ctx = open(portverbs::devices().into_iter().next().expect("a device")).unwrap();
        let port = port_info(&ctx, 1, None).unwrap();
        let pd = ctx.alloc_pd_blocking().unwrap();
        let cq = ctx
            .create_cq_blocking(CqInit {
                entries: 4,
                ..CqInit::default()
            })
            .unwrap();
        let base = options(&port);
        let cases = [
            (
                ConnectOptions {
                    max_dest_rd_atomic: u8::MAX,
                    ..base
                },
                "modifying the QP to RTR",
            ),
            (
                ConnectOptions {
                    retry_cnt: 8,
                    ..base
                },
                "modifying the QP to RTS",
            ),
        ];
        for (opts, want) in cases {
            let qp = pd.create_qp_blocking(QpInit::new(QpType::Rc, &cq)).unwrap();
            init(&qp, &opts).unwrap();
            let peer = endpoint(&port, &qp, 0);
            let err = connect(&qp, &peer, &opts).unwrap_err();
            assert!(
                matches!(&err, CliError::Verbs { context, .. } if context == want),
                "{err}"
            );
        }
    }

    #[test]
    fn gid_index_errors_have_one_wording() {
        let text = |index, problem: &GidProblem<'_>| {
            gid_index_error("soft0", 1, index, 16, problem).to_string()
        };
        let beyond = QueryError::IndexOutOfRange {
            table: "GID",
            index: 99,
            len: 16,
        };
        let want = "invalid GID index 99 for soft0 port 1: the GID table has 16 entries (0..=15)";
        assert_eq!(text(99, &GidProblem::Query(&beyond)), want);
        // Above 255 on a table that short: still the table's bound.
        assert_eq!(
            text(300, &GidProblem::AboveU8),
            "invalid GID index 300 for soft0 port 1: the GID table has 16 entries (0..=15)"
        );
        let empty = QueryError::EmptyGid { port: 1, index: 3 };
        assert_eq!(
            text(3, &GidProblem::Query(&empty)),
            "invalid GID index 3 for soft0 port 1: the entry is empty"
        );
        assert!(matches!(
            gid_index_error("d", 1, 300, 1024, &GidProblem::AboveU8),
            CliError::Usage(m) if m.ends_with(": GID indexes above 255 cannot be used")
        ));
    }
}

//! Verbs helpers shared by `perf` and `pingpong`: choosing the two devices, reading a port's
//! addressing, and bringing a QP from RESET to RTS with the IBTA attribute masks.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

use portverbs::AnyDevice;
use portverbs::hal::{Device as _, LinkLayer};
use portverbs::prelude::*;
use portverbs::verbs::QueryError;

use crate::error::{CliError, Context as _};

/// The Q_Key of the UD QPs the tools create.
pub(crate) const QKEY: u32 = 0x1111_1111;

/// The device a client runs on (`-d`, or the first one) and a different device for the
/// in-process server (the first device that is not the client's).
pub(crate) fn pick_devices(name: Option<&str>) -> Result<(AnyDevice, AnyDevice), CliError> {
    let all = portverbs::devices();
    let client = match name {
        Some(n) => all
            .iter()
            .find(|d| d.info().name == n)
            .cloned()
            .ok_or_else(|| CliError::NoDevice(n.to_owned()))?,
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

/// A random 24-bit packet sequence number.
pub(crate) fn random_psn() -> u32 {
    (RandomState::new().hash_one(std::time::Instant::now()) & 0x00ff_ffff) as u32
}

/// The remote end of a connection, as exchanged out of band.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Remote {
    /// LID (used when no GID is).
    pub(crate) lid: u16,
    /// QP number.
    pub(crate) qpn: u32,
    /// First PSN the remote sends with.
    pub(crate) psn: u32,
    /// GID (used when the local port uses a GID index).
    pub(crate) gid: Gid,
}

/// Connection parameters of a QP (the attributes of the INIT, RTR and RTS transitions).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Link {
    /// Local port addressing.
    pub(crate) port: PortInfo,
    /// Path MTU (RC/UC).
    pub(crate) mtu: Mtu,
    /// Remote access granted by the QP (RC/UC).
    pub(crate) access: AccessFlags,
    /// Service level.
    pub(crate) sl: u8,
    /// Local ACK timeout code.
    pub(crate) timeout: u8,
    /// Transport retries.
    pub(crate) retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub(crate) rnr_retry: u8,
    /// RNR NAK timer code.
    pub(crate) min_rnr_timer: u8,
    /// Outstanding reads/atomics as initiator.
    pub(crate) max_rd_atomic: u8,
    /// Outstanding reads/atomics as responder.
    pub(crate) max_dest_rd_atomic: u8,
}

/// The address vector toward `remote`: a GRH with hop limit 1 when the local port uses a GID.
pub(crate) fn address_vector(link: &Link, remote: &Remote) -> AddressVector {
    let mut av = AddressVector {
        dlid: remote.lid,
        sl: link.sl,
        port_num: link.port.port,
        ..AddressVector::default()
    };
    if let Some(index) = link.port.gid_index {
        av.is_global = true;
        av.hop_limit = 1;
        av.dgid = remote.gid;
        av.sgid_index = index;
    }
    av
}

/// RESET → INIT.
pub(crate) fn to_init(qp: &Qp, link: &Link) -> Result<(), CliError> {
    let t = qp.qp_type();
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: link.port.port,
        pkey_index: 0,
        qkey: QKEY,
        qp_access_flags: link.access,
        ..QpAttr::default()
    };
    let base = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
    let mask = match t {
        QpType::Ud => base | QpAttrMask::QKEY,
        QpType::Rc | QpType::Uc => base | QpAttrMask::ACCESS_FLAGS,
    };
    qp.modify_blocking(&attr, mask)
        .ctx("modifying the QP to INIT")
}

/// INIT → RTR toward `remote` (UD QPs need no remote).
pub(crate) fn to_rtr(qp: &Qp, link: &Link, remote: &Remote) -> Result<(), CliError> {
    let t = qp.qp_type();
    let attr = QpAttr {
        qp_state: QpState::Rtr,
        path_mtu: link.mtu,
        dest_qp_num: remote.qpn,
        rq_psn: remote.psn,
        max_dest_rd_atomic: link.max_dest_rd_atomic,
        min_rnr_timer: link.min_rnr_timer,
        ah_attr: address_vector(link, remote),
        ..QpAttr::default()
    };
    let connected = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN;
    let mask = match t {
        QpType::Ud => QpAttrMask::STATE,
        QpType::Uc => connected,
        QpType::Rc => connected | QpAttrMask::MAX_DEST_RD_ATOMIC | QpAttrMask::MIN_RNR_TIMER,
    };
    qp.modify_blocking(&attr, mask)
        .ctx("modifying the QP to RTR")
}

/// RTR → RTS, sending from `psn`.
pub(crate) fn to_rts(qp: &Qp, link: &Link, psn: u32) -> Result<(), CliError> {
    let t = qp.qp_type();
    let attr = QpAttr {
        qp_state: QpState::Rts,
        sq_psn: psn,
        timeout: link.timeout,
        retry_cnt: link.retry_cnt,
        rnr_retry: link.rnr_retry,
        max_rd_atomic: link.max_rd_atomic,
        ..QpAttr::default()
    };
    let mask = match t {
        QpType::Rc => {
            QpAttrMask::STATE
                | QpAttrMask::TIMEOUT
                | QpAttrMask::RETRY_CNT
                | QpAttrMask::RNR_RETRY
                | QpAttrMask::SQ_PSN
                | QpAttrMask::MAX_QP_RD_ATOMIC
        }
        QpType::Uc | QpType::Ud => QpAttrMask::STATE | QpAttrMask::SQ_PSN,
    };
    qp.modify_blocking(&attr, mask)
        .ctx("modifying the QP to RTS")
}

#[cfg(test)]
mod tests {
    use super::*;

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

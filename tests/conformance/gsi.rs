//! The GSI QP (QP1, IBA 13.5.1), which the connection manager's MADs travel on: created on
//! purpose at number 1, one per device, UD with the fixed Q_Key 0x80010000; two devices'
//! QP1s exchange 256-byte MADs, and an ordinary UD QP cannot reach QP1. On mlx4 QP1 is
//! the special QP CONF_SPECIAL_QP sets aside, and its MADs travel as MLX-transport WQEs
//! whose headers the driver builds and the emulated HCA checks and sends.

use portverbs::hal::CommandError;
use portverbs::prelude::*;
use portverbs::verbs::{
    ConnectOptions, CreateQpError, ModifyQpError, QpAttrError, SpecialQp, UdDest,
};

use super::env::{Backend, Env};
use super::tx_util::*;

/// A MAD: 256 bytes (IBA 13.4.1).
pub(super) const MAD: usize = 256;
/// The 40-byte GRH area a UD receive starts with.
pub(super) const GRH: u64 = 40;

/// A device's QP1 with a CQ and 4 KiB of registered memory.
pub(super) struct Gsi {
    pub(super) pd: Pd,
    pub(super) cq: Cq,
    pub(super) qp: Qp,
    pub(super) buf: Buffer,
    pub(super) mr: Mr,
}

pub(super) fn gsi(ctx: &Context) -> Result<Gsi, CreateQpError> {
    let pd = ctx.alloc_pd_blocking().unwrap();
    let cq = ctx
        .create_cq_blocking(CqInit {
            entries: 128,
            ..CqInit::default()
        })
        .unwrap();
    let qp = pd.create_qp_blocking(QpInit::gsi(&cq))?;
    let buf = ctx.alloc_buffer(4 * 1024).unwrap();
    let mr = pd
        .reg_mr_blocking(&buf, 0..4 * 1024, AccessFlags::LOCAL_WRITE)
        .unwrap();
    Ok(Gsi {
        pd,
        cq,
        qp,
        buf,
        mr,
    })
}

pub(super) fn mad(seed: u8) -> Vec<u8> {
    (0..MAD).map(|i| (i as u8).wrapping_mul(7) ^ seed).collect()
}

/// An address handle on `pd` toward the device whose GID is `gid`.
pub(super) fn ah_to(pd: &Pd, gid: Gid) -> AddressHandle {
    pd.create_ah_blocking(AddressVector {
        dgid: gid,
        is_global: true,
        port_num: 1,
        ..AddressVector::default()
    })
    .unwrap()
}

/// The UD destination of QP1 behind `ah`.
pub(super) fn qp1(ah: &AddressHandle) -> UdDest<'_> {
    UdDest {
        ah_pd: None,
        av: ah.av(),
        remote_qpn: SpecialQp::GSI_QPN,
        remote_qkey: SpecialQp::GSI_QKEY,
    }
}

/// Posts one MAD's receive (GRH area included) at the start of `to`'s buffer, as wr 7; then
/// writes `data` at offset 1024 of `from`'s buffer and sends it from `from`'s QP1 to the QP1
/// at `to_gid`, signaled, as wr 3. Returns the address handle to keep until the send is done.
pub(super) fn post_mad(from: &Gsi, to: &Gsi, to_gid: Gid, data: &[u8]) -> AddressHandle {
    to.qp
        .post_recv(&[RecvWr {
            wr_id: 7,
            sges: &[to.mr.sge(0, GRH as usize + MAD).unwrap()],
        }])
        .unwrap();
    from.buf.write(1024, data).unwrap();
    let ah = ah_to(&from.pd, to_gid);
    let sge = [from.mr.sge(1024, MAD).unwrap()];
    from.qp
        .post_send(&[SendWr::new(3, SendOp::Send)
            .sges(&sge)
            .ud(qp1(&ah))
            .signaled()])
        .unwrap();
    ah
}

/// Sends a MAD from `from`'s QP1 to the QP1 of the device whose GID is `to_gid`, and checks
/// it arrives at `to` intact from QP 1.
fn mad_across(env: &Env, from: &Gsi, to: &Gsi, to_gid: Gid, seed: u8) {
    let data = mad(seed);
    let _ah = post_mad(from, to, to_gid, &data);
    check_wc(
        &poll_one(env, &from.cq),
        3,
        WcStatus::Success,
        WcOpcode::Send,
    );
    let wc = poll_one(env, &to.cq);
    check_wc(&wc, 7, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.src_qp, 1, "from QP1: {wc:?}");
    assert_eq!(wc.byte_len as usize, GRH as usize + MAD);
    assert_eq!(to.buf.to_vec(GRH as usize, MAD).unwrap(), data);
}

fn gsi_qps_exchange_mads(backend: Backend) {
    let env = Env::new(backend);
    let a = gsi(env.a()).unwrap_or_else(|e| panic!("creating QP1: {e}"));
    let b = gsi(env.b()).unwrap();
    for g in [&a, &b] {
        assert_eq!(g.qp.qp_num(), 1);
        assert_eq!(g.qp.special(), Some(SpecialQp::Gsi));
        assert_eq!(g.qp.qp_type(), QpType::Ud);
        // The options' Q_Key (0x11111111 by default) does not apply to QP1.
        g.qp.ready_ud_blocking(&ConnectOptions::default()).unwrap();
        assert_eq!(g.qp.query_blocking().unwrap().qkey, SpecialQp::GSI_QKEY);
    }
    mad_across(&env, &a, &b, Env::gid(env.b()), 1);
    mad_across(&env, &b, &a, Env::gid(env.a()), 2);
}

fn one_gsi_qp_per_device(backend: Backend) {
    let env = Env::new(backend);
    let first = gsi(env.a()).unwrap_or_else(|e| panic!("creating QP1: {e}"));
    let again = first.pd.create_qp_blocking(QpInit::gsi(&first.cq));
    assert!(
        matches!(again, Err(CreateQpError::Device(CommandError::Busy { .. }))),
        "{again:?}"
    );
    let rc = QpInit {
        qp_type: QpType::Rc,
        ..QpInit::gsi(&first.cq)
    };
    assert!(
        matches!(
            first.pd.create_qp_blocking(rc),
            Err(CreateQpError::SpecialType { .. })
        ),
        "QP1 is UD"
    );
    // The pool never hands out number 1.
    let ud = make_qp(&first.pd, &first.cq, QpType::Ud, None, false);
    assert_ne!(ud.qp_num(), 1);
    let Gsi { pd, cq, qp, .. } = first;
    qp.destroy().unwrap();
    let second = pd.create_qp_blocking(QpInit::gsi(&cq)).unwrap();
    assert_eq!(second.qp_num(), 1, "QP1 again once the first is gone");
}

fn the_gsi_qkey_is_fixed(backend: Backend) {
    let env = Env::new(backend);
    let a = gsi(env.a()).unwrap_or_else(|e| panic!("creating QP1: {e}"));
    let attr = QpAttr {
        qp_state: QpState::Init,
        port_num: 1,
        qkey: 0x1111_1111,
        ..QpAttr::default()
    };
    let mask = QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::PKEY_INDEX | QpAttrMask::QKEY;
    let e = a.qp.modify_blocking(&attr, mask).unwrap_err();
    assert!(
        matches!(
            e,
            ModifyQpError::InvalidAttribute {
                error: QpAttrError::GsiQkey { qkey: 0x1111_1111 },
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(queried_state(&a.qp), QpState::Reset, "nothing changed");
    a.qp.ready_ud_blocking(&ConnectOptions::default()).unwrap();

    // A UD QP on the other device cannot reach QP1: with its own Q_Key the datagram is
    // dropped, and naming QP1's Q_Key does not help — a Q_Key with the high bit set in a
    // work request means "the sending QP's own" (IBA 10.2.5, controlled Q_Keys). Only a
    // QP whose own Q_Key is 0x80010000, a QP1, gets through.
    let b = gsi(env.b()).unwrap_or_else(|e| panic!("QP1 on b: {e}"));
    b.qp.ready_ud_blocking(&ConnectOptions::default()).unwrap();
    let opts = ConnectOptions::default();
    let u = make_qp(&b.pd, &b.cq, QpType::Ud, None, false);
    u.ready_ud_blocking(&opts).unwrap();
    a.qp.post_recv(&[RecvWr {
        wr_id: 9,
        sges: &[a.mr.sge(0, GRH as usize + MAD).unwrap()],
    }])
    .unwrap();
    let ah = ah_to(&b.pd, Env::gid(env.a()));
    let data = mad(3);
    b.buf.write(0, &data).unwrap();
    let sge = [b.mr.sge(0, MAD).unwrap()];
    for (wr_id, from, qkey) in [
        (1, &u, opts.qkey),
        (2, &u, SpecialQp::GSI_QKEY),
        (3, &b.qp, SpecialQp::GSI_QKEY),
    ] {
        let dest = UdDest {
            ah_pd: None,
            remote_qkey: qkey,
            ..qp1(&ah)
        };
        from.post_send(&[SendWr::new(wr_id, SendOp::Send)
            .sges(&sge)
            .ud(dest)
            .signaled()])
            .unwrap();
        check_wc(
            &poll_one(&env, &b.cq),
            wr_id,
            WcStatus::Success,
            WcOpcode::Send,
        );
        if wr_id < 3 {
            assert!(
                poll_exact(&env, &a.cq, 0).is_empty(),
                "wr {wr_id} is dropped"
            );
        }
    }
    let wc = poll_one(&env, &a.cq);
    check_wc(&wc, 9, WcStatus::Success, WcOpcode::Recv);
    assert_eq!(wc.src_qp, 1);
    if env.backend != Backend::Mlx4 {
        // mlx4 reads its counters through MAD_IFC, which the driver does not issue.
        let port = env.a().query_port_blocking(1).unwrap();
        assert_eq!(port.qkey_viol_cntr, 2, "both datagrams from the UD QP");
        assert_eq!(port.bad_pkey_cntr, 0);
    }
    assert_eq!(a.buf.to_vec(GRH as usize, MAD).unwrap(), data);
}

cases!(
    manual;
    gsi_qps_exchange_mads,
    one_gsi_qp_per_device,
    the_gsi_qkey_is_fixed,
);

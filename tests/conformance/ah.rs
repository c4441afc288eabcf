//! Address handles (pyverbs `test_addr`, rdma-unit-test `ah_test`).

use portverbs::prelude::*;
use portverbs::verbs::AhError;

use super::env::{Backend, Env};

fn av_to(env: &Env) -> AddressVector {
    AddressVector {
        dgid: Env::gid(env.b()),
        sgid_index: 0,
        hop_limit: 64,
        traffic_class: 0,
        is_global: true,
        port_num: 1,
        ..AddressVector::default()
    }
}

fn create_and_destroy_ah_with_grh(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let av = AddressVector {
        flow_label: 0x12345,
        traffic_class: 0x28,
        ..av_to(&env)
    };
    let ah = pd.create_ah_blocking(av).unwrap();
    assert_eq!(*ah.av(), av);
    assert_eq!(ah.pd().pdn(), pd.pdn());
    assert_eq!(env.a().object_counts().ahs, 1);
    let ah2 = pd.create_ah_blocking(av).unwrap();
    assert_eq!(env.a().object_counts().ahs, 2);
    drop((ah, ah2));
    assert_eq!(env.a().object_counts().ahs, 0);
}

fn ah_without_grh_on_a_roce_port_fails(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let r = pd.create_ah_blocking(AddressVector {
        is_global: false,
        dlid: 1,
        ..av_to(&env)
    });
    assert!(matches!(r, Err(AhError::GrhRequired { port: 1 })), "{r:?}");
    assert_eq!(env.a().object_counts().ahs, 0);
}

fn ah_on_a_port_that_does_not_exist_fails(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let count = env.a().attr().phys_port_cnt;
    for bad in [0, count + 1, u8::MAX] {
        let r = pd.create_ah_blocking(AddressVector {
            port_num: bad,
            ..av_to(&env)
        });
        match r {
            Err(AhError::NoSuchPort { port }) => assert_eq!(port, bad),
            other => panic!("port {bad}: expected NoSuchPort, got {other:?}"),
        }
    }
    assert_eq!(env.a().object_counts().ahs, 0);
}

fn ah_with_an_invalid_sgid_index_fails(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let len = env.a().query_port_blocking(1).unwrap().gid_tbl_len;
    // 1 is an empty entry; the others lie beyond the table.
    for bad in [1u8, len as u8, u8::MAX] {
        let r = pd.create_ah_blocking(AddressVector {
            sgid_index: bad,
            ..av_to(&env)
        });
        match r {
            Err(AhError::BadSgidIndex { port, index }) => assert_eq!((port, index), (1, bad)),
            other => panic!("sgid_index {bad}: expected BadSgidIndex, got {other:?}"),
        }
    }
    assert_eq!(env.a().object_counts().ahs, 0);
}

fn ah_with_an_empty_dgid_fails(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let r = pd.create_ah_blocking(AddressVector {
        dgid: Gid::ZERO,
        ..av_to(&env)
    });
    assert!(matches!(r, Err(AhError::EmptyDgid)), "{r:?}");
}

/// `ibv_destroy_ah`: refused while another handle exists (the handle comes back), and the
/// PD can be deallocated once the last AH on it is gone.
fn destroy_ah_is_refused_while_cloned_and_frees_the_pd(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let ah = pd.create_ah_blocking(av_to(&env)).unwrap();
    let other = ah.clone();
    let (err, ah) = ah.destroy().unwrap_err().into_parts();
    assert!(matches!(err, AhError::Busy { users: 1 }), "{err:?}");
    drop(other);
    ah.destroy().unwrap();
    assert_eq!(env.a().object_counts().ahs, 0);
    pd.dealloc().expect("no AH holds the PD any more");
}

cases!(
    manual;
    destroy_ah_is_refused_while_cloned_and_frees_the_pd,
    create_and_destroy_ah_with_grh,
    ah_without_grh_on_a_roce_port_fails,
    ah_on_a_port_that_does_not_exist_fails,
    ah_with_an_invalid_sgid_index_fails,
    ah_with_an_empty_dgid_fails,
);

//! Registering memory the application owns (`ibv_reg_mr` on the application's buffer):
//! `Pd::reg_vec`/`reg_host` map it for the device (through the IOMMU on mlx4), traffic lands in
//! it, and `Mr::into_vec`/`into_host` give it back; memory given by raw parts works the same
//! way under its `unsafe` contract. `Mr::sge` refuses ranges outside the MR.

use portverbs::hal::HostMemory;
use portverbs::prelude::*;
use portverbs::verbs::MrError;

use super::env::{Backend, Env};
use super::obj_util::*;
use super::util::*;

fn rdma_into_a_vector_lands_in_it_and_comes_back(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let mut v = pattern(3, 8192);
    v[8000..].fill(0);
    let before = v.clone();
    let addr = v.as_ptr() as u64;
    let mrs = env.devs[1].resources().mrs;
    let mr =
        p.b.pd
            .reg_vec_blocking(v, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    assert_eq!(
        (mr.addr(), mr.len()),
        (addr, 8192),
        "the vector's own bytes"
    );
    // A peer writes into it; b sends from it.
    let data = pattern(9, 100);
    let remote = RemoteAddr {
        addr: mr.addr() + 8000,
        rkey: mr.rkey().unwrap(),
    };
    assert_eq!(
        write(&env, &p.a, 1, &data, remote).status,
        WcStatus::Success
    );
    p.a.post_recv(2, 0, 4096);
    let sge = [mr.sge(0, 64).unwrap()];
    let wc = run(&env, &p.b, SendWr::new(3, SendOp::Send).sges(&sge));
    assert_eq!(wc.status, WcStatus::Success);
    assert_eq!(one(&env, &p.a.cq).byte_len, 64);
    assert_eq!(p.a.buf.to_vec(0, 64).unwrap(), before[..64]);
    let v = mr.into_vec().unwrap();
    assert_eq!(v.len(), 8192);
    assert_eq!(&v[..8000], &before[..8000], "untouched where nothing wrote");
    assert_eq!(&v[8000..8100], &data[..]);
    assert_eq!(env.devs[1].resources().mrs, mrs, "deregistered");
}

fn memory_given_by_raw_parts_is_registered_and_released(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let mut owner = vec![0u8; 4096];
    // SAFETY: `owner` outlives the MR below and is not touched until `into_host` returned:
    // the device is the only one reaching these bytes meanwhile.
    let memory = unsafe { HostMemory::from_raw_parts(owner.as_mut_ptr(), owner.len()) };
    let mr =
        p.b.pd
            .reg_host_blocking(memory, AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE)
            .unwrap();
    let data = pattern(4, 256);
    let remote = RemoteAddr {
        addr: mr.addr() + 16,
        rkey: mr.rkey().unwrap(),
    };
    assert_eq!(
        write(&env, &p.a, 1, &data, remote).status,
        WcStatus::Success
    );
    let mr = match mr.into_vec() {
        Err(r) => {
            assert!(matches!(r.error(), MrError::NotHostMemory { .. }), "{r:?}");
            r.into_handle()
        }
        Ok(_) => panic!("memory given by raw parts has no vector to give back"),
    };
    let memory = mr.into_host().unwrap();
    assert!(!memory.is_owned());
    assert_eq!(
        (memory.addr(), memory.len()),
        (owner.as_ptr() as usize, 4096)
    );
    assert_eq!(
        &owner[16..272],
        &data[..],
        "the write landed in the caller's memory"
    );
}

fn device_buffers_and_shared_memory_are_not_given_back(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    // An MR over a device buffer has no application memory.
    let mr = match p.b.mr.clone().into_vec() {
        Err(r) => {
            assert!(matches!(r.error(), MrError::NotHostMemory { .. }));
            r.into_handle()
        }
        Ok(_) => panic!("an MR over a device buffer gave memory back"),
    };
    drop(mr);
    // Application memory whose buffer handle is still held elsewhere stays registered.
    let mr =
        p.b.pd
            .reg_vec_blocking(vec![1u8; 512], AccessFlags::LOCAL_WRITE)
            .unwrap();
    let (held, _) = mr.buffer();
    let mr = match mr.into_vec() {
        Err(r) => {
            assert!(matches!(r.error(), MrError::NotHostMemory { .. }));
            r.into_handle()
        }
        Ok(_) => panic!("gave back memory a buffer handle still reaches"),
    };
    assert_eq!(
        held.to_vec(0, 4).unwrap(),
        [1; 4],
        "still readable through the handle"
    );
    drop(held);
    assert_eq!(mr.into_vec().unwrap(), vec![1u8; 512]);
}

fn a_refused_registration_gives_the_vector_back(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let v = pattern(2, 1000);
    let addr = v.as_ptr();
    match pd.reg_vec_blocking(v, AccessFlags::REMOTE_WRITE) {
        Err(r) => {
            assert!(matches!(r.error(), MrError::RemoteWithoutLocalWrite { .. }));
            let v = r.into_handle();
            assert_eq!(v.as_ptr(), addr, "the same allocation");
            assert_eq!(v, pattern(2, 1000));
        }
        Ok(_) => panic!("remote write without local write registered"),
    }
    assert_eq!(env.devs[0].resources().mrs, 0);
}

fn sge_outside_the_mr_is_a_typed_error(backend: Backend) {
    let env = Env::new(backend);
    let p = Pair::new(&env, QpType::Rc);
    let mr =
        p.a.pd
            .reg_mr_blocking(&p.a.buf, 100..1100, AccessFlags::LOCAL_WRITE)
            .unwrap();
    let ok = mr.sge(10, 990).unwrap();
    assert_eq!(
        (ok.addr, ok.length, ok.lkey),
        (mr.addr() + 10, 990, mr.lkey())
    );
    assert!(mr.sge(1000, 0).is_ok(), "an empty entry at the end");
    for (offset, len) in [(0, 1001), (1000, 1), (usize::MAX, 2), (0, 1 << 33)] {
        match mr.sge(offset, len) {
            Err(MrError::OutsideMr {
                offset: o,
                len: l,
                mr_len: 1000,
            }) => assert_eq!((o, l), (offset, len)),
            other => panic!("sge({offset}, {len}): {other:?}"),
        }
    }
}

/// `Mr::write`/`Mr::read` copy in and out of the registered range (offsets from the MR's
/// start, which is inside a larger buffer here) and refuse what leaves it, copying nothing.
fn mr_read_and_write_stay_inside_the_mr(backend: Backend) {
    let env = Env::new(backend);
    let pd = env.a().alloc_pd_blocking().unwrap();
    let buf = env.a().alloc_buffer(4096).unwrap();
    buf.write(0, &[0xee; 4096]).unwrap();
    let mr = pd
        .reg_mr_blocking(&buf, 1000..2000, AccessFlags::LOCAL_WRITE)
        .unwrap();
    mr.write(10, b"inside").unwrap();
    let mut got = [0u8; 6];
    mr.read(10, &mut got).unwrap();
    assert_eq!(&got, b"inside");
    assert_eq!(
        buf.to_vec(1010, 6).unwrap(),
        b"inside",
        "MR offsets start at the MR"
    );
    for (offset, len) in [(995, 6), (1000, 1), (usize::MAX, 2)] {
        let data = vec![0x11; len];
        match mr.write(offset, &data) {
            Err(MrError::OutsideMr { mr_len: 1000, .. }) => {}
            other => panic!("write({offset}, {len}): {other:?}"),
        }
        let mut dst = vec![0x22; len];
        assert!(matches!(
            mr.read(offset, &mut dst),
            Err(MrError::OutsideMr { mr_len: 1000, .. })
        ));
        assert!(dst.iter().all(|&b| b == 0x22), "nothing copied out");
    }
    assert_eq!(
        buf.to_vec(1995, 10).unwrap(),
        [0xee; 10],
        "nothing copied in"
    );
}

cases!(
    manual;
    mr_read_and_write_stay_inside_the_mr,
    rdma_into_a_vector_lands_in_it_and_comes_back,
    memory_given_by_raw_parts_is_registered_and_released,
    device_buffers_and_shared_memory_are_not_given_back,
    a_refused_registration_gives_the_vector_back,
    sge_outside_the_mr_is_a_typed_error,
);

//! The post and poll paths allocate nothing: a counting global allocator (per thread, so the
//! test harness's other threads do not disturb it) brackets post_send, post_recv, poll and
//! req_notify on a connected RC pair of the software device, with every kind of work request
//! the fast path carries (SGE and inline RDMA writes, sends with immediate data, reads, atomics), after
//! a warm-up that lets the queues reach their steady state. The transport engine itself runs
//! outside the brackets (`run_until_idle` on a stepped fabric): it is the device, not the host
//! path.

#[path = "../benches/common/mod.rs"]
mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use portverbs::prelude::*;
use portverbs::soft::Fabric;
use portverbs::verbs::RecvWr;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

struct Counting;

// SAFETY: every call is forwarded unchanged to the system allocator; the counting only touches
// const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: as for `alloc`; `ptr` came from this allocator, which is the system's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, which is the system's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

fn note() {
    // `try_with`: the thread-locals may already be gone while a thread shuts down.
    let _ = COUNTING.try_with(|c| {
        if c.get() {
            let _ = ALLOCATIONS.try_with(|a| a.set(a.get() + 1));
        }
    });
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns its result with the number of allocations it made on this thread.
fn counted<T>(f: impl FnOnce() -> T) -> (T, u64) {
    ALLOCATIONS.with(|a| a.set(0));
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, ALLOCATIONS.with(Cell::get))
}

/// One round: receives on B, a list of five requests from A, the device runs, both CQs drained.
/// Returns the allocations made inside the host paths and the completions seen.
fn round(p: &common::Pair, wc: &mut [WorkCompletion; 16], i: u64) -> (u64, usize) {
    let a_sge = [p.a.mr.sge(0, 256).expect("inside the MR")];
    let a_atomic = [p.a.mr.sge(512, 8).expect("inside the MR")];
    let b_sge = [p.b.mr.sge(1024, 256).expect("inside the MR")];
    let remote = RemoteAddr {
        addr: p.b.mr.addr() + 2048,
        rkey: p.b.mr.rkey().expect("rkey"),
    };
    let payload = [i as u8; 32];
    let wrs = [
        SendWr::new(1, SendOp::RdmaWrite { remote })
            .sges(&a_sge)
            .signaled(),
        SendWr::new(2, SendOp::RdmaWrite { remote })
            .inline(&payload)
            .signaled(),
        SendWr::new(3, SendOp::SendWithImm { imm: 7 })
            .sges(&a_sge)
            .signaled(),
        SendWr::new(4, SendOp::RdmaRead { remote })
            .sges(&a_sge)
            .signaled(),
        SendWr::new(
            5,
            SendOp::AtomicFetchAdd {
                remote: RemoteAddr {
                    addr: remote.addr + 512,
                    ..remote
                },
                add: 1,
            },
        )
        .sges(&a_atomic)
        .signaled(),
    ];
    let recv = [RecvWr {
        wr_id: 9,
        sges: &b_sge,
    }];
    let mut allocs = 0;
    let ((), n) = counted(|| p.b.qp.post_recv(&recv).expect("post_recv"));
    allocs += n;
    let ((), n) = counted(|| p.a.qp.post_send(&wrs).expect("post_send"));
    allocs += n;
    p.fabric.run_until_idle().expect("idle");
    let mut seen = 0;
    for cq in [&p.a.cq, &p.b.cq] {
        loop {
            let (got, n) = counted(|| cq.poll(wc).expect("poll"));
            allocs += n;
            for w in &wc[..got] {
                assert!(w.is_ok(), "{w:?}");
            }
            seen += got;
            if got == 0 {
                break;
            }
        }
        let ((), n) = counted(|| cq.req_notify(false));
        allocs += n;
    }
    (allocs, seen)
}

#[test]
fn post_and_poll_paths_allocate_nothing() {
    let p = common::pair(Fabric::stepped(7), 4096, 64);
    let mut wc = [WorkCompletion::default(); 16];
    // Warm-up: let every lazily grown structure on the path reach its steady size.
    for i in 0..64 {
        let (_, seen) = round(&p, &mut wc, i);
        assert_eq!(seen, 6, "five send-side completions and one receive");
    }
    let mut total = 0;
    for i in 0..1_000 {
        let (allocs, seen) = round(&p, &mut wc, i);
        assert_eq!(seen, 6);
        total += allocs;
    }
    assert_eq!(
        total, 0,
        "allocations inside post_send/post_recv/poll/req_notify"
    );
}

#[test]
fn the_counter_sees_allocations() {
    // Guards the test above against a counter that cannot count.
    let (v, n) = counted(|| vec![1u8; 100]);
    assert_eq!(v.len(), 100);
    assert!(n >= 1);
}

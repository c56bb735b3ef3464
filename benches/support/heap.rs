//! A counting global allocator around mimalloc (the Lambda binaries' allocator), for the
//! benchmarks that report peak heap. Counting can be switched off, since its atomics
//! would skew timing rounds. `realloc` goes to mimalloc's own, so a block that can grow
//! in place still does, as in the binaries.
//!
//! Use: `#[path = "support/heap.rs"] mod heap;` and
//! `#[global_allocator] static ALLOC: heap::Counting = heap::Counting;`.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

use mimalloc::MiMalloc;

/// The allocator: mimalloc, with live and peak bytes counted while counting is on.
pub struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(true);
static CURRENT: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

/// Adds `delta` bytes to the live heap and raises the peak; passes `p` through.
fn counted(p: *mut u8, delta: isize) -> *mut u8 {
    if !p.is_null() && COUNTING.load(Ordering::Relaxed) {
        let now = CURRENT.fetch_add(delta, Ordering::Relaxed) + delta;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
    p
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(unsafe { MiMalloc.alloc(layout) }, layout.size() as isize)
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted(
            unsafe { MiMalloc.alloc_zeroed(layout) },
            layout.size() as isize,
        )
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let delta = new_size as isize - layout.size() as isize;
        counted(unsafe { MiMalloc.realloc(ptr, layout, new_size) }, delta)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { MiMalloc.dealloc(ptr, layout) };
        if COUNTING.load(Ordering::Relaxed) {
            CURRENT.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        }
    }
}

/// Turns counting on or off (on from process start).
#[allow(dead_code)]
pub fn set_counting(on: bool) {
    COUNTING.store(on, Ordering::Relaxed);
}

/// Counts the live heap from zero from now on: blocks allocated before are not in it.
#[allow(dead_code)]
pub fn zero() {
    CURRENT.store(0, Ordering::Relaxed);
}

/// Starts a measured phase: the peak restarts from the live heap, which is returned.
pub fn restart_peak() -> isize {
    let now = CURRENT.load(Ordering::Relaxed);
    PEAK.store(now, Ordering::Relaxed);
    now
}

/// The highest live heap since the last `restart_peak`.
pub fn peak() -> isize {
    PEAK.load(Ordering::Relaxed)
}

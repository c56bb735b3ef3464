//! The functions' allocator (mimalloc, their `#[global_allocator]`) settings.

use libmimalloc_sys::{mi_option_set, mi_option_t};

/// mimalloc's `mi_option_purge_decommits` (its place in `mi_option_e`, mimalloc.h; the
/// sys crate does not name it). A unit test reads the option back by its name.
const PURGE_DECOMMITS: mi_option_t = 5;

/// Memory mimalloc purges (freed for a second) is handed back lazily (`MADV_FREE`)
/// instead of at once (`MADV_DONTNEED`, its default): the kernel takes the pages only
/// when it needs them, so the next full diff reuses them as they are instead of
/// faulting them back in, zeroed: about 0.1 s of the 1.6 s of CPU of a full
/// verification at 100,000 pods (BENCHMARKS.md). Never purging saved a little more, but
/// the 15-20 MiB it keeps are never given back, which a 256-MB function at that size
/// cannot spare; lazily freed pages count in RSS until taken, but the kernel takes them
/// before it runs out.
pub fn configure() {
    // SAFETY: sets one option in mimalloc's table (bounds-checked by mimalloc); 0 is a
    // valid value of this on/off option.
    unsafe { mi_option_set(PURGE_DECOMMITS, 0) };
}

#[cfg(test)]
mod tests {
    use std::ffi::{CStr, c_char, c_void};

    use libmimalloc_sys::mi_output_fun;

    unsafe extern "C" {
        // In mimalloc.h, not declared by the sys crate.
        fn mi_options_print_out(out: mi_output_fun, arg: *mut c_void);
    }

    unsafe extern "C" fn collect(msg: *const c_char, arg: *mut c_void) {
        // SAFETY: `arg` is the `String` handed to `mi_options_print_out` below, and
        // mimalloc hands over a NUL-terminated message.
        let (out, msg) = unsafe { (&mut *(arg as *mut String), CStr::from_ptr(msg)) };
        out.push_str(&msg.to_string_lossy());
    }

    #[test]
    fn purged_memory_is_reset_not_decommitted() {
        super::configure();
        let mut printed = String::new();
        // SAFETY: `collect` only appends to `printed`, which outlives the call.
        unsafe { mi_options_print_out(Some(collect), &mut printed as *mut String as *mut c_void) };
        assert!(
            printed.contains("option 'purge_decommits': 0"),
            "the option set is purge_decommits:\n{printed}"
        );
    }
}

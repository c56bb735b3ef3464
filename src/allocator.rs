//! The functions' allocator (mimalloc, their `#[global_allocator]`) settings.

use libmimalloc_sys::{mi_option_set, mi_option_t};

/// mimalloc's `mi_option_purge_decommits` (its place in `mi_option_e`, mimalloc.h; the
/// sys crate does not name it). A unit test reads the option back by its name.
const PURGE_DECOMMITS: mi_option_t = 5;

/// mimalloc's `mi_option_allow_thp` (as above, from `mi_option_e`).
const ALLOW_THP: mi_option_t = 43;

/// Memory mimalloc purges (freed for a second) is handed back lazily (`MADV_FREE`)
/// instead of at once (`MADV_DONTNEED`, its default): the kernel takes the pages only
/// when it needs them, so the next full diff reuses them as they are instead of
/// faulting them back in, zeroed: about 0.1 s of the 1.6 s of CPU of a full
/// verification at 100,000 pods (BENCHMARKS.md). Never purging saved a little more, but
/// the 15-20 MiB it keeps are never given back, which a 256-MB function at that size
/// cannot spare; lazily freed pages count in RSS until taken, but the kernel takes them
/// before it runs out.
///
/// Transparent huge pages are turned off for the process. mimalloc asks for them
/// (`MADV_HUGEPAGE`), so a first touch of its memory could fault in and zero a whole
/// 2-MiB page, much of it never used: a fresh process's first LIST of 100,000 pods
/// peaked at 93-136 MiB and took 0.61-0.89 s of CPU with them, 83-103 MiB and 0.63-0.69
/// s without; a full verification peaks 6-10 MiB lower, for the same CPU (BENCHMARKS.md).
/// mimalloc's option stops its requests for new memory; the process's own switch
/// (`PR_SET_THP_DISABLE`) also covers what it mapped before `main` and a host whose
/// setting is `always`. On a host with THP off both change nothing.
pub fn configure() {
    // SAFETY: sets two options in mimalloc's table (bounds-checked by mimalloc); 0 is a
    // valid value of these on/off options.
    unsafe {
        mi_option_set(PURGE_DECOMMITS, 0);
        mi_option_set(ALLOW_THP, 0);
    }
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and sets a flag of this
    // process; a kernel that does not know it answers EINVAL, which leaves things as
    // they were.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
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

    /// After `configure`, mimalloc prints option `name` (looked up by its name, not by
    /// the index `configure` used) as off.
    fn assert_configured_off(name: &str) {
        super::configure();
        let mut printed = String::new();
        // SAFETY: `collect` only appends to `printed`, which outlives the call.
        unsafe { mi_options_print_out(Some(collect), &mut printed as *mut String as *mut c_void) };
        assert!(
            printed.contains(&format!("option '{name}': 0")),
            "the option set is not {name}:\n{printed}"
        );
    }

    #[test]
    fn purged_memory_is_reset_not_decommitted() {
        assert_configured_off("purge_decommits");
    }

    #[test]
    fn transparent_huge_pages_are_off_for_the_process() {
        assert_configured_off("allow_thp");
        #[cfg(target_os = "linux")]
        {
            // SAFETY: PR_GET_THP_DISABLE takes no pointer; it answers the flag (or -1).
            let disabled = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
            assert_eq!(disabled, 1, "the process's THP switch is not set");
        }
    }
}

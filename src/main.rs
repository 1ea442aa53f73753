//! The `joist` command: parses arguments and hands off to [`joist::commands`].

use std::process::ExitCode;

use clap::Parser;
use joist::commands::{Cli, run};

/// The global allocator and its options.
#[cfg(not(feature = "system-allocator"))]
mod allocator {
    /// mimalloc rather than glibc's malloc: glibc keeps freed memory in one arena per thread, so
    /// `joist run` held nearly three times its live heap at 10,000 pods (docs/performance.md).
    #[global_allocator]
    static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

    /// mimalloc's `mi_option_purge_delay` (its place in `mi_option_e`, mimalloc.h, the same in its v2
    /// and v3; the Rust binding names no constant for it).
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

    /// How long freed memory stays with the process before it goes back to the system. mimalloc's
    /// default, one second, gave back and faulted in again the same pages all through a busy run:
    /// `joist bench e2e --nodes 4000` spent a quarter of its wall time in page faults, with the
    /// same peak (docs/performance.md). Ten seconds still returns what a spike took.
    const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

    /// The variable mimalloc reads the purge delay from: when it is set, its value stands.
    const PURGE_DELAY_VARIABLE: &str = "MIMALLOC_PURGE_DELAY";

    /// The variable mimalloc reads whether to allow transparent huge pages from: when it is set,
    /// its value stands.
    const ALLOW_THP_VARIABLE: &str = "MIMALLOC_ALLOW_THP";

    /// Sets the allocator's purge delay and turns transparent huge pages off for the process
    /// before anything else runs, each unless the environment sets it.
    ///
    /// Huge pages: mimalloc asks for them on its arenas (`madvise`), so where the kernel grants
    /// them on request (`madvise` mode, the default of most distributions) a partly used arena
    /// is backed 2 MiB at a time. `joist bench controller --pods 1000` peaked at 86 MiB so and
    /// at 53 MiB without them (docs/performance.md); a controller gains nothing from fewer TLB
    /// misses. The switch is the kernel's (`PR_SET_THP_DISABLE`), as mimalloc's own option sets
    /// it when read from the environment at start: set later, that option would miss the arena
    /// reserved before `main`. Should the call fail (Linux before 3.15), huge pages stay as
    /// the kernel had them and nothing else changes.
    #[allow(unsafe_code)]
    pub fn tune() {
        if std::env::var_os(PURGE_DELAY_VARIABLE).is_none() {
            // SAFETY: `mi_option_set` only stores the value of a known option; mimalloc reads
            // its options with atomics, so setting one while other threads allocate is allowed.
            unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
        }
        #[cfg(target_os = "linux")]
        if std::env::var_os(ALLOW_THP_VARIABLE).is_none() {
            // SAFETY: `prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0)` only sets a flag of this process;
            // it reads and writes no memory of ours.
            unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        }
    }
}

/// glibc's malloc, for heap profilers that follow it (the `system-allocator` feature): nothing to
/// set.
#[cfg(feature = "system-allocator")]
mod allocator {
    pub fn tune() {}
}

fn main() -> ExitCode {
    allocator::tune();
    let cli = Cli::parse();
    match run(cli, &mut std::io::stdout().lock()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("joist: {e}");
            ExitCode::from(2)
        }
    }
}

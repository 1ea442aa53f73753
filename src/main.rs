//! The `joist` command: parses arguments and hands off to [`joist::commands`].

use std::process::ExitCode;

use clap::Parser;
use joist::commands::{Cli, run};

/// The global allocator and its options: glibc's malloc for `joist run`, mimalloc for every other
/// command.
///
/// The controller's heap is small and long-lived, and mimalloc's pages per size class and thread
/// held half again its live heap: at the peak of `joist bench versus-karpenter --workload basic`
/// (1,000 pods) `joist run` was resident at 66 to 80 MiB with mimalloc and at 57 to 58 MiB with
/// glibc's malloc in two arenas, its live heap 21 MB by heaptrack; at 10,000 and 100,000 pods the
/// two were level (docs/performance.md). kubesim, the benchmarks and `joist simulate` churn
/// through objects, where mimalloc spent half the CPU glibc did. The choice is made once, at the
/// start of `main`, from the command's name; a block is freed by the allocator that made it
/// (those made before the choice are mimalloc's), so the switch can lose nothing.
#[cfg(not(feature = "system-allocator"))]
#[allow(unsafe_code)]
mod allocator {
    use std::{
        alloc::{GlobalAlloc, Layout, System},
        ffi::OsStr,
        sync::atomic::{AtomicBool, Ordering},
    };

    use mimalloc::MiMalloc;

    /// The command that allocates with glibc's malloc.
    const CONTROLLER_COMMAND: &str = "run";

    /// Whether new blocks come from glibc's malloc; set once, never unset.
    static SYSTEM: AtomicBool = AtomicBool::new(false);

    /// mimalloc until [`choose`] says otherwise.
    struct ByCommand;

    #[global_allocator]
    static ALLOCATOR: ByCommand = ByCommand;

    impl ByCommand {
        /// Whether `block` is to be freed (or grown) by glibc's malloc: only once the switch was
        /// made, and then only a block mimalloc does not hold.
        fn is_system(block: *mut u8) -> bool {
            // SAFETY: mimalloc looks the address up in its page map, which answers for any
            // address, its own or not, without reading the block.
            SYSTEM.load(Ordering::Relaxed) && !unsafe { libmimalloc_sys::mi_is_in_heap_region(block.cast()) }
        }
    }

    // SAFETY: every call is forwarded to one of two allocators that uphold `GlobalAlloc`'s
    // contract, and a block is always freed or grown by the one that made it ([`ByCommand::is_system`]).
    unsafe impl GlobalAlloc for ByCommand {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            if SYSTEM.load(Ordering::Relaxed) {
                unsafe { System.alloc(layout) }
            } else {
                unsafe { MiMalloc.alloc(layout) }
            }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            if SYSTEM.load(Ordering::Relaxed) {
                unsafe { System.alloc_zeroed(layout) }
            } else {
                unsafe { MiMalloc.alloc_zeroed(layout) }
            }
        }

        unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
            if Self::is_system(block) {
                unsafe { System.dealloc(block, layout) }
            } else {
                unsafe { MiMalloc.dealloc(block, layout) }
            }
        }

        unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            if Self::is_system(block) {
                unsafe { System.realloc(block, layout, new_size) }
            } else {
                unsafe { MiMalloc.realloc(block, layout, new_size) }
            }
        }
    }

    /// mimalloc's `mi_option_purge_delay` (its place in `mi_option_e`, mimalloc.h, the same in its v2
    /// and v3; the Rust binding names no constant for it).
    const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

    /// How long memory mimalloc freed stays with the process before it goes back to the system.
    /// mimalloc's default, one second, gave back and faulted in again the same pages all through a
    /// busy run: `joist bench e2e --nodes 4000` spent a quarter of its wall time in page faults,
    /// with the same peak (docs/performance.md). Ten seconds still returns what a spike took.
    const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

    /// The variable mimalloc reads the purge delay from: when it is set, its value stands.
    const PURGE_DELAY_VARIABLE: &str = "MIMALLOC_PURGE_DELAY";

    /// glibc's arenas for the controller: two, one per core of a small node, rather than eight per
    /// core. glibc keeps what a thread freed in that thread's arena, and the controller's threads
    /// (the runtime's workers, the solver's blocking pool) free what others allocated: at 10,000
    /// pods, before the controller was made lean, every thread its own arena held three times the
    /// live heap, two arenas under twice (docs/performance.md).
    const ARENA_MAX: std::ffi::c_int = 2;

    /// The variable glibc reads its arena limit from: when it is set, its value stands.
    const ARENA_MAX_VARIABLE: &str = "MALLOC_ARENA_MAX";

    /// The variable mimalloc reads whether to allow transparent huge pages from: when it is set,
    /// its value stands.
    const ALLOW_THP_VARIABLE: &str = "MIMALLOC_ALLOW_THP";

    /// Chooses the allocator for `command` (the first argument) and sets its options before
    /// anything else runs, each unless the environment sets it: for `joist run`, glibc's malloc in
    /// [`ARENA_MAX`] arenas; for the others, mimalloc's purge delay. Transparent huge pages are
    /// turned off for the process either way.
    ///
    /// Huge pages: mimalloc asks for them on its arenas (`madvise`), so where the kernel grants
    /// them on request (`madvise` mode, the default of most distributions) a partly used arena
    /// is backed 2 MiB at a time. `joist bench controller --pods 1000` peaked at 86 MiB so and
    /// at 53 MiB without them (docs/performance.md). The switch is the kernel's
    /// (`PR_SET_THP_DISABLE`), as mimalloc's own option sets it when read from the environment at
    /// start: set later, that option would miss the arena reserved before `main`. Should the call
    /// fail (Linux before 3.15), huge pages stay as the kernel had them and nothing else changes.
    pub fn choose(command: Option<&OsStr>) {
        if command == Some(OsStr::new(CONTROLLER_COMMAND)) {
            if std::env::var_os(ARENA_MAX_VARIABLE).is_none() {
                // SAFETY: `mallopt` only sets one of glibc's malloc parameters; no other thread
                // runs yet.
                unsafe { libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX) };
            }
            SYSTEM.store(true, Ordering::Relaxed);
        } else if std::env::var_os(PURGE_DELAY_VARIABLE).is_none() {
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

/// glibc's malloc for every command, for heap profilers that follow it (the `system-allocator`
/// feature): nothing to choose.
#[cfg(feature = "system-allocator")]
mod allocator {
    pub fn choose(_command: Option<&std::ffi::OsStr>) {}
}

fn main() -> ExitCode {
    allocator::choose(std::env::args_os().nth(1).as_deref());
    let cli = Cli::parse();
    match run(cli, &mut std::io::stdout().lock()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("joist: {e}");
            ExitCode::from(2)
        }
    }
}

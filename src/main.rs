//! The `joist` command: parses arguments and hands off to [`joist::commands`].

use std::process::ExitCode;

use clap::Parser;
use joist::commands::{Cli, run};

/// mimalloc rather than glibc's malloc: glibc keeps freed memory in one arena per thread, so
/// `joist run` held nearly three times its live heap at 10,000 pods (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli, &mut std::io::stdout().lock()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("joist: {e}");
            ExitCode::from(2)
        }
    }
}

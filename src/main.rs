//! The `joist` command: parses arguments and hands off to [`joist::commands`].

use std::process::ExitCode;

use clap::Parser;
use joist::commands::{Cli, run};

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

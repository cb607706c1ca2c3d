//! The command-line surface. Thin: every command parses its arguments and calls a library.

use std::io::Write as _;

use anyhow::Result;
use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};

use crate::meta_cmd::{self, MetaCommand};

#[derive(Debug, Parser)]
#[command(
    name = "slate",
    version,
    about = "Atomic, image-based OS updates with automatic rollback"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Read and change the META partition (values kept across reboots).
    #[command(subcommand)]
    Meta(MetaCommand),
    /// Print a shell completion script.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// How a status-like command prints its answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    #[default]
    Text,
    Json,
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Meta(cmd) => meta_cmd::run(cmd),
        Command::Completions { shell } => {
            let mut out = std::io::stdout().lock();
            clap_complete::generate(shell, &mut Cli::command(), "slate", &mut out);
            out.flush()?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }
}

//! The command-line surface. Thin: every command parses its arguments and calls a library.

use std::ffi::OsString;
use std::io::Write as _;

use anyhow::Result;
use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};

use crate::imager_cmd::{self, ImagerCommand};
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
    /// Build images from a profile (also the `imager` role).
    #[command(subcommand)]
    Imager(ImagerCommand),
    /// Run as the initramfs init (PID 1): mount the root image and switch to it.
    #[command(hide = true, disable_help_flag = true)]
    Init {
        /// Arguments the kernel passed to init, handed on to the real init.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
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
        Command::Init { args } => crate::init::run(args),
        Command::Imager(cmd) => imager_cmd::run(cmd),
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

    #[test]
    fn init_accepts_whatever_the_kernel_passes() {
        // A parse error would make PID 1 exit and panic the kernel.
        let cli = Cli::try_parse_from(["slate", "init", "single", "-b", "--help", "x=1"]).unwrap();
        match cli.command {
            Command::Init { args } => assert_eq!(args, ["single", "-b", "--help", "x=1"]),
            other => panic!("parsed as {other:?}"),
        }
        let cli = Cli::try_parse_from(["slate", "init"]).unwrap();
        assert!(matches!(cli.command, Command::Init { args } if args.is_empty()));
    }
}

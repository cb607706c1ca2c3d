//! The `slate` multi-call binary.
//!
//! The base name of argv[0] picks the role — `init`, `machined`, `installer` and `imager` run as
//! if invoked as `slate <role> ...` — so one statically linked file serves as the initramfs init,
//! PID 1, the installer carried in update bundles, and the operator's command line.

mod args;
mod boot_cmd;
mod boot_times;
mod bundle_cmd;
mod cli;
mod config_cmd;
#[cfg(feature = "etcd")]
mod fleet_cmd;
mod fleetlock_cmd;
mod imager_cmd;
mod installer_cmd;
mod meta_cmd;
mod node_cmd;
mod progress;
mod release_cmd;
mod services_cmd;
mod snapshot_cmd;
mod transport_cmd;
mod trust_cmd;
mod upgrade_cmd;
mod var_cmd;
mod wait;

use std::ffi::OsString;
use std::path::Path;
use std::process::ExitCode;

use clap::Parser as _;

/// Names under which the binary acts as a role rather than as the general CLI.
const ROLES: &[&str] = &["init", "machined", "installer", "imager"];

/// Rewrite `installer ARGS...` into `slate installer ARGS...` when invoked under a role name.
fn dispatch_args(args: Vec<OsString>) -> Vec<OsString> {
    let invoked_as = args
        .first()
        .and_then(|a| Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("slate")
        .to_string();
    if ROLES.contains(&invoked_as.as_str()) {
        let mut rewritten = vec![OsString::from("slate"), OsString::from(invoked_as)];
        rewritten.extend(args.into_iter().skip(1));
        rewritten
    } else {
        args
    }
}

/// Whether this process is PID 1's `machined` with no arguments: it starts without building
/// the command line's parser. Under emulation every first-run instruction is translated before
/// it runs, and building clap's tree of every subcommand is code run once at each boot.
fn bare_machined(args: &[OsString]) -> bool {
    args.len() == 1 && Path::new(&args[0]).file_name() == Some("machined".as_ref())
}

fn main() -> ExitCode {
    // bench-delta's pair (d), "slate rebuilt with a small source change": the build it makes
    // with this variable set differs from every other build by this one statement; unset, it
    // compiles to nothing (xtask/src/slate_static.rs).
    if let Some(note) = option_env!("SLATE_BENCH_SMALL_CHANGE") {
        eprintln!("slate: {note}");
    }
    let args: Vec<OsString> = std::env::args_os().collect();
    let result = if bare_machined(&args) {
        slate_machined::run()
    } else {
        cli::run(cli::Cli::parse_from(dispatch_args(args)))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn only_a_bare_machined_skips_the_parser() {
        assert!(bare_machined(&os(&["/usr/bin/machined"])));
        assert!(bare_machined(&os(&["machined"])));
        assert!(!bare_machined(&os(&["/usr/bin/machined", "--help"])));
        assert!(!bare_machined(&os(&["/usr/bin/slate", "machined"])));
        assert!(!bare_machined(&os(&["/init"])));
    }

    #[test]
    fn role_names_become_subcommands() {
        assert_eq!(
            dispatch_args(os(&["/sbin/installer", "--help"])),
            os(&["slate", "installer", "--help"])
        );
        assert_eq!(dispatch_args(os(&["/init"])), os(&["slate", "init"]));
        assert_eq!(
            dispatch_args(os(&["./slate", "meta", "list"])),
            os(&["./slate", "meta", "list"])
        );
    }
}

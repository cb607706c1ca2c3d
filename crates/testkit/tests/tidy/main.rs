//! Tidy: the pure crates do no I/O of their own (this file), and no crate's modules import
//! each other in a circle (`cycles.rs`).
//!
//! The pure crates do no I/O of their own. Their non-test source may not name
//! `std::fs`, `std::process`, the sockets of `std::net` (its address types are plain values and
//! allowed; `ToSocketAddrs` resolves names and is not), `std::os::unix::{fs, net, process}`,
//! nor `File::open`/`File::create`/`OpenOptions::new`/`Command::new`/`TcpStream`/... however
//! imported. Disks reach them through the `Disk` trait, files through byte slices.
//!
//! Comments and string literals are ignored, and so are items under `#[cfg(test)]` (test
//! modules, inline or in their own file). A failure lists file:line for every hit.

mod cycles;
mod source;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use source::{
    blank_comments_and_literals, collect_rs, module_files, paths, tokens, without_test_items,
};

/// What is scanned, relative to the workspace root: a crate's whole `src/`, or one file.
const PURE: &[&str] = &[
    "crates/meta/src",
    "crates/bootspec/src",
    "crates/sequencer/src",
    "crates/cpio/src",
    "crates/uki/src",
    "crates/modules/src",
    "crates/profile/src",
    "crates/layout/src",
    "crates/esp/src",
    // Both boot loaders, A/B and snapshot roots, over the Disk trait.
    "crates/bootloader/src",
    "crates/machine-config/src",
    "crates/release/src",
    "crates/fleetlock/src",
    "crates/rollout/src",
    "crates/snapshot/src",
    "crates/services/src",
    // The metrics' names, checks and text; the daemons serve it.
    "crates/metrics/src",
    // Only the policy of trust: keys.rs reads key files and key directories (std::fs).
    "crates/trust/src/policy.rs",
];

/// Files in [`PURE`] allowed to do I/O anyway, each with its reason. An entry without hits
/// fails the test, so the list cannot go stale.
const ALLOWED: &[(&str, &str)] = &[];

/// Items of `std::net` that are plain values: parsing and formatting addresses, no sockets.
const NET_VALUES: &[&str] = &[
    "IpAddr",
    "Ipv4Addr",
    "Ipv6Addr",
    "Ipv6MulticastScope",
    "SocketAddr",
    "SocketAddrV4",
    "SocketAddrV6",
    "AddrParseError",
];

/// Names that are I/O wherever they come from.
const IO_NAMES: &[&str] = &[
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "UnixStream",
    "UnixListener",
    "UnixDatagram",
    "ToSocketAddrs",
    "to_socket_addrs",
];

/// Two-segment paths that are I/O: `File::open(..)` and the like.
const IO_CALLS: &[(&str, &str)] = &[
    ("File", "open"),
    ("File", "create"),
    ("File", "create_new"),
    ("File", "options"),
    ("OpenOptions", "new"),
    ("Command", "new"),
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn pure_crates_do_no_io() {
    let root = workspace();
    let mut files = Vec::new();
    for scope in PURE {
        let path = root.join(scope);
        assert!(path.exists(), "{scope} is gone: update PURE");
        let before = files.len();
        collect_rs(&path, &mut files);
        assert!(files.len() > before, "{scope} holds no .rs file");
    }

    let mut test_only = BTreeSet::new();
    let mut hits = Vec::new();
    for file in &files {
        let source = std::fs::read_to_string(file).unwrap();
        let scan = scan(&source);
        test_only.extend(
            scan.test_modules
                .iter()
                .flat_map(|name| module_files(file, name)),
        );
        let rel = file.strip_prefix(&root).unwrap().display().to_string();
        let lines: Vec<&str> = source.lines().collect();
        for hit in scan.hits {
            hits.push((
                file.clone(),
                rel.clone(),
                hit.line,
                hit.why,
                lines[hit.line - 1].trim().to_owned(),
            ));
        }
    }

    let mut allowed_used = BTreeSet::new();
    let mut report = Vec::new();
    for (file, rel, line, why, text) in hits {
        if test_only.contains(&file) {
            continue;
        }
        if ALLOWED.iter().any(|(allowed, _)| *allowed == rel) {
            allowed_used.insert(rel);
            continue;
        }
        report.push(format!("{rel}:{line}: {why}: {text}"));
    }
    for (allowed, reason) in ALLOWED {
        assert!(
            allowed_used.contains(*allowed),
            "{allowed} ({reason}) does no I/O any more: remove it from ALLOWED"
        );
    }
    assert!(
        report.is_empty(),
        "the pure crates do I/O of their own (pass data in, or reach disks through the Disk \
         trait):\n{}",
        report.join("\n")
    );
    println!(
        "tidy: {} files of the pure crates do no I/O ({} test-only files skipped)",
        files.len(),
        test_only.len()
    );
}

/// The scanner itself: hits outside tests, none in comments, strings or test items.
#[test]
fn the_scanner_sees_io_outside_tests_only() {
    let source = r##"//! std::fs in a doc comment
use std::{io::{self, Read}, fs};
use std::net::{SocketAddr, Ipv4Addr};
use std::net::{IpAddr, TcpStream as Stream};
/* std::process, /* nested */ still a comment */
const S: &str = "std::process::Command::new";
const R: &str = r#"File::open("x")"#;
fn lifetimes<'a>(x: &'a str, c: char) -> bool { c == '"' || c == '\'' }
fn run() { let _ = std::process::Command::new("x"); }
#[cfg(test)]
mod tests {
    use std::fs::File;
    fn g() { File::open("x").unwrap(); }
}
#[cfg(test)]
mod more;
fn after(a: SocketAddr) { let _ = a.to_socket_addrs(); }
fn open() { let _ = File::open(PATH); let _ = OpenOptions::new(); }
fn os() { use std::os::unix::fs::PermissionsExt; }
"##;
    let scanned = scan(source);
    let found: Vec<(usize, &str)> = scanned
        .hits
        .iter()
        .map(|h| (h.line, h.why.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (2, "std::fs"),
            (4, "std::net::TcpStream"),
            (9, "std::process::Command::new"),
            (17, "to_socket_addrs"),
            (18, "File::open"),
            (18, "OpenOptions::new"),
            (19, "std::os::unix::fs::PermissionsExt"),
        ]
    );
    assert_eq!(scanned.test_modules, ["more"]);
    assert_eq!(
        module_files(Path::new("/c/src/lib.rs"), "more"),
        [
            PathBuf::from("/c/src/more.rs"),
            PathBuf::from("/c/src/more/mod.rs")
        ]
    );
    assert_eq!(
        module_files(Path::new("/c/src/store.rs"), "more"),
        [
            PathBuf::from("/c/src/store/more.rs"),
            PathBuf::from("/c/src/store/more/mod.rs")
        ]
    );
    // A file that is all test.
    assert!(scan("#![cfg(test)]\nuse std::fs;\n").hits.is_empty());
}

#[derive(Debug)]
struct Hit {
    line: usize,
    why: String,
}

#[derive(Debug)]
struct Scan {
    hits: Vec<Hit>,
    /// `#[cfg(test)] mod name;`: whole files that are test code.
    test_modules: Vec<String>,
}

fn scan(source: &str) -> Scan {
    let tokens = tokens(&blank_comments_and_literals(source));
    let (tokens, test_modules) = without_test_items(&tokens);
    let hits = paths(&tokens)
        .into_iter()
        .filter_map(|(line, path)| io_path(&path).map(|why| Hit { line, why }))
        .collect();
    Scan { hits, test_modules }
}

/// Why `path` is I/O, if it is.
fn io_path(path: &[String]) -> Option<String> {
    let seg = |n: usize| path.get(n).map(String::as_str);
    let io = match (seg(0), seg(1)) {
        (Some("std"), Some("fs" | "process")) => true,
        (Some("std"), Some("net")) => !seg(2).is_some_and(|item| NET_VALUES.contains(&item)),
        (Some("std"), Some("os")) => {
            seg(2) == Some("unix") && matches!(seg(3), Some("fs" | "net" | "process"))
        }
        _ => {
            path.iter().any(|s| IO_NAMES.contains(&s.as_str()))
                || path
                    .windows(2)
                    .any(|w| IO_CALLS.iter().any(|(ty, f)| w[0] == *ty && w[1] == *f))
        }
    };
    if !io {
        return None;
    }
    let shown = match path.iter().position(|s| s == "*") {
        Some(star) => &path[..star],
        None => path,
    };
    Some(shown.join("::"))
}

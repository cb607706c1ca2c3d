//! Tidy: the pure crates do no I/O of their own. Their non-test source may not name
//! `std::fs`, `std::process`, the sockets of `std::net` (its address types are plain values and
//! allowed; `ToSocketAddrs` resolves names and is not), `std::os::unix::{fs, net, process}`,
//! nor `File::open`/`File::create`/`OpenOptions::new`/`Command::new`/`TcpStream`/... however
//! imported. Disks reach them through the `Disk` trait, files through byte slices.
//!
//! Comments and string literals are ignored, and so are items under `#[cfg(test)]` (test
//! modules, inline or in their own file). A failure lists file:line for every hit.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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

fn collect_rs(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_owned());
        }
        return;
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for entry in entries {
        collect_rs(&entry, out);
    }
}

/// The files `mod name;` declared in `file` may live in.
fn module_files(file: &Path, name: &str) -> Vec<PathBuf> {
    let dir = file.parent().unwrap();
    let stem = file.file_stem().unwrap();
    let base = if ["lib", "main", "mod"].iter().any(|s| stem == *s) {
        dir.to_owned()
    } else {
        dir.join(stem)
    };
    vec![
        base.join(format!("{name}.rs")),
        base.join(name).join("mod.rs"),
    ]
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

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

fn scan(source: &str) -> Scan {
    let tokens = tokens(&blank_comments_and_literals(source));
    let (tokens, test_modules) = without_test_items(&tokens);
    let mut hits = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i].1 {
            Tok::Ident(word) if word == "use" => {
                i += 1;
                let mut paths = Vec::new();
                use_tree(&tokens, &mut i, &[], &mut paths);
                for (line, path) in paths {
                    if let Some(why) = io_path(&path) {
                        hits.push(Hit { line, why });
                    }
                }
            }
            Tok::Ident(_) | Tok::Path => {
                // A path: identifiers joined by `::` (a leading `::` allowed).
                let line = tokens[i].0;
                let mut path = Vec::new();
                if tokens[i].1 == Tok::Path {
                    i += 1;
                }
                while let Some((_, Tok::Ident(word))) = tokens.get(i) {
                    path.push(word.clone());
                    i += 1;
                    if tokens.get(i).map(|t| &t.1) != Some(&Tok::Path) {
                        break;
                    }
                    i += 1;
                }
                if let Some(why) = io_path(&path) {
                    hits.push(Hit { line, why });
                }
            }
            Tok::Punct(_) => i += 1,
        }
    }
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

/// A `use` tree from `tokens[*i]` on, as full paths (`{a, b::{c}}` expanded), each with the
/// line it is on; stops after the tree (before its `;`, `,` or `}`).
fn use_tree(
    tokens: &[(usize, Tok)],
    i: &mut usize,
    prefix: &[String],
    out: &mut Vec<(usize, Vec<String>)>,
) {
    let mut path = prefix.to_vec();
    let mut line = tokens.get(*i).map_or(0, |t| t.0);
    while let Some((at, tok)) = tokens.get(*i) {
        match tok {
            Tok::Ident(word) if word == "as" => {
                *i += 2;
                break;
            }
            Tok::Ident(word) => {
                if path.len() == prefix.len() {
                    line = *at;
                }
                path.push(word.clone());
            }
            Tok::Path => {}
            Tok::Punct('*') => path.push("*".into()),
            Tok::Punct('{') => {
                *i += 1;
                while let Some((_, tok)) = tokens.get(*i) {
                    match tok {
                        Tok::Punct('}') => break,
                        Tok::Punct(',') => *i += 1,
                        _ => use_tree(tokens, i, &path, out),
                    }
                }
                *i += 1;
                return;
            }
            Tok::Punct(_) => break,
        }
        *i += 1;
    }
    out.push((line, path));
}

/// `tokens` without the items under `#[cfg(test)]`, and the names of `#[cfg(test)] mod x;`.
fn without_test_items(tokens: &[(usize, Tok)]) -> (Vec<(usize, Tok)>, Vec<String>) {
    let is = |i: usize, want: &[Tok]| {
        tokens.len() >= i + want.len() && tokens[i..i + want.len()].iter().map(|t| &t.1).eq(want)
    };
    let punct = Tok::Punct;
    let ident = |s: &str| Tok::Ident(s.into());
    let cfg_test = [
        punct('['),
        ident("cfg"),
        punct('('),
        ident("test"),
        punct(')'),
        punct(']'),
    ];
    let mut kept = Vec::new();
    let mut modules = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        if is(i, &[punct('#'), punct('!')]) && is(i + 2, &cfg_test) {
            return (Vec::new(), Vec::new()); // the whole file is test code
        }
        if !(is(i, &[punct('#')]) && is(i + 1, &cfg_test)) {
            kept.push(tokens[i].clone());
            i += 1;
            continue;
        }
        i += 1 + cfg_test.len();
        // More attributes of the same item.
        while is(i, &[punct('#'), punct('[')]) {
            i = matching(tokens, i + 1);
        }
        let start = i;
        let mut depth = 0usize;
        while i < tokens.len() {
            match tokens[i].1 {
                Tok::Punct('(' | '[') => depth += 1,
                Tok::Punct(')' | ']') => depth = depth.saturating_sub(1),
                Tok::Punct('{') if depth == 0 => {
                    i = matching(tokens, i);
                    break;
                }
                Tok::Punct(';') if depth == 0 => {
                    let item: Vec<&Tok> = tokens[start..i].iter().map(|t| &t.1).collect();
                    if let [.., Tok::Ident(m), Tok::Ident(name)] = item[..] {
                        if m == "mod" {
                            modules.push(name.clone());
                        }
                    }
                    i += 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
    }
    (kept, modules)
}

/// The index just past the bracket that closes the one at `open`.
fn matching(tokens: &[(usize, Tok)], open: usize) -> usize {
    let mut depth = 0usize;
    for (i, (_, tok)) in tokens.iter().enumerate().skip(open) {
        match tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// Identifiers, `::` and other punctuation, each with its 1-based line.
fn tokens(text: &str) -> Vec<(usize, Tok)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if !c.is_ascii_digit() {
                out.push((line, Tok::Ident(word)));
            }
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push((line, Tok::Path));
            i += 2;
        } else {
            out.push((line, Tok::Punct(c)));
            i += 1;
        }
    }
    out
}

/// `source` with comments, string and character literals turned into spaces (newlines kept,
/// so lines keep their numbers).
fn blank_comments_and_literals(source: &str) -> String {
    let s: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |out: &mut String, chars: &[char]| {
        out.extend(chars.iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
    };
    let ident_char = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < s.len() {
        let prev_ident = i > 0 && ident_char(s[i - 1]);
        let end = match s[i] {
            '/' if s.get(i + 1) == Some(&'/') => {
                let mut j = i;
                while j < s.len() && s[j] != '\n' {
                    j += 1;
                }
                j
            }
            '/' if s.get(i + 1) == Some(&'*') => {
                let (mut j, mut depth) = (i + 2, 1);
                while j < s.len() && depth > 0 {
                    if s[j] == '/' && s.get(j + 1) == Some(&'*') {
                        depth += 1;
                        j += 2;
                    } else if s[j] == '*' && s.get(j + 1) == Some(&'/') {
                        depth -= 1;
                        j += 2;
                    } else {
                        j += 1;
                    }
                }
                j
            }
            // Raw strings: r"..", r#".."#, br#".."#.
            'r' if !prev_ident
                || (i > 0 && s[i - 1] == 'b' && (i < 2 || !ident_char(s[i - 2]))) =>
            {
                let mut j = i + 1;
                while s.get(j) == Some(&'#') {
                    j += 1;
                }
                let hashes = j - i - 1;
                if s.get(j) == Some(&'"') {
                    j += 1;
                    loop {
                        if j >= s.len() {
                            break j;
                        }
                        if s[j] == '"'
                            && s[j + 1..]
                                .iter()
                                .take(hashes)
                                .filter(|&&c| c == '#')
                                .count()
                                == hashes
                        {
                            break j + 1 + hashes;
                        }
                        j += 1;
                    }
                } else {
                    i
                }
            }
            '"' => {
                let mut j = i + 1;
                while j < s.len() && s[j] != '"' {
                    j += if s[j] == '\\' { 2 } else { 1 };
                }
                j + 1
            }
            // A character literal ('x', '\n', '\u{1F600}'), not a lifetime ('a).
            '\'' if s.get(i + 1) == Some(&'\\') => {
                let mut j = i + 3;
                while j < s.len() && s[j] != '\'' {
                    j += 1;
                }
                j + 1
            }
            '\'' if s.get(i + 2) == Some(&'\'') => i + 3,
            _ => i,
        };
        if end > i {
            let end = end.min(s.len());
            blank(&mut out, &s[i..end]);
            i = end;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

//! What the CLI tests share: running the built `slate` binary.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

/// Run the built `slate` with `args`.
pub fn slate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_slate"))
        .args(args)
        .output()
        .expect("run slate")
}

/// Run it and return its stdout; fail the test with its stderr when it fails.
pub fn ok(args: &[&str]) -> String {
    let out = slate(args);
    assert!(
        out.status.success(),
        "slate {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A path as an argument.
pub fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

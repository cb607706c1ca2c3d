//! Secure Boot test keys: an RSA-2048 key and self-signed certificate made by `openssl`, as an
//! owner's `db` key would be.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A key and its certificate, PEM files under a directory the caller owns.
#[derive(Debug, Clone)]
pub struct TestKey {
    pub key: PathBuf,
    pub cert: PathBuf,
}

impl TestKey {
    pub fn key_pem(&self) -> Vec<u8> {
        std::fs::read(&self.key).expect("reading the test key")
    }

    pub fn cert_pem(&self) -> Vec<u8> {
        std::fs::read(&self.cert).expect("reading the test certificate")
    }
}

/// Make `NAME.key` and `NAME.crt` (subject `CN=NAME`) in `dir`. `None` when openssl is missing
/// outside CI (under `CI=true`, [`crate::require_tool`] fails the test).
pub fn db_key(dir: &Path, name: &str) -> Option<TestKey> {
    if !crate::require_tool("openssl") {
        return None;
    }
    let key = dir.join(format!("{name}.key"));
    let cert = dir.join(format!("{name}.crt"));
    let status = Command::new("openssl")
        .args([
            "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256",
        ])
        .args(["-days", "3650", "-subj", &format!("/CN={name}/")])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("running openssl");
    assert!(
        status.status.success(),
        "openssl req: {}",
        String::from_utf8_lossy(&status.stderr)
    );
    Some(TestKey { key, cert })
}

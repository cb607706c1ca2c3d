//! `slate keygen`, `slate sign` and `slate verify`: the keys that sign installer bundles, and
//! the signature (cosign's layout, kept in the bundle's own OCI layout) checked before use.

use std::fs;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _, Result};
use clap::Args;
use serde::Serialize;
use slate_bundle::Bundle;
use slate_trust::PublicKey;

use crate::args::OutputFormat;

/// The private key file `slate keygen` writes (PKCS#8 PEM, mode 0600).
pub const PRIVATE_KEY_FILE: &str = "slate.key";
/// The public key file `slate keygen` writes (SPKI PEM, as cosign's `cosign.pub`).
pub const PUBLIC_KEY_FILE: &str = "slate.pub";

#[derive(Debug, Args)]
pub struct KeygenArgs {
    /// Directory for slate.key (private, 0600) and slate.pub; created if missing. Existing key
    /// files are never overwritten.
    #[arg(long)]
    out: PathBuf,
}

#[derive(Debug, Args)]
pub struct SignArgs {
    /// The installer bundle (OCI image layout directory).
    #[arg(long)]
    bundle: PathBuf,
    /// The private key (PKCS#8 or SEC1 PEM, P-256).
    #[arg(long)]
    key: PathBuf,
    /// The image's tag in the layout, when it holds several.
    #[arg(long)]
    tag: Option<String>,
    /// Check the bundle and the key and show what would be signed, without writing.
    #[arg(long)]
    dry_run: bool,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The installer bundle (OCI image layout directory).
    #[arg(long)]
    bundle: PathBuf,
    /// A trusted public key (SPKI PEM), or a directory of `*.pub` keys; repeatable.
    #[arg(long = "trusted-key", value_name = "FILE", required = true, num_args = 1..)]
    trusted_keys: Vec<PathBuf>,
    /// The image's tag in the layout, when it holds several.
    #[arg(long)]
    tag: Option<String>,
    #[arg(long, value_enum, default_value_t)]
    output: OutputFormat,
}

/// Write `bytes` to a new file (never over an existing one) with `mode`.
fn create_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

pub fn keygen(args: KeygenArgs) -> Result<()> {
    let private = args.out.join(PRIVATE_KEY_FILE);
    let public = args.out.join(PUBLIC_KEY_FILE);
    for path in [&private, &public] {
        if fs::symlink_metadata(path).is_ok() {
            bail!(
                "{} already exists; slate keygen never overwrites a key",
                path.display()
            );
        }
    }
    fs::create_dir_all(&args.out).with_context(|| format!("creating {}", args.out.display()))?;
    let pair = slate_trust::generate_keypair();
    create_new(&private, pair.private_pem.as_bytes(), 0o600)?;
    if let Err(err) = create_new(&public, pair.public_pem.as_bytes(), 0o644) {
        let _ = fs::remove_file(&private);
        return Err(err);
    }
    println!(
        "wrote {} (private, mode 0600) and {}\nkey id {}",
        private.display(),
        public.display(),
        pair.id
    );
    Ok(())
}

fn open_bundle(dir: &Path, tag: Option<&str>) -> Result<Bundle> {
    Bundle::open(dir, tag).with_context(|| format!("reading the bundle {}", dir.display()))
}

pub fn sign(args: SignArgs) -> Result<()> {
    let key = slate_trust::read_private_key(&args.key)?;
    let bundle = open_bundle(&args.bundle, args.tag.as_deref())?;
    // Parse, then write: every blob must match the digest the signature will cover.
    slate_trust::verify_blobs(&bundle)
        .with_context(|| format!("checking the blobs of {}", args.bundle.display()))?;
    let m = bundle.manifest();
    let id = key.public_key().id();
    let tag = slate_bundle::signature_tag(bundle.manifest_digest())?;
    if args.dry_run {
        println!(
            "would sign {} {} (manifest {}) with key {id} as {tag}",
            m.name,
            m.version,
            bundle.manifest_digest()
        );
        return Ok(());
    }
    slate_trust::sign(&bundle, &key)
        .with_context(|| format!("signing {}", args.bundle.display()))?;
    println!(
        "signed {} {} (manifest {}) with key {id} as {tag}",
        m.name,
        m.version,
        bundle.manifest_digest()
    );
    Ok(())
}

/// Keys from files and directories of `*.pub` files, duplicates dropped.
fn trusted_keys(paths: &[PathBuf]) -> Result<Vec<PublicKey>> {
    let mut keys = Vec::new();
    for path in paths {
        if path.is_dir() {
            keys.extend(slate_trust::load_trusted_keys(path)?);
        } else {
            keys.push(slate_trust::read_public_key(path)?);
        }
    }
    keys.sort_by_key(PublicKey::id);
    keys.dedup_by_key(|k| k.id());
    Ok(keys)
}

#[derive(Debug, Serialize)]
struct VerifiedBlob {
    role: String,
    file_name: String,
    digest: String,
    size: u64,
}

#[derive(Debug, Serialize)]
struct VerifyReport {
    name: String,
    version: String,
    arch: String,
    variant: String,
    manifest_digest: String,
    key_id: String,
    blobs: Vec<VerifiedBlob>,
}

pub fn verify(args: VerifyArgs) -> Result<()> {
    let keys = trusted_keys(&args.trusted_keys)?;
    let bundle = open_bundle(&args.bundle, args.tag.as_deref())?;
    let (verified, blobs) = slate_trust::verify_bundle(&bundle, &keys)
        .with_context(|| format!("verifying {}", args.bundle.display()))?;
    let m = bundle.manifest();
    let report = VerifyReport {
        name: m.name.clone(),
        version: m.version.clone(),
        arch: m.arch.clone(),
        variant: m.variant.clone(),
        manifest_digest: verified.manifest_digest,
        key_id: verified.key_id.to_hex(),
        blobs: blobs
            .into_iter()
            .map(|(role, blob)| VerifiedBlob {
                role,
                file_name: blob.file_name,
                digest: blob.digest,
                size: blob.size,
            })
            .collect(),
    };
    match args.output {
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        OutputFormat::Text => {
            println!(
                "verified {} {} (arch {}, variant {})\n  manifest {}\n  signed by key {}",
                report.name,
                report.version,
                report.arch,
                report.variant,
                report.manifest_digest,
                report.key_id
            );
            for blob in &report.blobs {
                println!(
                    "  blob {} {} {} ({} bytes)",
                    blob.role, blob.file_name, blob.digest, blob.size
                );
            }
        }
    }
    Ok(())
}

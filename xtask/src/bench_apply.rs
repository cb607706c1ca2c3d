//! Benchmark (not a test): applying a 256 MiB payload as an upgrade — `slate installer upgrade`
//! reads and verifies the bundle, writes the UKI into the ESP through the userspace FAT code,
//! flips the default, and flushes after each step — against `cp` + `sync` of the same bytes to
//! the same filesystem, measured in the same run and printed as a ratio.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{ensure, Context, Result};
use slate_bundle::{write_bundle, BlobInput, BundleSpec, BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE};

use crate::util::{output, repo_root, run};
use crate::vm_test::prepare;

const PAYLOAD: usize = 256 << 20;

/// Incompressible, reproducible bytes (xorshift): no filesystem or cache can shortcut them.
fn payload() -> Vec<u8> {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut bytes = Vec::with_capacity(PAYLOAD);
    while bytes.len() < PAYLOAD {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes
}

/// The demo profile with an ESP large enough for two 256 MiB UKIs, paths made absolute.
fn bench_profile(dir: &Path) -> Result<std::path::PathBuf> {
    let root = repo_root();
    let text = fs::read_to_string(root.join("profiles/demo.toml"))?
        .replace("\"../", &format!("\"{}/", root.display()))
        .replace("size_mib = 256", "size_mib = 1024")
        .replace("esp_mib = 96", "esp_mib = 700");
    ensure!(
        text.contains("esp_mib = 700"),
        "the demo profile changed shape"
    );
    let path = dir.join("bench-apply.toml");
    fs::write(&path, text)?;
    Ok(path)
}

pub fn bench_apply() -> Result<()> {
    let prepared = prepare()?;
    let dir = repo_root().join("target/bench-apply");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir)?;
    let profile = bench_profile(&dir)?;
    let disk = dir.join("disk.raw");
    run(Command::new(&prepared.slate)
        .args(["imager", "build", "--profile"])
        .arg(&profile)
        .args(["--output", "image", "--out"])
        .arg(&disk))?;

    let bytes = payload();
    let bundle = dir.join("bundle");
    let slate = fs::read(&prepared.slate)?;
    write_bundle(
        &bundle,
        BundleSpec {
            name: "slate",
            version: "2.0.0",
            arch: "amd64",
            variant: "demo",
        },
        &[
            BlobInput {
                role: slate_bundle::UKI_ROLE,
                file_name: "slate-2.0.0.efi",
                media_type: UKI_MEDIA_TYPE,
                bytes: &bytes,
            },
            BlobInput {
                role: slate_bundle::INSTALLER_ROLE,
                file_name: "slate",
                media_type: BINARY_MEDIA_TYPE,
                bytes: &slate,
            },
        ],
    )?;
    let plain = dir.join("payload.bin");
    fs::write(&plain, &bytes)?;
    drop(bytes);
    run(&mut Command::new("sync"))?;

    let start = Instant::now();
    let applied = output(
        Command::new(&prepared.slate)
            .args(["installer", "upgrade", "--disk"])
            .arg(&disk)
            .arg("--bundle")
            .arg(&bundle)
            .arg("--no-verify"),
    )?;
    let slate_time = start.elapsed();
    ensure!(
        applied.contains("installed slate-2.0.0+3.efi"),
        "the upgrade: {applied}"
    );

    let copy = dir.join("copy.bin");
    let start = Instant::now();
    run(Command::new("cp").arg(&plain).arg(&copy))?;
    run(&mut Command::new("sync"))?;
    let cp_time = start.elapsed();
    ensure!(
        fs::metadata(&copy).context("the copy")?.len() == PAYLOAD as u64,
        "cp copied everything"
    );

    println!(
        "apply a {} MiB payload, one run each, same filesystem",
        PAYLOAD >> 20
    );
    println!("  slate installer upgrade (verify digest, write ESP slot, flip, fsync each step): {slate_time:.2?}");
    println!("  cp + sync of the same bytes:                                                   {cp_time:.2?}");
    println!(
        "  ratio: {:.2}x (slate / cp+sync)",
        slate_time.as_secs_f64() / cp_time.as_secs_f64()
    );
    if std::env::var_os("SLATE_BENCH_KEEP").is_none() {
        let _ = fs::remove_dir_all(&dir);
    }
    Ok(())
}

//! Benchmark (not a test): applying a 256 MiB payload as an upgrade — `slate installer upgrade`
//! reads and verifies the bundle, writes the UKI into the ESP through the userspace FAT code,
//! flips the default, and flushes after each step — against `cp` of the same bytes to the same
//! filesystem and an fsync of the copy (`sync FILE`), measured in the same run.
//!
//! Every run of either side starts from the same state: slate's on a fresh copy of the
//! just-built disk image, the baseline's with no copy present, and both after a `sync` of the
//! whole system, untimed, so that neither pays for the other's (or its own setup's) writes.

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Context, Result};
use slate_bundle::{write_bundle, BlobInput, BundleSpec, BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE};

use super::apply_bare::{sync_all, Payload};
use crate::bench::{noise, stopwatch, Bench, Comparison, Sample, Side};
use crate::util::{output, repo_root, run};
use crate::vm_test::prepare;

const PAYLOAD: usize = 256 << 20;

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

/// The bundle with the payload as its UKI, and the payload alone as a plain file.
fn write_inputs(slate: &Path, bundle: &Path, plain: &Path) -> Result<()> {
    let bytes = noise(PAYLOAD);
    let slate = fs::read(slate).with_context(|| format!("reading {}", slate.display()))?;
    write_bundle(
        bundle,
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
    fs::write(plain, &bytes).with_context(|| format!("writing {}", plain.display()))
}

pub fn bench_apply() -> Result<Vec<Comparison>> {
    let prepared = prepare()?;
    let dir = repo_root().join("target/bench/apply");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let profile = bench_profile(&dir)?;
    let pristine = dir.join("pristine.raw");
    run(Command::new(&prepared.slate)
        .args(["imager", "build", "--profile"])
        .arg(&profile)
        .args(["--output", "image", "--out"])
        .arg(&pristine))?;
    let (bundle, plain) = (dir.join("bundle"), dir.join("payload.bin"));
    write_inputs(&prepared.slate, &bundle, &plain)?;

    let payload = Payload::read(&plain)?;

    let disk = dir.join("disk.raw");
    let slate = Side::new("slate installer upgrade", |_| {
        run(Command::new("cp")
            .arg("--sparse=always")
            .arg(&pristine)
            .arg(&disk))?;
        sync_all()?;
        let (applied, secs) = stopwatch(|| {
            output(
                Command::new(&prepared.slate)
                    .args(["installer", "upgrade", "--disk"])
                    .arg(&disk)
                    .arg("--bundle")
                    .arg(&bundle)
                    .arg("--no-verify"),
            )
        })?;
        ensure!(
            applied.contains("installed slate-2.0.0+3.efi"),
            "the upgrade: {applied}"
        );
        Ok(Sample::new(secs))
    });
    let copy = dir.join("copy.bin");
    let baseline = Side::new("cp + fsync", |_| {
        let _ = fs::remove_file(&copy);
        sync_all()?;
        let ((), secs) = stopwatch(|| {
            run(Command::new("cp").arg(&plain).arg(&copy))?;
            run(Command::new("sync").arg(&copy))
        })?;
        ensure!(
            fs::metadata(&copy).context("the copy")?.len() == PAYLOAD as u64,
            "cp copied everything"
        );
        Ok(Sample::new(secs))
    });
    let c = Bench::new(&format!("apply {} MiB", PAYLOAD >> 20), "s")
        .about("slate: read and verify the bundle, write the UKI into the ESP slot, flip the")
        .about("default, flush each step; on a fresh copy of the disk image each run")
        .about("baseline: cp of the same bytes to the same filesystem, then fsync of the copy")
        .about("bare: hash every byte and check it (on one core; per chunk on all cores), then")
        .about("write it O_DIRECT and fdatasync; no bundle, FAT or flip (bench_apply_bare.rs)")
        .run(slate, baseline, payload.sides(&dir))?;
    c.print();
    if std::env::var_os("SLATE_BENCH_KEEP").is_none() {
        let _ = fs::remove_dir_all(&dir);
    }
    Ok(vec![c])
}

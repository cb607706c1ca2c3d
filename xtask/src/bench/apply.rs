//! Benchmark (not a test): applying a 256 MiB payload as an upgrade — `slate installer upgrade`
//! reads and verifies the bundle, writes the UKI into the ESP through the userspace FAT code,
//! flips the default, and flushes after each step — against `cp` of the same bytes to the same
//! filesystem and an fsync of the copy (`sync FILE`), measured in the same run.
//!
//! slate runs it as a node does (issue 43): machined hashed the UKI as its upload arrived and
//! hands it to the installer as a sealed memfd (`slate_installer::UkiHandover`), so the
//! installer checks the seals and the signed digest and writes without hashing again. Sealing
//! it is the upload's work and untimed here, as writing the bundle file is. The offline upgrade
//! of a bundle file, which must hash every byte before its first write, runs beside it.
//!
//! Every run of either side starts from the same state: slate's on a fresh copy of the
//! just-built disk image, the baseline's with no copy present, and both after a `sync` of the
//! whole system, untimed, so that neither pays for the other's (or its own setup's) writes.

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Context, Result};
use slate_bundle::{
    seal_verified, write_bundle, BlobInput, Bundle, BundleSpec, BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE,
};

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

    // What machined holds after the upload: the UKI verified (hashed here, untimed) and sealed.
    let opened = Bundle::open(&bundle, None)?;
    let uki = opened.read_blob(slate_bundle::UKI_ROLE)?;
    let uki_digest = opened.blob_ref(slate_bundle::UKI_ROLE)?.digest.clone();
    let sealed = seal_verified("bench-apply-uki", &uki).context("sealing the UKI")?;
    drop((uki, opened));

    let disk = dir.join("disk.raw");
    let upgrade = |handover: bool| -> Result<Sample> {
        run(Command::new("cp")
            .arg("--sparse=always")
            .arg(&pristine)
            .arg(&disk))?;
        sync_all()?;
        let mut cmd = Command::new(&prepared.slate);
        cmd.args(["installer", "upgrade", "--disk"])
            .arg(&disk)
            .arg("--bundle")
            .arg(&bundle)
            .arg("--no-verify");
        if handover {
            let fd = slate_host::inherit_fd(&mut cmd, &sealed);
            cmd.env(slate_installer::UKI_FD_ENV, fd.to_string())
                .env(slate_installer::UKI_DIGEST_ENV, &uki_digest);
        }
        let (applied, secs) = stopwatch(|| output(&mut cmd))?;
        ensure!(
            applied.contains("installed slate-2.0.0+3.efi"),
            "the upgrade: {applied}"
        );
        Ok(Sample::new(secs))
    };
    let slate = Side::new("slate installer upgrade, UKI handed over", |_| {
        upgrade(true)
    });
    let offline = Side::new("slate installer upgrade, bundle file", |_| upgrade(false));
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
    let load_before = load_average();
    let mut also = vec![offline];
    also.extend(payload.sides(&dir));
    let mut c = Bench::new(&format!("apply {} MiB", PAYLOAD >> 20), "s")
        .about("slate: as on a node — the UKI verified on upload and handed to the installer as a")
        .about("sealed memfd (seals and signed digest checked, not hashed again); the rest of the")
        .about("bundle verified, the UKI written into the ESP slot, the default flipped, each step")
        .about("flushed; on a fresh copy of the disk image each run")
        .about(
            "bundle file: the same upgrade offline, hashing the UKI's file before the first write",
        )
        .about("baseline: cp of the same bytes to the same filesystem, then fsync of the copy")
        .about("bare: hash every byte and check it (on one core; per chunk on all cores), then")
        .about("write it O_DIRECT and fdatasync; no bundle, FAT or flip (bench_apply_bare.rs)")
        .run(slate, baseline, also)?;
    let load = format!(
        "load average before {load_before}, after {}",
        load_average()
    );
    c.extra("load_average", serde_json::json!(load), load.clone());
    c.print();
    drop(sealed);
    if std::env::var_os("SLATE_BENCH_KEEP").is_none() {
        let _ = fs::remove_dir_all(&dir);
    }
    Ok(vec![c])
}

/// The 1, 5 and 15 minute load averages: the machine is shared, and the figures mean little
/// without them.
fn load_average() -> String {
    fs::read_to_string("/proc/loadavg").map_or_else(
        |e| format!("unknown ({e})"),
        |text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        },
    )
}

//! Delta upgrades through a real registry (issue 41): a node on v1 follows `stable`; v2 — the
//! same profile, only the version changed — is published, and the update agent pulls it by
//! delta: the running UKI read from the ESP and the running slate binary as seeds, the missing
//! chunks by range requests on the registry's blobs — compressed frames of the blob `slate
//! push` tagged `.zchunks` (formats.md §7.8), so the journal's plan counts frame bytes, checked
//! against the signed table. slate's own counters (the agent's download line) say what went
//! over the wire, against the bundle's whole size; v2 commits, and its signed documents are
//! kept on STATE, so v3 is then planned from v2's signed index.
//!
//! With faults on the way, no extra boot (`delta_faults`): v2's UKI is served with one chunk
//! corrupted, in its frame and in the raw blob, so the first attempt refuses that frame by its
//! digest before decompressing it, falls back to the whole blob, refuses that too and installs
//! nothing; the registry repaired, the next attempt resumes from the chunks the first one kept
//! and fetches exactly the corrupted frame. v3 changes slate's binary too (bytes appended, in
//! the bundle and in the root), so the node derives the new root's copy of the binary from the
//! binary it pulls first (formats.md §7.7, "Derived seeds"; its size and chunk count in the
//! journal are the ones computed here with the node's code); v3's delta fetches exactly the
//! chunks the two signed indexes and that seed differ by, plus one: while v2 runs, a byte of
//! its UKI on the ESP is flipped in the disk image, inside a chunk v3 shares with v2, and the pull
//! says that chunk failed its signed digest and fetches it instead of reusing it; v3's UKI is
//! still assembled to its digest (on the ESP afterwards, byte for byte) and commits.

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{ensure, Context, Result};

use slate_bundle::{Bundle, UKI_ROLE};
use slate_delta::zchunks::ZChunk;
use slate_delta::{BlobChunks, Chunk, ChunkIndex, ZChunks};

use super::delta_faults as faults;
use super::{build_v1_v2, ensure_logged, running, Node, Prepared};
use crate::registry::Registry;
use crate::util::output;
use crate::vm::Vm;

/// The figures of `update agent: 2.0.0 downloaded and verified (N bytes fetched, M cached, R
/// reused from chunks this node holds)`.
fn moved(line: &str) -> Result<(u64, u64)> {
    let inside = line
        .split_once('(')
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(inside, _)| inside)
        .with_context(|| format!("no counts in {line:?}"))?;
    let number = |word: &str| -> Result<u64> {
        inside
            .split(", ")
            .find(|part| part.contains(word))
            .and_then(|part| part.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no {word} count in {line:?}"))
    };
    Ok((number("fetched")?, number("reused")?))
}

/// Bytes appended to slate's binary in v3: after its last section, where the loader maps
/// nothing, so the binary runs as before but is another blob, and another file in the root.
const APPENDED: usize = 512 * 1024;

/// v3's bundle at `out`: the demo profile with slate's binary changed (noise appended) both as
/// the bundle's installer and in the root. The changed binary's path.
fn build_v3(slate: &Path, work: &Path, out: &Path) -> Result<std::path::PathBuf> {
    let mut binary = fs::read(slate)?;
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    binary.extend((0..APPENDED).map(|_| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x as u8
    }));
    let changed = work.join("slate-v3");
    fs::write(&changed, &binary)?;
    fs::set_permissions(
        &changed,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )?;
    let profiles = crate::util::repo_root().join("profiles");
    let root = work.join("rootfs-v3");
    output(
        Command::new("cp")
            .arg("-a")
            .arg(profiles.join("../target/demo/rootfs"))
            .arg(&root),
    )?;
    fs::copy(&changed, root.join("usr/bin/slate"))?;
    let demo = fs::read_to_string(profiles.join("demo.toml"))?;
    let text = demo
        .replace(
            "\"../target/demo/rootfs\"",
            &format!("{:?}", root.display().to_string()),
        )
        .replace(
            "\"../target/static/x86_64-unknown-linux-gnu/release/slate\"",
            &format!("{:?}", changed.display().to_string()),
        );
    ensure!(
        text.matches(&*work.display().to_string()).count() == 2,
        "profiles/demo.toml no longer names the root and slate where this expects"
    );
    let profile = work.join("v3.toml");
    fs::write(
        &profile,
        text.replace("\"../", &format!("\"{}/../", profiles.display())),
    )?;
    super::rollback::build(slate, &profile, "installer", "3.0.0", &[], out)?;
    Ok(changed)
}

pub(super) fn delta_upgrade(prepared: &Prepared, work: &Path) -> Result<String> {
    let slate = &prepared.slate;
    let (v1, v2, v3) = build_v1_v2(slate, work)?;
    let slate3 = build_v3(slate, work, &v3)?;
    let open = |dir: &Path| -> Result<(Bundle, ChunkIndex)> {
        let bundle = Bundle::open(dir, None)?;
        let index = bundle.chunk_index()?.context("no chunk index")?;
        Ok((bundle, index))
    };
    let ((_, index1), (bundle2, index2), (bundle3, index3)) = (open(&v1)?, open(&v2)?, open(&v3)?);
    let uki_of = |bundle: &Bundle, index: &ChunkIndex| -> Result<BlobChunks> {
        let digest = &bundle.blob_ref(UKI_ROLE)?.digest;
        index
            .blob(digest)
            .cloned()
            .context("the UKI is not in the index")
    };
    let (uki2, uki3) = (uki_of(&bundle2, &index2)?, uki_of(&bundle3, &index3)?);
    let total: u64 = bundle2.image_blobs().iter().map(|(_, size)| size).sum();
    // The chunks travel compressed (formats.md §7.8): what each costs on the wire.
    let table = |bundle: &Bundle| -> Result<ZChunks> {
        Ok(bundle
            .zchunk_table()?
            .context("no compressed chunk table")?
            .1)
    };
    let (z2, z3) = (table(&bundle2)?, table(&bundle3)?);
    let wire = |z: &ZChunks, c: &Chunk| {
        z.by_raw
            .get(&c.digest)
            .map_or(u64::from(c.length), |w| w.wire_bytes(c.length))
    };
    // The node on v1 chunks its own UKI and binary as the imager chunked v1's.
    let new2 = faults::to_fetch(&uki2, &[&index1]);
    let raw2: u64 = new2.iter().map(|c| u64::from(c.length)).sum();
    let wire2: u64 = new2.iter().map(|c| wire(&z2, c)).sum();
    // The last one that travels compressed: its frame and its raw bytes both corrupted, so the
    // delta refuses the frame and the whole download that follows refuses the blob.
    let corrupt = *new2
        .iter()
        .rev()
        .find(|c| matches!(z2.by_raw.get(&c.digest), Some(ZChunk::Zstd { .. })))
        .context("v2's UKI has no compressed chunk to fetch")?;
    let Some(ZChunk::Zstd {
        offset: frame_at,
        length: frame_len,
        ..
    }) = z2.by_raw.get(&corrupt.digest).copied()
    else {
        unreachable!("found as compressed above")
    };

    let registry = Registry::start(&work.join("registry"))?;
    let repo = format!("{}/slate/os", registry.host);
    let port = registry.host.rsplit(':').next().unwrap_or_default();
    let guest_repo = format!("10.0.2.2:{port}/slate/os");
    let publish = |bundle: &Path| -> Result<String> {
        output(
            Command::new(slate)
                .args(["release", "publish", "--bundle"])
                .arg(bundle)
                .args(["--image", &repo, "--channel", "stable"]),
        )
    };
    publish(&v1)?;
    let config = output(
        Command::new(slate)
            .args(["gen", "config", "--name", "delta1", "--pki"])
            .arg(super::demo_pki())
            .args(["--image", &guest_repo, "--insecure-registry"])
            .args(["--poll-interval", "10s"]),
    )?;
    let config_path = work.join("delta1.machine.toml");
    fs::write(&config_path, config)?;
    let image = work.join("delta.raw");
    super::install_blank_disk_of(256, slate, &image, &v1, "1.0.0", &config_path)?;

    let mut vm = Vm::new(&image, &work.join("vm-delta"))?;
    let node = Node {
        prepared,
        port: vm.api_port,
        name: "delta1".into(),
    };
    let mut boot = running(&mut vm)?;
    boot.expect(
        &["committed: slate-1.0.0"],
        Duration::from_secs(60),
        "v1 committed",
    )?;
    // v2's blobs reach the registry before its release does, so the chunk is bad before the
    // node can ask for it: publishing finds the blobs there and pushes only documents.
    output(
        Command::new(slate)
            .args(["push", "--bundle"])
            .arg(&v2)
            .args(["--image", &format!("{repo}:2.0.0")]),
    )?;
    let storage = work.join("registry/storage");
    let stored = faults::registry_blob(&storage, &uki2.oci_digest())?;
    let bad_byte = corrupt.offset + u64::from(corrupt.length) / 2;
    faults::flip(&stored, bad_byte)?;
    let stored_frames = faults::registry_blob(&storage, &z2.blob)?;
    let bad_frame_byte = frame_at + u64::from(frame_len) / 2;
    faults::flip(&stored_frames, bad_frame_byte)?;
    publish(&v2)?;
    let uki_line = format!("pull 2.0.0: blob {} (", uki2.oci_digest());
    // Before a byte of the UKI is fetched, the agent's log says what it will cost.
    let planned = faults::nth_line(
        &boot,
        &uki_line,
        1,
        Duration::from_secs(120),
        "the delta's plan in the journal",
    )?;
    let (first_bytes, first_chunks) = faults::planned(&planned)?;
    // slate's plan counts the frames it will fetch, fewer bytes than the chunks they hold.
    ensure!(
        planned.contains("to fetch (compressed)") && first_bytes < raw2,
        "v2's chunks should be planned compressed ({wire2} bytes by the table, {raw2} raw): \
         {planned}"
    );
    let refused = boot.expect(
        &[&format!(
            "pull 2.0.0: blob {} is downloaded whole",
            uki2.oci_digest()
        )],
        Duration::from_secs(120),
        "the corrupted chunk refused",
    )?;
    ensure!(
        refused.contains("do not match their signed digest")
            && refused.contains("refused before decompression")
            && refused.contains(&format!("bytes {frame_at}..")),
        "the corrupted frame at {frame_at} should be refused by its digest: {refused}"
    );
    boot.expect(
        &["update agent: downloading 2.0.0: "],
        Duration::from_secs(240),
        "the whole download refused too",
    )?;
    // Repaired before the agent's next try (10 s later), then: nothing of v2 was installed.
    faults::flip(&stored, bad_byte)?;
    faults::flip(&stored_frames, bad_frame_byte)?;
    let status = node.status()?;
    let explain = node.ok(&["boot", "explain"])?;
    ensure!(
        status["version"] == "1.0.0"
            && status["staged_image"].is_null()
            && !explain.contains("2.0.0"),
        "a refused download must leave nothing behind: {status}\n{explain}"
    );
    let resumed = faults::nth_line(
        &boot,
        &uki_line,
        2,
        Duration::from_secs(120),
        "the second attempt's plan",
    )?;
    ensure!(
        faults::planned(&resumed)? == (u64::from(frame_len), 1),
        "the second attempt should fetch only the frame refused before ({frame_len} bytes), \
         the first's {} other chunks kept: {resumed}",
        first_chunks - 1
    );
    let downloaded = boot.expect(
        &["update agent: 2.0.0 downloaded and verified ("],
        Duration::from_secs(180),
        "v2 downloaded",
    )?;
    let (fetched, reused) = moved(&downloaded)?;
    // v1 was installed, not upgraded to: its chunks were listed by the node itself.
    ensure_logged(&boot, "no chunk index is kept for the running 1.0.0")?;
    ensure!(
        fetched * 20 < total && reused > total / 2,
        "a version-only change should fetch under 5 % of the bundle: {downloaded} ({total} \
         bytes whole)"
    );
    boot.expect(
        &["installer: installed"],
        Duration::from_secs(120),
        "v2's installer",
    )?;
    boot.wait_exit(Duration::from_secs(90))?;
    ensure_logged(
        &boot,
        "the chunk index of 2.0.0 is kept in /system/state/delta/",
    )?;
    // v3's slate binary changed, so the node on v2 derives the new root's copy of it from the
    // binary it pulls first, stored as v2's root stores files (formats.md §7.7): what it will
    // make, made here with the node's code.
    let v2_uki = bundle2.read_blob(UKI_ROLE)?;
    let storage = slate_bundle_diff::root_storage(&v2_uki)?;
    let derived = slate_machined::root_copy(&fs::read(&slate3)?, storage)?
        .context("no seed derived from v3's binary")?;
    let held3 = ChunkIndex {
        params: index2.params,
        blobs: index2
            .blobs
            .iter()
            .cloned()
            .chain([derived.chunks.clone()])
            .collect(),
    };
    let clean: Vec<Chunk> = faults::to_fetch(&uki3, &[&held3]);
    let underived: u64 = faults::to_fetch(&uki3, &[&index2])
        .iter()
        .map(|c| u64::from(c.length))
        .sum();
    let clean_raw: u64 = clean.iter().map(|c| u64::from(c.length)).sum();
    ensure!(
        underived >= clean_raw + (APPENDED * 3 / 4) as u64,
        "v3's UKI should hold most of the appended bytes again, which only the derived seed \
         holds: \
         {underived} bytes to fetch without it, {clean_raw} with"
    );

    let mut boot = running(&mut vm)?;
    boot.expect(
        &["committed: slate-2.0.0"],
        Duration::from_secs(60),
        "v2 committed",
    )?;
    ensure!(node.status()?["version"] == "2.0.0");
    // Rot on the ESP, while v2 runs: one byte of a chunk v3 would otherwise reuse from it.
    let rot = faults::shared_chunk(&uki2, &held3, &uki3)
        .context("v3's UKI shares no chunk with v2's that only v2's UKI holds")?;
    let (rot_file, rot_at) = faults::esp_uki_byte(&image, "2.0.0", &rot)?;
    faults::flip(&image, rot_at)?;
    let rot_end = rot.offset + u64::from(rot.length);
    // v2 came by an upgrade, so v3 is planned from v2's signed index kept on STATE.
    publish(&v3)?;
    let refused3 = boot.expect(
        &[&format!(
            "pull 3.0.0: blob {}: bytes {}..{rot_end} of the held blob {} do not match their \
             signed digest",
            uki3.oci_digest(),
            rot.offset,
            uki2.oci_digest()
        )],
        Duration::from_secs(120),
        "the ESP's rotten chunk refused",
    )?;
    let made = boot.expect(
        &["pull 3.0.0: derived the root image's copy of the new slate binary ("],
        Duration::from_secs(240),
        "the seed derived from v3's binary",
    )?;
    ensure!(
        made.contains(&format!(
            "({} bytes in {} chunks, {} KiB blocks at zstd {})",
            derived.chunks.size,
            derived.chunks.chunks.len(),
            storage.block_size / 1024,
            storage.zstd_level
        )),
        "the node should derive {} bytes in {} chunks: {made}",
        derived.chunks.size,
        derived.chunks.chunks.len()
    );
    let planned3 = boot.expect(
        &[&format!("pull 3.0.0: blob {} (", uki3.oci_digest())],
        Duration::from_secs(60),
        "v3's plan",
    )?;
    let clean_bytes: u64 = clean.iter().map(|c| wire(&z3, c)).sum();
    let rot_bytes = wire(&z3, &rot);
    ensure!(
        faults::planned(&planned3)? == (clean_bytes + rot_bytes, clean.len() + 1),
        "v3's UKI should cost its {} new chunks ({clean_bytes} bytes compressed) and the one \
         rotten on the ESP ({rot_bytes}): {planned3}",
        clean.len()
    );
    let downloaded3 = boot.expect(
        &["update agent: 3.0.0 downloaded and verified ("],
        Duration::from_secs(180),
        "v3 downloaded",
    )?;
    let serial = boot.serial();
    ensure!(
        !serial.contains("no chunk index is kept for the running 2.0.0"),
        "v2's kept index was not used"
    );
    let whole = serial
        .lines()
        .find(|l| l.contains("pull 3.0.0: blob ") && l.contains("is downloaded whole"));
    ensure!(
        whole.is_none(),
        "v3 should come by delta alone, its UKI assembled to its digest: {whole:?}"
    );
    let (fetched3, reused3) = moved(&downloaded3)?;
    ensure!(
        fetched3 * 20 < total && reused3 > total / 2,
        "v2 -> v3 by the kept index: {downloaded3}"
    );
    boot.expect(
        &["installer: installed"],
        Duration::from_secs(120),
        "v3's installer",
    )?;
    boot.wait_exit(Duration::from_secs(90))?;
    let mut boot = running(&mut vm)?;
    boot.expect(
        &["committed: slate-3.0.0"],
        Duration::from_secs(60),
        "v3 committed",
    )?;
    // What the assembly wrote is v3's signed UKI, whatever the ESP's rot offered it.
    ensure!(
        faults::esp_uki_digest(&image, "3.0.0")? == uki3.digest,
        "v3's UKI on the ESP is not the signed blob {}",
        uki3.oci_digest()
    );
    drop(registry);
    let percent = |n: u64| n as f64 * 100.0 / total as f64;
    let made = made.trim();
    Ok(format!(
        "upgrades by the update agent through a registry, of {total} bytes whole: \
         v1 -> v2 (version only; v1's chunks listed by the node): UKI chunk {}..{} corrupted in the registry \
         (its frame {frame_at}.. too) refused by its digest before decompression, the whole \
         blob refused, nothing installed; repaired, the next attempt fetched 1 frame of the \
         UKI's {first_chunks} chunks ({first_bytes} bytes planned compressed at first, \
         {raw2} raw), in all {fetched} ({:.2} %), reused {reused}; v2 -> v3 (v2's \
         signed index kept on STATE; v3's slate binary changed) fetched {fetched3} ({:.2} %), \
         reused {reused3}, the UKI's plan its {} new chunks ({underived} bytes raw without \
         the seed derived from the binary, `{made}`) and chunk {}..{rot_end} of v2's UKI, \
         refused for a byte flipped at disk offset {rot_at} in {rot_file} (`{}`); all \
         committed",
        corrupt.offset,
        corrupt.offset + u64::from(corrupt.length),
        percent(fetched),
        percent(fetched3),
        clean.len(),
        rot.offset,
        refused3.trim()
    ))
}

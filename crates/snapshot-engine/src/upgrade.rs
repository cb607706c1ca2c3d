//! `slate snapshot upgrade`: the seed's eight steps up to the reboot (docs/update-transaction.md,
//! "Btrfs snapshots"). Any failure, and SIGINT or SIGTERM, removes the half-built snapshot;
//! a power cut or SIGKILL leaves its in-progress marker, and the next run removes it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use slate_bootloader::grub::snapshots::menu::{MenuEntry, MENU_PATH};
use slate_bootloader::grub::snapshots::{self as grub, Mark};
use slate_bootloader::sdboot::snapshots as sdboot;
use slate_host::{Signal, SignalReader};
use slate_snapshot::entry::{self, carried_options, entry_text, EntrySpec, DEFAULT_TRIES};
use slate_snapshot::manifest::{sha256, Manifest, Record};
use slate_snapshot::policy::{prune, Listed, KEEP_SNAPSHOTS};
use slate_snapshot::{fstab, validate, SnapshotName};

use crate::boot::{remove_entry, Boot};
use crate::ops::remove_snapshot;
use crate::tree::{self, resolve_in_root, write_atomically};
use crate::{io_err, EngineError, Pool, Result};

/// What step 2 does to the new snapshot.
#[derive(Debug, Clone)]
pub enum Change {
    /// `/bin/sh -c CMD` chrooted in the snapshot.
    Command(String),
    /// An OS tree synced into it.
    Tree(PathBuf),
}

#[derive(Debug, Clone)]
pub struct UpgradeOptions {
    pub change: Change,
    pub dry_run: bool,
    /// The running entry's kernel command line, whose non-root options the entry carries.
    pub cmdline: String,
    /// Seconds since the epoch the snapshot is named after (now, unless a test says otherwise).
    pub now: Option<u64>,
    /// systemd-boot's boot-counting tries for the new entry (`None`: [`DEFAULT_TRIES`]).
    /// GRUB starts a new snapshot once (`next_entry`), so there it can only be 1.
    pub tries: Option<u32>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct UpgradeReport {
    pub snapshot: String,
    pub entry: String,
    pub fallback: String,
    pub pruned: Vec<String>,
    pub plan: Vec<String>,
}

/// Removes what interrupted upgrades left (markers of the in-progress snapshots): the ESP
/// copies, the manifest, the subvolume, then the marker. A marked snapshot that is running, or
/// whose entry exists (the entry is written last; on GRUB, grubenv's `next_entry` or
/// `saved_entry` naming it, written after its menu entry), was complete: only its marker goes.
pub fn clean_up_interrupted(pool: &Pool, say: &mut dyn FnMut(String)) -> Result<()> {
    for snap in pool.markers()? {
        let registered = match Boot::read(pool)? {
            Boot::SystemdBoot(scan) => scan.entry_of(&snap).is_some(),
            Boot::Grub { scan, .. } => [scan.next_entry(), scan.saved()]
                .into_iter()
                .flatten()
                .any(|e| e.snapshot == snap),
        };
        let complete = pool.running.as_ref() == Some(&snap) || registered;
        if !complete {
            say(format!(
                "cleanup: removing {snap}, left by an interrupted upgrade"
            ));
            pool.detach_under(&pool.path_of(&snap))?;
            remove_entry(pool, &snap)?;
            remove_snapshot(pool, &snap, false)?;
        }
        pool.unmark(&snap)?;
    }
    Ok(())
}

pub fn upgrade(
    pool: &Pool,
    opts: &UpgradeOptions,
    say: &mut dyn FnMut(String),
) -> Result<UpgradeReport> {
    // Everything checkable before the first write.
    let now = opts.now.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    let new = SnapshotName::at(now);
    let source_label = pool
        .running
        .as_ref()
        .map_or(pool.running_subvol.clone(), ToString::to_string);
    if pool.path_of(&new).exists() {
        return Err(EngineError::Invalid(format!(
            "{new} exists already; wait a second and run again"
        )));
    }
    if let Change::Tree(dir) = &opts.change {
        if !dir.join("usr").is_dir() {
            return Err(EngineError::Invalid(format!(
                "{} is not an OS tree (no usr/)",
                dir.display()
            )));
        }
    }
    let describe = match &opts.change {
        Change::Command(c) => format!("run `{c}` chrooted (with /proc, /sys, /dev)"),
        Change::Tree(d) => format!("sync the tree {}", d.display()),
    };
    let tries = opts.tries.unwrap_or(DEFAULT_TRIES);
    slate_bootspec::check_install_tries(tries).map_err(|e| EngineError::Invalid(e.to_string()))?;
    let entry_name = entry::entry_name(&new, Some(tries))?;
    let esp_now = pool.open_esp_read_only()?;
    let boot = Boot::read(pool)?;
    if boot.is_grub() && tries != 1 && opts.tries.is_some() {
        return Err(EngineError::Invalid(format!(
            "GRUB starts a new snapshot once (grubenv next_entry), so it has no {tries} tries; \
             leave --tries out (or give 1) on this node"
        )));
    }
    if boot.is_grub() {
        // The paths are known after step 3; the checks here do not depend on them.
        let placeholder = grub_entry(
            pool,
            &new,
            &opts.cmdline,
            "Linux",
            "boot/vmlinuz",
            "boot/initrd.img",
        )?;
        grub::check_register(&esp_now, &placeholder)?;
    } else {
        sdboot::check_register(&esp_now, &new)?;
    }
    let mut all = crate::ops::listed(pool, &boot)?;
    all.push(Listed {
        name: new.clone(),
        entry: Some(slate_bootspec::BootState::Indeterminate),
    });
    let protected: Vec<&SnapshotName> = [Some(&new), pool.running.as_ref()]
        .into_iter()
        .flatten()
        .collect();
    let to_prune = prune(&all, KEEP_SNAPSHOTS, &protected);
    let plan = upgrade_plan(
        &source_label,
        &new,
        &describe,
        entry_name.file_name(),
        &to_prune,
        boot.is_grub(),
    );
    if opts.dry_run {
        for step in &plan {
            say(format!("dry run: {step}"));
        }
        return Ok(UpgradeReport {
            snapshot: new.to_string(),
            entry: if boot.is_grub() {
                format!("menuentry {new}")
            } else {
                entry_name.file_name().into()
            },
            fallback: source_label,
            pruned: to_prune.iter().map(ToString::to_string).collect(),
            plan,
        });
    }

    let mut signals = SignalReader::block_polled(&[Signal::SIGINT, Signal::SIGTERM])?;
    clean_up_interrupted(pool, say)?;
    pool.mark(&new)?;
    let built = build(pool, opts, &new, &source_label, &mut signals, say);
    let registered = match built {
        Ok(r) => r,
        Err(e) => {
            say(format!("failed: {e}; removing {new}"));
            discard(pool, &new)?;
            return Err(e);
        }
    };
    // (7) The fallback is the root this upgrade started from: protected with the new one.
    let mut pruned = Vec::new();
    for old in &to_prune {
        remove_snapshot(pool, old, true)?;
        pruned.push(old.to_string());
    }
    say(format!(
        "(7) fallback {source_label} kept; pruned: {}",
        if pruned.is_empty() {
            "nothing".to_owned()
        } else {
            pruned.join(", ")
        }
    ));
    let running_has_entry = match &pool.running {
        Some(r) => Boot::read(pool)?.has_entry(r),
        None => false,
    };
    if !running_has_entry {
        say(format!(
            "warning: the running root {source_label} has no boot entry on this ESP: if {new} \
             fails, the boot loader has nothing better to start"
        ));
    }
    pool.unmark(&new)?;
    say(format!(
        "done: reboot to start {new}; `slate snapshot commit` there makes it permanent"
    ));
    Ok(UpgradeReport {
        snapshot: new.to_string(),
        entry: registered,
        fallback: source_label,
        pruned,
        plan,
    })
}

/// Steps 1 to 6. On error the caller discards the snapshot.
fn build(
    pool: &Pool,
    opts: &UpgradeOptions,
    new: &SnapshotName,
    source: &str,
    signals: &mut SignalReader,
    say: &mut dyn FnMut(String),
) -> Result<String> {
    let check = |signals: &mut SignalReader| -> Result<()> {
        match signals.pending()? {
            Some(s) => Err(EngineError::Interrupted(s.to_string())),
            None => Ok(()),
        }
    };
    let started = Instant::now();
    slate_host::snapshot_subvolume(&pool.root, &pool.top, new.as_str())?;
    let path = pool.path_of(new);
    say(format!(
        "(1) snapshot {source} -> {new} ({} ms)",
        started.elapsed().as_millis()
    ));
    check(signals)?;

    match &opts.change {
        Change::Command(command) => {
            say(format!("(2) upgrade: running `{command}` in {new}"));
            let mounts = slate_host::ApiMounts::bind(&path)?;
            let status = run_until_done(&path, command, signals)?;
            mounts.release()?;
            if !status.success() {
                return Err(EngineError::CommandFailed {
                    snapshot: new.to_string(),
                    status: status.to_string(),
                });
            }
        }
        Change::Tree(dir) => {
            say(format!("(2) upgrade: syncing {} into {new}", dir.display()));
            tree::sync_tree(dir, &path)?;
        }
    }
    check(signals)?;
    // The snapshot's fstab must mount the snapshot itself; a failure here is reported by
    // validation, together with anything else wrong.
    if let Some(fstab_path) = resolve_in_root(&path, "etc/fstab") {
        if let Ok(text) = std::fs::read_to_string(&fstab_path) {
            if let Ok(rewritten) = fstab::rewrite_root(&text, new) {
                write_atomically(&fstab_path, rewritten.as_bytes(), 0o644)?;
            }
        }
    }

    let boot = validate::validate(&tree::facts(&path), new).map_err(|problems| {
        EngineError::Validation {
            snapshot: new.to_string(),
            problems,
        }
    })?;
    say(format!(
        "(3) validate: kernel /boot/{}, initramfs /boot/{}, init present, fstab root subvol={new}",
        boot.kernel, boot.initrd
    ));
    check(signals)?;

    let read = |name: &str| -> Result<Vec<u8>> {
        let p = resolve_in_root(&path, &format!("boot/{name}"))
            .unwrap_or_else(|| path.join("boot").join(name));
        std::fs::read(&p).map_err(io_err("reading", &p))
    };
    let (kernel, initrd) = (read(&boot.kernel)?, read(&boot.initrd)?);

    let is_grub = grub::is_grub_layout(&pool.open_esp_read_only()?)?;
    // (5) before (4)'s entry: the entry is the last write, so an entry never exists without
    // its manifest. The ESP copies are recorded from the bytes about to be written (GRUB
    // boots /boot in the pool, which the manifest covers: no copies).
    let mut manifest = Manifest::new(new.clone());
    tree::walk_into(&path, &mut manifest)?;
    let copies = if is_grub {
        Vec::new()
    } else {
        vec![
            (entry::kernel_path(new), &kernel),
            (entry::initrd_path(new), &initrd),
        ]
    };
    for (p, bytes) in copies {
        manifest.insert(
            p.as_bytes(),
            Record::Esp {
                size: bytes.len() as u64,
                sha256: sha256(bytes),
            },
        )?;
    }
    pool.write_manifest(&manifest)?;
    say(format!(
        "(5) manifest: {} records, HMAC-SHA256 -> {}",
        manifest.records.len(),
        pool.manifest_path(new).display()
    ));
    check(signals)?;

    if is_grub {
        let inside = |name: &str| in_snapshot(&path, &format!("boot/{name}"));
        let (k, i) = (inside(&boot.kernel)?, inside(&boot.initrd)?);
        let entry = grub_entry(pool, new, &opts.cmdline, &tree::os_name(&path), &k, &i)?;
        // The record first: the one-shot is consumed without a trace, and the record is what
        // tells a trial that ended without a commit (docs/formats.md §12.9).
        pool.mark_boot(new, Mark::Trial)?;
        let mut disk = pool.open_esp()?;
        grub::register(&mut disk, &entry)?;
        say(format!(
            "(4) register: menuentry {new} in {} (/{new}/{k}, /{new}/{i} in the pool)",
            MENU_PATH
        ));
        let scan = grub::scan(&disk)?;
        let (next, saved) = (
            scan.selected().map(|e| e.snapshot.clone()),
            scan.saved()
                .map(|e| e.snapshot.to_string())
                .unwrap_or_default(),
        );
        if next.as_ref() != Some(new) {
            return Err(EngineError::Invalid(format!(
                "after registration GRUB would start {next:?}, not {new}"
            )));
        }
        say(format!(
            "(6) next boot: grubenv next_entry={new} (one-shot, consumed before it starts); \
             saved_entry={saved} unchanged, so a boot that is not committed returns there"
        ));
        return Ok(format!("menuentry {new}"));
    }
    let spec = EntrySpec {
        snapshot: new.clone(),
        pool_uuid: pool.uuid.clone(),
        os_name: tree::os_name(&path),
        extra_options: carried_options(&opts.cmdline),
    };
    let text = entry_text(&spec)?;
    let mut disk = pool.open_esp()?;
    let tries = opts.tries.unwrap_or(DEFAULT_TRIES);
    let name = sdboot::register(&mut disk, new, &kernel, &initrd, &text, tries)?;
    say(format!(
        "(4) register: ESP:/{}/ ({} + {} bytes), loader/entries/{}",
        entry::esp_dir(new),
        kernel.len(),
        initrd.len(),
        name.file_name()
    ));

    let scan = sdboot::scan(&disk)?;
    let next = scan
        .selected()
        .map(|f| f.name.file_name().to_owned())
        .unwrap_or_default();
    if next != name.file_name() {
        return Err(EngineError::Invalid(format!(
            "after registration systemd-boot would start {next}, not {}",
            name.file_name()
        )));
    }
    say(format!(
        "(6) next boot: {next} (first match of loader.conf default {:?}; default unchanged; {tries} failed {} make it bad and the previous entry boots)",
        scan.loader_conf.as_ref().and_then(|c| c.default.clone()).unwrap_or_default(),
        if tries == 1 { "try" } else { "tries" }
    ));
    Ok(name.file_name().to_owned())
}

/// Waits for the chrooted command, polling for SIGINT/SIGTERM: on one, the command gets
/// SIGTERM, then SIGKILL after 10 s, and the upgrade fails as interrupted.
fn run_until_done(
    root: &Path,
    command: &str,
    signals: &mut SignalReader,
) -> Result<std::process::ExitStatus> {
    let mut child = slate_host::spawn_chrooted(root, command)?;
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(io_err("waiting for the command in", root))?
        {
            return Ok(status);
        }
        if let Some(signal) = signals.pending()? {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while child.try_wait().ok().flatten().is_none() {
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            return Err(EngineError::Interrupted(signal.to_string()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Removes a failed upgrade's snapshot: ESP parts (copies, an entry if it got that far), the
/// manifest, the subvolume, then its marker.
fn discard(pool: &Pool, snap: &SnapshotName) -> Result<()> {
    pool.detach_under(&pool.path_of(snap))?;
    remove_entry(pool, snap)?;
    remove_snapshot(pool, snap, false)?;
    pool.unmark(snap)
}

/// A GRUB menu entry for `snapshot` (kernel and initramfs paths inside it).
fn grub_entry(
    pool: &Pool,
    snapshot: &SnapshotName,
    cmdline: &str,
    os_name: &str,
    kernel: &str,
    initrd: &str,
) -> Result<MenuEntry> {
    let spec = EntrySpec {
        snapshot: snapshot.clone(),
        pool_uuid: pool.uuid.clone(),
        os_name: os_name.to_owned(),
        extra_options: carried_options(cmdline),
    };
    Ok(MenuEntry::new(&spec, kernel, initrd)?)
}

/// `rel`'s real path inside the snapshot at `root`, symlinks resolved there: GRUB would
/// resolve an absolute link against the pool's top level, not the snapshot.
fn in_snapshot(root: &Path, rel: &str) -> Result<String> {
    let real = resolve_in_root(root, rel).unwrap_or_else(|| root.join(rel));
    real.strip_prefix(root)
        .ok()
        .and_then(|p| p.to_str())
        .map(str::to_owned)
        .ok_or_else(|| {
            EngineError::Invalid(format!(
                "{} does not resolve inside {}",
                rel,
                root.display()
            ))
        })
}

/// The steps of an upgrade, in order, as `--dry-run` prints them.
fn upgrade_plan(
    source: &str,
    new: &SnapshotName,
    change: &str,
    entry_file: &str,
    prune: &[SnapshotName],
    grub: bool,
) -> Vec<String> {
    let pruned = if prune.is_empty() {
        "nothing to prune".to_owned()
    } else {
        prune
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if grub {
        return vec![
            format!("(1) snapshot {source} -> {new} (writable, copy-on-write)"),
            format!("(2) upgrade {new}: {change}"),
            format!("(3) validate {new}: kernel + initramfs in /boot, /sbin/init, fstab root subvol={new}"),
            format!("(4) register: menu entry --id {new} in {MENU_PATH} (GRUB reads its /boot in the pool)"),
            format!("(5) manifest: HMAC-SHA256 over /usr and /boot -> .slate/manifests/{new}.manifest"),
            format!("(6) next boot: grubenv next_entry={new} (one-shot); saved_entry unchanged"),
            format!("(7) keep fallback {source}; prune: {pruned}"),
        ];
    }
    vec![
        format!("(1) snapshot {source} -> {new} (writable, copy-on-write)"),
        format!("(2) upgrade {new}: {change}"),
        format!("(3) validate {new}: kernel + initramfs in /boot, /sbin/init, fstab root subvol={new}"),
        format!("(4) register: copy kernel and initramfs to ESP:/{}/, entry loader/entries/{entry_file}", entry::esp_dir(new)),
        format!("(5) manifest: HMAC-SHA256 over /usr, /boot and the ESP copies -> .slate/manifests/{new}.manifest"),
        format!("(6) next boot: {entry_file} sorts first (loader.conf default {}); default pattern unchanged", entry::LOADER_DEFAULT),
        format!("(7) keep fallback {source}; prune: {pruned}"),
    ]
}

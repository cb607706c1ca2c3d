//! The crash matrix of the GRUB backend: upgrade, commit and revert replayed over a
//! fault-injecting disk, power cut at every write and flush (unflushed writes dropped, kept,
//! torn, scattered). For each state the GRUB selection model must start a slot holding the old
//! or the new version, every file of it intact; and the boot after that one (the one-shot
//! `next_entry` consumed, nothing committed) must also come up on an intact old or new slot.
//! And should grubenv then be corrupted (GRUB loads nothing from it), the slot `grub.cfg`
//! takes from slate's second record, `grub/slate-default.env`, must come up the same way.

use slate_bootloader::{Bootloader, Grub, GrubWriteOrder, SlotPayload};
use slate_disk::{CrashPoint, Disk, MemDisk, RecordingDisk};
use slate_installer::{write_grub_image, GrubImagePlan};
use slate_layout::{LayoutParams, MIB};

const DISK_LEN: usize = 64 * MIB as usize;
const EPOCH: u64 = 1_700_000_000;

fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ seed;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Version `v`'s slot: distinct pseudo-random kernel and initramfs (so a torn or misplaced
/// sector shows), sizes varying by version.
fn payload(v: u64) -> SlotPayload {
    SlotPayload {
        kernel: bytes(v * 2, 9_000 + 1_000 * v as usize),
        initramfs: bytes(v * 2 + 1, 14_000 + 700 * v as usize),
        cmdline: format!("console=ttyS0 slate.init=/usr/bin/machined v={v}"),
    }
}

fn grub<D: Disk>(disk: D) -> Grub<D> {
    Grub::new(disk).with_source_date_epoch(EPOCH)
}

/// v1 in slot A, as the image mode writes it.
fn installed() -> MemDisk {
    let p = payload(1);
    let plan = GrubImagePlan {
        image_id: "grub-crash".into(),
        layout: LayoutParams {
            esp_size: 40 * MIB,
            state_size: 4 * MIB,
            ephemeral_min_size: 4 * MIB,
            ..LayoutParams::default()
        },
        source_date_epoch: EPOCH,
        grub_efi: vec![0x4d; 4096],
        kernel: p.kernel,
        initramfs: p.initramfs,
        cmdline: p.cmdline,
        version: "1".into(),
        menu_timeout: 1,
    };
    let mut disk = MemDisk::zeroed(DISK_LEN);
    write_grub_image(&mut disk, &plan, &mut |_| {}).unwrap();
    disk
}

/// Upgrade to `v`, boot it (one shot), commit it.
fn upgrade_boot_commit(disk: MemDisk, v: u64) -> MemDisk {
    let mut g = grub(disk);
    let running = g.grub_status().unwrap().booted_slot().unwrap();
    let out = g
        .upgrade_slot(&payload(v), &v.to_string(), running)
        .unwrap();
    assert_eq!(g.simulate_boot().unwrap(), Some(out.file_name.as_str()));
    g.commit(&out.file_name).unwrap();
    g.into_disk()
}

/// The slot that comes up on `g`, checked intact and one of `versions`; its version.
fn boots(g: &Grub<MemDisk>, versions: &[u64]) -> Result<u64, String> {
    let status = g.grub_status().map_err(|e| format!("status: {e:?}"))?;
    let slot = status
        .booted_slot()
        .ok_or_else(|| format!("GRUB boots nothing: {status:?}"))?;
    let (found, version) = g
        .read_slot(slot)
        .map_err(|e| format!("reading slot {slot}: {e:?}"))?;
    let v: u64 = version
        .parse()
        .map_err(|_| format!("slot {slot}: version {version:?}"))?;
    if !versions.contains(&v) {
        return Err(format!("slot {slot} holds v{v}, neither of {versions:?}"));
    }
    if found != payload(v) {
        return Err(format!("slot {slot} (v{v}): files differ from v{v}'s"));
    }
    Ok(v)
}

/// The check of one crash state: this boot and the next (one-shot consumed), each one of
/// `versions`, and the boot of the same state with grubenv corrupted, one of `corrupted`.
fn check(
    disk: MemDisk,
    versions: &[u64],
    corrupted_versions: &[u64],
) -> Result<(u64, u64), String> {
    let mut corrupted = disk.clone();
    let mut g = grub(disk);
    let first = boots(&g, versions)?;
    g.simulate_boot()
        .map_err(|e| format!("GRUB's save_env: {e:?}"))?;
    let second = boots(&g, versions).map_err(|e| format!("the boot after: {e}"))?;
    corrupt_grubenv(&mut corrupted, b'x');
    let g = grub(corrupted);
    boots(&g, corrupted_versions).map_err(|e| format!("grubenv corrupted: {e}"))?;
    if g.grub_status().unwrap().env_error.is_none() {
        return Err("the corrupted grubenv reads".into());
    }
    Ok((first, second))
}

/// Overwrite `path` on the ESP in place (same clusters, as a stray writer or a failing medium
/// would) with 1024 bytes of `fill`.
fn overwrite_in_place(disk: &mut MemDisk, path: &str, bytes: &[u8]) {
    use std::io::Write;
    let esp = slate_esp::session::open(disk).unwrap();
    let fs = slate_esp::fat::mount(esp, EPOCH).unwrap();
    {
        let mut f = fs.root_dir().open_file(path).unwrap();
        f.write_all(bytes).unwrap();
        f.flush().unwrap();
    }
    slate_esp::fat::unmount(fs).unwrap();
}

fn corrupt_grubenv(disk: &mut MemDisk, fill: u8) {
    overwrite_in_place(disk, "grub/grubenv", &[fill; 1024]);
}

fn record(
    base: &MemDisk,
    order: GrubWriteOrder,
    op: impl FnOnce(&mut Grub<RecordingDisk>),
) -> RecordingDisk {
    let mut g = grub(RecordingDisk::on(base.clone())).with_write_order(order);
    op(&mut g);
    g.into_disk()
}

/// (states, failures, versions seen on the first boot)
fn run_matrix(
    rec: &RecordingDisk,
    pts: &[CrashPoint],
    versions: &[u64],
    corrupted_versions: &[u64],
) -> (usize, Vec<String>, Vec<u64>) {
    let mut failures = Vec::new();
    let mut seen = Vec::new();
    for &point in pts {
        match check(rec.materialize(point), versions, corrupted_versions) {
            Ok((first, _)) => {
                if !seen.contains(&first) {
                    seen.push(first);
                }
            }
            Err(e) => failures.push(format!("{point:?}: {e}")),
        }
    }
    seen.sort();
    (pts.len(), failures, seen)
}

#[test]
fn grub_crash_matrix() {
    let fresh = installed();
    // A later life: v3 committed in slot A, v2 left in slot B (the inactive slot is never
    // empty after the first upgrade).
    let later = upgrade_boot_commit(upgrade_boot_commit(installed(), 2), 3);
    {
        let s = grub(later.clone()).grub_status().unwrap();
        assert_eq!(s.slots[0].version(), Some("3"));
        assert_eq!(s.slots[1].version(), Some("2"));
        assert_eq!(s.env.get("saved_entry"), Some("A"));
    }
    // The same life with the record lagging one commit behind grubenv (the commit of v3 was cut
    // after its grubenv write): saved_entry=A, the record still naming B — the slot the next
    // upgrade empties. The upgrade brings the record in line before it touches the slot.
    let mut lagging = later.clone();
    overwrite_in_place(
        &mut lagging,
        "grub/slate-default.env",
        &slate_bootloader::grub::config::default_record("B").to_bytes(),
    );
    assert_eq!(
        grub(lagging.clone()).grub_status().unwrap().record_entry(),
        Some("B")
    );
    let mut booted = grub(fresh.clone());
    booted.upgrade_slot(&payload(2), "2", "A").unwrap();
    assert_eq!(booted.simulate_boot().unwrap(), Some("B"));
    let upgraded = booted.into_disk();

    let order = GrubWriteOrder::SlotThenFlip;
    // (what, the writer, versions every boot may start, versions it must start in some state,
    // versions a boot with grubenv corrupted may start: the same, except where the disk
    // before the write already went by a lagging record)
    type Case<'a> = (&'a str, RecordingDisk, Vec<u64>, Vec<u64>, Option<Vec<u64>>);
    let cases: Vec<Case> = vec![
        (
            "upgrade v1 -> v2 (slot B empty)",
            record(&fresh, order, |g| {
                g.upgrade_slot(&payload(2), "2", "A").unwrap();
            }),
            vec![1, 2],
            vec![1, 2],
            None,
        ),
        (
            "upgrade v3 -> v4 (slot B holding v2)",
            record(&later, order, |g| {
                g.upgrade_slot(&payload(4), "4", "A").unwrap();
            }),
            vec![3, 4],
            vec![3, 4],
            None,
        ),
        (
            "upgrade v3 -> v4 (record lagging, naming slot B)",
            record(&lagging, order, |g| {
                g.upgrade_slot(&payload(4), "4", "A").unwrap();
            }),
            vec![3, 4],
            vec![3, 4],
            // Before the record is brought in line it names B, still intact v2.
            Some(vec![2, 3, 4]),
        ),
        (
            "commit v2",
            record(&upgraded, order, |g| {
                g.commit("B").unwrap();
            }),
            vec![1, 2],
            vec![1, 2],
            None,
        ),
        (
            "revert v2",
            record(&upgraded, order, |g| {
                assert_eq!(g.revert("B").unwrap().as_deref(), Some("A"));
            }),
            vec![1, 2],
            vec![1],
            None,
        ),
        (
            "rollback v3 -> v2 (slot B)",
            record(&later, order, |g| {
                let plan = g.rollback("A", 3).unwrap();
                assert_eq!((plan.from.as_str(), plan.to.as_str()), ("A", "B"));
                assert_eq!(plan.version, "2");
            }),
            vec![2, 3],
            vec![2, 3],
            None,
        ),
    ];
    let mut total = 0;
    let mut report = Vec::new();
    for (what, rec, versions, must_see, corrupted) in &cases {
        let pts = rec.crash_points(8, 16);
        let corrupted = corrupted.as_ref().unwrap_or(versions);
        let (n, failures, seen) = run_matrix(rec, &pts, versions, corrupted);
        assert!(
            failures.is_empty(),
            "{what}: {} of {n} states fail, e.g. {:#?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
        for v in must_see {
            assert!(seen.contains(v), "{what}: v{v} never boots: {seen:?}");
        }
        report.push(format!(
            "{what}: {n} ({} ops, boots {seen:?})",
            rec.log().len()
        ));
        total += n;
    }
    println!(
        "GRUB crash matrix: {total} crash states checked, each boot, the boot after and the \
         boot with grubenv corrupted: {}",
        report.join("; ")
    );
}

/// After the upgrade, GRUB tries the new slot once; if it never commits, the boot after is the
/// old slot again (the one-shot was consumed), with the tag still naming it; its commit then
/// clears the tag without changing the default.
#[test]
fn an_uncommitted_one_shot_returns_to_saved_entry() {
    let mut g = grub(installed());
    g.upgrade_slot(&payload(2), "2", "A").unwrap();
    let s = g.grub_status().unwrap();
    assert_eq!(s.env.get("next_entry"), Some("B"));
    assert_eq!(s.upgrade_tag.as_deref(), Some("A"));
    assert_eq!(g.simulate_boot().unwrap(), Some("B"));
    assert_eq!(g.grub_status().unwrap().env.get("next_entry"), Some(""));
    // v2 hangs: nothing commits; the watchdog resets.
    assert_eq!(g.simulate_boot().unwrap(), Some("A"));
    let out = g.commit("A").unwrap();
    assert_eq!(out.previous.as_deref(), Some("A"));
    let s = g.grub_status().unwrap();
    assert_eq!(
        (s.env.get("saved_entry"), s.env.get("next_entry")),
        (Some("A"), None)
    );
    assert_eq!(s.upgrade_tag, None);
    // The upgrade can be tried again, into the same slot.
    g.upgrade_slot(&payload(2), "2", "A").unwrap();
    assert_eq!(g.simulate_boot().unwrap(), Some("B"));
    g.commit("B").unwrap();
    let s = g.grub_status().unwrap();
    assert_eq!(s.env.get("saved_entry"), Some("B"));
    assert_eq!(g.status().unwrap().selected_file(), Some("B"));
    // B is now the saved default: upgrading *from A* (were A somehow running) must refuse to
    // overwrite it.
    let err = g.upgrade_slot(&payload(3), "3", "A").unwrap_err();
    assert!(err.to_string().contains("saved default"), "{err}");
}

/// The flip-first order (`next_entry` before the slot is written): the matrix must catch it,
/// or it proves nothing. With the inactive slot holding an older version, a cut after the
/// flip starts that older version (neither the old nor the new one).
#[test]
fn the_matrix_catches_flipping_first() {
    let later = upgrade_boot_commit(upgrade_boot_commit(installed(), 2), 3);
    let rec = record(&later, GrubWriteOrder::FlipThenSlot, |g| {
        g.upgrade_slot(&payload(4), "4", "A").unwrap();
    });
    let pts = rec.crash_points(8, 16);
    let (n, failures, _) = run_matrix(&rec, &pts, &[3, 4], &[3, 4]);
    assert!(!failures.is_empty(), "all {n} states passed flipping first");
    println!(
        "flip-first writer: {} of {n} crash states boot something else, e.g. {}",
        failures.len(),
        failures[0]
    );
}

/// A grubenv that is corrupted, too long or unsigned: GRUB loads no slot from it, and
/// grub.cfg takes saved_entry from the second record — the committed slot B, not the first
/// entry. Status and explain say so and name the damage; every write refuses with a clear
/// error before writing anything.
#[test]
fn a_bad_grubenv_boots_the_recorded_default_and_refuses_writes() {
    let base = upgrade_boot_commit(installed(), 2); // saved_entry=B, the record B
    let patched = |patch: &[u8]| {
        let mut disk = base.clone();
        let mut env = grub(base.clone()).read_file("grub/grubenv").unwrap();
        env[..patch.len()].copy_from_slice(patch);
        overwrite_in_place(&mut disk, "grub/grubenv", &env);
        disk
    };
    for (what, disk, expect) in [
        (
            "unsigned",
            patched(b"# GRUB Environment Blocq\n"),
            "signature",
        ),
        (
            "corrupted",
            patched(b"# GRUB Environment Block\nnoequals\n"),
            "neither a comment",
        ),
        ("garbage", patched(&[b'x'; 1024]), "signature"),
    ] {
        let mut g = grub(RecordingDisk::on(disk));
        let status = g.status().unwrap();
        assert_eq!(status.selected_file(), Some("B"), "{what}");
        assert!(
            status.warnings.iter().any(|w| w.contains("grub/grubenv")
                && w.contains(expect)
                && w.contains("saved_entry=B from grub/slate-default.env")),
            "{what}: {:?}",
            status.warnings
        );
        let x = g.explain().unwrap();
        assert_eq!(
            (x.next_boot.as_deref(), &x.reason),
            (
                Some("B"),
                &slate_bootloader::NextBootReason::GrubDefaultRecord { value: "B".into() }
            ),
            "{what}"
        );
        let err = g.upgrade_slot(&payload(3), "3", "B").unwrap_err();
        assert!(
            matches!(err, slate_bootloader::BootloaderError::GrubEnv(_)),
            "{what}: {err:?}"
        );
        let chain = format!(
            "{err}: {}",
            std::error::Error::source(&err)
                .map(|s| s.to_string())
                .unwrap_or_default()
        );
        assert!(
            chain.contains("grubenv") && chain.contains(expect),
            "{what}: {chain}"
        );
        assert!(g.commit("B").is_err() && g.revert("B").is_err() && g.rollback("B", 3).is_err());
        assert!(g.disk().log().is_empty(), "{what}: something was written");
        // Without the record (a disk imaged before it), GRUB starts the first entry.
        let sel = slate_bootspec::grub_select(None, &slate_bootloader::grub_menu()).unwrap();
        assert_eq!(sel.index, 0);
    }
    // Too long: a grubenv of 1536 bytes (written by something other than slate).
    let mut disk = base;
    {
        let mut long = grub(disk.clone()).read_file("grub/grubenv").unwrap();
        long.extend(std::iter::repeat_n(b'#', 512));
        let esp = slate_esp::session::open(&mut disk).unwrap();
        let fs = slate_esp::fat::mount(esp, EPOCH).unwrap();
        slate_esp::fat::write_file_atomically(&fs, "grub/grubenv", &long).unwrap();
        slate_esp::fat::unmount(fs).unwrap();
    }
    let mut g = grub(RecordingDisk::on(disk));
    let status = g.status().unwrap();
    assert_eq!(status.selected_file(), Some("B"));
    assert!(
        status
            .warnings
            .iter()
            .any(|w| w.contains("1536 bytes, too long")),
        "{:?}",
        status.warnings
    );
    let err = g.upgrade_slot(&payload(3), "3", "B").unwrap_err();
    let text = std::error::Error::source(&err).unwrap().to_string();
    assert!(text.contains("1536 bytes, too long"), "{text}");
    assert!(g.disk().log().is_empty());
}

/// The record follows every change of the committed slot — commit, revert — and an upgrade
/// first brings a lagging one in line; rollback and the one-shot leave it alone.
#[test]
fn the_second_record_follows_the_committed_slot() {
    let record = |g: &Grub<MemDisk>| g.grub_status().unwrap().record_entry().map(str::to_owned);
    let mut g = grub(installed());
    assert_eq!(record(&g).as_deref(), Some("A"));
    assert_eq!(
        g.read_file("grub/slate-default.env").unwrap(),
        g.read_file("grub/grubenv").unwrap(),
        "a fresh record is byte for byte the initial grubenv"
    );
    g.upgrade_slot(&payload(2), "2", "A").unwrap();
    assert_eq!(record(&g).as_deref(), Some("A"));
    assert_eq!(g.simulate_boot().unwrap(), Some("B"));
    g.commit("B").unwrap();
    assert_eq!(record(&g).as_deref(), Some("B"));
    g.upgrade_slot(&payload(3), "3", "B").unwrap();
    assert_eq!(g.simulate_boot().unwrap(), Some("A"));
    assert_eq!(g.revert("A").unwrap().as_deref(), Some("B"));
    assert_eq!(record(&g).as_deref(), Some("B"));
    let plan = g.rollback("B", 3).unwrap();
    assert_eq!(plan.to, "A");
    assert_eq!(record(&g).as_deref(), Some("B"));
    // A commit cut after its grubenv write: the next commit writes the record alone.
    let mut disk = g.into_disk();
    overwrite_in_place(
        &mut disk,
        "grub/slate-default.env",
        &slate_bootloader::grub::config::default_record("A").to_bytes(),
    );
    let g = grub(RecordingDisk::on(disk));
    assert!(g
        .status()
        .unwrap()
        .warnings
        .iter()
        .any(|w| w.contains("grub/slate-default.env names A, grubenv saved_entry=B")));
    let mut g = g;
    g.commit("B").unwrap();
    assert_eq!(
        g.grub_status().unwrap().record_entry(),
        Some("B"),
        "the commit brought the record in line"
    );
}

/// GRUB's two slots leave nothing to pin: refused, nothing written.
#[test]
fn grub_refuses_pins() {
    let mut boot = grub(RecordingDisk::on(installed()));
    let err = boot.pin("1", true, false).unwrap_err().to_string();
    assert!(err.contains("GRUB keeps two slots"), "{err}");
    assert!(boot.into_disk().log().is_empty());
}

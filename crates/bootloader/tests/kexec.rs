//! A restart by kexec (`SystemdBoot::plan_kexec`, `count_kexec_attempt`): the entry
//! systemd-boot would start, its attempt counted by the same rename systemd-boot makes, its UKI
//! taken apart; refused where systemd-boot would change an EFI variable on the way.

mod common;

use common::*;
use slate_bootloader::{
    Bootloader, BootloaderError, EfiVars, MemEfiVars, SystemdBoot, LOADER_ENTRY_DEFAULT,
    LOADER_ENTRY_ONESHOT,
};
use slate_disk::{CrashPoint, CutMode, MemDisk, RecordingDisk};

/// A small PE32+ holding the given sections back to back (what `object` reads; no stub code).
fn pe(sections: &[(&str, &[u8])]) -> Vec<u8> {
    const LFANEW: usize = 0x40;
    const OPT: usize = LFANEW + 24;
    const TABLE: usize = OPT + 240;
    let put16 =
        |out: &mut Vec<u8>, at: usize, v: u16| out[at..at + 2].copy_from_slice(&v.to_le_bytes());
    let put32 =
        |out: &mut Vec<u8>, at: usize, v: u32| out[at..at + 4].copy_from_slice(&v.to_le_bytes());
    let align = |n: usize, a: usize| n.div_ceil(a) * a;
    let headers = align(TABLE + 40 * sections.len(), 0x200);
    let mut out = vec![0u8; headers];
    out[0..2].copy_from_slice(b"MZ");
    put32(&mut out, 0x3C, LFANEW as u32);
    out[LFANEW..LFANEW + 4].copy_from_slice(b"PE\0\0");
    put16(&mut out, LFANEW + 4, 0x8664);
    put16(&mut out, LFANEW + 6, sections.len() as u16);
    put16(&mut out, LFANEW + 20, 240);
    put16(&mut out, LFANEW + 22, 0x0206);
    put16(&mut out, OPT, 0x20B);
    put32(&mut out, OPT + 32, 0x1000);
    put32(&mut out, OPT + 36, 0x200);
    put32(&mut out, OPT + 60, headers as u32);
    put16(&mut out, OPT + 68, 10);
    put32(&mut out, OPT + 108, 16);
    let mut va = 0x1000;
    for (i, (name, data)) in sections.iter().enumerate() {
        let at = TABLE + i * 40;
        let ptr = out.len();
        out[at..at + name.len()].copy_from_slice(name.as_bytes());
        put32(&mut out, at + 8, data.len() as u32);
        put32(&mut out, at + 12, va);
        put32(&mut out, at + 16, align(data.len(), 0x200) as u32);
        put32(&mut out, at + 20, ptr as u32);
        put32(&mut out, at + 36, 0x4000_0040);
        out.extend_from_slice(data);
        out.resize(align(out.len(), 0x200), 0);
        va += align(data.len(), 0x1000) as u32;
    }
    put32(&mut out, OPT + 56, va);
    out
}

fn kexec_uki(version: u32) -> Vec<u8> {
    pe(&[
        (
            ".osrel",
            format!("ID=slate\nIMAGE_VERSION={version}\n").as_bytes(),
        ),
        (".cmdline", b"console=ttyS0 panic=10\0"),
        (".linux", &uki(version, 9000)),
        (".initrd", &uki(version + 100, 5000)),
    ])
}

/// v1 committed, v2 upgraded to (on trial, `slate-2+3.efi`), both real PEs.
fn upgraded() -> SystemdBoot<MemDisk, MemEfiVars> {
    let mut boot = sdboot(running_v1(&kexec_uki(1)));
    boot.upgrade(&request(&kexec_uki(2), "2", "slate-1.efi"))
        .unwrap();
    boot
}

#[test]
fn the_plan_is_the_entry_systemd_boot_would_start_with_its_counted_name() {
    let boot = upgraded();
    let plan = boot.plan_kexec().unwrap();
    assert_eq!(plan.entry, "slate-2+3.efi");
    assert_eq!(plan.counted, "slate-2+2-1.efi");
    assert_eq!(plan.kernel, uki(2, 9000));
    assert_eq!(plan.initrd, uki(102, 5000));
    assert_eq!(
        plan.cmdline,
        "console=ttyS0 panic=10 slate.entry=slate-2+2-1.efi"
    );
    // Planning writes nothing.
    assert_eq!(entry_files(&boot), ["slate-1.efi", "slate-2+3.efi"]);
}

#[test]
fn counting_the_attempt_is_systemd_boots_rename_and_is_flushed() {
    let plan = upgraded().plan_kexec().unwrap();
    let (disk, vars) = upgraded().into_parts();
    let mut rec = SystemdBoot::new(RecordingDisk::on(disk), vars).with_source_date_epoch(EPOCH);
    rec.count_kexec_attempt(&plan).unwrap();
    let (rec, vars) = rec.into_parts();
    // Durable before the jump: the state after a power cut that drops every unflushed write
    // holds the rename.
    let last = CrashPoint {
        ops_done: rec.log().len(),
        mode: CutMode::DropUnflushed,
    };
    let mut boot = SystemdBoot::new(rec.materialize(last), vars).with_source_date_epoch(EPOCH);
    assert_eq!(entry_files(&boot), ["slate-1.efi", "slate-2+2-1.efi"]);
    // The same rename systemd-boot makes: a firmware attempt from here goes on counting.
    assert_eq!(
        boot.simulate_boot_attempt().unwrap().as_deref(),
        Some("slate-2+1-2.efi")
    );
    // A cut anywhere in the rename leaves a disk that boots v2 (tried or not) or v1.
    let (v1, v2) = (kexec_uki(1), kexec_uki(2));
    for point in rec.crash_points(8, 16) {
        let booted = check_boots(rec.materialize(point), &[("1", &v1), ("2", &v2)]);
        assert!(booted.is_ok(), "{point:?}: {booted:?}");
    }
}

#[test]
fn kexec_attempts_spend_the_tries_and_then_the_fallback_is_started() {
    let mut boot = upgraded();
    for counted in ["slate-2+2-1.efi", "slate-2+1-2.efi", "slate-2+0-3.efi"] {
        let plan = boot.plan_kexec().unwrap();
        assert_eq!(plan.counted, counted);
        boot.count_kexec_attempt(&plan).unwrap();
    }
    // Out of tries: v2 sorts last, and the kexec starts v1, blessed, with no rename.
    let plan = boot.plan_kexec().unwrap();
    assert_eq!(
        (plan.entry.as_str(), plan.counted.as_str()),
        ("slate-1.efi", "slate-1.efi")
    );
    assert!(plan.cmdline.ends_with(" slate.entry=slate-1.efi"));
    assert_eq!(plan.kernel, uki(1, 9000));
    let before = entry_files(&boot);
    boot.count_kexec_attempt(&plan).unwrap();
    assert_eq!(entry_files(&boot), before);
}

#[test]
fn a_one_shot_or_a_saved_default_refuses_kexec_before_any_write() {
    for (var, value, why) in [
        (LOADER_ENTRY_ONESHOT, "slate-1.efi", "LoaderEntryOneShot"),
        (LOADER_ENTRY_DEFAULT, "@saved", "@saved"),
    ] {
        let (disk, mut vars) = upgraded().into_parts();
        vars.set(var, value).unwrap();
        let boot = SystemdBoot::new(disk, vars).with_source_date_epoch(EPOCH);
        let err = boot.plan_kexec().unwrap_err();
        assert!(
            matches!(&err, BootloaderError::NoKexec(m) if m.contains(why)),
            "{err:?}"
        );
        assert_eq!(entry_files(&boot), ["slate-1.efi", "slate-2+3.efi"]);
    }
}

#[test]
fn a_stale_plan_or_a_forged_name_is_refused_before_any_write() {
    let mut boot = upgraded();
    let plan = boot.plan_kexec().unwrap();
    boot.count_kexec_attempt(&plan).unwrap();
    // The entry was renamed since: the plan names a file that no longer is the selection.
    let err = boot.count_kexec_attempt(&plan).unwrap_err();
    assert!(matches!(err, BootloaderError::NoKexec(_)), "{err:?}");
    let mut forged = boot.plan_kexec().unwrap();
    forged.counted = "slate-2+3.efi".into();
    let err = boot.count_kexec_attempt(&forged).unwrap_err();
    assert!(matches!(err, BootloaderError::Invalid(_)), "{err:?}");
    assert_eq!(entry_files(&boot), ["slate-1.efi", "slate-2+2-1.efi"]);
}

#[test]
fn a_uki_without_a_kernel_is_not_started_by_kexec() {
    let boot = sdboot(running_v1(&pe(&[
        (".osrel", b"ID=slate\n"),
        (".initrd", b"x"),
    ])));
    let err = boot.plan_kexec().unwrap_err();
    assert!(
        matches!(&err, BootloaderError::NoKexec(m) if m.contains(".linux")),
        "{err:?}"
    );
    let boot = sdboot(running_v1(&uki(1, 20_000)));
    let err = boot.plan_kexec().unwrap_err();
    assert!(
        matches!(&err, BootloaderError::NoKexec(m) if m.contains("unreadable")),
        "{err:?}"
    );
}

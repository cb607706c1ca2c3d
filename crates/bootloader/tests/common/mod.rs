//! Shared fixtures: a small slate image with v1 installed, fake UKIs, and the boot check.
#![allow(dead_code)]

use slate_bootloader::{Bootloader, MemEfiVars, SystemdBoot, UpgradeRequest};
use slate_disk::{Disk, MemDisk};
use slate_esp::loader_conf;
use slate_installer::{write_image, ImagePlan};
use slate_layout::{LayoutParams, MIB};

pub const DISK_LEN: usize = 64 * MIB as usize;
pub const EPOCH: u64 = 1_700_000_000;

/// The UKI file names on the ESP, sorted.
pub fn entry_files(boot: &impl Bootloader) -> Vec<String> {
    let mut files: Vec<String> = boot
        .status()
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.file_name)
        .collect();
    files.sort();
    files
}

/// A fake UKI: reproducible pseudo-random bytes (so a torn or misplaced sector shows).
pub fn uki(version: u32, len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(version);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// v1 installed by the installer's image mode (`slate-1+3.efi`, `default slate-*`).
pub fn installed(v1: &[u8]) -> MemDisk {
    let mut disk = MemDisk::zeroed(DISK_LEN);
    write_installed(&mut disk, v1);
    disk
}

/// The installer's writes for v1 onto `disk` (blank, [`DISK_LEN`] bytes).
pub fn write_installed(disk: &mut impl Disk, v1: &[u8]) {
    let plan = ImagePlan {
        image_id: "bootloader-test".into(),
        layout: LayoutParams {
            esp_size: 40 * MIB,
            state_size: 4 * MIB,
            ephemeral_min_size: 4 * MIB,
            ..LayoutParams::default()
        },
        source_date_epoch: EPOCH,
        systemd_boot: vec![0x4d; 4096],
        uki: v1.to_vec(),
        uki_name: "slate-1+3.efi".into(),
        loader_conf: loader_conf("slate-*", 3).unwrap(),
        enroll: None,
    };
    write_image(disk, &plan, &mut |_| {}).unwrap();
}

pub fn sdboot<D: Disk>(disk: D) -> SystemdBoot<D, MemEfiVars> {
    SystemdBoot::new(disk, MemEfiVars::new()).with_source_date_epoch(EPOCH)
}

/// v1 installed, booted once and committed: `slate-1.efi`, no Upgrade tag.
pub fn running_v1(v1: &[u8]) -> MemDisk {
    let mut boot = sdboot(installed(v1));
    let booted = boot.simulate_boot_attempt().unwrap().unwrap();
    assert_eq!(booted, "slate-1+2-1.efi");
    boot.commit(&booted).unwrap();
    boot.into_parts().0
}

pub fn request<'a>(uki: &'a [u8], version: &'a str, running: &'a str) -> UpgradeRequest<'a> {
    UpgradeRequest {
        uki,
        name: "slate",
        version,
        tries: 3,
        running_entry: running,
    }
}

/// The crash-state check: the FAT and META read, the model selects an entry, it is one of
/// `versions` (by file-name stem `slate-<v>`), and its content is byte-identical to that
/// version's UKI. Returns the version booted.
pub fn check_boots(disk: MemDisk, versions: &[(&str, &[u8])]) -> Result<String, String> {
    let boot = sdboot(disk);
    let status = boot.status().map_err(|e| format!("status: {e:?}"))?;
    let file = status
        .selected_file()
        .ok_or("the model selects no entry")?
        .to_owned();
    let (version, expected) = versions
        .iter()
        .find(|(v, _)| {
            let stem = format!("slate-{v}");
            file.strip_prefix(&stem)
                .is_some_and(|rest| rest.starts_with('+') || rest.starts_with('.'))
        })
        .ok_or_else(|| format!("{file} is neither of the expected versions"))?;
    let content = boot
        .read_entry(&file)
        .map_err(|e| format!("reading {file}: {e:?}"))?;
    if content != *expected {
        return Err(format!(
            "{file}: content differs ({} bytes, expected {})",
            content.len(),
            expected.len()
        ));
    }
    Ok(version.to_string())
}

//! GPT writing: what slate writes, read back by the real `sgdisk`, by the `gpt` crate's reader,
//! and by slate's own independent verifier.

use std::process::Command;

use sha2::{Digest, Sha256};
use slate_disk::{Disk, FileDisk, MemDisk, RecordingDisk};
use slate_layout::{
    find_partition, partitions, verify_gpt, write_gpt, DiskLayout, LayoutError, LayoutParams,
    PartitionSize, MIB, VAR_TYPE,
};

fn layout() -> DiskLayout {
    DiskLayout::reference("slate-test-1.0.0", &LayoutParams::default())
}

fn sgdisk(args: &[&str], path: &std::path::Path) -> String {
    let out = Command::new("sgdisk")
        .args(args)
        .arg(path)
        .output()
        .expect("sgdisk is installed by the test command");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "sgdisk {args:?}: {out:?}");
    text
}

fn upper(guid: slate_layout::Uuid) -> String {
    guid.to_string().to_uppercase()
}

#[test]
fn sgdisk_finds_no_problems_and_sees_our_guids() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    let layout = layout();
    let placed = {
        let mut disk = FileDisk::create(&path, 512 * MIB).unwrap();
        write_gpt(&mut disk, &layout).unwrap()
    };
    let verify = sgdisk(&["-v"], &path);
    assert!(verify.contains("No problems found"), "{verify}");
    assert!(
        !verify.contains("Caution"),
        "every partition starts and ends aligned: {verify}"
    );

    let print = sgdisk(&["-p"], &path);
    assert!(
        print.contains(&format!(
            "Disk identifier (GUID): {}",
            upper(placed.disk_guid)
        )),
        "{print}"
    );
    for p in &placed.partitions {
        let info = sgdisk(&["-i", &p.number.to_string()], &path);
        assert!(
            info.contains(&format!("Partition unique GUID: {}", upper(p.guid))),
            "{info}"
        );
        assert!(
            info.contains(&format!("First sector: {} ", p.first_lba)),
            "{info}"
        );
        assert!(
            info.contains(&format!("Last sector: {} ", p.last_lba)),
            "{info}"
        );
        assert!(
            info.contains(&format!("Partition name: '{}'", p.label)),
            "{info}"
        );
        assert!(
            info.contains(&format!("Partition GUID code: {}", upper(p.type_guid))),
            "{info}"
        );
    }

    let mut disk = FileDisk::open_read_only(&path).unwrap();
    assert_eq!(verify_gpt(&mut disk, &layout).unwrap(), placed);
    let labels: Vec<_> = partitions(&mut disk)
        .unwrap()
        .into_iter()
        .map(|p| p.label)
        .collect();
    assert_eq!(labels, ["EFI", "META", "STATE", "EPHEMERAL"]);
    assert_eq!(find_partition(&mut disk, "META").unwrap().len, MIB);
}

#[test]
fn same_layout_same_bytes_and_other_image_other_guids() {
    let image = |id: &str| {
        let mut disk = MemDisk::zeroed(300 * MIB as usize);
        write_gpt(
            &mut disk,
            &DiskLayout::reference(id, &LayoutParams::default()),
        )
        .unwrap();
        Sha256::digest(disk.to_bytes())
    };
    assert_eq!(image("a"), image("a"));
    assert_ne!(image("a"), image("b"));
}

#[test]
fn a_too_small_disk_is_refused_before_any_write() {
    let layout = layout();
    let needed = layout.min_disk_len().unwrap();
    let mut disk = RecordingDisk::new(vec![0; (needed - MIB) as usize]);
    let err = write_gpt(&mut disk, &layout).unwrap_err();
    assert!(matches!(err, LayoutError::DiskTooSmall { .. }), "{err}");
    assert!(err.to_string().contains(&needed.to_string()), "{err}");
    assert!(disk.log().is_empty());

    let mut disk = RecordingDisk::new(vec![0; needed as usize]);
    write_gpt(&mut disk, &layout).unwrap();
    assert!(!disk.log().is_empty());
    assert_eq!(disk.log().last(), Some(&slate_disk::Op::Flush));
}

#[test]
fn verify_reports_damage_and_foreign_tables() {
    let layout = layout();
    let mut disk = MemDisk::zeroed(300 * MIB as usize);
    write_gpt(&mut disk, &layout).unwrap();

    // A flipped bit in the backup array breaks its CRC and its entry.
    let mut damaged = disk.clone();
    let backup_array = (300 * MIB) - 33 * 512;
    let byte = damaged.read_vec(backup_array + 40, 1).unwrap()[0];
    damaged.write_at(backup_array + 40, &[byte ^ 1]).unwrap();
    let err = verify_gpt(&mut damaged, &layout).unwrap_err().to_string();
    assert!(err.contains("backup partition array: CRC32"), "{err}");
    assert!(err.contains("backup partition entry 1"), "{err}");
    assert!(!err.contains("primary"), "{err}");

    // The same disk checked against another image's layout: every GUID differs.
    let other = DiskLayout::reference("another-image", &LayoutParams::default());
    let err = verify_gpt(&mut disk, &other).unwrap_err().to_string();
    assert!(err.contains("disk GUID"), "{err}");

    // A different EPHEMERAL type is a different table.
    let mut var = layout.clone();
    var.partitions[3].type_guid = VAR_TYPE;
    assert!(verify_gpt(&mut disk, &var).is_err());
    assert!(verify_gpt(&mut disk, &layout).is_ok());
}

#[test]
fn attributes_and_var_type_reach_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.img");
    let mut layout = DiskLayout::reference(
        "attrs",
        &LayoutParams {
            ephemeral_type: VAR_TYPE,
            ..LayoutParams::default()
        },
    );
    layout.partitions[0].attributes = 1; // required by the platform
    layout.partitions[3].attributes = 1 << 59; // DPS grow-fs
    layout.partitions[3].size = PartitionSize::RestOfDisk { min: MIB };
    {
        let mut disk = FileDisk::create(&path, 256 * MIB).unwrap();
        write_gpt(&mut disk, &layout).unwrap();
        verify_gpt(&mut disk, &layout).unwrap();
    }
    assert!(sgdisk(&["-v"], &path).contains("No problems found"));
    let info = sgdisk(&["-i", "4"], &path);
    assert!(
        info.contains("4D21B016-B534-45C2-A9FB-5C16E091FD2D"),
        "{info}"
    );
    assert!(info.contains("Attribute flags: 0800000000000000"), "{info}");
    let info = sgdisk(&["-i", "1"], &path);
    assert!(info.contains("Attribute flags: 0000000000000001"), "{info}");
}

#[test]
fn four_k_sector_disks_round_trip() {
    let layout = DiskLayout::reference(
        "4k",
        &LayoutParams {
            sector_size: 4096,
            ..LayoutParams::default()
        },
    );
    let mut disk = MemDisk::zeroed(300 * MIB as usize);
    let placed = write_gpt(&mut disk, &layout).unwrap();
    assert_eq!(verify_gpt(&mut disk, &layout).unwrap(), placed);
    assert_eq!(&disk.to_bytes()[4096..4104], b"EFI PART");
    assert_eq!(placed.get("EFI").unwrap().start(), MIB);
}

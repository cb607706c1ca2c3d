//! Partitions laid out by the real `sgdisk` are found by label.

use std::process::Command;

use slate_disk::{Disk, FileDisk};
use slate_layout::{find_partition, open_partition, partitions, LayoutError};

fn sgdisk_image(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("disk.img");
    FileDisk::create(&path, 64 << 20).unwrap();
    let status = Command::new("sgdisk")
        .args(["-n", "1:2048:+16M", "-c", "1:EFI", "-t", "1:ef00"])
        .args(["-n", "2:0:+1M", "-c", "2:META"])
        .args(["-n", "3:0:0", "-c", "3:STATE"])
        .arg(&path)
        .output()
        .expect("sgdisk is installed by the test command");
    assert!(status.status.success(), "{status:?}");
    path
}

#[test]
fn finds_partitions_by_label() {
    let dir = tempfile::tempdir().unwrap();
    let path = sgdisk_image(dir.path());
    let mut disk = FileDisk::open(&path).unwrap();
    let all = partitions(&mut disk).unwrap();
    let labels: Vec<_> = all.iter().map(|p| p.label.as_str()).collect();
    assert_eq!(labels, ["EFI", "META", "STATE"]);
    let meta = find_partition(&mut disk, "META").unwrap();
    assert_eq!(meta.start, (2048 + 16 * 2048) * 512);
    assert_eq!(meta.len, 1 << 20);

    let mut view = open_partition(&mut disk, "META").unwrap();
    assert_eq!(view.len(), 1 << 20);
    view.write_at(0, b"meta").unwrap();
    assert_eq!(disk.read_vec(meta.start, 4).unwrap(), b"meta");

    let err = find_partition(&mut disk, "BOOT").unwrap_err();
    assert!(matches!(err, LayoutError::NoSuchPartition { .. }));
    assert!(err.to_string().contains("found: EFI, META, STATE"), "{err}");
}

#[test]
fn falls_back_to_the_backup_gpt_and_refuses_a_disk_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = sgdisk_image(dir.path());
    let mut disk = FileDisk::open(&path).unwrap();
    disk.write_at(512, &[0; 512]).unwrap(); // primary header gone
    assert_eq!(find_partition(&mut disk, "META").unwrap().len, 1 << 20);

    let blank = dir.path().join("blank.img");
    let mut blank = FileDisk::create(&blank, 8 << 20).unwrap();
    assert!(matches!(
        find_partition(&mut blank, "META"),
        Err(LayoutError::NoGpt(_))
    ));
}

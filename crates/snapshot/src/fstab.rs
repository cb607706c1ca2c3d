//! The snapshot's `/etc/fstab` root entry (docs/formats.md §12.4): an upgrade rewrites it to
//! mount `subvol=<snapshot>`, and validation checks it does. Without it a booted snapshot
//! would remount `/` from its parent (the `subvol=` of the root it was cloned from).

use crate::{SnapshotError, SnapshotName};

fn fields(line: &str) -> Option<Vec<&str>> {
    let t = line.trim();
    if t.is_empty() || t.starts_with('#') {
        return None;
    }
    Some(t.split_ascii_whitespace().collect())
}

fn root_line(fstab: &str) -> Result<(usize, Vec<&str>), SnapshotError> {
    let mut found = None;
    for (i, line) in fstab.lines().enumerate() {
        let Some(f) = fields(line) else { continue };
        if f.get(1) == Some(&"/") {
            if found.is_some() {
                return Err(SnapshotError::Fstab(format!(
                    "line {}: a second entry for /",
                    i + 1
                )));
            }
            if f.len() < 4 {
                return Err(SnapshotError::Fstab(format!(
                    "line {}: the entry for / has no options field",
                    i + 1
                )));
            }
            if f[2] != "btrfs" {
                return Err(SnapshotError::Fstab(format!(
                    "line {}: / is mounted as {}, not btrfs",
                    i + 1,
                    f[2]
                )));
            }
            found = Some((i, f));
        }
    }
    found.ok_or_else(|| SnapshotError::Fstab("no entry mounts /".into()))
}

fn names_subvol(option: &str) -> bool {
    option.starts_with("subvol=") || option.starts_with("subvolid=")
}

/// `fstab` with the root entry's `subvol=`/`subvolid=` options replaced by
/// `subvol=<snapshot>`; every other line is kept byte for byte.
pub fn rewrite_root(fstab: &str, snapshot: &SnapshotName) -> Result<String, SnapshotError> {
    let (index, f) = root_line(fstab)?;
    let mut options: Vec<String> = f[3]
        .split(',')
        .filter(|o| !names_subvol(o) && *o != "defaults")
        .map(str::to_owned)
        .collect();
    options.push(format!("subvol={snapshot}"));
    let mut line = format!("{}\t{}\t{}\t{}", f[0], f[1], f[2], options.join(","));
    for rest in &f[4..] {
        line.push('\t');
        line.push_str(rest);
    }
    let mut out = String::with_capacity(fstab.len() + 32);
    for (i, l) in fstab.split_inclusive('\n').enumerate() {
        if i == index {
            out.push_str(&line);
            out.push('\n');
        } else {
            out.push_str(l);
        }
    }
    Ok(out)
}

/// The root entry mounts exactly `subvol=<snapshot>` (or `/<snapshot>`), with no `subvolid=`.
pub fn check_root(fstab: &str, snapshot: &SnapshotName) -> Result<(), SnapshotError> {
    let (index, f) = root_line(fstab)?;
    let subvols: Vec<&str> = f[3].split(',').filter(|o| names_subvol(o)).collect();
    let expected = [format!("subvol={snapshot}"), format!("subvol=/{snapshot}")];
    match subvols[..] {
        [one] if expected.iter().any(|e| e == one) => Ok(()),
        _ => Err(SnapshotError::Fstab(format!(
            "line {}: / mounts {}, not subvol={snapshot}",
            index + 1,
            if subvols.is_empty() {
                "the default subvolume".to_owned()
            } else {
                subvols.join(",")
            }
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrite_and_check() {
        let snap = SnapshotName::parse("root-20260628-093000").unwrap();
        let fstab = "# static\nUUID=ab / btrfs rw,subvol=/root-20260615-120000,subvolid=256,compress=zstd 0 0\n\
                     UUID=ab /home btrfs subvol=@home 0 0\n";
        assert!(check_root(fstab, &snap).is_err());
        let new = rewrite_root(fstab, &snap).unwrap();
        assert_eq!(
            new,
            "# static\nUUID=ab\t/\tbtrfs\trw,compress=zstd,subvol=root-20260628-093000\t0\t0\n\
             UUID=ab /home btrfs subvol=@home 0 0\n"
        );
        check_root(&new, &snap).unwrap();
        assert!(rewrite_root("UUID=ab / ext4 rw 0 1\n", &snap).is_err());
        assert!(rewrite_root("UUID=ab /home btrfs rw 0 1\n", &snap).is_err());
        assert!(check_root(
            "UUID=ab / btrfs rw,subvol=root-20260628-093000,subvolid=5 0 0",
            &snap
        )
        .is_err());
    }
}

//! Step 3, validation of a built snapshot, as a function of facts the edge gathered
//! (docs/formats.md §12.5): a kernel and an initramfs under /boot, the init the kernel will
//! start, and fstab's root entry pointing at the snapshot itself.

use std::cmp::Ordering;

use slate_bootspec::compare_versions;

use crate::{fstab, SnapshotName};

/// What the edge found in a snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RootFacts {
    /// Names of the regular files directly under `/boot` (symlinks resolved).
    pub boot_files: Vec<String>,
    /// `/sbin/init` resolves, inside the snapshot, to an executable regular file. The kernel
    /// starts it unless told otherwise, on a systemd root and a busybox (slate) root alike.
    pub init_executable: bool,
    /// `/usr/lib/systemd/systemd` exists: a systemd root.
    pub systemd: bool,
    /// On a systemd root: `default.target` resolves in `/etc/systemd/system` or
    /// `/usr/lib/systemd/system` (what systemd starts; without it systemd drops to emergency).
    pub default_target: bool,
    /// `/etc/fstab`, if readable as UTF-8.
    pub fstab: Option<String>,
}

/// The kernel and initramfs chosen under `/boot`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootFiles {
    pub kernel: String,
    pub initrd: String,
}

fn kernel_version(name: &str) -> Option<&str> {
    match name {
        "vmlinuz" => Some(""),
        _ => name.strip_prefix("vmlinuz-"),
    }
}

fn initrd_version(name: &str) -> Option<&str> {
    if matches!(
        name,
        "initrd.img" | "initramfs.img" | "initrd" | "initramfs"
    ) {
        return Some("");
    }
    name.strip_prefix("initrd.img-")
        .or_else(|| {
            name.strip_prefix("initramfs-")
                .map(|v| v.strip_suffix(".img").unwrap_or(v))
        })
        .or_else(|| {
            name.strip_prefix("initrd-")
                .map(|v| v.strip_suffix(".img").unwrap_or(v))
        })
}

/// The newest kernel (`vmlinuz[-VERSION]`, by UAPI version order) and the initramfs of the
/// same version (`initrd.img-V`, `initramfs-V.img`, `initrd-V`), else the newest initramfs.
pub fn pick_boot_files(names: &[String]) -> Result<BootFiles, Vec<String>> {
    let newest = |f: fn(&str) -> Option<&str>| {
        names
            .iter()
            .filter_map(|n| f(n).map(|v| (v, n)))
            .max_by(|a, b| compare_versions(a.0, b.0).then_with(|| b.1.cmp(a.1)))
    };
    let kernel = newest(kernel_version);
    let mut problems = Vec::new();
    if kernel.is_none() {
        problems.push("no kernel (vmlinuz or vmlinuz-VERSION) under /boot".to_owned());
    }
    let initrd = kernel
        .and_then(|(kv, _)| {
            names
                .iter()
                .filter(|n| initrd_version(n).is_some_and(|v| !kv.is_empty() && v == kv))
                .min()
        })
        .or_else(|| newest(initrd_version).map(|(_, n)| n));
    if initrd.is_none() {
        problems.push(
            "no initramfs (initrd.img[-V], initramfs[-V].img, initrd-V) under /boot".to_owned(),
        );
    }
    match (kernel, initrd) {
        (Some((_, k)), Some(i)) => Ok(BootFiles {
            kernel: k.clone(),
            initrd: i.clone(),
        }),
        _ => Err(problems),
    }
}

/// Every problem of the snapshot, or the boot files to register.
pub fn validate(facts: &RootFacts, snapshot: &SnapshotName) -> Result<BootFiles, Vec<String>> {
    let mut problems = Vec::new();
    let boot = pick_boot_files(&facts.boot_files)
        .map_err(|p| problems.extend(p))
        .ok();
    if !facts.init_executable {
        problems.push("/sbin/init is missing or not an executable file".to_owned());
    }
    if facts.systemd && !facts.default_target {
        problems.push(
            "systemd root without default.target (in /etc/systemd/system or /usr/lib/systemd/system)"
                .to_owned(),
        );
    }
    match &facts.fstab {
        None => problems.push("/etc/fstab is missing or not text".to_owned()),
        Some(text) => {
            if let Err(e) = fstab::check_root(text, snapshot) {
                problems.push(e.to_string());
            }
        }
    }
    match boot {
        Some(b) if problems.is_empty() => Ok(b),
        _ => Err(problems),
    }
}

/// Whether `a` sorts before `b` as snapshots do (by name = by time).
pub fn older(a: &SnapshotName, b: &SnapshotName) -> bool {
    a.cmp(b) == Ordering::Less
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn boot_files() {
        let got = pick_boot_files(&names(&[
            "vmlinuz-6.1.0-9-amd64",
            "vmlinuz-6.1.0-10-amd64",
            "initrd.img-6.1.0-10-amd64",
            "initrd.img-6.1.0-9-amd64",
            "config-6.1.0-10-amd64",
        ]))
        .unwrap();
        assert_eq!(got.kernel, "vmlinuz-6.1.0-10-amd64");
        assert_eq!(got.initrd, "initrd.img-6.1.0-10-amd64");
        let arch = pick_boot_files(&names(&[
            "vmlinuz-linux",
            "initramfs-linux.img",
            "initramfs-linux-fallback.img",
        ]))
        .unwrap();
        assert_eq!(arch.initrd, "initramfs-linux.img");
        let plain = pick_boot_files(&names(&["vmlinuz", "initramfs.img"])).unwrap();
        assert_eq!(plain.initrd, "initramfs.img");
        assert_eq!(
            pick_boot_files(&names(&["initrd.img"])).unwrap_err().len(),
            1
        );
        assert_eq!(pick_boot_files(&names(&[])).unwrap_err().len(), 2);
    }

    #[test]
    fn all_problems_are_listed() {
        let snap = SnapshotName::parse("root-20260628-093000").unwrap();
        let facts = RootFacts {
            boot_files: names(&["vmlinuz"]),
            init_executable: false,
            systemd: true,
            default_target: false,
            fstab: Some("UUID=a / btrfs subvol=root-20260615-120000 0 0\n".into()),
        };
        let p = validate(&facts, &snap).unwrap_err();
        assert_eq!(p.len(), 4, "{p:?}");
        let ok = RootFacts {
            boot_files: names(&["vmlinuz", "initrd.img"]),
            init_executable: true,
            systemd: false,
            default_target: false,
            fstab: Some("UUID=a / btrfs subvol=root-20260628-093000 0 0\n".into()),
        };
        assert!(validate(&ok, &snap).is_ok());
    }
}

//! A systemd image (`[os] init = "systemd"`): the root must hold systemd, and slate adds its
//! units and mount points; the initramfs carries the marker that tells slate's init to set up
//! /var, STATE and /etc before it executes systemd (docs/formats.md §6.5).

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt as _};
use std::path::Path;

use slate_profile::{image_contract, units, OsInit, Profile, SYSTEMD};

use crate::root_tree::{program_in, write_generated};
use crate::ImagerError;

/// Refuse `[os] init = "systemd"` for a root without systemd, naming the field and the path.
pub(crate) fn check_root(profile: &Profile, tree: &Path) -> Result<(), ImagerError> {
    if profile.os.init == OsInit::Systemd && !program_in(tree, Path::new(SYSTEMD)) {
        return Err(ImagerError::BadInput {
            what: "the profile's [os] init",
            reason: format!(
                "os.init = \"systemd\", but the base rootfs holds no executable {SYSTEMD}"
            ),
        });
    }
    Ok(())
}

/// slate's units, the links that enable them, and the mount points: `/var` (EPHEMERAL) and
/// `/system/state` (STATE), which init mounts, and `/efi` for [`units::ESP_MOUNT`].
pub(crate) fn add_units(profile: &Profile, tree: &Path) -> Result<(), ImagerError> {
    if profile.os.init != OsInit::Systemd {
        return Ok(());
    }
    let dir = tree.join(units::DIR);
    let link = |link: &str, target: &str| -> Result<(), ImagerError> {
        let link = dir.join(link);
        let parent = link.parent().unwrap_or(&dir);
        make_dirs(parent)?;
        if fs::symlink_metadata(&link).is_ok() {
            fs::remove_file(&link).map_err(output_err(&link))?;
        }
        symlink(target, &link).map_err(output_err(&link))
    };
    for unit in units::ALL {
        write_generated(&dir.join(unit.name), unit.text.as_bytes())?;
        for (name, target) in unit.links {
            link(name, target)?;
        }
    }
    let checks = profile.health.as_ref().map_or(0, |h| h.checks.len());
    for index in 0..checks {
        let (name, target) = units::check_link(index);
        link(&name, target)?;
    }
    for mount_point in [
        "var",
        "system/state",
        units::ESP_MOUNT_POINT.trim_start_matches('/'),
    ] {
        make_dirs(&tree.join(mount_point))?;
    }
    Ok(())
}

/// The initramfs marker's content for `profile`, when it has one.
pub(crate) fn initramfs_marker(profile: &Profile) -> Option<(&'static str, &'static str)> {
    (profile.os.init == OsInit::Systemd).then_some((image_contract::ROOT_INIT_PATH, "systemd\n"))
}

fn make_dirs(path: &Path) -> Result<(), ImagerError> {
    let mut missing = Vec::new();
    let mut dir = Some(path);
    while let Some(d) = dir.filter(|d| fs::symlink_metadata(d).is_err()) {
        missing.push(d.to_owned());
        dir = d.parent();
    }
    for d in missing.iter().rev() {
        fs::create_dir(d).map_err(output_err(d))?;
        fs::set_permissions(d, fs::Permissions::from_mode(0o755)).map_err(output_err(d))?;
    }
    Ok(())
}

fn output_err(path: &Path) -> impl FnOnce(std::io::Error) -> ImagerError + '_ {
    move |source| ImagerError::Output {
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(init: &str) -> Profile {
        Profile::parse(&format!(
            "name = \"debian\"\nversion = \"1\"\narch = \"amd64\"\nplatform = \"qemu\"\n\
             [kernel]\nimage = \"k\"\nmodules_dir = \"m\"\n[rootfs]\nbase = \"r\"\n\
             [boot]\nstub = \"s\"\nsystemd_boot = \"b\"\nslate = \"x\"\n[os]\ninit = \"{init}\"\n\
             [health]\n[[health.checks]]\nfile = \"/etc/a\"\n\
             [[health.checks]]\ncommand = [\"/bin/true\"]\n"
        ))
        .unwrap()
    }

    #[test]
    fn systemd_is_required_in_the_root_and_gets_slates_units() {
        let tree = tempfile::tempdir().unwrap();
        let err = check_root(&profile("systemd"), tree.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("[os] init"), "{err}");
        assert!(err.contains("os.init = \"systemd\""), "{err}");
        assert!(err.contains("/usr/lib/systemd/systemd"), "{err}");
        check_root(&profile("slate"), tree.path()).unwrap();

        // Debian's usr-merged layout: /lib is a link to usr/lib.
        let systemd = tree.path().join("usr/lib/systemd/systemd");
        fs::create_dir_all(systemd.parent().unwrap()).unwrap();
        fs::write(&systemd, "").unwrap();
        fs::set_permissions(&systemd, fs::Permissions::from_mode(0o755)).unwrap();
        check_root(&profile("systemd"), tree.path()).unwrap();

        add_units(&profile("systemd"), tree.path()).unwrap();
        for unit in units::ALL {
            let path = tree.path().join(units::DIR).join(unit.name);
            assert_eq!(fs::read_to_string(path).unwrap(), unit.text);
        }
        for unit in [units::SETUP_HOOKS, units::MACHINED] {
            let link = tree
                .path()
                .join(units::DIR)
                .join("multi-user.target.wants")
                .join(unit.name);
            assert_eq!(
                fs::read_link(link).unwrap(),
                Path::new("..").join(unit.name)
            );
        }
        // An instance of the check template per `[[health.checks]]`, required by
        // boot-complete.target; no third.
        let requires = tree
            .path()
            .join(units::DIR)
            .join("boot-complete.target.requires");
        for index in 0..2 {
            assert_eq!(
                fs::read_link(requires.join(format!("slate-check@{index}.service"))).unwrap(),
                Path::new("../slate-check@.service")
            );
        }
        assert!(!requires.join("slate-check@2.service").exists());
        assert!(tree.path().join("system/state").is_dir());
        assert_eq!(
            initramfs_marker(&profile("systemd")),
            Some(("etc/slate/root-init", "systemd\n"))
        );
        assert_eq!(initramfs_marker(&profile("slate")), None);
    }
}

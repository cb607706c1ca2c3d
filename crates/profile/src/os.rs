//! `[os]`: what the image's root is, as far as slate's boot cares. `init = "systemd"` says
//! the root boots systemd as PID 1 (a Debian or other systemd image): slate's initramfs init
//! then sets up /var, STATE and the /etc overlay itself before it executes systemd, and the
//! imager adds slate's units (docs/node.md, "A systemd image").

use serde::Deserialize;

/// The program slate's init executes on a systemd image.
pub const SYSTEMD: &str = "/usr/lib/systemd/systemd";

/// `[os]`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Os {
    #[serde(default)]
    pub init: OsInit,
}

/// What runs as PID 1 of the root.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OsInit {
    /// Whatever `slate.init=` names (machined on slate's own OS): it sets up the volumes and
    /// /etc itself.
    #[default]
    Slate,
    /// systemd ([`SYSTEMD`]): slate's init sets up the volumes and /etc before executing it.
    Systemd,
}

impl OsInit {
    pub fn as_str(self) -> &'static str {
        match self {
            OsInit::Slate => "slate",
            OsInit::Systemd => "systemd",
        }
    }
}

/// What a systemd image cannot have: slate's `[[services]]` (systemd's units are the services
/// there) and health checks that only machined can answer — `service` checks, and a `tcp`
/// check of the node API's port, which slate-machined.service opens only after
/// `boot-complete.target`, the target the checks are required by (it would never pass).
pub(crate) fn validate_for_systemd(
    health: Option<&crate::Health>,
    services: &[crate::ServiceSpec],
) -> Result<(), crate::ProfileError> {
    let invalid =
        |field: &'static str, reason: String| crate::ProfileError::Invalid { field, reason };
    if let Some(service) = services.first() {
        return Err(invalid(
            "services",
            format!(
                "[[services]] {:?}: on a systemd image (os.init = \"systemd\") the services are \
                 systemd units in the root; slate runs none",
                service.name
            ),
        ));
    }
    for (i, check) in health.map_or(&[][..], |h| &h.checks[..]).iter().enumerate() {
        match check {
            crate::HealthCheck::Service(name) => {
                return Err(invalid(
                    "health.checks",
                    format!(
                        "check {i} (service {name:?}): slate runs no services on a systemd \
                         image; check the unit instead, e.g. command = \
                         [\"/usr/bin/systemctl\", \"is-active\", \"--quiet\", \"{name}\"]"
                    ),
                ))
            }
            crate::HealthCheck::Tcp(addr) if addr.ip().is_loopback() && addr.port() == API_PORT => {
                return Err(invalid(
                    "health.checks",
                    format!(
                        "check {i} (tcp {addr}): the node API opens only after \
                         boot-complete.target, which the checks gate; it cannot be one of them"
                    ),
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The node API's default port (machined's `slate.api.listen`).
const API_PORT: u16 = 50000;

/// slate's units on a systemd image: each file's path in the root and its text. The imager
/// writes them (and the links that enable them); `systemd-analyze verify` checks them on the
/// built root.
pub mod units {
    /// The directory of the image's own units.
    pub const DIR: &str = "usr/lib/systemd/system";

    /// One unit: its file name under [`DIR`], its text, and the links its `[Install]` section
    /// asks for, relative to [`DIR`]: (link, target).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Unit {
        pub name: &'static str,
        pub text: &'static str,
        pub links: &'static [(&'static str, &'static str)],
    }

    /// Every unit the imager adds, in the order systemd reaches them.
    pub const ALL: &[Unit] = &[SETUP_HOOKS, CHECK, ESP_MOUNT, BLESS_BOOT_ESP, MACHINED];

    /// Where [`ESP_MOUNT`] mounts the ESP (a mount point the imager makes).
    pub const ESP_MOUNT_POINT: &str = "/efi";

    /// The ESP on /efi for the tools that need it mounted (systemd-bless-boot, bootctl) and for
    /// as long as one of them runs. slate writes the ESP through its own FAT code on the
    /// unmounted partition (one writer: the kernel's vfat must not cache what slate
    /// rewrites), so nothing keeps this mounted: it is stopped once no active unit wants it,
    /// and machined waits for that before it writes (docs/node.md, "A systemd image").
    pub const ESP_MOUNT: Unit = Unit {
        name: "efi.mount",
        text: "\
[Unit]
Description=EFI System Partition (for systemd-bless-boot and bootctl, while they run)
StopWhenUnneeded=yes

[Mount]
What=/dev/disk/by-partlabel/EFI
Where=/efi
Type=vfat
Options=umask=0077,nosuid,nodev,noexec
",
        links: &[],
    };

    /// systemd-bless-boot (Debian's systemd-boot package) drops the booted entry's counter once
    /// `boot-complete.target` is reached; it needs the ESP mounted. Not kept active once done,
    /// so that [`ESP_MOUNT`] is unneeded and goes.
    pub const BLESS_BOOT_ESP: Unit = Unit {
        name: "systemd-bless-boot.service.d/slate-esp.conf",
        text: "\
[Unit]
Wants=efi.mount
After=efi.mount

[Service]
RemainAfterExit=no
",
        links: &[],
    };

    /// One of the image's `[[health.checks]]` (`slate health-check N`, N its index), as
    /// systemd's boot assessment wants a health check: ordered before `boot-complete.target`
    /// and required by it (the imager links an instance per check into
    /// `boot-complete.target.requires/`, [`check_link`]). It retries within `[health]
    /// timeout_secs`, as machined's checks do on slate's own OS; a failure fails the unit,
    /// and with it the target.
    pub const CHECK: Unit = Unit {
        name: "slate-check@.service",
        text: "\
[Unit]
Description=slate health check %i (the image's [[health.checks]])
RequiresMountsFor=/var /system/state
# What the checks may look at is there: /etc after the setup hooks, the network configured.
After=slate-setup-hooks.service network.target
Before=boot-complete.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/slate health-check %i
StandardOutput=journal+console
StandardError=journal+console
",
        links: &[],
    };

    /// The link that makes check `index` required by `boot-complete.target`: (link, target).
    pub fn check_link(index: usize) -> (String, &'static str) {
        (
            format!("boot-complete.target.requires/slate-check@{index}.service"),
            "../slate-check@.service",
        )
    }

    /// The setup hooks after a reset of /etc: `slate setup-hooks`, once per version, before
    /// the system is multi-user. A failure fails the unit: the console says so, the system is
    /// `degraded`, and — required by `boot-complete.target` — the boot is not blessed.
    pub const SETUP_HOOKS: Unit = Unit {
        name: "slate-setup-hooks.service",
        text: "\
[Unit]
Description=slate setup hooks (after a reset of /etc)
# /var (the user's hooks) and STATE (the record of the version whose hooks ran) are mounted by
# slate's initramfs init before systemd starts; the default dependencies order this after
# local-fs.target and sysinit.target.
RequiresMountsFor=/var /system/state
Before=multi-user.target boot-complete.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/slate setup-hooks
StandardOutput=journal+console
StandardError=journal+console
# Each hook has its own timeout (60 s); this bounds the whole run.
TimeoutStartSec=30min

[Install]
WantedBy=multi-user.target
RequiredBy=boot-complete.target
",
        links: &[
            (
                "multi-user.target.wants/slate-setup-hooks.service",
                "../slate-setup-hooks.service",
            ),
            (
                "boot-complete.target.requires/slate-setup-hooks.service",
                "../slate-setup-hooks.service",
            ),
        ],
    };

    /// machined as a service (`slate machined --under-systemd`): the node API, the update
    /// agent, and the boot's assessment. Ordered after `boot-complete.target`, which it pulls
    /// in: the units that target requires (the setup hooks, the image's health units) have
    /// succeeded or failed by the time it starts, and it commits the boot — or takes the
    /// fatal path back to the previous version — on that verdict and its own health checks.
    pub const MACHINED: Unit = Unit {
        name: "slate-machined.service",
        text: "\
[Unit]
Description=slate node API, update agent and boot assessment
RequiresMountsFor=/var /system/state
Wants=boot-complete.target
# systemd-bless-boot (when the image has it and the boot was counted) has renamed the entry
# by the time the commit runs; the commit then only drops the upgrade marker.
After=boot-complete.target systemd-bless-boot.service network.target

[Service]
Type=simple
ExecStart=/usr/bin/slate machined --under-systemd
StandardOutput=journal+console
StandardError=journal+console
# Its way down is systemd's: an upgrade or a rollback asks for `systemctl reboot`.
KillMode=mixed
TimeoutStopSec=90s

[Install]
WantedBy=multi-user.target
",
        links: &[(
            "multi-user.target.wants/slate-machined.service",
            "../slate-machined.service",
        )],
    };
}

#[cfg(test)]
mod tests {
    use crate::{OsInit, Profile, ProfileError};

    const BASE: &str = r#"
name = "debian"
version = "1.0.0"
arch = "amd64"
platform = "qemu"
[kernel]
image = "vmlinuz"
modules_dir = "modules"
args = ["console=ttyS0"]
[rootfs]
base = "rootfs"
[boot]
stub = "stub.efi"
systemd_boot = "sd.efi"
slate = "slate"
"#;

    #[test]
    fn the_root_init_defaults_to_slate_and_systemd_adds_its_path_to_the_command_line() {
        let p = Profile::parse(BASE).unwrap();
        assert_eq!(p.os.init, OsInit::Slate);
        assert_eq!(p.cmdline(), "console=ttyS0");
        let p = Profile::parse(&format!("{BASE}[os]\ninit = \"systemd\"\n")).unwrap();
        assert_eq!(p.os.init, OsInit::Systemd);
        assert_eq!(
            p.cmdline(),
            "console=ttyS0 slate.init=/usr/lib/systemd/systemd"
        );
        // Named explicitly, it is not added twice.
        let text = BASE.replace(
            r#"args = ["console=ttyS0"]"#,
            r#"args = ["console=ttyS0", "slate.init=/usr/lib/systemd/systemd"]"#,
        );
        let p = Profile::parse(&format!("{text}[os]\ninit = \"systemd\"\n")).unwrap();
        assert_eq!(
            p.cmdline(),
            "console=ttyS0 slate.init=/usr/lib/systemd/systemd"
        );
    }

    #[test]
    fn a_systemd_image_refuses_what_only_machined_could_answer() {
        let systemd = format!("{BASE}[os]\ninit = \"systemd\"\n");
        let err = |extra: &str| {
            Profile::parse(&format!("{systemd}{extra}"))
                .unwrap_err()
                .to_string()
        };
        let e = err("[health]\n[[health.checks]]\nfile = \"/etc/a\"\n[[health.checks]]\nservice = \"web\"\n");
        assert!(
            e.starts_with("health.checks: check 1 (service \"web\")"),
            "{e}"
        );
        assert!(e.contains("systemctl"), "{e}");
        let e = err("[health]\n[[health.checks]]\ntcp = \"127.0.0.1:50000\"\n");
        assert!(e.contains("check 0 (tcp 127.0.0.1:50000)"), "{e}");
        assert!(e.contains("boot-complete.target"), "{e}");
        let e = err("[[services]]\nname = \"web\"\ncommand = [\"/bin/httpd\"]\n");
        assert!(e.starts_with("services: [[services]] \"web\""), "{e}");
        // Another port, a file or a command: fine; and all of it on slate's own OS.
        Profile::parse(&format!(
            "{systemd}[health]\n[[health.checks]]\ntcp = \"127.0.0.1:8080\"\n\
             [[health.checks]]\ncommand = [\"/bin/true\"]\n"
        ))
        .unwrap();
        Profile::parse(&format!(
            "{BASE}[health]\n[[health.checks]]\ntcp = \"127.0.0.1:50000\"\n"
        ))
        .unwrap();
    }

    #[test]
    fn every_var_mode_is_an_image_choice_under_systemd_too() {
        // slate's init opens a tpm2 /var before executing systemd, as machined does on
        // slate's own OS (docs/node.md, "A systemd image"); an unknown mode is refused alike.
        for mode in ["persistent", "ephemeral", "tpm2"] {
            let p = Profile::parse(&format!(
                "{BASE}[os]\ninit = \"systemd\"\n[var]\nmode = \"{mode}\"\n"
            ))
            .unwrap();
            assert_eq!(p.var.map(|v| v.mode.name()), Some(mode));
        }
        let e = Profile::parse(&format!(
            "{BASE}[os]\ninit = \"systemd\"\n[var]\nmode = \"tmpfs\"\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("tmpfs"), "{e}");
    }

    #[test]
    fn bad_os_tables_are_refused_naming_the_field() {
        let err = |extra: &str, text: &str| {
            Profile::parse(&format!("{text}{extra}"))
                .unwrap_err()
                .to_string()
        };
        let e = err("[os]\ninit = \"openrc\"\n", BASE);
        assert!(e.contains("unknown variant `openrc`"), "{e}");
        let e = err("[os]\ninits = \"systemd\"\n", BASE);
        assert!(e.contains("unknown field `inits`"), "{e}");
        let text = BASE.replace(
            r#"args = ["console=ttyS0"]"#,
            r#"args = ["console=ttyS0", "slate.init=/usr/bin/machined"]"#,
        );
        match Profile::parse(&format!("{text}[os]\ninit = \"systemd\"\n")).unwrap_err() {
            ProfileError::Invalid { field, reason } => {
                assert_eq!(field, "kernel.args");
                assert!(
                    reason.contains("slate.init=/usr/bin/machined contradicts"),
                    "{reason}"
                );
            }
            other => panic!("{other}"),
        }
    }
}

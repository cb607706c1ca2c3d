//! Image profiles: what the imager builds, as a TOML file.
//!
//! Pure: parsing and validation of the text only. Whether the named files exist is checked by the
//! imager before it writes anything. Relative paths are kept as written; the imager resolves them
//! against the profile's directory.
//!
//! The optional `[health]` and `[watchdog]` sections are the node's runtime configuration
//! ([`NodeConfig`]): the imager writes them into the image for machined to read.

pub mod extensions;
mod image;
pub mod image_contract;
mod node;
mod os;

use std::path::PathBuf;

use serde::Deserialize;
pub use slate_services::ServiceSpec;

pub use extensions::{
    parse_extensions_manifest, render_extensions_manifest, ExtensionEntry,
    EXTENSIONS_MANIFEST_HEADER,
};
pub use image::{Image, KEEP_VERSIONS_RANGE, MAX_ESP_MIB, MAX_IMAGE_MIB};
pub use node::{
    Health, HealthCheck, NodeConfig, Reboot, RebootMethod, Var, VarMode, Watchdog,
    HEALTH_TIMEOUT_RANGE, NODE_CONFIG_PATH, WATCHDOG_TIMEOUT_RANGE,
};
pub use os::{units, Os, OsInit, SYSTEMD};

#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The parser's message (with its snippet) is in this one and not a `source()`, so a
    /// chain printer shows the snippet once (issue 44).
    #[error("the profile is not valid TOML for a slate profile: {0}")]
    Syntax(toml::de::Error),
    #[error("{field}: {reason}")]
    Invalid { field: &'static str, reason: String },
}

impl From<toml::de::Error> for ProfileError {
    fn from(e: toml::de::Error) -> Self {
        ProfileError::Syntax(e)
    }
}

/// The platforms an image can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    Metal,
    Qemu,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Amd64,
}

impl Arch {
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bootloader {
    #[default]
    SystemdBoot,
    /// GRUB with A/B slots on the ESP and grubenv (`[boot] grub_efi` names the GRUB EFI image).
    Grub,
}

/// A whole profile.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// OS name: the `ID=` of os-release and the stem of UKI file names.
    pub name: String,
    pub version: String,
    pub arch: Arch,
    pub platform: Platform,
    /// Variant recorded in the installer bundle (an update must match the node's).
    #[serde(default = "default_variant")]
    pub variant: String,
    #[serde(default)]
    pub bootloader: Bootloader,
    pub kernel: Kernel,
    pub rootfs: Rootfs,
    pub boot: Boot,
    /// What the root's init is (`[os] init = "systemd"`: slate's init prepares /var and /etc
    /// and executes systemd).
    #[serde(default)]
    pub os: Os,
    #[serde(default)]
    pub image: Image,
    /// Checks machined runs at stage Running before it commits the boot.
    #[serde(default)]
    pub health: Option<Health>,
    /// The hardware watchdog machined arms at startup.
    #[serde(default)]
    pub watchdog: Option<Watchdog>,
    /// How the node restarts by default (`[reboot] mode`; a machine configuration's wins).
    #[serde(default)]
    pub reboot: Option<Reboot>,
    /// The services every node of the image runs (`[[services]]`, docs/node.md "Services").
    #[serde(default)]
    pub services: Vec<ServiceSpec>,
    /// How /var lives (`[var] mode`; a machine configuration's wins).
    #[serde(default)]
    pub var: Option<Var>,
    /// The public keys this image trusts for updates.
    #[serde(default)]
    pub trust: Trust,
    /// Sign the boot files with the owner's Secure Boot key (`[secureboot]`).
    #[serde(default)]
    pub secureboot: Option<SecureBoot>,
}

/// `[secureboot]`: a Secure Boot image. The imager signs systemd-boot and every UKI with `key`
/// (PEM RSA) whose certificate is `cert`, and the root carries `cert` as the db certificate the
/// node checks every update's UKI against
/// ([`image_contract::SECURE_BOOT_DB`](crate::image_contract::SECURE_BOOT_DB)). With `enroll`,
/// a directory holding `PK.auth`, `KEK.auth` and `db.auth` (`slate gen secureboot-keys`), a disk
/// image ships them in `ESP/loader/keys/auto/` with `secure-boot-enroll force`: its first boot
/// on firmware in setup mode enrols them. Paths are relative to the profile's directory.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecureBoot {
    pub key: PathBuf,
    pub cert: PathBuf,
    #[serde(default)]
    pub enroll: Option<PathBuf>,
}

/// `[trust]`: the public keys (SPKI PEM files, as `slate keygen` or cosign write them) whose
/// signatures this image accepts on update bundles. The imager checks that each parses and
/// writes it into the root as `/etc/slate/trusted-keys/<key id>.pub`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trust {
    #[serde(default)]
    pub keys: Vec<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kernel {
    /// The kernel image (bzImage with EFI stub).
    pub image: PathBuf,
    /// `lib/modules/<release>` of that kernel; the directory name is the release.
    pub modules_dir: PathBuf,
    /// Modules to carry in the initramfs; their dependency closure is added.
    #[serde(default)]
    pub modules: Vec<String>,
    #[serde(default)]
    pub args: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rootfs {
    /// A directory, or a tar archive (`.tar`), holding the base root filesystem.
    pub base: PathBuf,
    /// System extensions layered above the base, topmost first: each path names an
    /// extension's signed manifest (`slate imager extension`, docs/formats.md §7.6), whose
    /// squashfs image lies beside it.
    #[serde(default)]
    pub extensions: Vec<PathBuf>,
    #[serde(default = "default_zstd_level")]
    pub zstd_level: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Boot {
    /// systemd-stub, the UKI's PE base.
    pub stub: PathBuf,
    /// systemd-boot, installed as the ESP's BOOTX64.EFI.
    pub systemd_boot: PathBuf,
    /// The statically linked slate binary: the root's `/usr/bin/slate` (machined), the bundle's
    /// installer, and the initramfs `/init` unless `init` names another.
    pub slate: PathBuf,
    /// A statically linked `slate-init` (the init role alone) as the initramfs `/init`: a
    /// fraction of slate's size, so the kernel unpacks and init starts sooner. `slate` when
    /// absent.
    #[serde(default)]
    pub init: Option<PathBuf>,
    /// With `bootloader = "grub"`: the GRUB EFI image installed as BOOTX64.EFI, built with
    /// `grub-mkstandalone -O x86_64-efi` around slate's embedded config (`xtask vm-test
    /// grub_upgrade_and_revert` builds one into `target/grub/grubx64.efi`).
    #[serde(default)]
    pub grub_efi: Option<PathBuf>,
}

fn default_variant() -> String {
    "default".into()
}
fn default_zstd_level() -> u32 {
    15
}

impl Profile {
    /// Parse and validate profile text.
    pub fn parse(text: &str) -> Result<Self, ProfileError> {
        let profile: Profile = toml::from_str(text)?;
        profile.validate()?;
        Ok(profile)
    }

    /// Replace the version (the same profile builds successive versions).
    pub fn with_version(mut self, version: &str) -> Result<Self, ProfileError> {
        self.version = version.to_string();
        self.validate()?;
        Ok(self)
    }

    fn validate(&self) -> Result<(), ProfileError> {
        let invalid = |field, reason: &str| ProfileError::Invalid {
            field,
            reason: reason.to_string(),
        };
        let file_name_safe = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        };
        if !file_name_safe(&self.name) || self.name.contains('+') {
            return Err(invalid(
                "name",
                "must be non-empty ASCII letters, digits, '.', '_' or '-' (it names UKI files)",
            ));
        }
        if !file_name_safe(&self.version) || !self.version.starts_with(|c: char| c.is_ascii_digit())
        {
            return Err(invalid(
                "version",
                "must start with a digit and use only ASCII letters, digits, '.', '_' or '-'",
            ));
        }
        if !file_name_safe(&self.variant) {
            return Err(invalid(
                "variant",
                "must be ASCII letters, digits, '.', '_' or '-'",
            ));
        }
        if self
            .kernel
            .args
            .iter()
            .any(|a| a.is_empty() || a.contains(char::is_whitespace))
        {
            return Err(invalid(
                "kernel.args",
                "each argument is one non-empty word",
            ));
        }
        if self.os.init == OsInit::Systemd {
            let named = self
                .kernel
                .args
                .iter()
                .filter_map(|a| a.strip_prefix("slate.init="))
                .find(|init| *init != SYSTEMD);
            if let Some(init) = named {
                return Err(ProfileError::Invalid {
                    field: "kernel.args",
                    reason: format!(
                        "slate.init={init} contradicts [os] init = \"systemd\" (which \
                         executes {SYSTEMD}; leave slate.init out)"
                    ),
                });
            }
            os::validate_for_systemd(self.health.as_ref(), &self.services)?;
        }
        if self.rootfs.zstd_level == 0 || self.rootfs.zstd_level > 22 {
            return Err(invalid("rootfs.zstd_level", "must be 1 to 22"));
        }
        image::validate(&self.image, self.bootloader)?;
        if let Some(sb) = &self.secureboot {
            let paths = [Some(&sb.key), Some(&sb.cert), sb.enroll.as_ref()];
            if paths
                .into_iter()
                .flatten()
                .any(|p| p.as_os_str().is_empty())
            {
                return Err(invalid("secureboot", "a path is empty"));
            }
            if self.bootloader == Bootloader::Grub {
                return Err(invalid(
                    "secureboot",
                    "Secure Boot images use systemd-boot and UKIs (GRUB would need shim)",
                ));
            }
        }
        if self.trust.keys.iter().any(|k| k.as_os_str().is_empty()) {
            return Err(invalid("trust.keys", "a key path is empty"));
        }
        match (self.bootloader, &self.boot.grub_efi) {
            (Bootloader::Grub, None) => {
                return Err(invalid(
                    "boot.grub_efi",
                    "bootloader = \"grub\" needs the GRUB EFI image (grub-mkstandalone output)",
                ))
            }
            (Bootloader::SystemdBoot, Some(_)) => {
                return Err(invalid(
                    "boot.grub_efi",
                    "only used with bootloader = \"grub\"",
                ))
            }
            _ => {}
        }
        node::validate(self.health.as_ref(), self.watchdog.as_ref())?;
        node::validate_services(&self.services, self.health.as_ref())
    }

    /// The node's runtime configuration this image carries, when the profile has any.
    pub fn node_config(&self) -> Option<NodeConfig> {
        let any = self.health.is_some()
            || self.watchdog.is_some()
            || self.reboot.is_some()
            || !self.services.is_empty()
            || self.var.is_some();
        any.then(|| NodeConfig {
            health: self.health.clone(),
            watchdog: self.watchdog.clone(),
            reboot: self.reboot.clone(),
            services: self.services.clone(),
            var: self.var.clone(),
        })
    }

    /// Append kernel arguments (e.g. a fault to inject into one test image).
    pub fn with_extra_args(mut self, args: &[String]) -> Result<Self, ProfileError> {
        self.kernel.args.extend(args.iter().cloned());
        self.validate()?;
        Ok(self)
    }

    /// The kernel command line the image boots with.
    pub fn cmdline(&self) -> String {
        let mut args = self.kernel.args.join(" ");
        let named = self
            .kernel
            .args
            .iter()
            .any(|a| a.starts_with("slate.init="));
        if self.os.init == OsInit::Systemd && !named {
            args.push_str(&format!(" slate.init={SYSTEMD}"));
        }
        args.trim_start().to_owned()
    }

    /// os-release of this image (the UKI's `.osrel` and the root's `/etc/os-release`).
    /// `IMAGE_ID` makes systemd-boot sort our entries by version, newest first.
    pub fn os_release(&self) -> String {
        let (name, version) = (&self.name, &self.version);
        format!(
            "NAME=\"{name}\"\nID={name}\nPRETTY_NAME=\"{name} {version}\"\nVERSION_ID={version}\n\
             IMAGE_ID={name}\nIMAGE_VERSION={version}\nVARIANT_ID={}\n",
            self.variant
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
name = "slate"
version = "1.0.0"
arch = "amd64"
platform = "qemu"
[kernel]
image = "vmlinuz"
modules_dir = "modules"
modules = ["squashfs"]
args = ["console=ttyS0"]
[rootfs]
base = "rootfs"
[boot]
stub = "stub.efi"
systemd_boot = "sd.efi"
slate = "slate"
"#;

    #[test]
    fn parses_with_defaults() {
        let p = Profile::parse(MINIMAL).unwrap();
        assert_eq!(p.image.tries, 3);
        assert_eq!(p.image.keep_versions, 2);
        assert_eq!(p.variant, "default");
        assert_eq!(p.cmdline(), "console=ttyS0");
        assert!(p.os_release().contains("IMAGE_VERSION=1.0.0\n"));
        assert_eq!(p.with_version("2.0.0").unwrap().version, "2.0.0");
    }

    #[test]
    fn bad_profiles_name_the_field() {
        let err = |text: String| Profile::parse(&text).unwrap_err().to_string();
        assert!(err(MINIMAL.replace("1.0.0", "v 1")).starts_with("version:"));
        assert!(err(MINIMAL.replace("name = \"slate\"", "name = \"sl+ate\"")).starts_with("name:"));
        assert!(err(MINIMAL.replace("amd64", "sparc")).contains("unknown variant `sparc`"));
        assert!(
            err(MINIMAL.replace("[boot]", "[boot]\nbogus = 1")).contains("unknown field `bogus`")
        );
        assert!(err(MINIMAL.replace("image = \"vmlinuz\"\n", "")).contains("missing field `image`"));
        assert!(err(MINIMAL.replace("\"console=ttyS0\"", "\"a b\"")).starts_with("kernel.args:"));
        assert!(err(format!("{MINIMAL}[image]\nsize_mib = 10\n")).starts_with("image.size_mib:"));
        assert!(err(format!("{MINIMAL}[health]\ntimeout_secs = 0\n"))
            .starts_with("health.timeout_secs:"));
        assert!(err(format!("{MINIMAL}[watchdog]\ntimeout_secs = 1\n"))
            .starts_with("watchdog.timeout_secs:"));
        assert!(
            err(format!("{MINIMAL}[watchdog]\ntimeout = 1\n")).contains("unknown field `timeout`")
        );
        assert!(err(format!(
            "{MINIMAL}[[health.checks]]\nfile = \"/a\"\ncommand = [\"/b\"]\n"
        ))
        .contains("exactly one of `file`, `command`, `tcp` or `service`"));
    }

    /// issue 18: sizes that wrapped around in the imager's arithmetic, a timeout that waits
    /// forever, tries read as uncounted.
    #[test]
    fn numbers_out_of_bounds_are_refused_naming_the_field() {
        let err = |image: &str| {
            Profile::parse(&format!("{MINIMAL}[image]\n{image}\n"))
                .unwrap_err()
                .to_string()
        };
        // 2^44 + 256 MiB is 2^64 + 256 MiB bytes: a 256 MiB image once it wrapped.
        let e = err("size_mib = 17592186044672");
        assert!(
            e.starts_with("image.size_mib: 17592186044672 MiB is not 1 to"),
            "{e}"
        );
        let e = err("esp_mib = 9223372036854775807\nsize_mib = 1024");
        assert!(
            e.starts_with("image.esp_mib: 9223372036854775807 MiB"),
            "{e}"
        );
        let e = err("esp_mib = 9223372036854775000\nstate_mib = 9223372036854775000");
        assert!(e.starts_with("image.esp_mib:"), "{e}");
        let e = err("state_mib = 9223372036854775807");
        assert!(e.starts_with("image.state_mib:"), "{e}");
        let e = err("menu_timeout = 4294967295");
        assert!(
            e.starts_with("image.menu_timeout: 4294967295 seconds is not 0 to 600"),
            "{e}"
        );
        let e = err("menu_timeout = 601");
        assert!(e.starts_with("image.menu_timeout:"), "{e}");
        let e = err("tries = 3000000000");
        assert!(
            e.starts_with("image.tries: 3000000000 boot-counting tries"),
            "{e}"
        );
        assert!(err("tries = 0").starts_with("image.tries:"));
        let e = err("size_mib = -1");
        assert!(e.contains("size_mib"), "{e}");
        let p = Profile::parse(&format!(
            "{MINIMAL}[image]\nsize_mib = 16777216\nmenu_timeout = 600\ntries = 15\n"
        ))
        .unwrap();
        assert_eq!(p.image.size_bytes().unwrap(), 1 << 44);
    }

    #[test]
    fn trust_keys_are_paths() {
        assert!(Profile::parse(MINIMAL).unwrap().trust.keys.is_empty());
        let p = Profile::parse(&format!(
            "{MINIMAL}[trust]\nkeys = [\"keys/a.pub\", \"/b.pub\"]\n"
        ));
        assert_eq!(
            p.unwrap().trust.keys,
            [PathBuf::from("keys/a.pub"), "/b.pub".into()]
        );
        let err = |text: String| Profile::parse(&text).unwrap_err().to_string();
        assert!(err(format!("{MINIMAL}[trust]\nkeys = [\"\"]\n")).starts_with("trust.keys:"));
        assert!(err(format!("{MINIMAL}[trust]\nkey = []\n")).contains("unknown field `key`"));
    }

    #[test]
    fn health_and_watchdog_become_the_node_config() {
        assert_eq!(Profile::parse(MINIMAL).unwrap().node_config(), None);
        let text = format!(
            "{MINIMAL}[health]\ntimeout_secs = 20\n[[health.checks]]\ntcp = \"127.0.0.1:50000\"\n\
             [[health.checks]]\nfile = \"/etc/os-release\"\n[watchdog]\ntimeout_secs = 45\n"
        );
        let profile = Profile::parse(&text).unwrap();
        let node = profile.node_config().unwrap();
        assert_eq!(node.health.as_ref().unwrap().checks.len(), 2);
        assert_eq!(node.health.as_ref().unwrap().timeout_secs, 20);
        assert_eq!(node.enabled_watchdog().unwrap().timeout_secs, 45);
        assert_eq!(NodeConfig::parse(&node.to_toml()).unwrap(), node);
        // Only a watchdog: still a node config (no checks).
        let dog = Profile::parse(&format!("{MINIMAL}[watchdog]\ntimeout_secs = 30\n")).unwrap();
        assert_eq!(dog.node_config().unwrap().health, None);
    }

    #[test]
    fn keep_versions_is_2_to_16_and_2_with_grub() {
        let with = |text: &str, n: &str| format!("{text}[image]\nkeep_versions = {n}\n");
        let parse = |text: String| Profile::parse(&text).map_err(|e| e.to_string());
        assert_eq!(parse(with(MINIMAL, "3")).unwrap().image.keep_versions, 3);
        assert_eq!(parse(with(MINIMAL, "16")).unwrap().image.keep_versions, 16);
        for bad in ["0", "1", "17"] {
            let err = parse(with(MINIMAL, bad)).unwrap_err();
            assert!(err.starts_with("image.keep_versions:"), "{bad}: {err}");
            assert!(err.contains("2 to 16"), "{err}");
        }
        assert!(parse(with(MINIMAL, "-1"))
            .unwrap_err()
            .contains("keep_versions"));
        let grub = MINIMAL
            .replace(
                "platform = \"qemu\"",
                "platform = \"qemu\"\nbootloader = \"grub\"",
            )
            .replace("[boot]", "[boot]\ngrub_efi = \"grubx64.efi\"");
        assert_eq!(parse(grub.clone()).unwrap().image.keep_versions, 2);
        assert_eq!(parse(with(&grub, "2")).unwrap().image.keep_versions, 2);
        let err = parse(with(&grub, "3")).unwrap_err();
        assert!(err.starts_with("image.keep_versions:"), "{err}");
        assert!(err.contains("GRUB keeps exactly 2"), "{err}");
    }

    #[test]
    fn grub_needs_its_efi_image() {
        let grub = MINIMAL.replace(
            "platform = \"qemu\"",
            "platform = \"qemu\"\nbootloader = \"grub\"",
        );
        let err = Profile::parse(&grub).unwrap_err().to_string();
        assert!(err.starts_with("boot.grub_efi:"), "{err}");
        let p =
            Profile::parse(&grub.replace("[boot]", "[boot]\ngrub_efi = \"grubx64.efi\"")).unwrap();
        assert_eq!(p.bootloader, Bootloader::Grub);
        assert_eq!(
            p.boot.grub_efi.as_deref(),
            Some(std::path::Path::new("grubx64.efi"))
        );
        let err = Profile::parse(&MINIMAL.replace("[boot]", "[boot]\ngrub_efi = \"g.efi\""))
            .unwrap_err()
            .to_string();
        assert!(err.contains("only used with"), "{err}");
    }
}

//! Everything a build needs, resolved and checked before anything is built.

use std::fs;
use std::path::{Path, PathBuf};

use slate_modules::ModuleDeps;
use slate_profile::Profile;

use crate::ImagerError;

/// The most bytes of a profile (they are a few KiB); a bigger file is not one.
pub const MAX_PROFILE_BYTES: u64 = 1 << 20;

/// What to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    Rootfs,
    Initramfs,
    Cmdline,
    Kernel,
    Uki,
    Image,
    Installer,
    /// GPT + ESP (systemd-boot, a Type #1 entry) + one Btrfs pool whose first `root-<ts>`
    /// snapshot holds the root: the snapshot engine's disk (docs/formats.md §12.8).
    BtrfsImage,
}

impl OutputKind {
    pub const ALL: [OutputKind; 8] = [
        OutputKind::Rootfs,
        OutputKind::Initramfs,
        OutputKind::Cmdline,
        OutputKind::Kernel,
        OutputKind::Uki,
        OutputKind::Image,
        OutputKind::Installer,
        OutputKind::BtrfsImage,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OutputKind::Rootfs => "rootfs",
            OutputKind::Initramfs => "initramfs",
            OutputKind::Cmdline => "cmdline",
            OutputKind::Kernel => "kernel",
            OutputKind::Uki => "uki",
            OutputKind::Image => "image",
            OutputKind::Installer => "installer",
            OutputKind::BtrfsImage => "btrfs-image",
        }
    }

    pub fn parse(name: &str) -> Result<Self, ImagerError> {
        Self::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| ImagerError::BadInput {
                what: "output kind",
                reason: format!(
                    "{name:?} is not one of {}",
                    Self::ALL.map(|k| k.name()).join(", ")
                ),
            })
    }

    fn needs_rootfs(self) -> bool {
        !matches!(self, OutputKind::Cmdline | OutputKind::Kernel)
    }
    fn needs_initramfs(self) -> bool {
        matches!(
            self,
            OutputKind::Initramfs
                | OutputKind::Uki
                | OutputKind::Image
                | OutputKind::Installer
                | OutputKind::BtrfsImage
        )
    }
    fn needs_kernel(self) -> bool {
        matches!(
            self,
            OutputKind::Kernel
                | OutputKind::Uki
                | OutputKind::Image
                | OutputKind::Installer
                | OutputKind::BtrfsImage
        )
    }
    fn needs_uki(self) -> bool {
        matches!(
            self,
            OutputKind::Uki | OutputKind::Image | OutputKind::Installer
        )
    }
}

/// The resolved inputs of one build.
#[derive(Debug, Clone)]
pub struct Inputs {
    pub kind: OutputKind,
    pub profile: Profile,
    pub kernel_image: PathBuf,
    pub modules_dir: PathBuf,
    /// `uname -r` of the kernel: the name of its modules directory.
    pub kernel_release: String,
    /// The module closure, relative to `modules_dir`, dependencies first.
    pub module_paths: Vec<String>,
    /// What each of `module_paths` needs loaded before it (its `modules.dep` line).
    pub module_dependencies: std::collections::BTreeMap<String, Vec<String>>,
    pub base_rootfs: PathBuf,
    /// The profile's system extensions, topmost first: each manifest verified against
    /// `trusted_keys` and its image checked (once the rootfs is needed).
    pub extensions: Vec<crate::ExtensionInput>,
    /// The manifests `rootfs.extensions` names, resolved against the profile's directory.
    pub extension_manifests: Vec<PathBuf>,
    pub stub: PathBuf,
    pub systemd_boot: PathBuf,
    /// `bootloader = "grub"`: the GRUB EFI image.
    pub grub_efi: Option<PathBuf>,
    pub slate: PathBuf,
    /// The profile's `init`: the initramfs `/init` when set, else `slate`.
    pub init: Option<PathBuf>,
    /// The profile's `[trust] keys`, parsed (sorted by key id, duplicates dropped): the root
    /// carries them as `/etc/slate/trusted-keys/<key id>.pub`.
    pub trusted_keys: Vec<slate_trust::PublicKey>,
    /// `[secureboot]`, read and checked: the boot files are signed, the root carries the db
    /// certificate, a disk image enrols the keys.
    pub secure_boot: Option<crate::SecureBootInputs>,
    /// Every timestamp in every artifact.
    pub source_date_epoch: u64,
    /// Where the outputs of costly stages are kept between builds (`--cache`); the artifact is
    /// the same bytes with or without it.
    pub cache: Option<crate::StageCache>,
}

fn must_exist(what: &'static str, path: &Path) -> Result<(), ImagerError> {
    match fs::metadata(path) {
        Ok(_) => Ok(()),
        // A link to nothing is named as that, not as a file that is missing (issue 44).
        Err(_) if path.symlink_metadata().is_ok() => {
            Err(ImagerError::Input(slate_files::FileError::NotAFile {
                what: what.to_owned(),
                path: path.to_owned(),
                kind: "a dangling symbolic link",
                expected: "an existing file or directory",
            }))
        }
        Err(source) => Err(ImagerError::MissingInput {
            what,
            path: path.to_owned(),
            source,
        }),
    }
}

/// The profile's trusted keys (relative to the profile's directory), each parsed as a P-256
/// SPKI PEM public key: a key that does not parse stops the build before anything is built.
fn read_trusted_keys(
    base: &Path,
    paths: &[PathBuf],
) -> Result<Vec<slate_trust::PublicKey>, ImagerError> {
    let mut keys = Vec::new();
    for path in paths {
        let path = base.join(path);
        keys.push(
            slate_trust::read_public_key(&path).map_err(|err| match err {
                slate_trust::TrustError::Io { path, source } => ImagerError::MissingInput {
                    what: "the trusted key",
                    path,
                    source,
                },
                slate_trust::TrustError::File(e) if e.is_not_found() => ImagerError::MissingInput {
                    what: "the trusted key",
                    path: e.path().to_owned(),
                    source: e.into_io(),
                },
                other => ImagerError::BadInput {
                    what: "trust.keys",
                    reason: other.to_string(),
                },
            })?,
        );
    }
    keys.sort_by_key(slate_trust::PublicKey::id);
    keys.dedup_by_key(|k| k.id());
    Ok(keys)
}

impl Inputs {
    /// Read the profile at `path` (with `version` overriding its version, and extra kernel
    /// arguments appended) and check what `kind` needs. Relative paths in the profile are relative to the profile's directory.
    pub fn resolve(
        path: &Path,
        version: Option<&str>,
        extra_kernel_args: &[String],
        kind: OutputKind,
        source_date_epoch: u64,
    ) -> Result<Self, ImagerError> {
        let text = slate_files::read_string_bounded(path, MAX_PROFILE_BYTES, "the profile")
            .map_err(|e| ImagerError::ReadProfile {
                path: path.to_owned(),
                source: e.into_io(),
            })?;
        let profile_err = |source| ImagerError::Profile {
            path: path.to_owned(),
            source,
        };
        let mut profile = Profile::parse(&text).map_err(profile_err)?;
        if let Some(version) = version {
            profile = profile.with_version(version).map_err(profile_err)?;
        }
        if !extra_kernel_args.is_empty() {
            profile = profile
                .with_extra_args(extra_kernel_args)
                .map_err(profile_err)?;
        }
        let base = path.parent().unwrap_or(Path::new("."));
        let at = |p: &Path| base.join(p);

        let inputs = Inputs {
            kind,
            kernel_image: at(&profile.kernel.image),
            modules_dir: at(&profile.kernel.modules_dir),
            kernel_release: String::new(),
            module_paths: Vec::new(),
            module_dependencies: Default::default(),
            base_rootfs: at(&profile.rootfs.base),
            extensions: Vec::new(),
            extension_manifests: profile.rootfs.extensions.iter().map(|p| at(p)).collect(),
            stub: at(&profile.boot.stub),
            systemd_boot: at(&profile.boot.systemd_boot),
            grub_efi: profile.boot.grub_efi.as_deref().map(at),
            slate: at(&profile.boot.slate),
            init: profile.boot.init.as_deref().map(at),
            trusted_keys: Vec::new(),
            secure_boot: None,
            source_date_epoch,
            cache: None,
            profile,
        };
        inputs.check(base)
    }

    fn check(mut self, base: &Path) -> Result<Self, ImagerError> {
        let kind = self.kind;
        if kind == OutputKind::BtrfsImage {
            crate::btrfs_image::check_profile(&self.profile)?;
        }
        if kind.needs_kernel() {
            must_exist("the kernel image", &self.kernel_image)?;
        }
        if let Some(sb) = self
            .profile
            .secureboot
            .as_ref()
            .filter(|_| kind.needs_rootfs())
        {
            self.secure_boot = Some(crate::SecureBootInputs::resolve(base, sb)?);
        }
        if kind.needs_rootfs() {
            must_exist("the base rootfs", &self.base_rootfs)?;
            self.trusted_keys = read_trusted_keys(base, &self.profile.trust.keys)?;
            self.extensions = crate::extension::resolve_extensions(
                &self.extension_manifests,
                &self.trusted_keys,
            )?;
        }
        if kind.needs_initramfs() {
            must_exist("the slate binary", &self.slate)?;
            if let Some(init) = &self.init {
                must_exist("the init binary", init)?;
            }
            self.resolve_modules()?;
        }
        if kind.needs_uki() {
            must_exist("systemd-stub", &self.stub)?;
        }
        if kind == OutputKind::BtrfsImage {
            must_exist("systemd-boot", &self.systemd_boot)?;
        }
        if kind == OutputKind::Image || kind == OutputKind::Installer {
            match &self.grub_efi {
                Some(grub) => must_exist("the GRUB EFI image", grub)?,
                None => must_exist("systemd-boot", &self.systemd_boot)?,
            }
        }
        Ok(self)
    }

    fn resolve_modules(&mut self) -> Result<(), ImagerError> {
        let dep_path = self.modules_dir.join("modules.dep");
        let read = |path: &Path| crate::read_text_input("the kernel's module index", path);
        let mut deps = ModuleDeps::parse(&read(&dep_path)?)?;
        let builtin = self.modules_dir.join("modules.builtin");
        if builtin.exists() {
            deps = deps.with_builtin(&read(&builtin)?)?;
        }
        self.module_paths = deps
            .resolve(&self.profile.kernel.modules)?
            .into_iter()
            .map(str::to_owned)
            .collect();
        for module in &self.module_paths {
            must_exist("a kernel module", &self.modules_dir.join(module))?;
            let needs = deps.dependencies(module).unwrap_or_default();
            self.module_dependencies.insert(
                module.clone(),
                needs.into_iter().map(str::to_owned).collect(),
            );
        }
        let canonical =
            fs::canonicalize(&self.modules_dir).map_err(|source| ImagerError::MissingInput {
                what: "the modules directory",
                path: self.modules_dir.clone(),
                source,
            })?;
        self.kernel_release = canonical
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| ImagerError::BadInput {
                what: "kernel.modules_dir",
                reason: "its name must be the kernel release".into(),
            })?
            .to_string();
        Ok(())
    }

    /// Seeds the disk's GUIDs: the same image, the same GUIDs.
    pub fn image_id(&self) -> String {
        format!("{}-{}", self.profile.name, self.profile.version)
    }
}

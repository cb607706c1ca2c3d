//! The online upgrade. A bundle arrives over the API as a tar stream of its OCI layout and is
//! kept under `/var/lib/slate/bundles/<manifest hex>` once every digest checks out; nothing
//! touches the boot disk then. The Upgrade sequence later runs *the bundle's own* slate binary
//! (the target version's code, after its digest was checked) in installer mode against the
//! system disk, and reboots into the result.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

use slate_api::{BackendError, Stage, UploadedBundle};
use slate_bundle::{Bundle, INSTALLER_ROLE};
use slate_sequencer::{PhaseListBuilder, RebootMode, Sequence, SequenceKind, TaskError};

use super::node::Node;
use super::sequences::task;
use super::transaction::chain;

pub const BUNDLES_DIR: &str = "/var/lib/slate/bundles";
/// The keys this image trusts (baked in by the imager from the profile's `[trust] keys`).
pub const TRUSTED_KEYS: &str = "/etc/slate/trusted-keys";
/// The prefix of an upgrade image that names a received bundle: `bundle:sha256:<hex>`.
pub const BUNDLE_SCHEME: &str = "bundle:";
const DEFAULT_TRIES: u32 = 3;

/// What the Upgrade sequence installs, and how.
#[derive(Debug, Clone)]
pub struct UpgradePlan {
    pub bundle_dir: PathBuf,
    pub version: String,
    pub tries: u32,
    pub reboot: RebootMode,
    pub allow_downgrade: bool,
    /// Record the upgrade in META and reboot; the next boot's Install sequence performs it.
    pub stage: bool,
}

/// META `StagedUpgradeInstallOptions`: what the staged upgrade needs besides the image.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagedOptions {
    /// The bundle's version when it was staged (for the log; the bundle itself is checked again
    /// before it runs).
    pub version: String,
    pub tries: u32,
    pub allow_downgrade: bool,
}

/// A staged upgrade taken out of META: the bundle reference and its options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Staged {
    pub image: String,
    pub options: StagedOptions,
}

fn invalid(message: impl std::fmt::Display) -> BackendError {
    BackendError::InvalidArgument(message.to_string())
}

/// Only the files of an OCI layout, as plain relative paths: no links, devices, `..` or
/// absolute names can come out of an upload.
fn layout_path(path: &Path) -> Option<PathBuf> {
    let parts: Vec<&str> = path
        .components()
        .filter(|c| *c != Component::CurDir)
        .map(|c| match c {
            Component::Normal(part) => part.to_str(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let ok = match parts.as_slice() {
        ["oci-layout"] | ["index.json"] | ["blobs"] | ["blobs", "sha256"] => true,
        ["blobs", "sha256", hex] => hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        _ => false,
    };
    ok.then(|| parts.iter().collect())
}

struct Counting<'a> {
    inner: &'a mut dyn Read,
    bytes: u64,
}

impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Unpack the tar stream into `dir`, refusing anything that is not a layout file.
fn unpack(body: &mut Counting<'_>, dir: &Path) -> Result<(), BackendError> {
    let mut archive = tar::Archive::new(body);
    let entries = archive
        .entries()
        .map_err(|e| invalid(format!("the upload is not a tar stream: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| invalid(format!("the upload broke: {e}")))?;
        let name = entry
            .path()
            .map_err(|e| invalid(format!("a bad name in the upload: {e}")))?
            .into_owned();
        let relative = layout_path(&name).ok_or_else(|| {
            invalid(format!(
                "{} is not a file of an OCI layout; refusing the upload",
                name.display()
            ))
        })?;
        let target = dir.join(&relative);
        match entry.header().entry_type() {
            tar::EntryType::Directory => fs::create_dir_all(&target)
                .map_err(|e| BackendError::Failed(format!("{}: {e}", target.display())))?,
            tar::EntryType::Regular => {
                if let Some(parent) = target.parent() {
                    fs::create_dir_all(parent)
                        .map_err(|e| BackendError::Failed(format!("{}: {e}", parent.display())))?;
                }
                let mut file = fs::File::create(&target)
                    .map_err(|e| BackendError::Failed(format!("{}: {e}", target.display())))?;
                io::copy(&mut entry, &mut file)
                    .map_err(|e| invalid(format!("the upload broke in {}: {e}", name.display())))?;
            }
            other => {
                return Err(invalid(format!(
                    "{} is a {other:?} entry; a layout holds plain files only",
                    name.display()
                )))
            }
        }
    }
    Ok(())
}

/// Open the bundle in `dir`, check every blob against its digest and its signature against the
/// keys this image trusts. Returns the bundle and who signed it.
fn check(dir: &Path) -> Result<(Bundle, String), String> {
    let bundle = Bundle::open(dir, None).map_err(|e| chain(&e))?;
    slate_trust::verify_blobs(&bundle).map_err(|e| chain(&e))?;
    bundle.blob_ref(INSTALLER_ROLE).map_err(|e| chain(&e))?;
    let keys = slate_trust::load_trusted_keys(Path::new(TRUSTED_KEYS)).map_err(|e| chain(&e))?;
    let verified = slate_trust::verify(&bundle, &keys).map_err(|e| chain(&e))?;
    Ok((bundle, verified.key_id.short()))
}

/// META `VersionFloor` on the system disk, if one is kept.
fn version_floor() -> Result<Option<String>, String> {
    let meta = slate_host::find_partition_by_label("META", None).map_err(|e| e.to_string())?;
    let disk = slate_disk::FileDisk::open_read_only(&meta.device)
        .map_err(|e| format!("{}: {e}", meta.device.display()))?;
    let store = slate_meta::MetaStore::open(disk).map_err(|e| chain(&e))?;
    Ok(store
        .get(slate_meta::tags::VERSION_FLOOR)
        .map(|v| String::from_utf8_lossy(v).trim().to_string()))
}

/// May this node move to `target`? Arch, variant, and no downgrade unless allowed (and above
/// the floor).
fn check_policy(
    node: &Node,
    target: &slate_bundle::BundleManifest,
    allow_downgrade: bool,
) -> Result<slate_trust::UpdateKind, String> {
    let facts = slate_trust::NodeFacts {
        arch: slate_bundle::NATIVE_ARCH.into(),
        variant: node.variant.clone(),
        running_version: node.version.clone(),
        version_floor: version_floor()?,
    };
    slate_trust::check_update(target, &facts, allow_downgrade).map_err(|e| chain(&e))
}

/// `POST /v1/bundles`: unpack beside the others, check, and keep only this one.
pub fn receive(node: &Node, body: &mut dyn Read) -> Result<UploadedBundle, BackendError> {
    static UPLOADS: AtomicU64 = AtomicU64::new(0);
    let root = Path::new(BUNDLES_DIR);
    let staging = root.join(format!(
        ".incoming-{}",
        UPLOADS.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging)
        .map_err(|e| BackendError::Failed(format!("{}: {e}", staging.display())))?;
    let mut counting = Counting {
        inner: body,
        bytes: 0,
    };
    let result = unpack(&mut counting, &staging)
        .and_then(|()| check(&staging).map_err(|e| invalid(format!("the bundle is refused: {e}"))));
    let (bundle, signer) = match result {
        Ok(checked) => checked,
        Err(err) => {
            let _ = fs::remove_dir_all(&staging);
            node.journal
                .info(format_args!("refused an uploaded bundle: {err}"));
            return Err(err);
        }
    };
    let id = bundle.manifest_digest().to_owned();
    let manifest = bundle.manifest().clone();
    let kept = root.join(id.trim_start_matches("sha256:"));
    // One bundle at a time: /var is not a cache of old versions.
    if let Ok(entries) = fs::read_dir(root) {
        for entry in entries.flatten() {
            if entry.path() != staging {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
    fs::rename(&staging, &kept)
        .map_err(|e| BackendError::Failed(format!("keeping the bundle: {e}")))?;
    node.journal.info(format_args!(
        "received bundle {} {} ({id}, {} bytes, signed by key {signer})",
        manifest.name, manifest.version, counting.bytes
    ));
    Ok(UploadedBundle {
        id,
        name: manifest.name,
        version: manifest.version,
        size: counting.bytes,
    })
}

/// The directory and version of the received bundle `bundle:sha256:<hex>`.
fn locate(image: &str) -> Result<(PathBuf, String), BackendError> {
    let id = image.strip_prefix(BUNDLE_SCHEME).ok_or_else(|| {
        invalid(format!(
            "cannot upgrade to {image:?}: upload the bundle first (POST /v1/bundles, or \
             `slate upgrade --image …`) and name it as {BUNDLE_SCHEME}<id>"
        ))
    })?;
    let hex = id
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| invalid(format!("{id:?} is not a bundle id (sha256:<hex>)")))?;
    let bundle_dir = Path::new(BUNDLES_DIR).join(hex);
    let bundle = Bundle::open(&bundle_dir, None)
        .map_err(|e| invalid(format!("no received bundle {id}: {}", chain(&e))))?;
    let version = bundle.manifest().version.clone();
    Ok((bundle_dir, version))
}

/// The plan for `POST /v1/upgrade` with `image` = `bundle:<id>` of a received bundle, refused
/// here (synchronously, before the lock) when the update policy says no.
pub fn plan(node: &Node, req: &slate_api::UpgradeRequest) -> Result<UpgradePlan, BackendError> {
    let (bundle_dir, version) = locate(&req.image)?;
    let bundle = Bundle::open(&bundle_dir, None)
        .map_err(|e| invalid(format!("the received bundle: {}", chain(&e))))?;
    check_policy(node, bundle.manifest(), req.allow_downgrade)
        .map_err(|e| invalid(format!("the upgrade is refused: {e}")))?;
    Ok(UpgradePlan {
        bundle_dir,
        version,
        tries: req.tries.unwrap_or(DEFAULT_TRIES),
        reboot: match req.reboot_mode {
            slate_api::RebootMode::Default => RebootMode::Default,
            slate_api::RebootMode::Powercycle => RebootMode::Powercycle,
        },
        allow_downgrade: req.allow_downgrade,
        stage: req.stage,
    })
}

/// Open META on the system disk for writing.
fn meta_store() -> Result<slate_meta::MetaStore<slate_disk::FileDisk>, String> {
    let meta = slate_host::find_partition_by_label("META", None).map_err(|e| e.to_string())?;
    let disk = slate_disk::FileDisk::open(&meta.device)
        .map_err(|e| format!("{}: {e}", meta.device.display()))?;
    slate_meta::MetaStore::open(disk).map_err(|e| chain(&e))
}

/// Write the staged upgrade into META (both tags in one flush).
fn record_staged(plan: &UpgradePlan) -> Result<(), String> {
    let hex = plan
        .bundle_dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("the bundle has no id")?;
    let options = serde_json::to_vec(&StagedOptions {
        version: plan.version.clone(),
        tries: plan.tries,
        allow_downgrade: plan.allow_downgrade,
    })
    .map_err(|e| e.to_string())?;
    let mut store = meta_store()?;
    store
        .set(
            slate_meta::tags::STAGED_UPGRADE_IMAGE_REF,
            format!("{BUNDLE_SCHEME}sha256:{hex}").into_bytes(),
        )
        .map_err(|e| chain(&e))?;
    store
        .set(slate_meta::tags::STAGED_UPGRADE_INSTALL_OPTIONS, options)
        .map_err(|e| chain(&e))?;
    store.flush().map_err(|e| chain(&e))
}

/// Take a staged upgrade out of META: both tags are deleted and flushed before anything acts
/// on them, so an upgrade that fails (or whose version fails) is never tried again.
pub fn consume_staged(
    store: &mut slate_meta::MetaStore<slate_disk::FileDisk>,
) -> Result<Option<Staged>, String> {
    use slate_meta::tags::{STAGED_UPGRADE_IMAGE_REF, STAGED_UPGRADE_INSTALL_OPTIONS};
    let image = store
        .get(STAGED_UPGRADE_IMAGE_REF)
        .map(|v| String::from_utf8_lossy(v).into_owned());
    let options = store
        .get(STAGED_UPGRADE_INSTALL_OPTIONS)
        .map(<[u8]>::to_vec);
    if image.is_none() && options.is_none() {
        return Ok(None);
    }
    store.delete(STAGED_UPGRADE_IMAGE_REF);
    store.delete(STAGED_UPGRADE_INSTALL_OPTIONS);
    store.flush().map_err(|e| chain(&e))?;
    let image = image.ok_or("META holds staged install options but no image")?;
    let options = match options {
        Some(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| format!("META StagedUpgradeInstallOptions is not readable: {e}"))?,
        None => StagedOptions {
            version: "unknown".into(),
            tries: DEFAULT_TRIES,
            allow_downgrade: false,
        },
    };
    Ok(Some(Staged { image, options }))
}

/// The plan for a staged upgrade found at boot. /var is not mounted yet, so the bundle is only
/// located here; the staged phases mount /var and check it (digests, signature, policy).
pub fn staged_plan(staged: &Staged) -> Result<UpgradePlan, String> {
    let hex = staged
        .image
        .strip_prefix(BUNDLE_SCHEME)
        .and_then(|id| id.strip_prefix("sha256:"))
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| format!("{:?} is not a received bundle", staged.image))?;
    Ok(UpgradePlan {
        bundle_dir: Path::new(BUNDLES_DIR).join(hex),
        version: staged.options.version.clone(),
        tries: staged.options.tries,
        reboot: RebootMode::Default,
        allow_downgrade: staged.options.allow_downgrade,
        stage: false,
    })
}

fn failed(message: impl std::fmt::Display) -> TaskError {
    TaskError::msg(message.to_string())
}

/// `--stage`: record the upgrade in META, then reboot into the Install sequence that runs it.
pub fn stage_sequence(node: &Node, plan: UpgradePlan) -> Sequence<'_> {
    let reboot = plan.reboot;
    PhaseListBuilder::new()
        .append(
            "stage",
            [task(node, "stageUpgrade", move |ctx| {
                record_staged(&plan).map_err(failed)?;
                ctx.log(&format!(
                    "staged the upgrade to {} in META; it runs on the next boot",
                    plan.version
                ));
                Ok(())
            })],
        )
        .append(
            "reboot",
            [task(node, "reboot", move |_| {
                node.set_stage(Stage::Rebooting);
                Err(TaskError::Reboot(reboot))
            })],
        )
        .into_sequence(SequenceKind::Upgrade)
}

pub fn sequence<'a>(node: &'a Node, plan: UpgradePlan) -> Sequence<'a> {
    upgrade_phases(node, plan, PhaseListBuilder::new()).into_sequence(SequenceKind::Upgrade)
}

/// The staged upgrade at boot, inside the Install sequence: /var (where the bundle waits)
/// mounted first, then the same phases as an upgrade on a running node.
pub fn staged_phases<'a>(
    node: &'a Node,
    plan: UpgradePlan,
    builder: PhaseListBuilder<'a>,
) -> PhaseListBuilder<'a> {
    let builder = builder.append(
        "stagedVolumes",
        [task(node, "mountEphemeral", |ctx| {
            let part = slate_host::find_partition_by_label("EPHEMERAL", None)?;
            fs::create_dir_all("/var").map_err(|e| failed(format!("/var: {e}")))?;
            slate_host::mount(
                &part.device,
                Path::new("/var"),
                "ext4",
                slate_host::MsFlags::empty(),
                None,
            )?;
            ctx.log(&format!(
                "{} mounted on /var for the staged upgrade",
                part.device.display()
            ));
            Ok(())
        })],
    );
    upgrade_phases(node, plan, builder)
}

fn upgrade_phases<'a>(
    node: &'a Node,
    plan: UpgradePlan,
    builder: PhaseListBuilder<'a>,
) -> PhaseListBuilder<'a> {
    let installer = plan.bundle_dir.join("installer");
    let (dir, run_installer) = (plan.bundle_dir.clone(), installer.clone());
    let reboot = plan.reboot;
    let plan_allow_downgrade = plan.allow_downgrade;
    builder
        .append(
            "stage",
            [task(node, "announce", move |_| {
                node.set_stage(Stage::Upgrading);
                Ok(())
            })],
        )
        .append(
            "verify",
            [task(node, "verifyBundle", move |ctx| {
                let (bundle, signer) = check(&dir).map_err(failed)?;
                check_policy(node, bundle.manifest(), plan_allow_downgrade).map_err(failed)?;
                let binary = bundle
                    .read_blob(INSTALLER_ROLE)
                    .map_err(|e| failed(chain(&e)))?;
                fs::write(&installer, &binary)
                    .and_then(|()| {
                        fs::set_permissions(&installer, fs::Permissions::from_mode(0o755))
                    })
                    .map_err(|e| failed(format!("{}: {e}", installer.display())))?;
                ctx.log(&format!(
                    "bundle {} {} verified (signed by key {signer}); its installer is {} bytes",
                    bundle.manifest().name,
                    bundle.manifest().version,
                    binary.len()
                ));
                Ok(())
            })],
        )
        .append(
            "install",
            [task(node, "runInstaller", move |ctx| {
                let meta = slate_host::find_partition_by_label("META", None)
                    .map_err(|e| failed(format!("finding the system disk: {e}")))?;
                let running = super::transaction::booted_entry(node).ok_or_else(|| {
                    failed("neither the firmware nor the kernel command line says what booted")
                })?;
                let mut cmd = Command::new(&run_installer);
                cmd.arg0("slate")
                    .args(["installer", "upgrade", "--disk"])
                    .arg(&meta.disk)
                    .arg("--bundle")
                    .arg(&plan.bundle_dir)
                    .args(["--running-entry", &running])
                    .args(["--tries", &plan.tries.to_string()])
                    .args(["--trusted-keys", TRUSTED_KEYS])
                    .args(["--variant", &node.variant]);
                if plan.allow_downgrade {
                    cmd.arg("--allow-downgrade");
                }
                ctx.log(&format!(
                    "running the {} installer on {}",
                    plan.version,
                    meta.disk.display()
                ));
                let out = slate_host::run_command(&mut cmd)?;
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    ctx.log(&format!("installer: {line}"));
                }
                Ok(())
            })],
        )
        .append(
            "reboot",
            [task(node, "reboot", move |_| {
                Err(TaskError::Reboot(reboot))
            })],
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_layout_files_come_out_of_an_upload() {
        let hex = "ab".repeat(32);
        for ok in [
            "oci-layout".to_string(),
            "./index.json".into(),
            "blobs/sha256".into(),
            format!("blobs/sha256/{hex}"),
        ] {
            assert!(layout_path(Path::new(&ok)).is_some(), "{ok}");
        }
        for bad in [
            "../etc/passwd".to_string(),
            "/etc/passwd".into(),
            "blobs/sha256/../../x".into(),
            "blobs/sha256/short".into(),
            format!("blobs/sha512/{hex}"),
            "installer".into(),
        ] {
            assert!(layout_path(Path::new(&bad)).is_none(), "{bad}");
        }
    }

    fn tar_with(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(*kind);
            header.set_size(data.len() as u64);
            header.set_mode(0o644);
            if *kind == tar::EntryType::Symlink {
                header.set_link_name("/etc/shadow").unwrap();
            }
            header.set_cksum();
            builder.append_data(&mut header, name, *data).unwrap();
        }
        builder.into_inner().unwrap()
    }

    #[test]
    fn links_and_foreign_names_are_refused_and_nothing_is_left_outside() {
        let dir = tempfile::tempdir().unwrap();
        let link = tar_with(&[("index.json", tar::EntryType::Symlink, b"")]);
        let mut body: &[u8] = &link;
        let err = unpack(
            &mut Counting {
                inner: &mut body,
                bytes: 0,
            },
            dir.path(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("plain files only"), "{err}");
        let foreign = tar_with(&[("etc/cron.d/x", tar::EntryType::Regular, b"* * * * *")]);
        let mut body: &[u8] = &foreign;
        let err = unpack(
            &mut Counting {
                inner: &mut body,
                bytes: 0,
            },
            dir.path(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("not a file of an OCI layout"),
            "{err}"
        );
        assert!(!dir.path().join("etc").exists());
    }
}

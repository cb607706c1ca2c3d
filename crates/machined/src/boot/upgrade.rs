//! The online upgrade. A bundle arrives over the API as a tar stream of its OCI layout
//! ([`receive`]: signature first, every blob hashed once as it arrives) and is kept under
//! `/var/lib/slate/bundles/<manifest hex>` — up to three of them, until installed or removed by
//! the retention rule (`receive.rs`); nothing touches the boot disk then. The Upgrade
//! sequence later runs *the bundle's own* slate binary (the target version's code, after its
//! digest was checked) in installer mode against the system disk, and reboots into the result.
//!
//! Each blob is hashed at most once per boot: what the upload verified is remembered and handed
//! to `plan` and the Upgrade sequence, which check the signature again (documents only) and the
//! sizes, not the bytes. A staged upgrade runs after a reboot, so it hashes each blob once more.

pub mod kept_index;
pub mod pull;
mod receive;
mod sealed_uki;

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use slate_api::{BackendError, Stage, UploadedBundle};
use slate_bundle::{Bundle, Digest, VerifiedBlobs, INSTALLER_ROLE};
use slate_profile::image_contract::SECURE_BOOT_DB;
use slate_sequencer::{
    error_chain as chain, PhaseListBuilder, RebootMode, Sequence, SequenceKind, TaskError,
};
use slate_trust::PublicKey;

use crate::base::node::{Node, UpgradePlan};
use crate::base::task::{failed, task};
use crate::boot::drain::DrainReason;
use receive::invalid;

pub const BUNDLES_DIR: &str = "/var/lib/slate/bundles";
/// The keys this image trusts (baked in by the imager from the profile's `[trust] keys`).
pub use slate_profile::image_contract::TRUSTED_KEYS;
/// The prefix of an upgrade image that names a received bundle: `bundle:sha256:<hex>`.
pub const BUNDLE_SCHEME: &str = "bundle:";
const DEFAULT_TRIES: u32 = slate_bootspec::DEFAULT_INSTALL_TRIES;

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

/// Where the received (or pulled) bundle `id` is kept.
pub fn bundle_dir(id: &Digest) -> PathBuf {
    Path::new(BUNDLES_DIR).join(id.hex())
}

/// Make room for a pull into `dir` by the retention rule of received bundles (`receive.rs`),
/// `dir` counted as the newest: /var is not a cache of old versions, but a bundle answered to
/// an upload stays until the rule removes it. `dir` itself may hold an interrupted pull to
/// resume.
pub fn keep_only(dir: &Path) {
    receive::retain(Path::new(BUNDLES_DIR), Some(dir));
}

/// At start: removes the staging directories uploads of an earlier process left under
/// [`BUNDLES_DIR`] and applies the retention rule; how many staging directories went.
pub fn tidy_received() -> usize {
    receive::tidy(Path::new(BUNDLES_DIR))
}

/// The plan for a bundle the update agent pulled into `dir` by its digest `id`: the checks of
/// an upload (signature against the image's keys, the update policy), and the version the
/// release index promised.
pub fn plan_pulled(
    node: &Node,
    dir: &Path,
    id: &Digest,
    verified: VerifiedBlobs,
    version: &str,
) -> Result<UpgradePlan, String> {
    let keys = trusted_keys()?;
    let (bundle, signer) = check_signed(dir, id, verified, &keys)?;
    let manifest = bundle.manifest();
    if manifest.version != version {
        return Err(format!(
            "the release index says {version}, but bundle {id} is version {}",
            manifest.version
        ));
    }
    check_policy(node, manifest, false).map_err(|e| format!("the upgrade is refused: {e}"))?;
    node.journal.info(format_args!(
        "bundle {} {version} ({id}) is signed by key {signer}",
        manifest.name
    ));
    Ok(UpgradePlan {
        bundle_dir: dir.to_path_buf(),
        bundle_id: id.clone(),
        verified: bundle.verified_blobs(),
        version: version.to_owned(),
        tries: DEFAULT_TRIES,
        reboot: RebootMode::Default,
        allow_downgrade: false,
        stage: false,
        replace: false,
    })
}

/// The tries of `POST /v1/upgrade` (the default when it names none), or a bad request (HTTP
/// 400) when they are outside [`slate_bootspec::INSTALL_TRIES`]: 0 would mark the version bad
/// before it boots, and a counter above `INT_MAX` reads as uncounted, so the version would never
/// be rolled back. Refused before the lock is taken or a bundle looked at: the bundle's own
/// installer checks again, but only after the request was answered "accepted".
pub fn requested_tries(req: &slate_api::UpgradeRequest) -> Result<u32, BackendError> {
    slate_bootspec::check_install_tries(req.tries.unwrap_or(DEFAULT_TRIES))
        .map_err(|e| invalid(format!("the upgrade is refused: {e}")))
}

/// The bundle `bundle:sha256:<hex>` names (lower-case hex only, as its directory is named).
fn bundle_id(image: &str) -> Result<Digest, String> {
    let id = image
        .strip_prefix(BUNDLE_SCHEME)
        .ok_or_else(|| format!("{image:?} is not a received bundle ({BUNDLE_SCHEME}<id>)"))?;
    Digest::parse(id).map_err(|e| format!("{id:?} is not a bundle id (sha256:<hex>): {e}"))
}

/// Open the received bundle `id` in `dir`; blobs in `verified` are not hashed again. The
/// directory's index must still name `id`.
fn open_received(dir: &Path, id: &Digest, verified: VerifiedBlobs) -> Result<Bundle, String> {
    let bundle = Bundle::open_with(dir, None, verified).map_err(|e| chain(&e))?;
    if bundle.digest() != id {
        return Err(format!(
            "{} holds bundle {}, not {id}",
            dir.display(),
            bundle.digest()
        ));
    }
    Ok(bundle)
}

/// Open the received bundle `id` and check its signature against `keys` (documents only: no
/// blob is read). Returns the bundle and who signed it.
fn check_signed(
    dir: &Path,
    id: &Digest,
    verified: VerifiedBlobs,
    keys: &[PublicKey],
) -> Result<(Bundle, String), String> {
    let bundle = open_received(dir, id, verified)?;
    let signed = slate_trust::verify(&bundle, keys).map_err(|e| chain(&e))?;
    bundle.blob_ref(INSTALLER_ROLE).map_err(|e| chain(&e))?;
    Ok((bundle, signed.key_id.short()))
}

fn trusted_keys() -> Result<Vec<PublicKey>, String> {
    slate_trust::load_trusted_keys(Path::new(TRUSTED_KEYS)).map_err(|e| chain(&e))
}

/// Copy the bundle's installer binary to `path`, executable. It is verified as it is copied
/// unless the bundle verified it already; a copy that fails leaves nothing behind.
fn write_installer(bundle: &Bundle, path: &Path) -> Result<u64, String> {
    let result = (|| -> Result<u64, String> {
        let mut blob = bundle.open_blob(INSTALLER_ROLE).map_err(|e| chain(&e))?;
        let mut file = fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let bytes = io::copy(&mut blob, &mut file)
            .map_err(|e| format!("copying the installer to {}: {e}", path.display()))?;
        file.set_permissions(fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(bytes)
    })();
    if result.is_err() {
        let _ = fs::remove_file(path);
    }
    result
}

/// META `VersionFloor` on the system disk, if one is kept.
fn version_floor() -> Result<Option<String>, String> {
    let store = crate::base::system_disk::open_meta(false)?;
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
    if node.host == crate::base::node::Host::Systemd {
        booted_through_slate(node.booted_entry.as_deref())?;
    }
    let facts = slate_trust::NodeFacts {
        arch: slate_bundle::NATIVE_ARCH.into(),
        variant: node.variant.clone(),
        running_version: node.version.clone(),
        version_floor: version_floor()?,
    };
    slate_trust::check_update(target, &facts, allow_downgrade).map_err(|e| chain(&e))
}

/// On a systemd image, slate updates only a machine it booted: through UEFI (systemd-boot
/// said which entry it started) from one of slate's UKIs. Anything else — a legacy BIOS boot,
/// another loader, a kernel started by hand — would get an entry it never boots.
pub fn booted_through_slate(entry: Option<&str>) -> Result<(), String> {
    match entry {
        Some(entry) if entry.starts_with("slate-") && entry.ends_with(".efi") => Ok(()),
        Some(entry) => Err(format!(
            "this machine booted {entry:?}, not one of slate's UKIs (slate-*.efi): slate \
             updates only a machine that booted one of its own entries"
        )),
        None => Err(
            "this machine did not boot through systemd-boot under UEFI (no \
             LoaderEntrySelected): slate updates only a machine that booted one of its own \
             UKIs"
                .into(),
        ),
    }
}

/// `POST /v1/bundles`: unpack in a staging directory of its own, check (signature first, each
/// blob hashed once as it arrives), keep it by its id, and apply the retention rule.
pub fn receive(node: &Node, body: &mut dyn Read) -> Result<UploadedBundle, BackendError> {
    let refuse = |err: BackendError| {
        node.journal
            .info(format_args!("refused an uploaded bundle: {err}"));
        err
    };
    // Before a byte of the body is read: a node without anchors takes nothing.
    let keys =
        trusted_keys().map_err(|e| refuse(invalid(format!("the bundle is refused: {e}"))))?;
    let kept = receive::keep_upload(Path::new(BUNDLES_DIR), &keys, body).map_err(refuse)?;
    let id = kept.received.bundle.digest().clone();
    let manifest = kept.received.bundle.manifest().clone();
    // Best effort: without it, the installer hashes the UKI's file again.
    match kept.sealed {
        Ok(sealed) => sealed_uki::keep(sealed),
        Err(e) => node.journal.info(format_args!(
            "the UKI of bundle {id} is not kept sealed: {e}"
        )),
    }
    node.journal.info(format_args!(
        "received bundle {} {} ({id}, {} bytes, signed by key {})",
        manifest.name, manifest.version, kept.bytes, kept.received.signed
    ));
    Ok(UploadedBundle {
        id: id.to_string(),
        name: manifest.name,
        version: manifest.version,
        size: kept.bytes,
    })
}

/// The received bundle `image` (`bundle:sha256:<hex>`) names, opened: blobs its upload
/// verified in this boot are not hashed again.
fn locate(image: &str) -> Result<(Digest, Bundle), BackendError> {
    if !image.starts_with(BUNDLE_SCHEME) {
        return Err(invalid(format!(
            "cannot upgrade to {image:?}: upload the bundle first (POST /v1/bundles, or \
             `slate upgrade --image …`) and name it as {BUNDLE_SCHEME}<id>"
        )));
    }
    let id = bundle_id(image).map_err(invalid)?;
    let bundle = open_received(&bundle_dir(&id), &id, receive::remembered(&id))
        .map_err(|e| invalid(format!("no received bundle {id}: {e}")))?;
    Ok((id, bundle))
}

/// The plan for `POST /v1/upgrade` with `image` = `bundle:<id>` of a received bundle, refused
/// here (synchronously, before the lock) when the update policy says no.
pub fn plan(node: &Node, req: &slate_api::UpgradeRequest) -> Result<UpgradePlan, BackendError> {
    let tries = requested_tries(req)?;
    crate::boot::replace::check_request(req)?;
    let (id, bundle) = locate(&req.image)?;
    check_policy(node, bundle.manifest(), req.allow_downgrade)
        .map_err(|e| invalid(format!("the upgrade is refused: {e}")))?;
    Ok(UpgradePlan {
        bundle_dir: bundle_dir(&id),
        bundle_id: id,
        verified: bundle.verified_blobs(),
        version: bundle.manifest().version.clone(),
        tries,
        reboot: req.reboot_mode,
        allow_downgrade: req.allow_downgrade,
        stage: req.stage,
        replace: req.replace,
    })
}

/// Open META on the system disk for writing.
fn meta_store() -> Result<crate::base::system_disk::SystemMeta, String> {
    crate::base::system_disk::open_meta(true)
}

/// Write the staged upgrade into META (both tags in one flush).
fn record_staged(plan: &UpgradePlan) -> Result<(), String> {
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
            format!("{BUNDLE_SCHEME}{}", plan.bundle_id).into_bytes(),
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
    store: &mut crate::base::system_disk::SystemMeta,
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
    let id = bundle_id(&staged.image)?;
    // Written by this node's machined after the same check; META is a disk all the same.
    slate_bootspec::check_install_tries(staged.options.tries)
        .map_err(|e| format!("META StagedUpgradeInstallOptions: {e}"))?;
    Ok(UpgradePlan {
        bundle_dir: bundle_dir(&id),
        bundle_id: id,
        // A new boot: nothing was verified by this process yet.
        verified: VerifiedBlobs::new(),
        version: staged.options.version.clone(),
        tries: staged.options.tries,
        reboot: RebootMode::Default,
        allow_downgrade: staged.options.allow_downgrade,
        stage: false,
        replace: false,
    })
}

/// `--stage`: record the upgrade in META, then reboot into the Install sequence that runs it.
pub fn stage_sequence(node: &Node, plan: UpgradePlan) -> Sequence<'_> {
    let reboot = plan.reboot;
    let reason = DrainReason::StagedUpgrade {
        to: plan.version.clone(),
    };
    crate::boot::drain::drain(node, PhaseListBuilder::new(), reason)
        .append(
            "stage",
            [task(node, "stageUpgrade", move |ctx| {
                // Kept for the next boot: the retention rule must not remove it meanwhile.
                receive::hold(&plan.bundle_id);
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
    upgrade_phases(node, plan, PhaseListBuilder::new(), true).into_sequence(SequenceKind::Upgrade)
}

/// The staged upgrade at boot, inside the Install sequence: /var (where the bundle waits)
/// mounted first, then the same phases as an upgrade on a running node.
pub fn staged_phases<'a>(
    node: &'a Node,
    plan: UpgradePlan,
    builder: PhaseListBuilder<'a>,
) -> PhaseListBuilder<'a> {
    // Under systemd, slate's init mounted /var before systemd started.
    let builder = builder.append_when(
        node.host == crate::base::node::Host::Pid1,
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
    upgrade_phases(node, plan, builder, false)
}

/// The upgrade's phases; `live`: on a running node (drained before the install), not at boot.
fn upgrade_phases<'a>(
    node: &'a Node,
    plan: UpgradePlan,
    builder: PhaseListBuilder<'a>,
    live: bool,
) -> PhaseListBuilder<'a> {
    let installer = plan.bundle_dir.join("installer");
    let (dir, run_installer) = (plan.bundle_dir.clone(), installer.clone());
    let (id, verified) = (plan.bundle_id.clone(), plan.verified.clone());
    let reboot = plan.reboot;
    let plan_allow_downgrade = plan.allow_downgrade;
    let held = plan.bundle_id.clone();
    let replace_plan = plan.clone();
    // At boot (a staged upgrade) nothing runs yet: the reboot that staged it drained the node.
    let drain_reason = live.then(|| DrainReason::Upgrade {
        to: plan.version.clone(),
    });
    builder
        .append(
            "stage",
            [task(node, "announce", move |_| {
                // The retention rule leaves the bundle alone while it is installed.
                receive::hold(&held);
                node.set_stage(Stage::Upgrading);
                Ok(())
            })],
        )
        .append(
            "verify",
            [task(node, "verifyBundle", move |ctx| {
                // Signature, then policy, then blobs: nothing large is read for a bundle that
                // is refused. Blobs the upload verified in this boot are checked for size only.
                let keys = trusted_keys().map_err(failed)?;
                let (bundle, signer) =
                    check_signed(&dir, &id, verified.clone(), &keys).map_err(failed)?;
                check_policy(node, bundle.manifest(), plan_allow_downgrade).map_err(failed)?;
                bundle.verify_blobs().map_err(|e| failed(chain(&e)))?;
                // A UKI this node's firmware would refuse must never reach its ESP.
                if let Some(db) = crate::boot::secure_boot::trusted_db().map_err(failed)? {
                    let line =
                        crate::boot::secure_boot::check_bundle_uki(&bundle, &db).map_err(failed)?;
                    ctx.log(&line);
                }
                let bytes = write_installer(&bundle, &installer).map_err(failed)?;
                ctx.log(&format!(
                    "bundle {} {} verified (signed by key {signer}); its installer is {bytes} \
                     bytes",
                    bundle.manifest().name,
                    bundle.manifest().version,
                ));
                Ok(())
            })],
        )
        // After the checks (a refused bundle leaves the services running), before anything is
        // written: the node's workload is down before its next version is installed, and a
        // drain command that fails refuses the upgrade.
        .append(
            "drain",
            [task(node, "drainNode", move |ctx| match &drain_reason {
                Some(reason) => crate::boot::drain::task(ctx, node, reason),
                None => Ok(()),
            })],
        )
        .append(
            "replace",
            [task(node, "recordReplace", move |ctx| {
                // Before the installer: a replacement is never installed without its record.
                let recorded = crate::boot::replace::record_before_install(&replace_plan)
                    .map_err(|e| failed(format!("META ReplaceOnBoot: {e}")))?;
                if let Some(line) = recorded {
                    ctx.log(&line);
                }
                Ok(())
            })],
        )
        .append(
            "install",
            [task(node, "runInstaller", move |ctx| {
                let meta = crate::base::system_disk::meta_partition()
                    .map_err(|e| failed(format!("finding the system disk: {e}")))?;
                crate::base::system_disk::esp_unmounted(&meta.disk).map_err(failed)?;
                let running = crate::settle::transaction::booted_entry(node).ok_or_else(|| {
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
                if Path::new(SECURE_BOOT_DB).exists() {
                    cmd.args(["--secureboot-db", SECURE_BOOT_DB]);
                }
                // The upload's UKI, sealed: not hashed again (an older installer ignores it).
                let sealed = sealed_uki::of(&plan.bundle_id);
                if let Some((fd, uki)) = &sealed {
                    let raw = slate_host::inherit_fd(&mut cmd, fd);
                    cmd.env(slate_bundle::UKI_FD_ENV, raw.to_string())
                        .env(slate_bundle::UKI_DIGEST_ENV, uki.to_string());
                }
                ctx.log(&format!(
                    "running the {} installer on {}",
                    plan.version,
                    meta.disk.display()
                ));
                let out = slate_host::run_command(&mut cmd)?;
                drop(sealed);
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    ctx.log(&format!("installer: {line}"));
                }
                // Installed: its signed documents are kept on STATE for the next upgrade's
                // delta (issue 41). Best effort: without them the next one downloads whole.
                ctx.log(&keep_documents(node, &plan));
                // Installed: the bundle has served (the retention rule's "used by an upgrade").
                if let Err(e) = receive::used(&plan.bundle_dir, &plan.bundle_id) {
                    ctx.log(&format!("removing the installed bundle: {e}"));
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

/// Keep the installed bundle's documents on STATE (`kept_index`); the line to log.
fn keep_documents(node: &Node, plan: &UpgradePlan) -> String {
    let kept = open_received(&plan.bundle_dir, &plan.bundle_id, plan.verified.clone()).and_then(
        |bundle| kept_index::keep(&crate::base::paths::state_dir(), &bundle, &node.version),
    );
    match kept {
        Ok(dir) => format!(
            "the chunk index of {} is kept in {} for the next upgrade's delta",
            plan.version,
            dir.display()
        ),
        Err(e) => format!(
            "the chunk index of {} is not kept ({e}): the next upgrade downloads whole",
            plan.version
        ),
    }
}

#[cfg(test)]
#[path = "upgrade_tests.rs"]
mod tests;

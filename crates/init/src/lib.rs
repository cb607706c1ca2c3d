//! The `init` role: PID 1 of the initramfs.
//!
//! It loads the kernel modules the image needs, mounts the root squashfs (with any system
//! extensions layered above it by a read-only overlay) — or, when the command line names a
//! `root=` (a Btrfs snapshot root: `root=UUID=… rootflags=subvol=… rootfstype=btrfs rw`),
//! that block device once the kernel has probed it — moves `/dev`, `/proc`, `/sys` and `/run`
//! into it, switches root and executes the real init. If anything fails it says so on the
//! kernel log and reboots (or halts with `panic=0`), because PID 1 exiting panics the kernel
//! and a panic message would hide the reason.

use std::convert::Infallible;
use std::ffi::OsString;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, ensure, Context as _, Result};
use slate_host::{self as host, KmsgLogger, ModuleLoad, MsFlags};
use slate_profile::image_contract::{EXTENSIONS as EXTENSIONS_DIR, MODULES_LOAD, ROOTFS_IMAGE};
use slate_profile::{parse_extensions_manifest, ExtensionEntry};

mod modules;
mod parse;
pub mod systemd;
mod systemd_var;

pub use modules::{load_in_order, parse_modules_load, Loaded, ModuleToLoad, MAX_LOADERS};
pub use parse::{block_root, BlockRoot, RootSource};
use parse::{failure_action, init_program, module_name, plan_layers, Layer};
use slate_host::AfterFailure;

const MODULES_DIR: &str = "/lib/modules";
const MANIFEST: &str = "manifest";
const RUN: &str = "/run";
const LAYERS_DIR: &str = "/run/slate/layers";
const NEW_ROOT: &str = "/newroot";
const DEFAULT_INIT: &str = "/sbin/init";
/// Long enough to read the error on a console, short enough that boot counting takes over soon.
const REBOOT_DELAY: Duration = Duration::from_secs(10);

/// Runs as the initramfs init. Returns only if this process is not PID 1 (refusing to run);
/// as PID 1 it either executes the real init or reboots/halts.
///
/// `init_args` are the arguments the kernel gave init (`single`, anything after `--`); they are
/// handed on to the real init.
pub fn run(init_args: Vec<OsString>) -> Result<()> {
    if !host::is_pid1() {
        bail!(
            "slate init is the initramfs init and must run as PID 1 (this is PID {}): \
             it mounts over /, switches root and reboots the machine on failure",
            std::process::id()
        );
    }
    let pseudo = host::mount_pseudo_filesystems();
    // Before opening /dev/kmsg, so the log does not take a missing stdio descriptor.
    let console = host::ensure_console_stdio();
    let log = KmsgLogger::open("initramfs");
    if let Err(err) = console {
        log.warn(format_args!(
            "no console on stdio: {:#}",
            anyhow::Error::from(err)
        ));
    }
    let outcome = pseudo
        .context("mounting /proc, /sys and /dev")
        .and_then(|()| boot(&log, init_args));
    let Err(err) = outcome;
    log.error(format_args!("boot failed: {err:#}"));
    fail(&log)
}

/// The happy path; returns only with the error that stopped it.
fn boot(log: &KmsgLogger, init_args: Vec<OsString>) -> Result<Infallible> {
    if let Err(err) = host::disable_kmsg_ratelimit() {
        log.warn(format_args!(
            "{:#} (some log lines may be dropped)",
            anyhow::Error::from(err)
        ));
    }
    log.info(format_args!("starting slate {}", env!("CARGO_PKG_VERSION")));
    let cmdline = host::kernel_cmdline()?;
    let init = init_program(&cmdline)?.to_string();
    let root_init = systemd::root_init()?;

    let started = host::since_boot();
    load_modules(log)?;
    let modules_loaded = host::since_boot();

    // A tmpfs on /run from the start: the layer mount points live there, and it moves into
    // the new root with them, so the real system sees its layers under /run/slate/layers.
    let run = Path::new(RUN);
    create_dir(run)?;
    host::mount(
        "tmpfs",
        run,
        "tmpfs",
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755"),
    )?;

    let new_root = Path::new(NEW_ROOT);
    create_dir(new_root)?;
    match block_root(&cmdline)? {
        Some(root) => mount_block_root(log, &root, new_root)
            .context("mounting the root filesystem named by root=")?,
        None => mount_image_root(log, new_root)?,
    }
    // For machined's boot breakdown (`slate status --boot-times`); /run moves with the root.
    let milestones = Path::new(host::INIT_MILESTONES);
    for (name, at) in [
        ("init started", started),
        ("modules loaded", modules_loaded),
        ("root mounted", host::since_boot()),
    ] {
        host::record_milestone_at(milestones, name, at);
    }

    for dir in [RUN, "/dev", "/proc", "/sys"] {
        let target = new_root.join(dir.trim_start_matches('/'));
        // symlink_metadata: an absolute symlink would resolve against the initramfs, not the
        // new root.
        if std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_dir()) {
            host::move_mount(Path::new(dir), &target)?;
        } else {
            log.warn(format_args!(
                "the new root has no directory {dir}: that mount stays behind in the initramfs"
            ));
        }
    }
    host::switch_root(new_root)?;
    host::record_milestone(milestones, "switched root");
    if root_init == systemd::RootInit::Systemd {
        systemd::prepare(log).context("setting up /var, STATE and /etc for systemd")?;
    }
    log.info(format_args!("switched root; executing {init}"));
    let Err(err) = host::exec(Path::new(&init), &init_args);
    Err(err).with_context(|| format!("starting the real init (slate.init={init})"))
}

/// The squashfs root in the initramfs, with the system extensions layered above it.
fn mount_image_root(log: &KmsgLogger, new_root: &Path) -> Result<()> {
    let extensions = find_extensions(Path::new(EXTENSIONS_DIR))?;
    for name in &extensions.unlisted {
        log.warn(format_args!(
            "ignoring {EXTENSIONS_DIR}/{name}: not listed in {MANIFEST}"
        ));
    }
    for ext in &extensions.ordered {
        check_extension(Path::new(EXTENSIONS_DIR), ext)?;
        log.info(format_args!(
            "system extension {} {} ({}, {} bytes) matches its digest",
            ext.name, ext.version, ext.file, ext.size
        ));
    }
    let files: Vec<String> = extensions.ordered.iter().map(|e| e.file.clone()).collect();
    let layers = plan_layers(
        Path::new(ROOTFS_IMAGE),
        Path::new(EXTENSIONS_DIR),
        &files,
        Path::new(LAYERS_DIR),
    );
    mount_root_stack(log, &layers, new_root).context("mounting the root filesystem")?;
    Ok(())
}

/// How long a root device may take to appear after its driver loaded (virtio and AHCI probe
/// in well under a second; USB storage can take several).
const ROOT_DEVICE_WAIT: Duration = Duration::from_secs(30);

/// A root on a block device (a Btrfs snapshot, `root=UUID=… rootflags=subvol=…`): found by
/// its filesystem UUID once the kernel has probed it, then mounted as the command line says.
fn mount_block_root(log: &KmsgLogger, root: &BlockRoot, new_root: &Path) -> Result<()> {
    let started = std::time::Instant::now();
    let (device, probed) = loop {
        let found = match &root.source {
            RootSource::Uuid(uuid) => host::find_filesystem_by_uuid(uuid)?
                .map(|(device, identity)| (device, Some(identity.fstype))),
            RootSource::Device(device) => device.exists().then(|| (device.clone(), None)),
        };
        if let Some(found) = found {
            break found;
        }
        ensure!(
            started.elapsed() < ROOT_DEVICE_WAIT,
            "no block device holds the root {:?} after {} s (is its disk driver in the \
             profile's modules?)",
            root.source,
            ROOT_DEVICE_WAIT.as_secs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let fstype = root.fstype.as_deref().or(probed).context(
        "rootfstype= is not given and the root device's filesystem is not one slate knows",
    )?;
    let flags = if root.read_write {
        MsFlags::empty()
    } else {
        MsFlags::MS_RDONLY
    };
    host::mount(&device, new_root, fstype, flags, root.flags.as_deref())?;
    log.info(format_args!(
        "mounted {} ({fstype}{}{}) on {} after {} ms",
        device.display(),
        root.flags
            .as_deref()
            .map(|f| format!(", {f}"))
            .unwrap_or_default(),
        if root.read_write { ", rw" } else { ", ro" },
        new_root.display(),
        started.elapsed().as_millis()
    ));
    Ok(())
}

fn fail(log: &KmsgLogger) -> ! {
    let cmdline = host::kernel_cmdline().ok();
    match failure_action(cmdline.as_deref()) {
        AfterFailure::Halt => {
            log.error("panic=0 on the kernel command line: halting here");
        }
        AfterFailure::Reboot(delay) => {
            log.error(format_args!("rebooting in {} s", delay.as_secs()));
            std::thread::sleep(delay);
            let Err(err) = host::reboot();
            log.error(format_args!(
                "{:#}; halting instead",
                anyhow::Error::from(err)
            ));
        }
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn load_modules(log: &KmsgLogger) -> Result<()> {
    let text = match std::fs::read_to_string(MODULES_LOAD) {
        Ok(text) => text,
        Err(err) if err.kind() == ErrorKind::NotFound => {
            log.info(format_args!("no {MODULES_LOAD}: loading no modules"));
            return Ok(());
        }
        Err(err) => return Err(err).with_context(|| format!("reading {MODULES_LOAD}")),
    };
    let modules = parse_modules_load(&text).with_context(|| format!("parsing {MODULES_LOAD}"))?;
    if modules.is_empty() {
        return Ok(());
    }
    let release = module_release(Path::new(MODULES_DIR))?;
    match host::kernel_release() {
        Ok(running) if running != release => log.warn(format_args!(
            "modules are for kernel {release} but the running kernel is {running}"
        )),
        Ok(_) => {}
        Err(err) => log.warn(format_args!("{:#}", anyhow::Error::from(err))),
    }
    let dir = Path::new(MODULES_DIR).join(&release);
    let total = modules.len();
    let loaders = std::thread::available_parallelism().map_or(1, |n| n.get());
    load_in_order(
        &modules,
        loaders,
        |module| {
            if let Some(why) = host::unusable_here(module_name(module)) {
                return Ok(ModuleLoad::Unusable(why));
            }
            host::load_module(&dir.join(module))
                .with_context(|| format!("loading module {}", module_name(module)))
        },
        |loaded| {
            let note = match loaded.outcome {
                ModuleLoad::AlreadyLoaded => " (already loaded)".to_owned(),
                ModuleLoad::NoDevice => " (no such device here: skipped)".to_owned(),
                ModuleLoad::Unusable(why) => format!(" ({why}: not loaded)"),
                ModuleLoad::Loaded => String::new(),
            };
            log.info(format_args!(
                "loaded {}/{total} {}{note} in {} ms",
                loaded.done,
                module_name(loaded.path),
                loaded.took.as_millis()
            ));
        },
    )
}

/// The one kernel release directory under `/lib/modules`.
fn module_release(dir: &Path) -> Result<String> {
    let mut releases = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            releases.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    match <[String; 1]>::try_from(releases) {
        Ok([release]) => Ok(release),
        Err(found) => bail!(
            "expected exactly one kernel release directory in {}, found {found:?}",
            dir.display()
        ),
    }
}

/// The extension images to layer, from `<dir>/manifest` (docs/formats.md §6.4).
#[derive(Debug, Default, PartialEq, Eq)]
struct Extensions {
    /// In manifest order: the first is the topmost layer.
    ordered: Vec<ExtensionEntry>,
    /// `.sqsh` files present but not in the manifest.
    unlisted: Vec<String>,
}

fn find_extensions(dir: &Path) -> Result<Extensions> {
    let mut present = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries {
                let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.ends_with(".sqsh") {
                    present.push(name);
                }
            }
        }
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Extensions::default()),
        Err(err) => return Err(err).with_context(|| format!("listing {}", dir.display())),
    }
    present.sort();
    let manifest = dir.join(MANIFEST);
    let text = match std::fs::read_to_string(&manifest) {
        Ok(text) => text,
        Err(err) if err.kind() == ErrorKind::NotFound && present.is_empty() => {
            return Ok(Extensions::default())
        }
        Err(err) if err.kind() == ErrorKind::NotFound => bail!(
            "{} holds extension images {present:?} but no {MANIFEST}: their layering order \
             is unknown",
            dir.display()
        ),
        Err(err) => return Err(err).with_context(|| format!("reading {}", manifest.display())),
    };
    let ordered = parse_extensions_manifest(&text)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("parsing {}", manifest.display()))?;
    for ext in &ordered {
        let path = dir.join(&ext.file);
        ensure!(
            path.is_file(),
            "{} lists {}, but {} is not a file",
            manifest.display(),
            ext.file,
            path.display()
        );
    }
    let unlisted = present
        .into_iter()
        .filter(|p| !ordered.iter().any(|e| &e.file == p))
        .collect();
    Ok(Extensions { ordered, unlisted })
}

/// An extension image must be exactly what the manifest (inside the signed UKI) says: another
/// size or digest is corruption, and the boot stops here rather than run an unknown root.
fn check_extension(dir: &Path, ext: &ExtensionEntry) -> Result<()> {
    use sha2::{Digest as _, Sha256};
    use std::io::Read as _;
    let path = dir.join(&ext.file);
    let mut file =
        std::fs::File::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut size = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        size += n as u64;
        hasher.update(&buf[..n]);
    }
    ensure!(
        size == ext.size,
        "system extension {} {}: {} is {size} bytes, the image's manifest says {}: the image is \
         corrupt, refusing to layer it",
        ext.name,
        ext.version,
        path.display(),
        ext.size
    );
    let digest = format!("sha256:{:x}", hasher.finalize());
    ensure!(
        digest == ext.digest,
        "system extension {} {}: {} has digest {digest}, the image's manifest says {}: the image \
         is corrupt, refusing to layer it",
        ext.name,
        ext.version,
        path.display(),
        ext.digest
    );
    Ok(())
}

/// Mounts the layers read-only at `target`: a single layer directly, several as an overlay.
/// Returns the loop devices used.
fn mount_root_stack(log: &KmsgLogger, layers: &[Layer], target: &Path) -> Result<Vec<PathBuf>> {
    if let [only] = layers {
        return Ok(vec![mount_layer(log, only, target)?]);
    }
    let mut devices = Vec::new();
    for layer in layers {
        create_dir(&layer.mountpoint)?;
        devices.push(mount_layer(log, layer, &layer.mountpoint)?);
    }
    let lowers: Vec<&Path> = layers.iter().map(|l| l.mountpoint.as_path()).collect();
    host::mount_overlay_read_only(&lowers, target)?;
    let order: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
    log.info(format_args!(
        "mounted overlay on {} (top to bottom: {})",
        target.display(),
        order.join(", ")
    ));
    Ok(devices)
}

fn mount_layer(log: &KmsgLogger, layer: &Layer, at: &Path) -> Result<PathBuf> {
    let image = &layer.image;
    let device = host::attach_loop_read_only(image)
        .with_context(|| format!("layer {}: attaching {}", layer.name, image.display()))?;
    host::mount(&device, at, "squashfs", MsFlags::MS_RDONLY, None)
        .with_context(|| format!("layer {}: mounting {}", layer.name, image.display()))?;
    log.info(format_args!(
        "mounted {} ({}) read-only on {} as {}",
        image.display(),
        device.display(),
        at.display(),
        layer.name
    ));
    Ok(device)
}

fn create_dir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))
}

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;

//! The root tree the imager assembles: what it holds (a program, as the node will see it) and
//! the files the imager writes into it. Shared by the root's assembly (`artifacts`), the
//! systemd image's units (`systemd_root`) and the Btrfs image.

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use crate::extension::Node;
use crate::ImagerError;

/// Write a file the imager generates into the root tree, replacing what the base had there.
/// Modes are explicit (files 0644, directories created here 0755) so the build host's umask
/// cannot reach the image.
pub(crate) fn write_generated(path: &Path, contents: &[u8]) -> Result<(), ImagerError> {
    let write_err = |path: &Path| {
        let path = path.to_owned();
        move |source| ImagerError::Output { path, source }
    };
    if let Some(parent) = path.parent() {
        let mut missing = Vec::new();
        let mut dir = Some(parent);
        while let Some(d) = dir.filter(|d| !d.exists()) {
            missing.push(d.to_owned());
            dir = d.parent();
        }
        for d in missing.iter().rev() {
            fs::create_dir(d).map_err(write_err(d))?;
            fs::set_permissions(d, fs::Permissions::from_mode(0o755)).map_err(write_err(d))?;
        }
    }
    if fs::symlink_metadata(path).is_ok() {
        fs::remove_file(path).map_err(write_err(path))?;
    }
    fs::write(path, contents).map_err(write_err(path))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644)).map_err(write_err(path))
}

/// Whether the root at `tree` holds an executable file at `path` (as the node will see it:
/// symbolic links followed inside `tree`, an absolute target meaning `tree`'s root).
pub(crate) fn program_in(tree: &Path, path: &Path) -> bool {
    program_in_layers(tree, &[], path)
}

/// [`program_in`] over the root with system extensions above it (topmost first): each path is
/// what the topmost layer holding it has.
pub(crate) fn program_in_layers(
    tree: &Path,
    layers: &[std::collections::BTreeMap<std::path::PathBuf, Node>],
    path: &Path,
) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    let lookup = |at: &Path| -> Option<Node> {
        if let Some(node) = layers.iter().find_map(|l| l.get(at)) {
            return Some(node.clone());
        }
        let inside = tree.join(at.strip_prefix("/").unwrap_or(at));
        let meta = fs::symlink_metadata(&inside).ok()?;
        Some(if meta.file_type().is_symlink() {
            Node::Symlink(fs::read_link(&inside).ok()?)
        } else if meta.is_file() {
            Node::File {
                executable: meta.permissions().mode() & 0o111 != 0,
            }
        } else {
            Node::Other
        })
    };
    let mut at = inside_root(path);
    // As many links as the kernel follows before ELOOP.
    for _ in 0..40 {
        match lookup(&at) {
            None | Some(Node::Other) => return false,
            Some(Node::File { executable }) => return executable,
            Some(Node::Symlink(target)) => {
                let joined = if target.is_absolute() {
                    target
                } else {
                    at.parent().unwrap_or(Path::new("/")).join(target)
                };
                at = inside_root(&joined);
            }
        }
    }
    false
}

/// `path` with `.` and `..` taken lexically, never above `/`: a link cannot lead outside the
/// root being built.
fn inside_root(path: &Path) -> std::path::PathBuf {
    use std::path::Component;
    let mut out = std::path::PathBuf::from("/");
    for part in path.components() {
        match part {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

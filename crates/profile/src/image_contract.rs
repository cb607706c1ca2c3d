//! The image contract: every path the imager writes into an image and the node reads from it,
//! defined once. Each path exists twice: relative to the tree being built (what the imager and
//! tests join onto a directory) and absolute (what init and machined open on a running node).

macro_rules! image_paths {
    ($($(#[$doc:meta])* $relative:ident, $absolute:ident = $path:literal;)*) => {
        $(
            $(#[$doc])*
            pub const $relative: &str = $path;
            $(#[$doc])*
            pub const $absolute: &str = concat!("/", $path);
        )*
    };
}

image_paths! {
    /// The node's runtime configuration (`[health]`, `[watchdog]`), in the root squashfs.
    NODE_CONFIG_PATH, NODE_CONFIG = "etc/slate/node.toml";
    /// The public keys the node trusts for bundles (`<key id>.pub`, SPKI PEM), in the root.
    TRUSTED_KEYS_PATH, TRUSTED_KEYS = "etc/slate/trusted-keys";
    /// The Secure Boot db certificate(s) (PEM) the image's boot files are signed under; machined
    /// refuses an update whose UKI they do not verify. In the root of a Secure Boot image.
    SECURE_BOOT_DB_PATH, SECURE_BOOT_DB = "etc/slate/secureboot/db.pem";
    /// The kernel modules init loads, in order, one path per line below
    /// `/lib/modules/<release>/`; in the initramfs.
    MODULES_LOAD_PATH, MODULES_LOAD = "etc/slate/modules.load";
    /// What the root's init is, in the initramfs: absent on slate's own OS; `systemd` (one
    /// line) on a systemd image, where init sets up /var, STATE and /etc before executing it
    /// (docs/formats.md §6.4).
    ROOT_INIT_PATH, ROOT_INIT = "etc/slate/root-init";
    /// The root file system image, in the initramfs.
    ROOTFS_IMAGE_PATH, ROOTFS_IMAGE = "rootfs.sqsh";
    /// System extensions (squashfs images overlaid on the root), in a second initramfs archive.
    EXTENSIONS_PATH, EXTENSIONS = "extensions";
    /// The extensions, topmost first: file, name, version, size and digest per line (§6.4).
    EXTENSIONS_MANIFEST_PATH, EXTENSIONS_MANIFEST = "extensions/manifest";
}

/// `cryptsetup` (Debian's cryptsetup-bin), which a `tpm2` /var drives (LUKS2: format, key
/// slots, token, open, erase): an image whose /var mode is `tpm2` must carry it, in its root or
/// an extension (`xtask tpm2-ext`).
pub const CRYPTSETUP: &str = "/usr/sbin/cryptsetup";

/// tpm2-tools' programs a `tpm2` /var runs (seal at the first boot, unseal at every later one);
/// in Debian each is a link to one multi-call `tpm2`.
pub const TPM2_TOOLS: &[&str] = &[
    "/usr/bin/tpm2_createprimary",
    "/usr/bin/tpm2_createpolicy",
    "/usr/bin/tpm2_create",
    "/usr/bin/tpm2_load",
    "/usr/bin/tpm2_unseal",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absolute_paths_are_the_relative_ones_under_root() {
        for (relative, absolute) in [
            (NODE_CONFIG_PATH, NODE_CONFIG),
            (TRUSTED_KEYS_PATH, TRUSTED_KEYS),
            (SECURE_BOOT_DB_PATH, SECURE_BOOT_DB),
            (MODULES_LOAD_PATH, MODULES_LOAD),
            (ROOT_INIT_PATH, ROOT_INIT),
            (ROOTFS_IMAGE_PATH, ROOTFS_IMAGE),
            (EXTENSIONS_PATH, EXTENSIONS),
            (EXTENSIONS_MANIFEST_PATH, EXTENSIONS_MANIFEST),
        ] {
            assert!(!relative.starts_with('/'));
            assert_eq!(absolute, format!("/{relative}"));
        }
    }
}

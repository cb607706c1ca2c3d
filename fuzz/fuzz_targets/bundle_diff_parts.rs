//! What `slate bundle diff` takes apart in a UKI must never panic, on any input: the kernel
//! release read from a bzImage's setup header (parsed by hand), the initramfs decompressed (zstd,
//! with a limit) and split into its archive and the compressed members after it, and the root
//! squashfs listed and hashed, its block size and zstd level read (also out of a whole UKI).
//! The first byte chooses the reader; the rest is its input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_bundle_diff::{
    list_squashfs, release_of_bzimage, root_storage, section_text, split_initramfs,
};

fuzz_target!(|data: &[u8]| {
    let Some((&which, input)) = data.split_first() else {
        return;
    };
    match which % 3 {
        0 => {
            if let Some(release) = release_of_bzimage(input) {
                assert!((1..=64).contains(&release.len()), "{release:?}");
                assert!(release.bytes().all(|b| b.is_ascii_graphic()), "{release:?}");
            }
            let text = section_text(input);
            assert!(!text.ends_with(['\0', '\n', ' ']));
        }
        1 => {
            if let Ok(initramfs) = split_initramfs(input) {
                assert_eq!(initramfs.init.path, "/init");
                // Within what the input holds, decompressed if it is zstd.
                let limit = if input.starts_with(slate_bundle_diff::ZSTD_MAGIC) {
                    slate_bundle_diff::MAX_INITRAMFS_BYTES
                } else {
                    input.len() as u64
                };
                assert!(initramfs.init.size <= limit);
                assert!(initramfs.rootfs.len() as u64 <= limit);
                assert!(initramfs.compressed.map_or(0, |c| c.size) < limit);
            }
        }
        _ => {
            // What a node reads of its running UKI to derive a seed (formats.md §7.7).
            let _ = slate_rootfs::storage_of(input);
            let _ = root_storage(input);
            if let Ok(listing) = list_squashfs(input) {
                // Every path is absolute and the root is a directory.
                assert!(listing.keys().all(|path| path.starts_with(b"/")));
            }
        }
    }
});

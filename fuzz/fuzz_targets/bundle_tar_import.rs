//! Arbitrary bytes as an upload (the tar of one bundle) into a fresh directory: nothing may
//! panic or hang, a refusal says why, and whatever was written stays inside the directory as
//! plain directories and regular files (no link, device or FIFO is ever created).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fn only_plain_files(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("reading the import directory") {
        let entry = entry.expect("a directory entry");
        let kind = entry.file_type().expect("its type");
        assert!(
            kind.is_dir() || kind.is_file(),
            "the import created {:?}, neither a directory nor a regular file",
            entry.path()
        );
        if kind.is_dir() {
            only_plain_files(&entry.path());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let target = dir.path().join("bundle");
    match slate_bundle::import_tar(data, &target, &mut |_| Ok(())) {
        Ok(imported) => {
            let _ = imported.bundle.manifest();
        }
        Err(err) => assert!(!err.to_string().is_empty()),
    }
    if target.exists() {
        only_plain_files(&target);
    }
});

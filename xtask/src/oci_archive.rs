//! An OCI image archive (image-layout tar, what `ctr images import` reads) of a static busybox
//! web server, written here: one gzip layer holding `/bin/busybox` and the applet links the
//! container uses, its config, the image manifest and `index.json` naming it with
//! `org.opencontainers.image.ref.name`. Deterministic: every timestamp is 0, entries sorted.

use std::io::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};
use flate2::write::GzEncoder;
use flate2::Compression;
use serde_json::json;
use sha2::{Digest as _, Sha256};

/// The tag the archive's index names; `ctr images import --base-name <name>` makes the image
/// `<name>:<tag>`.
pub const WEB_IMAGE_TAG: &str = "1.0";

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(bytes))
}

fn header(path: &str, mode: u32, size: u64, kind: tar::EntryType) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_path(path).expect("a short path");
    h
}

/// The layer: `bin/busybox` and `bin/{sh,httpd}` linking to it, and the directories.
fn layer(busybox: &[u8]) -> Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for dir in ["bin/", "data/", "proc/", "sys/", "dev/", "tmp/"] {
        let mut h = header(dir, 0o755, 0, tar::EntryType::Directory);
        h.set_cksum();
        tar.append(&h, std::io::empty())?;
    }
    let mut h = header(
        "bin/busybox",
        0o755,
        busybox.len() as u64,
        tar::EntryType::Regular,
    );
    h.set_cksum();
    tar.append(&h, busybox)?;
    for applet in ["httpd", "sh"] {
        let mut h = header(&format!("bin/{applet}"), 0o777, 0, tar::EntryType::Symlink);
        h.set_link_name("busybox")?;
        h.set_cksum();
        tar.append(&h, std::io::empty())?;
    }
    Ok(tar.into_inner()?)
}

/// The archive's bytes for `busybox` (a static busybox binary).
pub fn web_image_archive(busybox: &[u8]) -> Result<Vec<u8>> {
    let layer_tar = layer(busybox)?;
    let mut gz = GzEncoder::new(Vec::new(), Compression::best());
    gz.write_all(&layer_tar)?;
    let layer_gz = gz.finish()?;
    let config = serde_json::to_vec_pretty(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Cmd": ["/bin/httpd", "-f", "-p", "8080", "-h", "/data"],
            "WorkingDir": "/",
        },
        "rootfs": { "type": "layers", "diff_ids": [digest(&layer_tar)] },
    }))?;
    let manifest = serde_json::to_vec_pretty(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": digest(&config),
            "size": config.len(),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": digest(&layer_gz),
            "size": layer_gz.len(),
        }],
    }))?;
    let index = serde_json::to_vec_pretty(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(&manifest),
            "size": manifest.len(),
            "platform": { "architecture": "amd64", "os": "linux" },
            "annotations": { "org.opencontainers.image.ref.name": WEB_IMAGE_TAG },
        }],
    }))?;
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |path: &str, bytes: &[u8], kind| -> Result<()> {
        let mut h = header(path, 0o644, bytes.len() as u64, kind);
        if kind == tar::EntryType::Directory {
            h.set_mode(0o755);
        }
        h.set_cksum();
        tar.append(&h, bytes)?;
        Ok(())
    };
    add("blobs/", &[], tar::EntryType::Directory)?;
    add("blobs/sha256/", &[], tar::EntryType::Directory)?;
    let mut blobs = [&config, &manifest, &layer_gz];
    blobs.sort_by_key(|b| digest(b));
    for blob in blobs {
        let hex = digest(blob).trim_start_matches("sha256:").to_owned();
        add(
            &format!("blobs/sha256/{hex}"),
            blob,
            tar::EntryType::Regular,
        )?;
    }
    add("index.json", &index, tar::EntryType::Regular)?;
    add(
        "oci-layout",
        br#"{"imageLayoutVersion":"1.0.0"}"#,
        tar::EntryType::Regular,
    )?;
    Ok(tar.into_inner()?)
}

/// Write the archive of `busybox` to `out`.
pub fn write_web_image(busybox: &Path, out: &Path) -> Result<()> {
    let bytes = std::fs::read(busybox).with_context(|| format!("reading {}", busybox.display()))?;
    std::fs::write(out, web_image_archive(&bytes)?)
        .with_context(|| format!("writing {}", out.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_archive_is_a_layout_whose_digests_hold() {
        let bytes = web_image_archive(b"\x7fELF pretend busybox").unwrap();
        assert_eq!(
            bytes,
            web_image_archive(b"\x7fELF pretend busybox").unwrap()
        );
        let mut archive = tar::Archive::new(&bytes[..]);
        let mut files = std::collections::BTreeMap::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut data).unwrap();
            files.insert(path, data);
        }
        let index: serde_json::Value = serde_json::from_slice(&files["index.json"]).unwrap();
        let m = &index["manifests"][0];
        assert_eq!(
            m["annotations"]["org.opencontainers.image.ref.name"],
            WEB_IMAGE_TAG
        );
        let blob = |d: &serde_json::Value| {
            let d = d.as_str().unwrap();
            let data = &files[&format!("blobs/sha256/{}", &d[7..])];
            assert_eq!(digest(data), d);
            data.clone()
        };
        let manifest: serde_json::Value = serde_json::from_slice(&blob(&m["digest"])).unwrap();
        blob(&manifest["config"]["digest"]);
        blob(&manifest["layers"][0]["digest"]);
    }
}

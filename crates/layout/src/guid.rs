//! Deterministic GUIDs: the same image id always yields the same disk and partition GUIDs, so
//! two builds of one image are bit-identical.

use sha2::{Digest, Sha256};
use uuid::{Builder, Uuid};

/// The GUID of partition `label` in images of `image_id`.
///
/// SHA-256 of `slate:<image id>:<label>`, the first 16 bytes stamped as an RFC 4122 version-4
/// UUID (the version and variant bits are the only ones changed), so the result looks like any
/// other random GUID to tools that check those bits. Labels never contain `:` and are never
/// empty (see [`crate::DiskLayout::validate`]), so the last `:` of the key always separates image
/// id from label and no two (id, label) pairs share a key.
pub fn partition_guid(image_id: &str, label: &str) -> Uuid {
    guid_of(&format!("slate:{image_id}:{label}"))
}

/// The disk GUID of images of `image_id`: the key of [`partition_guid`] with an empty label,
/// which no partition can have.
pub fn disk_guid(image_id: &str) -> Uuid {
    guid_of(&format!("slate:{image_id}:"))
}

/// Four bytes derived from `image_id` and a purpose, for identifiers smaller than a GUID (a FAT
/// volume id).
pub fn derived_u32(image_id: &str, purpose: &str) -> u32 {
    let digest = Sha256::digest(format!("slate:{image_id}:#{purpose}").as_bytes());
    u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]])
}

fn guid_of(key: &str) -> Uuid {
    let digest = Sha256::digest(key.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    Builder::from_random_bytes(bytes).into_uuid()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guids_are_stable_distinct_and_v4_shaped() {
        let a = partition_guid("slate-1.0.0", "META");
        assert_eq!(a, partition_guid("slate-1.0.0", "META"));
        assert_ne!(a, partition_guid("slate-1.0.0", "STATE"));
        assert_ne!(a, partition_guid("slate-1.0.1", "META"));
        assert_ne!(disk_guid("x"), partition_guid("x", "EFI"));
        for guid in [a, disk_guid("slate-1.0.0")] {
            assert_eq!(guid.get_version_num(), 4);
            assert_eq!(guid.get_variant(), uuid::Variant::RFC4122);
        }
    }

    #[test]
    fn guid_vectors() {
        // Pinned so that a change of derivation, which would change every image, is noticed.
        assert_eq!(
            partition_guid("test-image", "META").to_string(),
            "76b9f93e-898e-4f2f-b789-8da0c9faca0f"
        );
        assert_eq!(
            disk_guid("test-image").to_string(),
            "635c85a4-e045-44c6-a382-21db0dd57390"
        );
    }
}

//! `[image]`: the disk image's sizes and boot settings, and the bounds on each of them.
//!
//! Every number here ends up somewhere with a limit of its own: sizes become byte counts in
//! 64-bit arithmetic (the imager multiplies by a MiB, the layout adds them up), tries become a
//! systemd-boot counter, the timeout a `loader.conf` line. Each is refused here, naming its
//! field, before any of that arithmetic runs.

use serde::Deserialize;
use slate_bootspec::{check_install_tries, DEFAULT_INSTALL_TRIES, MENU_TIMEOUT_SECS};

use crate::{Bootloader, ProfileError};

/// One mebibyte, in bytes.
const MIB: u64 = 1 << 20;

/// Largest `[image] size_mib` (and `state_mib`): 16 TiB. The largest file ext4 holds with 4 KiB
/// blocks, and beyond any image worth building to copy onto a disk (installed onto a larger
/// disk, EPHEMERAL takes the rest). In bytes it is 2^44, so the sizes and their sum stay far
/// below where 64-bit byte counts wrap around.
pub const MAX_IMAGE_MIB: u64 = 16 << 20;

/// Largest `[image] esp_mib`: 2 TiB, as far as FAT32's 32-bit sector count reaches with the
/// 512-byte sectors the imager writes.
pub const MAX_ESP_MIB: u64 = 2 << 20;

/// The valid `[image] keep_versions`: at least the new version and the running one; at most
/// what an ESP sensibly holds.
pub const KEEP_VERSIONS_RANGE: std::ops::RangeInclusive<u32> = 2..=16;

/// What the image needs besides EFI and STATE, in MiB: META (1), the partition tables and
/// alignment (2), a minimal EPHEMERAL (16).
const OTHER_PARTITIONS_MIB: u64 = 1 + 2 + 16;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Image {
    /// The whole disk image, 1 to [`MAX_IMAGE_MIB`].
    #[serde(default = "default_size")]
    pub size_mib: u64,
    /// The EFI system partition, 1 to [`MAX_ESP_MIB`] (FAT32 needs about 33 at least; the
    /// imager checks the exact geometry).
    #[serde(default = "default_esp")]
    pub esp_mib: u64,
    /// STATE (machine configuration), 1 to [`MAX_IMAGE_MIB`].
    #[serde(default = "default_state")]
    pub state_mib: u64,
    /// Boot-counting tries given to a newly installed UKI
    /// ([`slate_bootspec::INSTALL_TRIES`]).
    #[serde(default = "default_tries")]
    pub tries: u32,
    /// systemd-boot menu timeout in seconds; finite, so an unattended machine never waits
    /// ([`slate_bootspec::MENU_TIMEOUT_SECS`]).
    #[serde(default = "default_timeout")]
    pub menu_timeout: u32,
    /// How many versions an upgrade leaves on the ESP ([`KEEP_VERSIONS_RANGE`], default 2): the
    /// new one, the running one, the pending fallback, then the newest others up to this count;
    /// older ones are pruned, bad ones first (docs/update-transaction.md, "Pruning"). Carried in
    /// the installer bundle, so the new version's installer applies it. GRUB has two slots: only
    /// 2 is valid with `bootloader = "grub"`.
    #[serde(default = "default_keep_versions")]
    pub keep_versions: u32,
}

impl Default for Image {
    fn default() -> Self {
        Self {
            size_mib: default_size(),
            esp_mib: default_esp(),
            state_mib: default_state(),
            tries: default_tries(),
            menu_timeout: default_timeout(),
            keep_versions: default_keep_versions(),
        }
    }
}

fn default_size() -> u64 {
    512
}
fn default_esp() -> u64 {
    100
}
fn default_state() -> u64 {
    64
}
fn default_tries() -> u32 {
    DEFAULT_INSTALL_TRIES
}
fn default_timeout() -> u32 {
    1
}
fn default_keep_versions() -> u32 {
    2
}

impl Image {
    /// The image's size in bytes.
    pub fn size_bytes(&self) -> Result<u64, ProfileError> {
        mib_to_bytes("image.size_mib", self.size_mib)
    }

    /// The EFI system partition's size in bytes.
    pub fn esp_bytes(&self) -> Result<u64, ProfileError> {
        mib_to_bytes("image.esp_mib", self.esp_mib)
    }

    /// STATE's size in bytes.
    pub fn state_bytes(&self) -> Result<u64, ProfileError> {
        mib_to_bytes("image.state_mib", self.state_mib)
    }
}

/// `mib` MiB in bytes, or an error naming `field` when that does not fit 64 bits. A parsed
/// profile never fails here (its sizes are bounded); the check keeps a hand-made [`Image`]
/// from wrapping around into a small size.
fn mib_to_bytes(field: &'static str, mib: u64) -> Result<u64, ProfileError> {
    mib.checked_mul(MIB).ok_or_else(|| ProfileError::Invalid {
        field,
        reason: format!("{mib} MiB is more bytes than a 64-bit size holds"),
    })
}

/// Range checks of `[image]`; `bootloader` decides what `keep_versions` may be.
pub(crate) fn validate(image: &Image, bootloader: Bootloader) -> Result<(), ProfileError> {
    check_install_tries(image.tries).map_err(|e| ProfileError::Invalid {
        field: "image.tries",
        reason: e.to_string(),
    })?;
    if !MENU_TIMEOUT_SECS.contains(&image.menu_timeout) {
        return Err(ProfileError::Invalid {
            field: "image.menu_timeout",
            reason: format!(
                "{} seconds is not {} to {}: an unattended machine must boot on its own \
                 (systemd-boot reads 4294967295 as \"show the menu and wait forever\")",
                image.menu_timeout,
                MENU_TIMEOUT_SECS.start(),
                MENU_TIMEOUT_SECS.end()
            ),
        });
    }
    if !KEEP_VERSIONS_RANGE.contains(&image.keep_versions) {
        return Err(ProfileError::Invalid {
            field: "image.keep_versions",
            reason: format!(
                "{} is not {} to {} (the new version and the running one are always kept)",
                image.keep_versions,
                KEEP_VERSIONS_RANGE.start(),
                KEEP_VERSIONS_RANGE.end()
            ),
        });
    }
    if bootloader == Bootloader::Grub && image.keep_versions != 2 {
        return Err(ProfileError::Invalid {
            field: "image.keep_versions",
            reason: format!(
                "{} with bootloader = \"grub\": GRUB keeps exactly 2 versions (slots A and B)",
                image.keep_versions
            ),
        });
    }
    for (field, mib, max, why) in [
        (
            "image.size_mib",
            image.size_mib,
            MAX_IMAGE_MIB,
            "16 TiB, the largest image file",
        ),
        (
            "image.esp_mib",
            image.esp_mib,
            MAX_ESP_MIB,
            "2 TiB, the largest FAT32 volume of 512-byte sectors",
        ),
        (
            "image.state_mib",
            image.state_mib,
            MAX_IMAGE_MIB,
            "16 TiB, the largest image file",
        ),
    ] {
        if !(1..=max).contains(&mib) {
            return Err(ProfileError::Invalid {
                field,
                reason: format!("{mib} MiB is not 1 to {max} MiB ({why})"),
            });
        }
    }
    // Bounded above, so this cannot overflow; checked all the same, since an overflowed sum is
    // exactly how a too-small image would pass.
    let min = image
        .esp_mib
        .checked_add(image.state_mib)
        .and_then(|n| n.checked_add(OTHER_PARTITIONS_MIB))
        .ok_or_else(|| ProfileError::Invalid {
            field: "image.size_mib",
            reason: format!(
                "esp_mib {} + state_mib {} overflows",
                image.esp_mib, image.state_mib
            ),
        })?;
    if image.size_mib < min {
        return Err(ProfileError::Invalid {
            field: "image.size_mib",
            reason: format!(
                "{} MiB is below the {min} MiB the partitions need",
                image.size_mib
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(image: &Image) -> Result<(), String> {
        validate(image, Bootloader::SystemdBoot).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_valid_and_convert_to_bytes() {
        let image = Image::default();
        checked(&image).unwrap();
        assert_eq!(image.size_bytes().unwrap(), 512 * MIB);
        assert_eq!(image.esp_bytes().unwrap(), 100 * MIB);
        assert_eq!(image.state_bytes().unwrap(), 64 * MIB);
    }

    #[test]
    fn largest_sizes_are_accepted_and_fit_64_bits() {
        let image = Image {
            size_mib: MAX_IMAGE_MIB,
            esp_mib: MAX_ESP_MIB,
            state_mib: MAX_IMAGE_MIB - MAX_ESP_MIB - OTHER_PARTITIONS_MIB,
            ..Image::default()
        };
        checked(&image).unwrap();
        assert_eq!(image.size_bytes().unwrap(), 1 << 44);
    }

    #[test]
    fn sizes_out_of_range_name_their_field() {
        let cases = [
            (
                Image {
                    size_mib: (1 << 44) + 256,
                    ..Image::default()
                },
                "image.size_mib: 17592186044672 MiB is not 1 to 16777216 MiB",
            ),
            (
                Image {
                    esp_mib: (1 << 63) - 1,
                    ..Image::default()
                },
                "image.esp_mib: 9223372036854775807 MiB is not 1 to 2097152 MiB",
            ),
            (
                Image {
                    state_mib: u64::MAX,
                    ..Image::default()
                },
                "image.state_mib: 18446744073709551615 MiB is not 1 to 16777216 MiB",
            ),
            (
                Image {
                    esp_mib: 0,
                    ..Image::default()
                },
                "image.esp_mib: 0 MiB",
            ),
        ];
        for (image, expected) in cases {
            let err = checked(&image).unwrap_err();
            assert!(err.starts_with(expected), "{err}");
        }
    }

    #[test]
    fn bytes_of_a_hand_made_image_never_wrap() {
        let image = Image {
            size_mib: (1 << 44) + 256,
            esp_mib: 1 << 63,
            state_mib: u64::MAX,
            ..Image::default()
        };
        let err = image.size_bytes().unwrap_err().to_string();
        assert!(
            err.starts_with("image.size_mib: 17592186044672 MiB is more bytes"),
            "{err}"
        );
        assert!(image
            .esp_bytes()
            .unwrap_err()
            .to_string()
            .starts_with("image.esp_mib:"));
        assert!(image
            .state_bytes()
            .unwrap_err()
            .to_string()
            .starts_with("image.state_mib:"));
    }

    #[test]
    fn menu_timeout_is_finite_and_bounded() {
        for ok in [0, 1, 600] {
            let image = Image {
                menu_timeout: ok,
                ..Image::default()
            };
            checked(&image).unwrap();
        }
        for bad in [601, u32::MAX - 1, u32::MAX] {
            let image = Image {
                menu_timeout: bad,
                ..Image::default()
            };
            let err = checked(&image).unwrap_err();
            assert!(
                err.starts_with(&format!(
                    "image.menu_timeout: {bad} seconds is not 0 to 600"
                )),
                "{err}"
            );
        }
    }

    #[test]
    fn tries_are_the_shared_install_range() {
        for ok in slate_bootspec::INSTALL_TRIES {
            let image = Image {
                tries: ok,
                ..Image::default()
            };
            checked(&image).unwrap();
        }
        for bad in [0, 16, 3_000_000_000, u32::MAX] {
            let image = Image {
                tries: bad,
                ..Image::default()
            };
            let err = checked(&image).unwrap_err();
            assert!(
                err.starts_with(&format!(
                    "image.tries: {bad} boot-counting tries is not 1 to 15"
                )),
                "{err}"
            );
        }
    }
}

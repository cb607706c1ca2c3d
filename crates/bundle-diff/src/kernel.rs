//! The kernel release, from the kernel image itself when nothing else names it: an x86 bzImage
//! (which an EFI-stub kernel also is) points at its version string from the setup header
//! (Linux `Documentation/arch/x86/boot.rst`: `HdrS` at 0x202, protocol version at 0x206,
//! `kernel_version` at 0x20E — an offset from 0x200 to a NUL-terminated string that starts with
//! the release, as `uname -r` prints it).

/// Offset of the setup header's `HdrS` magic.
const HDRS_OFFSET: usize = 0x202;
/// Offset of the boot protocol version (`kernel_version` exists from 2.00 on).
const PROTOCOL_OFFSET: usize = 0x206;
/// Offset of `kernel_version`, the pointer to the version string (minus 0x200).
const KERNEL_VERSION_OFFSET: usize = 0x20e;
/// The longest version string read: Linux's is `UTS_RELEASE (builder) #version date`.
const MAX_VERSION_STRING: usize = 512;
/// The longest release taken: the kernel's `__NEW_UTS_LEN` is 64.
const MAX_RELEASE: usize = 64;

fn le16(bytes: &[u8], offset: usize) -> Option<u16> {
    let b = bytes.get(offset..offset.checked_add(2)?)?;
    Some(u16::from_le_bytes([b[0], b[1]]))
}

/// The release (`6.1.0-18-amd64`) of an x86 bzImage, or `None` when `image` is not one or its
/// version string is missing or not a plausible release.
pub fn release_of_bzimage(image: &[u8]) -> Option<String> {
    if image.get(HDRS_OFFSET..HDRS_OFFSET + 4)? != b"HdrS" {
        return None;
    }
    if le16(image, PROTOCOL_OFFSET)? < 0x0200 {
        return None;
    }
    let pointer = le16(image, KERNEL_VERSION_OFFSET)?;
    if pointer == 0 {
        return None;
    }
    let start = usize::from(pointer) + 0x200;
    let tail = image.get(start..)?;
    let tail = &tail[..tail.len().min(MAX_VERSION_STRING)];
    let text = &tail[..tail.iter().position(|&b| b == 0)?];
    let release = text.split(|b| b.is_ascii_whitespace()).next()?;
    plausible_release(release)
}

/// A release as `uname -r` prints it: 1 to 64 printable ASCII characters without spaces.
pub fn plausible_release(bytes: &[u8]) -> Option<String> {
    let ok = !bytes.is_empty()
        && bytes.len() <= MAX_RELEASE
        && bytes.iter().all(|b| b.is_ascii_graphic());
    ok.then(|| String::from_utf8_lossy(bytes).into_owned())
}

/// A text section of a UKI (`.cmdline`, `.uname`) as systemd-stub and slate's GRUB backend read
/// it: trailing NULs, newlines and spaces trimmed.
pub fn section_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .trim_end_matches(['\0', '\n', ' '])
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bzimage(version: &[u8]) -> Vec<u8> {
        let mut image = vec![0u8; 0x1000];
        image[HDRS_OFFSET..HDRS_OFFSET + 4].copy_from_slice(b"HdrS");
        image[PROTOCOL_OFFSET..PROTOCOL_OFFSET + 2].copy_from_slice(&0x020fu16.to_le_bytes());
        // Linux puts the string after the setup header; 0x300 + 0x200 here.
        image[KERNEL_VERSION_OFFSET..KERNEL_VERSION_OFFSET + 2]
            .copy_from_slice(&0x300u16.to_le_bytes());
        image[0x500..0x500 + version.len()].copy_from_slice(version);
        image
    }

    #[test]
    fn the_release_is_the_first_word_of_the_version_string() {
        let image = bzimage(b"6.1.0-18-amd64 (debian-kernel@lists.debian.org) #1 SMP\0");
        assert_eq!(
            release_of_bzimage(&image).as_deref(),
            Some("6.1.0-18-amd64")
        );
    }

    #[test]
    fn anything_else_is_no_release() {
        assert_eq!(release_of_bzimage(b""), None);
        assert_eq!(release_of_bzimage(&[0; 0x1000]), None);
        // No NUL within the limit, an empty string, a non-printable release, an old protocol.
        assert_eq!(release_of_bzimage(&bzimage(&[b'a'; 600])), None);
        assert_eq!(release_of_bzimage(&bzimage(b"\0")), None);
        assert_eq!(release_of_bzimage(&bzimage(b"6.1\x01x\0")), None);
        let mut old = bzimage(b"6.1\0");
        old[PROTOCOL_OFFSET + 1] = 0x01;
        assert_eq!(release_of_bzimage(&old), None);
        // The pointer past the end.
        let mut far = bzimage(b"6.1\0");
        far[KERNEL_VERSION_OFFSET..KERNEL_VERSION_OFFSET + 2].copy_from_slice(&[0xff, 0xff]);
        assert_eq!(release_of_bzimage(&far), None);
    }

    #[test]
    fn sections_lose_trailing_nul_newline_and_space() {
        assert_eq!(section_text(b"console=ttyS0 \n\0\0"), "console=ttyS0");
        assert_eq!(section_text(b""), "");
    }
}

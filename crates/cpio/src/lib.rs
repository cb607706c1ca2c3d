//! Initramfs archives for slate images: a deterministic cpio "newc" (`070701`) writer, the
//! safe way to concatenate several initrds, and a strict reader used to check both.
//!
//! Reproducible images need byte-identical initrds, so the writer takes no input from the
//! build host: no timestamps, owners or inode numbers are read from anywhere, and entries
//! appear exactly in the order they were added. The crate does no I/O; callers hand in bytes
//! and get bytes back.
//!
//! Format facts (header layout, 4-byte padding, `TRAILER!!!`, the kernel's concatenation
//! grammar) follow `docs/formats.md` §6, which summarises the kernel's
//! `Documentation/driver-api/early-userspace/buffer-format.rst` and `init/initramfs.c`.

mod error;
mod format;
mod reader;
mod writer;

pub use error::CpioError;
pub use reader::{parse_newc, Entry, EntryKind};
pub use writer::CpioWriter;

/// Join initrds into one buffer the way systemd-stub and ukify do: each member in order,
/// followed by zero bytes up to the next multiple of four.
///
/// The kernel only recognises an uncompressed archive (or the compressed-member magic) that
/// starts on a 4-byte boundary and skips zero bytes in between, so padding every member keeps
/// the next one findable whatever the previous one's length. Members may be compressed or
/// not; x86 early microcode must be the first, uncompressed member.
pub fn concat_initrds(members: &[&[u8]]) -> Vec<u8> {
    let total: usize = members.iter().map(|m| m.len() + 3).sum();
    let mut out = Vec::with_capacity(total);
    for member in members {
        out.extend_from_slice(member);
        format::pad4(&mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn concat_pads_each_member_to_four_bytes() {
        let out = concat_initrds(&[b"abc", b"", b"defgh", b"ijkl"]);
        assert_eq!(out, b"abc\0defgh\0\0\0ijkl");
        assert!(concat_initrds(&[]).is_empty());
    }
}

//! A large blob handed from the process that verified it to the one that writes it, so that no
//! byte is hashed twice across the two (issue 43): machined hashes an upload's UKI as it
//! arrives, then its Upgrade sequence runs the bundle's own installer, which used to hash all
//! of it again before its first write.
//!
//! The verifier puts the verified bytes into a memfd and seals it against every change
//! (`F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW`, then `F_SEAL_SEAL` so no seal can be taken
//! off): from then on the kernel guarantees that the bytes the writer maps are the bytes that
//! were hashed, which a file on disk cannot promise. The writer takes the descriptor only when
//! it is such a memfd (`F_GET_SEALS` answers only for memfds; a file made any other way on
//! tmpfs carries `F_SEAL_SEAL` alone), its size is the signed size, and the digest the verifier
//! names for it is the signed digest of the role it stands for. Anything else is refused before
//! anything is written; nothing falls back to reading a descriptor that was not sealed.
//!
//! What the writer trusts is its parent's word that the sealed bytes hashed to that digest. It
//! takes that word only from whoever started it with the descriptor open, and whoever can do
//! that can already write the target disk directly.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Mutex;

use rustix::fs::{fcntl_add_seals, fcntl_get_seals, memfd_create, MemfdFlags, SealFlags};

use crate::blob::lock;
use crate::{BlobBytes, BundleError, Digest, VerifiedBlobs};

/// Where `slate installer upgrade` finds a handed-over UKI (its `handover.rs`): the number of
/// the inherited descriptor of the sealed memfd, and the digest its bytes were verified
/// against (`sha256:<hex>`). Here, where both sides of the handover can name them.
pub const UKI_FD_ENV: &str = "SLATE_INSTALLER_UKI_FD";
pub const UKI_DIGEST_ENV: &str = "SLATE_INSTALLER_UKI_DIGEST";

/// The seals a handed-over blob must carry, every one of them.
pub const HANDOVER_SEALS: SealFlags = SealFlags::WRITE
    .union(SealFlags::SHRINK)
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// Why a handed-over blob was refused.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    #[error("the descriptor handed over for {what} is not a memfd ({source})")]
    NotMemfd {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the memfd handed over for {what} is not sealed against changes (seals {seals:#x}, needs {needs:#x})")]
    NotSealed {
        what: String,
        seals: u32,
        needs: u32,
    },
    #[error(
        "the memfd handed over for {what} was verified as {claimed}, but the bundle signs {signed}"
    )]
    WrongDigest {
        what: String,
        claimed: String,
        signed: String,
    },
    #[error("the memfd handed over for {what} is {actual} bytes, the bundle signs {expected}")]
    WrongSize {
        what: String,
        expected: u64,
        actual: u64,
    },
    #[error("reading the memfd handed over for {what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// `bytes` (verified by the caller) in a new memfd named `name`, sealed as [`HANDOVER_SEALS`]
/// says. Close-on-exec: the caller passes it to the one child it is meant for.
pub fn seal_verified(name: &str, bytes: &[u8]) -> std::io::Result<OwnedFd> {
    seal_verified_from(name, &mut &bytes[..])
}

/// [`seal_verified`] of everything `bytes` yields: a blob streamed out of its file, which a
/// reader of this crate verifies as it goes (or knows verified).
pub fn seal_verified_from(name: &str, bytes: &mut dyn Read) -> std::io::Result<OwnedFd> {
    let fd = memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    let mut file = File::from(fd);
    std::io::copy(bytes, &mut file)?;
    let fd = OwnedFd::from(file);
    fcntl_add_seals(&fd, HANDOVER_SEALS)?;
    Ok(fd)
}

/// The blob `signed` of `size` bytes, from the memfd `fd` a verifier sealed and named as
/// `claimed`: checked (module documentation), mapped, and remembered as verified. Not hashed.
pub(crate) fn handed_over(
    what: &str,
    fd: OwnedFd,
    claimed: &Digest,
    signed: &Digest,
    size: u64,
    verified: &Mutex<VerifiedBlobs>,
) -> Result<BlobBytes, HandoverError> {
    if claimed != signed {
        return Err(HandoverError::WrongDigest {
            what: what.to_owned(),
            claimed: claimed.to_string(),
            signed: signed.to_string(),
        });
    }
    check_sealed(what, fd.as_fd())?;
    let file = File::from(fd);
    let io = |source| HandoverError::Io {
        what: what.to_owned(),
        source,
    };
    let actual = file.metadata().map_err(io)?.len();
    if actual != size {
        return Err(HandoverError::WrongSize {
            what: what.to_owned(),
            expected: size,
            actual,
        });
    }
    let len = usize::try_from(size).map_err(|_| HandoverError::WrongSize {
        what: what.to_owned(),
        expected: size,
        actual,
    })?;
    // SAFETY: mapping is a syscall with no Rust-level preconditions; the slice then relies on
    // the bytes and the length not changing while mapped, which the seals checked above make
    // the kernel refuse to anyone (no write, no shrink, no grow, and no seal removed).
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::MmapOptions::new().len(len).populate().map(&file) }.map_err(io)?;
    lock(verified).insert(signed.clone(), size);
    Ok(BlobBytes::Mapped(map))
}

/// Whether `fd` is a memfd carrying every seal of [`HANDOVER_SEALS`].
fn check_sealed(what: &str, fd: std::os::fd::BorrowedFd<'_>) -> Result<(), HandoverError> {
    let seals = fcntl_get_seals(fd).map_err(|e| HandoverError::NotMemfd {
        what: what.to_owned(),
        source: e.into(),
    })?;
    if !seals.contains(HANDOVER_SEALS) {
        return Err(HandoverError::NotSealed {
            what: what.to_owned(),
            seals: seals.bits(),
            needs: HANDOVER_SEALS.bits(),
        });
    }
    Ok(())
}

impl From<HandoverError> for BundleError {
    fn from(e: HandoverError) -> Self {
        BundleError::Handover(Box::new(e))
    }
}

#[cfg(test)]
#[path = "sealed_tests.rs"]
mod tests;

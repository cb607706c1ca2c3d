//! `xtask slate-static`: the `slate` and `slate-init` binaries linked statically against
//! glibc, so they run as PID 1 (slate-init as the initramfs `/init`) with no dynamic loader or
//! libraries beside them. (There is no musl
//! target on these machines; `+crt-static` on the gnu target gives a static-pie.)

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, ensure, Context, Result};

use crate::util::{self, run};

const TARGET: &str = "x86_64-unknown-linux-gnu";

pub fn slate_static() -> Result<PathBuf> {
    build(None)
}

/// bench-delta's pair (d): slate built with `SLATE_BENCH_SMALL_CHANGE` set, one statement more
/// in its `main` (only the `slate` crate is compiled again). Build [`slate_static`] after it:
/// the binary is where the checkout's own goes.
pub fn slate_static_changed() -> Result<PathBuf> {
    build(Some((
        "SLATE_BENCH_SMALL_CHANGE",
        "built with a small change (bench-delta)",
    )))
}

fn build(env: Option<(&str, &str)>) -> Result<PathBuf> {
    let root = util::repo_root();
    let target_dir = root.join("target/static");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cargo = Command::new(cargo);
    match env {
        Some((name, value)) => cargo.env(name, value),
        None => cargo.env_remove("SLATE_BENCH_SMALL_CHANGE"),
    };
    run(cargo
        .current_dir(&root)
        // A separate target dir: the flags differ from normal builds, which would otherwise
        // rebuild everything each time one or the other runs.
        // Stripped: the binary is in every UKI twice (initramfs /init and the root's
        // /usr/bin/slate) and two UKIs must fit the demo's 96 MiB ESP; symbols were 2.5 MB of
        // 14.7 MB once.
        // Relative relocations packed (DT_RELR; glibc 2.36 and binutils 2.38 on): the
        // static-pie's 36,000 of them were 872 KB of RELA entries, packed 8 KB, so slate is
        // 16.46 → 15.60 MB and slate-init 3.46 → 3.30 MB, in every UKI, bundle and delta.
        // (Boot time did not move measurably: bench-boot's exec to machined's first line.)
        .env(
            "RUSTFLAGS",
            "-C target-feature=+crt-static -C strip=symbols \
             -C link-arg=-Wl,-z,pack-relative-relocs",
        )
        // Cargo prefers the encoded form when set (e.g. when run from a build script).
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        // The test command lints while it compiles (scripts/test); the release build of the
        // guest binary need not be linted a second time.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CLIPPY_ARGS")
        .args(["build", "--release", "-p", "slate", "-p", "slate-init"])
        .args(["--target", TARGET])
        // Without the etcd store: a node is a FleetLock client, never the server.
        .arg("--no-default-features")
        .arg("--target-dir")
        .arg(&target_dir))?;
    let binary = target_dir.join(TARGET).join("release/slate");
    check_static(&binary)?;
    // The initramfs /init of the demo profiles (`boot.init`): the init role alone.
    check_static(&target_dir.join(TARGET).join("release/slate-init"))?;
    println!("{}", binary.display());
    Ok(binary)
}

/// Fails unless `path` is an x86-64 ELF without a PT_INTERP program header: a binary with
/// one needs the dynamic loader, which the initramfs does not have.
pub fn check_static(path: &Path) -> Result<()> {
    let elf = fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    match program_interpreter(&elf) {
        Ok(None) => Ok(()),
        Ok(Some(interp)) => bail!(
            "{} is dynamically linked (PT_INTERP {interp}); it would not run as /init",
            path.display()
        ),
        Err(e) => Err(e.context(format!("{} is not a usable ELF file", path.display()))),
    }
}

const PT_INTERP: u32 = 3;

/// `N` bytes at `at`; offsets come from the file, so out-of-range is an error, not a panic.
fn bytes<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N]> {
    let slice = b.get(at..).and_then(|s| s.get(..N)).context("truncated")?;
    Ok(slice.try_into()?)
}

fn read_u16(b: &[u8], at: usize) -> Result<u16> {
    Ok(u16::from_le_bytes(bytes(b, at)?))
}

fn read_u32(b: &[u8], at: usize) -> Result<u32> {
    Ok(u32::from_le_bytes(bytes(b, at)?))
}

fn read_u64(b: &[u8], at: usize) -> Result<u64> {
    Ok(u64::from_le_bytes(bytes(b, at)?))
}

/// The PT_INTERP string of a little-endian ELF64 file, if it has one.
fn program_interpreter(elf: &[u8]) -> Result<Option<String>> {
    ensure!(elf.starts_with(b"\x7fELF"), "no ELF magic");
    ensure!(elf.get(4) == Some(&2), "not ELF64");
    ensure!(elf.get(5) == Some(&1), "not little-endian");
    let phoff = usize::try_from(read_u64(elf, 0x20)?)?;
    let phentsize = usize::from(read_u16(elf, 0x36)?);
    let phnum = usize::from(read_u16(elf, 0x38)?);
    ensure!(phentsize >= 0x38, "program header entries too small");
    for i in 0..phnum {
        let ph = i
            .checked_mul(phentsize)
            .and_then(|o| o.checked_add(phoff))
            .context("program header offset overflows")?;
        if read_u32(elf, ph)? == PT_INTERP {
            let offset = usize::try_from(read_u64(elf, ph + 0x08)?)?;
            let size = usize::try_from(read_u64(elf, ph + 0x20)?)?;
            let raw = elf
                .get(offset..)
                .and_then(|r| r.get(..size))
                .context("PT_INTERP outside the file")?;
            let text = String::from_utf8_lossy(raw);
            return Ok(Some(text.trim_end_matches('\0').to_owned()));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An ELF64 header plus one program header of type `p_type` whose data is `interp`.
    fn synthetic(p_type: u32, interp: &[u8]) -> Vec<u8> {
        let mut elf = vec![0u8; 0x40 + 0x38];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20..0x28].copy_from_slice(&0x40u64.to_le_bytes()); // e_phoff
        elf[0x36..0x38].copy_from_slice(&0x38u16.to_le_bytes()); // e_phentsize
        elf[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes()); // e_phnum
        elf[0x40..0x44].copy_from_slice(&p_type.to_le_bytes());
        let offset = elf.len() as u64;
        elf[0x48..0x50].copy_from_slice(&offset.to_le_bytes()); // p_offset
        elf[0x60..0x68].copy_from_slice(&(interp.len() as u64).to_le_bytes()); // p_filesz
        elf.extend_from_slice(interp);
        elf
    }

    #[test]
    fn interpreter_is_found_or_absent() {
        let dynamic = synthetic(PT_INTERP, b"/lib64/ld-linux-x86-64.so.2\0");
        assert_eq!(
            program_interpreter(&dynamic).unwrap().as_deref(),
            Some("/lib64/ld-linux-x86-64.so.2")
        );
        assert_eq!(program_interpreter(&synthetic(1, b"")).unwrap(), None);
        // Debian's /bin/sh (dash) is dynamically linked.
        assert!(check_static(Path::new("/bin/sh")).is_err());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(program_interpreter(b"\x7fELF\x02\x01").is_err());
        assert!(program_interpreter(b"#!/bin/sh").is_err());
        let mut truncated = synthetic(PT_INTERP, b"/x");
        truncated.truncate(0x50);
        assert!(program_interpreter(&truncated).is_err());
    }
}

//! Shared test helpers: a generator for small synthetic PE images, and access to the real
//! Debian systemd-stub.

#![allow(dead_code)]

pub const STUB_PATH: &str = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub";

/// The real stub, or `None` when systemd-boot-efi is not installed: the test is skipped,
/// saying so, or failed under `CI=true` (see slate-testkit).
pub fn debian_stub() -> Option<Vec<u8>> {
    if !slate_testkit::require_path(
        STUB_PATH,
        "Debian's systemd-boot-efi; scripts/install-deps installs it",
    ) {
        return None;
    }
    Some(std::fs::read(STUB_PATH).unwrap_or_else(|err| panic!("cannot read {STUB_PATH}: {err}")))
}

#[derive(Debug, Clone)]
pub struct FakeSection {
    pub name: &'static str,
    pub va: u32,
    pub vs: u32,
    pub ptr: u32,
    pub raw: Vec<u8>,
}

/// A minimal but well-formed PE image, with every layout knob exposed.
#[derive(Debug, Clone)]
pub struct FakePe {
    pub pe32: bool,
    pub file_alignment: u32,
    pub section_alignment: u32,
    pub size_of_headers: u32,
    pub size_of_image: u32,
    pub sections: Vec<FakeSection>,
    pub security: (u32, u32),
    /// (PointerToSymbolTable, NumberOfSymbols); the table and a 4-byte string table are
    /// written there.
    pub symtab: Option<(u32, u32)>,
    /// Extra bytes appended at the very end.
    pub trailer: Vec<u8>,
}

pub const E_LFANEW: usize = 0x40;
pub const OPT: usize = E_LFANEW + 24;

pub const SBAT_STUB: &[u8] =
    b"sbat,1,SBAT Version,sbat,1,https://github.com/rhboot/shim/blob/main/SBAT.md\n\
      fakestub,1,Test,fakestub,1,https://example.invalid/\n";

impl FakePe {
    /// Two sections, roomy `.sbat` (512 bytes on disk, 4 KiB in memory), 20 header slots.
    pub fn typical() -> Self {
        let mut text = vec![0xCC; 0x180];
        text[0] = 0xC3;
        Self {
            pe32: false,
            file_alignment: 0x200,
            section_alignment: 0x1000,
            size_of_headers: 0x400,
            size_of_image: 0x3000,
            sections: vec![
                FakeSection {
                    name: ".text",
                    va: 0x1000,
                    vs: 0x180,
                    ptr: 0x400,
                    raw: pad(text, 0x200),
                },
                FakeSection {
                    name: ".sbat",
                    va: 0x2000,
                    vs: SBAT_STUB.len() as u32,
                    ptr: 0x600,
                    raw: pad(SBAT_STUB.to_vec(), 0x200),
                },
            ],
            security: (0, 0),
            symtab: None,
            trailer: Vec::new(),
        }
    }

    pub fn optional_header_size(&self) -> usize {
        if self.pe32 {
            224
        } else {
            240
        }
    }

    pub fn section_table_offset(&self) -> usize {
        OPT + self.optional_header_size()
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut end = self.size_of_headers as usize;
        for s in &self.sections {
            end = end.max(s.ptr as usize + s.raw.len());
        }
        let mut out = vec![0u8; end];
        out[0..2].copy_from_slice(b"MZ");
        put32(&mut out, 0x3C, E_LFANEW as u32);
        out[E_LFANEW..E_LFANEW + 4].copy_from_slice(b"PE\0\0");
        let coff = E_LFANEW + 4;
        put16(&mut out, coff, 0x8664);
        put16(&mut out, coff + 2, self.sections.len() as u16);
        put16(&mut out, coff + 16, self.optional_header_size() as u16);
        put16(&mut out, coff + 18, 0x0206);

        put16(&mut out, OPT, if self.pe32 { 0x10B } else { 0x20B });
        put32(&mut out, OPT + 8, 0x1000);
        put32(&mut out, OPT + 16, 0x1000);
        put32(&mut out, OPT + 32, self.section_alignment);
        put32(&mut out, OPT + 36, self.file_alignment);
        put32(&mut out, OPT + 56, self.size_of_image);
        put32(&mut out, OPT + 60, self.size_of_headers);
        put16(&mut out, OPT + 68, 10);
        let dirs = if self.pe32 { OPT + 96 } else { OPT + 112 };
        put32(&mut out, dirs - 4, 16);
        put32(&mut out, dirs + 4 * 8, self.security.0);
        put32(&mut out, dirs + 4 * 8 + 4, self.security.1);

        let table = self.section_table_offset();
        for (i, s) in self.sections.iter().enumerate() {
            let at = table + i * 40;
            out[at..at + s.name.len()].copy_from_slice(s.name.as_bytes());
            put32(&mut out, at + 8, s.vs);
            put32(&mut out, at + 12, s.va);
            put32(&mut out, at + 16, s.raw.len() as u32);
            put32(&mut out, at + 20, s.ptr);
            put32(&mut out, at + 36, 0x4000_0040);
            let p = s.ptr as usize;
            out[p..p + s.raw.len()].copy_from_slice(&s.raw);
        }

        if let Some((ptr, count)) = self.symtab {
            put32(&mut out, coff + 8, ptr);
            put32(&mut out, coff + 12, count);
            let strings = ptr as usize + 18 * count as usize;
            out.resize(out.len().max(strings), 0);
            out.truncate(strings);
            out.extend_from_slice(&4u32.to_le_bytes());
        }
        out.extend_from_slice(&self.trailer);
        out
    }
}

pub fn pad(mut v: Vec<u8>, to: usize) -> Vec<u8> {
    v.resize(v.len().div_ceil(to) * to, 0);
    v
}

pub fn put16(out: &mut [u8], at: usize, v: u16) {
    out[at..at + 2].copy_from_slice(&v.to_le_bytes());
}

pub fn put32(out: &mut [u8], at: usize, v: u32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn get32(data: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(data[at..at + 4].try_into().unwrap())
}

//! UEFI boot options (docs/formats.md §2.9): `EFI_LOAD_OPTION` (UEFI 2.10 §3.1.3) with a
//! device path of a GPT partition and a file on it, `BootOrder`, and the plan that puts slate's
//! own options first. Pure: bytes in, bytes out; the efivarfs reads and writes are the caller's.
//!
//! Why slate writes boot options at all: when a loader returns to the firmware with an error (a
//! UKI whose kernel cannot be decompressed makes systemd-boot exit with "Load Error"), the
//! firmware starts the next option in `BootOrder`. With only the removable-path option the
//! firmware created, that next option is the network (OVMF waits there forever); with several
//! options naming the loader, the loader is started again, and each start spends one boot try,
//! until the entry is out of tries and the fallback boots.

use std::collections::BTreeMap;

/// `LOAD_OPTION_ACTIVE`: the boot manager tries the option.
pub const LOAD_OPTION_ACTIVE: u32 = 0x1;
/// `EFI_GLOBAL_VARIABLE`, the vendor GUID of `Boot####` and `BootOrder`.
pub const EFI_GLOBAL_GUID: &str = "8be4df61-93ca-11d2-aa0d-00e098032b8c";
/// NON_VOLATILE | BOOTSERVICE_ACCESS | RUNTIME_ACCESS, what `efibootmgr` writes.
pub const BOOT_VAR_ATTRIBUTES: u32 = 0x07;
/// How slate's options are told apart from everyone else's: their description starts so.
pub const SLATE_OPTION_PREFIX: &str = "slate start ";
/// Larger load options are refused; real ones are a few hundred bytes.
pub const MAX_LOAD_OPTION_LEN: usize = 64 * 1024;

const DEVICE_PATH_MEDIA: u8 = 0x04;
const MEDIA_HARD_DRIVE: u8 = 0x01;
const MEDIA_FILE_PATH: u8 = 0x04;
const DEVICE_PATH_END: u8 = 0x7f;
const END_ENTIRE: u8 = 0xff;
const HARD_DRIVE_NODE_LEN: u16 = 42;
const PARTITION_FORMAT_GPT: u8 = 0x02;
const SIGNATURE_TYPE_GUID: u8 = 0x02;

/// Why a `Boot####` or `BootOrder` value is refused. Every message says where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadOptionError {
    #[error("{what} is {len} bytes, shorter than its 4 attribute bytes")]
    NoAttributes { what: String, len: usize },
    #[error("BootOrder has an odd number of data bytes ({len}); it is an array of 16-bit numbers")]
    OddBootOrder { len: usize },
    #[error("{what}: {reason} (at byte {offset})")]
    Malformed {
        what: String,
        offset: usize,
        reason: &'static str,
    },
    #[error("{what} is {len} bytes; a load option slate reads is at most {MAX_LOAD_OPTION_LEN}")]
    TooLong { what: String, len: usize },
    #[error("the loader path {path:?} is not a relative path of ASCII characters")]
    BadLoaderPath { path: String },
    #[error("{count} boot options were asked for; slate writes 1 to 32")]
    BadCount { count: usize },
    #[error("no free Boot#### number is left for slate's option")]
    NoFreeNumber,
}

/// The partition and file a slate option starts: a short-form device path, as `efibootmgr`
/// writes it (the firmware finds the disk by the partition's GUID).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderLocation {
    /// 1-based GPT entry number.
    pub partition_number: u32,
    /// In logical blocks.
    pub start_lba: u64,
    pub size_lba: u64,
    /// The partition's unique GUID as it is stored in the GPT entry (mixed-endian bytes).
    pub partition_guid: [u8; 16],
    /// On the ESP, `/`-separated, relative (`EFI/BOOT/BOOTX64.EFI`).
    pub path: String,
}

/// One `EFI_LOAD_OPTION` as read: the device path list is kept as bytes (slate compares whole
/// options; it never needs to understand another OS's device path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadOption {
    pub attributes: u32,
    pub description: String,
    pub file_path_list: Vec<u8>,
    pub optional_data: Vec<u8>,
}

/// The efivarfs name of `Boot####`.
pub fn boot_var_name(number: u16) -> String {
    format!("Boot{number:04X}")
}

/// `Boot0005` → 5; anything else (`BootOrder`, `Boot05`, lower-case hex) → `None`.
pub fn parse_boot_var_name(name: &str) -> Option<u16> {
    let hex = name.strip_prefix("Boot")?;
    if hex.len() != 4
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_uppercase())
    {
        return None;
    }
    u16::from_str_radix(hex, 16).ok()
}

/// The data of a variable's efivarfs file (its 4 attribute bytes dropped).
fn data<'a>(what: &str, file: &'a [u8]) -> Result<&'a [u8], LoadOptionError> {
    file.get(4..).ok_or_else(|| LoadOptionError::NoAttributes {
        what: what.to_owned(),
        len: file.len(),
    })
}

/// `BootOrder`'s efivarfs file → the option numbers in order.
pub fn parse_boot_order(file: &[u8]) -> Result<Vec<u16>, LoadOptionError> {
    let data = data("BootOrder", file)?;
    if data.len() % 2 != 0 {
        return Err(LoadOptionError::OddBootOrder { len: data.len() });
    }
    Ok(data
        .chunks_exact(2)
        .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
        .collect())
}

/// The efivarfs file of a `BootOrder`.
pub fn build_boot_order(order: &[u16]) -> Vec<u8> {
    let mut out = BOOT_VAR_ATTRIBUTES.to_le_bytes().to_vec();
    for number in order {
        out.extend_from_slice(&number.to_le_bytes());
    }
    out
}

/// A `Boot####` efivarfs file → the option. `what` names the variable in errors. Refused: a
/// file path list that overruns the option, a description without its NUL or not UTF-16, a
/// device path node shorter than its header or past the list, a list without its end node.
pub fn parse_load_option(what: &str, file: &[u8]) -> Result<LoadOption, LoadOptionError> {
    if file.len() > MAX_LOAD_OPTION_LEN {
        return Err(LoadOptionError::TooLong {
            what: what.to_owned(),
            len: file.len(),
        });
    }
    let data = data(what, file)?;
    let bad = |offset: usize, reason: &'static str| LoadOptionError::Malformed {
        what: what.to_owned(),
        offset: offset + 4,
        reason,
    };
    let (Some(attributes), Some(list_len)) = (data.get(0..4), data.get(4..6)) else {
        return Err(bad(0, "shorter than the 6-byte option header"));
    };
    let attributes =
        u32::from_le_bytes([attributes[0], attributes[1], attributes[2], attributes[3]]);
    let list_len = usize::from(u16::from_le_bytes([list_len[0], list_len[1]]));
    let mut units = Vec::new();
    let mut at = 6;
    loop {
        let Some(pair) = data.get(at..at + 2) else {
            return Err(bad(at, "the description has no terminating NUL"));
        };
        at += 2;
        match u16::from_le_bytes([pair[0], pair[1]]) {
            0 => break,
            unit => units.push(unit),
        }
    }
    let description =
        String::from_utf16(&units).map_err(|_| bad(6, "the description is not valid UTF-16"))?;
    let list = data
        .get(at..at + list_len)
        .ok_or_else(|| bad(4, "FilePathListLength runs past the end of the option"))?;
    check_device_path_list(list).map_err(|(offset, reason)| bad(at + offset, reason))?;
    Ok(LoadOption {
        attributes,
        description,
        file_path_list: list.to_vec(),
        optional_data: data[at + list_len..].to_vec(),
    })
}

/// Each node's header inside the list, and an end-of-entire-path node last.
fn check_device_path_list(list: &[u8]) -> Result<(), (usize, &'static str)> {
    let mut at = 0;
    loop {
        let Some(header) = list.get(at..at + 4) else {
            return Err((at, "the device path list ends without an end node"));
        };
        let len = usize::from(u16::from_le_bytes([header[2], header[3]]));
        if len < 4 {
            return Err((at, "a device path node is shorter than its 4-byte header"));
        }
        if list.len() - at < len {
            return Err((at, "a device path node runs past the file path list"));
        }
        if header[0] == DEVICE_PATH_END && header[1] == END_ENTIRE {
            return if at + len == list.len() {
                Ok(())
            } else {
                Err((at + len, "bytes follow the end-of-path node"))
            };
        }
        at += len;
    }
}

fn push_node(out: &mut Vec<u8>, kind: u8, sub: u8, body: &[u8]) {
    let len = u16::try_from(body.len() + 4).expect("slate's nodes are small");
    out.extend_from_slice(&[kind, sub]);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(body);
}

/// The device path list of `loader`: HD(number, GPT, GUID, start, size)/File(\PATH)/End.
pub fn loader_device_path(loader: &LoaderLocation) -> Result<Vec<u8>, LoadOptionError> {
    let path = &loader.path;
    if path.is_empty()
        || path.starts_with('/')
        || path.len() > 255
        || !path.bytes().all(|b| b.is_ascii_graphic() && b != b'\\')
    {
        return Err(LoadOptionError::BadLoaderPath { path: path.clone() });
    }
    let mut out = Vec::new();
    let mut hd = Vec::with_capacity(usize::from(HARD_DRIVE_NODE_LEN) - 4);
    hd.extend_from_slice(&loader.partition_number.to_le_bytes());
    hd.extend_from_slice(&loader.start_lba.to_le_bytes());
    hd.extend_from_slice(&loader.size_lba.to_le_bytes());
    hd.extend_from_slice(&loader.partition_guid);
    hd.extend_from_slice(&[PARTITION_FORMAT_GPT, SIGNATURE_TYPE_GUID]);
    push_node(&mut out, DEVICE_PATH_MEDIA, MEDIA_HARD_DRIVE, &hd);
    let mut file = Vec::new();
    for unit in format!("\\{}", path.replace('/', "\\"))
        .encode_utf16()
        .chain([0])
    {
        file.extend_from_slice(&unit.to_le_bytes());
    }
    push_node(&mut out, DEVICE_PATH_MEDIA, MEDIA_FILE_PATH, &file);
    push_node(&mut out, DEVICE_PATH_END, END_ENTIRE, &[]);
    Ok(out)
}

/// The efivarfs file of an option (attributes 0x07, then the `EFI_LOAD_OPTION`).
pub fn build_load_option(option: &LoadOption) -> Vec<u8> {
    let mut out = BOOT_VAR_ATTRIBUTES.to_le_bytes().to_vec();
    out.extend_from_slice(&option.attributes.to_le_bytes());
    let list_len = u16::try_from(option.file_path_list.len()).expect("device paths are small");
    out.extend_from_slice(&list_len.to_le_bytes());
    for unit in option.description.encode_utf16().chain([0]) {
        out.extend_from_slice(&unit.to_le_bytes());
    }
    out.extend_from_slice(&option.file_path_list);
    out.extend_from_slice(&option.optional_data);
    out
}

/// The description of slate's option `k` of `n`: `slate start 2/4`.
pub fn slate_description(k: usize, n: usize) -> String {
    format!("{SLATE_OPTION_PREFIX}{k}/{n}")
}

/// What the firmware's boot variables should become: options to write (name, efivarfs bytes),
/// options to delete, and the new `BootOrder` when it changes. Empty when all is in place.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BootOptionsPlan {
    pub write: Vec<(String, Vec<u8>)>,
    pub remove: Vec<String>,
    pub boot_order: Option<Vec<u16>>,
    /// slate's option numbers, first in the new order.
    pub slate_options: Vec<u16>,
}

impl BootOptionsPlan {
    pub fn is_empty(&self) -> bool {
        self.write.is_empty() && self.remove.is_empty() && self.boot_order.is_none()
    }
}

/// The plan that makes `count` active options starting `loader` the first entries of
/// `BootOrder`, reusing the numbers of slate's existing options and taking the lowest free
/// numbers for the rest, option `k` at the `k`-th lowest of them (so a second plan is empty); slate's options beyond `count` are removed, everyone
/// else's options are kept, in their order, after slate's. `boot_order` and `options` are the
/// efivarfs files as read (`options` by number); any of them malformed refuses the plan, so
/// nothing is written over a variable slate cannot read.
pub fn plan_boot_options(
    boot_order: Option<&[u8]>,
    options: &BTreeMap<u16, Vec<u8>>,
    loader: &LoaderLocation,
    count: usize,
) -> Result<BootOptionsPlan, LoadOptionError> {
    if !(1..=32).contains(&count) {
        return Err(LoadOptionError::BadCount { count });
    }
    let order = boot_order
        .map(parse_boot_order)
        .transpose()?
        .unwrap_or_default();
    let mut ours = Vec::new();
    for (number, file) in options {
        let option = parse_load_option(&boot_var_name(*number), file)?;
        if option.description.starts_with(SLATE_OPTION_PREFIX) {
            ours.push(*number);
        }
    }
    let path = loader_device_path(loader)?;
    let mut numbers: Vec<u16> = ours.iter().copied().take(count).collect();
    let mut free = (0..=u16::MAX).filter(|n| !options.contains_key(n));
    while numbers.len() < count {
        numbers.push(free.next().ok_or(LoadOptionError::NoFreeNumber)?);
    }
    // In number order, as the next plan reads slate's options back: otherwise a reused high
    // number and new low ones would swap descriptions at every boot (found by the fuzz target).
    numbers.sort_unstable();
    let mut plan = BootOptionsPlan {
        slate_options: numbers.clone(),
        ..BootOptionsPlan::default()
    };
    for (k, number) in numbers.iter().enumerate() {
        let wanted = build_load_option(&LoadOption {
            attributes: LOAD_OPTION_ACTIVE,
            description: slate_description(k + 1, count),
            file_path_list: path.clone(),
            optional_data: Vec::new(),
        });
        if options.get(number) != Some(&wanted) {
            plan.write.push((boot_var_name(*number), wanted));
        }
    }
    plan.remove = ours.iter().skip(count).map(|n| boot_var_name(*n)).collect();
    let new_order: Vec<u16> = numbers
        .iter()
        .copied()
        .chain(
            order
                .iter()
                .copied()
                .filter(|n| !ours.contains(n) && !numbers.contains(n)),
        )
        .collect();
    if new_order != order {
        plan.boot_order = Some(new_order);
    }
    Ok(plan)
}

#[cfg(test)]
#[path = "load_option_tests.rs"]
mod tests;

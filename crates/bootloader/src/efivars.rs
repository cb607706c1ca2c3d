//! EFI variables behind a small trait: the efivarfs implementation lives in the edge crate
//! (`host`); [`MemEfiVars`] serves tests and machines without EFI variables.

use std::collections::BTreeMap;

/// `LoaderEntryOneShot`: ID or glob for the next boot only (systemd-boot deletes it once read).
pub const LOADER_ENTRY_ONESHOT: &str = "LoaderEntryOneShot";
/// `LoaderEntryDefault`: persistent ID or glob.
pub const LOADER_ENTRY_DEFAULT: &str = "LoaderEntryDefault";
/// `LoaderEntryLastBooted`: consulted only when a default is `@saved`.
pub const LOADER_ENTRY_LAST_BOOTED: &str = "LoaderEntryLastBooted";

/// A variable could not be written or removed.
#[derive(Debug, thiserror::Error)]
#[error("EFI variable {name}: {reason}")]
pub struct EfiVarsError {
    pub name: String,
    pub reason: String,
}

/// The systemd-boot string variables (vendor GUID `LOADER_GUID`), by name without the GUID.
pub trait EfiVars {
    /// The value, or `None` when the variable is absent (or unreadable).
    fn get(&self, name: &str) -> Option<String>;
    fn set(&mut self, name: &str, value: &str) -> Result<(), EfiVarsError>;
    /// Removing an absent variable succeeds.
    fn remove(&mut self, name: &str) -> Result<(), EfiVarsError>;
}

/// `BootOrder`: the firmware's list of `Boot####` option numbers, tried in turn.
pub const BOOT_ORDER: &str = "BootOrder";

/// The firmware's own boot variables (vendor `EFI_GLOBAL_VARIABLE`: `Boot####`, `BootOrder`),
/// each as its efivarfs file — 4 attribute bytes, then the data — so that the bytes are built
/// and parsed in one pure place (`slate_bootspec::plan_boot_options`, formats.md §2.9).
pub trait BootVars {
    /// The names of the variables of that vendor (`Boot0001`, `BootOrder`, `Timeout`, …).
    fn names(&self) -> Result<Vec<String>, EfiVarsError>;
    /// The file, or `None` when the variable is absent.
    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, EfiVarsError>;
    fn write(&mut self, name: &str, file: &[u8]) -> Result<(), EfiVarsError>;
    /// Removing an absent variable succeeds.
    fn remove(&mut self, name: &str) -> Result<(), EfiVarsError>;
}

/// Boot variables held in memory, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemBootVars {
    pub vars: BTreeMap<String, Vec<u8>>,
}

impl BootVars for MemBootVars {
    fn names(&self) -> Result<Vec<String>, EfiVarsError> {
        Ok(self.vars.keys().cloned().collect())
    }
    fn read(&self, name: &str) -> Result<Option<Vec<u8>>, EfiVarsError> {
        Ok(self.vars.get(name).cloned())
    }
    fn write(&mut self, name: &str, file: &[u8]) -> Result<(), EfiVarsError> {
        self.vars.insert(name.to_owned(), file.to_vec());
        Ok(())
    }
    fn remove(&mut self, name: &str) -> Result<(), EfiVarsError> {
        self.vars.remove(name);
        Ok(())
    }
}

/// EFI variables held in memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemEfiVars {
    pub vars: BTreeMap<String, String>,
}

impl MemEfiVars {
    pub fn new() -> Self {
        Self::default()
    }
}

impl EfiVars for MemEfiVars {
    fn get(&self, name: &str) -> Option<String> {
        self.vars.get(name).cloned()
    }
    fn set(&mut self, name: &str, value: &str) -> Result<(), EfiVarsError> {
        self.vars.insert(name.to_owned(), value.to_owned());
        Ok(())
    }
    fn remove(&mut self, name: &str) -> Result<(), EfiVarsError> {
        self.vars.remove(name);
        Ok(())
    }
}

impl<T: EfiVars + ?Sized> EfiVars for &mut T {
    fn get(&self, name: &str) -> Option<String> {
        (**self).get(name)
    }
    fn set(&mut self, name: &str, value: &str) -> Result<(), EfiVarsError> {
        (**self).set(name, value)
    }
    fn remove(&mut self, name: &str) -> Result<(), EfiVarsError> {
        (**self).remove(name)
    }
}

/// The variables the selection model reads.
pub fn loader_vars(vars: &(impl EfiVars + ?Sized)) -> slate_bootspec::EfiVars {
    slate_bootspec::EfiVars {
        entry_oneshot: vars.get(LOADER_ENTRY_ONESHOT),
        entry_default: vars.get(LOADER_ENTRY_DEFAULT),
        entry_last_booted: vars.get(LOADER_ENTRY_LAST_BOOTED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_vars_round_trip() {
        let mut vars = MemEfiVars::new();
        assert_eq!(vars.get(LOADER_ENTRY_DEFAULT), None);
        vars.set(LOADER_ENTRY_DEFAULT, "slate-1.efi").unwrap();
        vars.set(LOADER_ENTRY_ONESHOT, "slate-2+3.efi").unwrap();
        let model = loader_vars(&vars);
        assert_eq!(model.entry_default.as_deref(), Some("slate-1.efi"));
        assert_eq!(model.entry_oneshot.as_deref(), Some("slate-2+3.efi"));
        vars.remove(LOADER_ENTRY_ONESHOT).unwrap();
        vars.remove(LOADER_ENTRY_ONESHOT).unwrap();
        assert_eq!(loader_vars(&vars).entry_oneshot, None);
    }
}

//! Errors from parsing PE images and assembling UKIs.

/// Everything that can go wrong while reading a PE image or assembling a UKI.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UkiError {
    /// The bytes are not a PE image the parser can read (bad magic, truncated headers,
    /// section table out of bounds, ...).
    #[error("not a valid PE image: {0}")]
    InvalidPe(String),

    /// The stub carries an Authenticode signature. Appending sections would invalidate it and
    /// leave a stale certificate table behind, so (like ukify) we refuse; sign the finished UKI.
    #[error("the stub is signed (its Security directory is set); use an unsigned stub and sign the finished UKI")]
    SignedStub,

    /// The stub parses, but its layout breaks an assumption the assembler relies on.
    #[error("unsupported stub layout: {0}")]
    UnsupportedStub(String),

    /// A section name that cannot be stored in a PE section header.
    #[error("invalid section name {name:?}: {reason}")]
    InvalidSectionName {
        /// The requested name.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// A section with no contents; its VirtualSize would be 0, which loaders read as "use
    /// SizeOfRawData" (also 0), so systemd-stub could not tell it apart from a missing one.
    #[error("section {name} is empty")]
    EmptySection {
        /// The section name.
        name: String,
    },

    /// A singleton section was added twice (only `.dtbauto` and `.efifw` may repeat, and
    /// any section after a `.profile` separator).
    #[error("section {name} was added more than once")]
    DuplicateSection {
        /// The section name.
        name: String,
    },

    /// The header area (below SizeOfHeaders) has no space for another 40-byte section header.
    /// Growing it would shift every section's file offset, which the stub was not linked for.
    #[error(
        "no room for the header of section {name}: SizeOfHeaders {size_of_headers:#x} leaves \
         space for {capacity} new section headers after the stub's {stub_sections}"
    )]
    NoHeaderRoom {
        /// The section that did not fit.
        name: String,
        /// How many new headers fit in total.
        capacity: usize,
        /// How many sections the stub already has.
        stub_sections: usize,
        /// The (file-aligned) SizeOfHeaders.
        size_of_headers: u32,
    },

    /// A section that replaces one the stub already has is larger than the space the old one
    /// occupies on disk or in memory.
    #[error("section {name} is {len} bytes but the stub's existing {name} has room for {usable}")]
    ExistingSectionTooSmall {
        /// The section name.
        name: String,
        /// Length of the new contents.
        len: usize,
        /// Bytes usable without touching the next section (file and memory).
        usable: usize,
    },

    /// A size or offset does not fit the 32-bit PE fields.
    #[error("image too large: {0} exceeds the 32-bit PE limit")]
    TooLarge(&'static str),

    /// A caller-supplied SBAT line is not `component,generation,vendor,package,version,url`.
    #[error("invalid SBAT line {line:?}: {reason}")]
    InvalidSbat {
        /// The offending line.
        line: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

impl From<object::read::Error> for UkiError {
    fn from(err: object::read::Error) -> Self {
        Self::InvalidPe(err.to_string())
    }
}

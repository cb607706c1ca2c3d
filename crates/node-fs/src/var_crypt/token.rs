//! The pure half of a `tpm2` /var (docs/formats.md §15): the LUKS2 token slate stores its
//! TPM-sealed key in, read back out of cryptsetup's metadata dump; the few fields of the LUKS2
//! binary header slate looks at (magic, version, label); what a volume found at boot is; the
//! recovery key's spelling. No I/O: the tools live in `tools.rs`.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

/// The token's `type`: LUKS2 keeps tokens of types it does not know and ignores them when it
/// unlocks, so `cryptsetup open` on another host asks for a passphrase (the recovery key).
pub const TOKEN_TYPE: &str = "slate-tpm2";
/// The token layout this slate writes and reads.
pub const TOKEN_VERSION: u32 = 1;
/// The LUKS2 label while the first boot sets the volume up: a volume with this label and no
/// slate token was never holding data (the token is stored before anything is formatted inside).
pub const SETUP_LABEL: &str = "slate-var-setup";
/// The label once the token is stored.
pub const LABEL: &str = "slate-var";
/// The PCR policy: SHA-256 bank, PCR 7 (the Secure Boot state; docs/node.md, "/var modes").
pub const PCR_BANK: &str = "sha256";
pub const PCRS: &[u8] = &[7];
/// A sealed blob is a TPM2B of a few hundred bytes; anything larger is not one.
const MAX_BLOB: usize = 4096;
/// cryptsetup's metadata is at most 4 MiB of JSON (LUKS2's largest header).
const MAX_METADATA: usize = 4 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("the LUKS2 metadata is not JSON slate can read: {0}")]
    Metadata(String),
    #[error("LUKS2 token {id} ({TOKEN_TYPE}): {reason}")]
    Token { id: String, reason: String },
    #[error("the LUKS2 header holds {0} {TOKEN_TYPE} tokens; slate writes one")]
    Several(usize),
}

/// slate's LUKS2 token: the key of one key slot, sealed by the TPM under a PCR policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Token {
    /// [`TOKEN_TYPE`].
    #[serde(rename = "type")]
    pub kind: String,
    /// The one key slot whose passphrase is sealed (LUKS2 spells slot numbers as strings).
    pub keyslots: Vec<String>,
    #[serde(rename = "slate-version")]
    pub version: u32,
    /// The PCR bank and indices of the policy the key is sealed under.
    #[serde(rename = "tpm2-pcr-bank")]
    pub pcr_bank: String,
    #[serde(rename = "tpm2-pcrs")]
    pub pcrs: Vec<u8>,
    /// The policy digest (`tpm2_createpolicy --policy-pcr`), lower-case hex.
    #[serde(rename = "tpm2-policy-hash")]
    pub policy_hash: String,
    /// The sealed object's TPM2B_PUBLIC and TPM2B_PRIVATE (`tpm2_create -u`, `-r`), base64.
    #[serde(rename = "tpm2-public")]
    pub public: String,
    #[serde(rename = "tpm2-private")]
    pub private: String,
}

impl Token {
    /// A token for `keyslot` over the sealed object's two halves.
    pub fn new(keyslot: u32, policy_hash: &[u8], public: &[u8], private: &[u8]) -> Self {
        let b64 = base64::engine::general_purpose::STANDARD;
        Token {
            kind: TOKEN_TYPE.into(),
            keyslots: vec![keyslot.to_string()],
            version: TOKEN_VERSION,
            pcr_bank: PCR_BANK.into(),
            pcrs: PCRS.to_vec(),
            policy_hash: policy_hash.iter().map(|b| format!("{b:02x}")).collect(),
            public: b64.encode(public),
            private: b64.encode(private),
        }
    }

    /// The JSON `cryptsetup token import` takes.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The key slot it unlocks.
    pub fn keyslot(&self) -> u32 {
        self.keyslots
            .first()
            .and_then(|k| k.parse().ok())
            .unwrap_or(0)
    }

    /// `sha256:7` as tpm2-tools spells a PCR selection.
    pub fn pcr_selection(&self) -> String {
        let list: Vec<String> = self.pcrs.iter().map(u8::to_string).collect();
        format!("{}:{}", self.pcr_bank, list.join(","))
    }

    /// The sealed object's public and private halves.
    pub fn blobs(&self) -> (Vec<u8>, Vec<u8>) {
        let b64 = base64::engine::general_purpose::STANDARD;
        (
            b64.decode(&self.public).unwrap_or_default(),
            b64.decode(&self.private).unwrap_or_default(),
        )
    }

    /// Everything [`Token::keyslot`], [`Token::pcr_selection`] and [`Token::blobs`] assume.
    fn check(&self) -> Result<(), String> {
        if self.version != TOKEN_VERSION {
            return Err(format!(
                "layout version {} (this slate reads {TOKEN_VERSION})",
                self.version
            ));
        }
        match self.keyslots.as_slice() {
            [slot] if !slot.is_empty() && slot.len() <= 2 && slot.parse::<u32>().is_ok() => {}
            other => return Err(format!("keyslots {other:?}: one slot number expected")),
        }
        if self.pcr_bank != PCR_BANK {
            return Err(format!("PCR bank {:?} (sha256 expected)", self.pcr_bank));
        }
        let increasing = self.pcrs.windows(2).all(|w| w[0] < w[1]);
        if self.pcrs.is_empty() || !increasing || self.pcrs.iter().any(|p| *p > 23) {
            return Err(format!("PCRs {:?}: increasing indices 0 to 23", self.pcrs));
        }
        let hex = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        if self.policy_hash.len() != 64 || !hex(&self.policy_hash) {
            return Err("tpm2-policy-hash: 64 lower-case hex digits expected".into());
        }
        let b64 = base64::engine::general_purpose::STANDARD;
        for (name, value) in [
            ("tpm2-public", &self.public),
            ("tpm2-private", &self.private),
        ] {
            match b64.decode(value) {
                Ok(bytes) if !bytes.is_empty() && bytes.len() <= MAX_BLOB => {}
                Ok(bytes) => return Err(format!("{name}: {} bytes", bytes.len())),
                Err(e) => return Err(format!("{name}: not base64: {e}")),
            }
        }
        Ok(())
    }
}

/// The part of `cryptsetup luksDump --dump-json-metadata` slate reads.
#[derive(Deserialize)]
struct Metadata {
    #[serde(default)]
    tokens: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    keyslots: BTreeMap<String, serde_json::Value>,
}

fn parse_metadata(metadata: &str) -> Result<Metadata, TokenError> {
    if metadata.len() > MAX_METADATA {
        return Err(TokenError::Metadata(format!(
            "{} bytes (at most {MAX_METADATA})",
            metadata.len()
        )));
    }
    serde_json::from_str(metadata).map_err(|e| TokenError::Metadata(e.to_string()))
}

/// slate's token in a LUKS2 metadata dump, with its token id: `None` when there is none. A
/// token of slate's type that does not read as this layout is an error, never skipped: the
/// caller must not take the volume for one without a token (and set it up again).
pub fn find_token(metadata: &str) -> Result<Option<(u32, Token)>, TokenError> {
    let parsed = parse_metadata(metadata)?;
    let mut found = Vec::new();
    for (id, value) in parsed.tokens {
        if value.get("type").and_then(|t| t.as_str()) != Some(TOKEN_TYPE) {
            continue;
        }
        let bad = |reason: String| TokenError::Token {
            id: id.clone(),
            reason,
        };
        let number: u32 = id
            .parse()
            .ok()
            .filter(|_| id.len() <= 2)
            .ok_or_else(|| bad("not a token number".into()))?;
        let token: Token = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        token.check().map_err(bad)?;
        found.push((number, token));
    }
    match found.len() {
        0 => Ok(None),
        1 => Ok(found.pop()),
        n => Err(TokenError::Several(n)),
    }
}

/// The key slots a LUKS2 metadata dump holds, in increasing order.
pub fn key_slots(metadata: &str) -> Result<Vec<u32>, TokenError> {
    let parsed = parse_metadata(metadata)?;
    let mut slots = parsed
        .keyslots
        .keys()
        .map(|k| {
            k.parse::<u32>()
                .ok()
                .filter(|n| *k == n.to_string() && *n < MAX_KEY_SLOTS)
                .ok_or_else(|| TokenError::Metadata(format!("key slot {k:?} is not a slot number")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    slots.sort_unstable();
    Ok(slots)
}

/// LUKS2 has 32 key slots.
const MAX_KEY_SLOTS: u32 = 32;

/// Which slot a reseal puts the new key in, and which slots a reseal cut short left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResealPlan {
    pub new_slot: u32,
    pub leftovers: Vec<u32>,
}

/// The plan for a volume whose key slots are `used`, whose token names `token_slot` and
/// whose recovery key is in `recovery_slot`: the new key goes to the lowest slot that is none
/// of those two (a leftover of a cut reseal is destroyed first, so it may be reused). No
/// recovery slot: refused (the recovery key is what authorises a reseal).
pub fn plan_reseal(
    used: &[u32],
    token_slot: u32,
    recovery_slot: u32,
) -> Result<ResealPlan, String> {
    if !used.contains(&recovery_slot) {
        return Err(format!(
            "the volume has no recovery key slot ({recovery_slot}): it was set up with \
             [var] recovery_key = \"none\", and only its TPM under the Secure Boot state it \
             was sealed to opens it"
        ));
    }
    if token_slot == recovery_slot {
        return Err(format!(
            "its token names key slot {token_slot}, the recovery key's: not a volume slate set up"
        ));
    }
    let leftovers: Vec<u32> = used
        .iter()
        .copied()
        .filter(|s| *s != token_slot && *s != recovery_slot)
        .collect();
    let new_slot = (0..MAX_KEY_SLOTS)
        .find(|s| *s != token_slot && *s != recovery_slot)
        .unwrap_or(0);
    Ok(ResealPlan {
        new_slot,
        leftovers,
    })
}

/// The label of a LUKS2 binary header (its first 72 bytes at least): `None` when `head` is
/// not LUKS version 2 (magic `LUKS\xba\xbe`, big-endian version 2 at byte 6; label, 48 bytes
/// NUL-padded, at byte 24).
pub fn luks2_label(head: &[u8]) -> Option<String> {
    if head.get(..6)? != b"LUKS\xba\xbe" || head.get(6..8)? != [0, 2] {
        return None;
    }
    let label = head.get(24..72)?;
    let end = label.iter().position(|b| *b == 0).unwrap_or(label.len());
    Some(String::from_utf8_lossy(&label[..end]).into_owned())
}

/// What a `tpm2` /var finds on EPHEMERAL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// A blank head: the first boot (or one after a reset): set it up.
    Blank,
    /// slate's volume: unseal its key and open it.
    Sealed(u32, Box<Token>),
    /// A LUKS2 header slate began and did not finish (a power cut before the token was
    /// stored): no filesystem was ever made inside, so it is set up again.
    SetupInterrupted,
    /// Anything else: refused, never formatted (why, for the refusal).
    Other(String),
}

/// The one decision. `signature` is the head's (`crypto_LUKS`, `ext2/3/4`, … or `None` when
/// blank); `label` the LUKS2 label; `token` slate's token.
pub fn classify(
    signature: Option<&str>,
    label: Option<&str>,
    token: Option<(u32, Token)>,
) -> Found {
    match (signature, label, token) {
        (None, _, _) => Found::Blank,
        (Some("crypto_LUKS"), Some(_), Some((_, token))) => {
            Found::Sealed(token.keyslot(), Box::new(token))
        }
        (Some("crypto_LUKS"), Some(SETUP_LABEL), None) => Found::SetupInterrupted,
        (Some("crypto_LUKS"), Some(label), None) => Found::Other(format!(
            "a LUKS2 volume (label {label:?}) without slate's {TOKEN_TYPE} token"
        )),
        (Some("crypto_LUKS"), None, _) => Found::Other("a LUKS volume of version 1".into()),
        (Some(other), _, _) => Found::Other(format!("an unencrypted {other} filesystem")),
    }
}

/// 32 random bytes as the recovery key: 8 groups of 8 lower-case hex digits joined by '-',
/// what an owner types at `cryptsetup open`'s passphrase prompt.
pub fn recovery_key(random: &[u8; 32]) -> String {
    let hex: String = random.iter().map(|b| format!("{b:02x}")).collect();
    hex.as_bytes()
        .chunks(8)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token::new(0, &[0xab; 32], &[1, 2, 3], &[4, 5])
    }

    /// The example of docs/formats.md §15.
    const EXAMPLE: &str = r#"{"type":"slate-tpm2","keyslots":["0"],"slate-version":1,"tpm2-pcr-bank":"sha256","tpm2-pcrs":[7],"tpm2-policy-hash":"abababababababababababababababababababababababababababababababab","tpm2-public":"AQID","tpm2-private":"BAU="}"#;

    #[test]
    fn the_token_round_trips_through_a_metadata_dump() {
        assert_eq!(token().to_json(), EXAMPLE);
        let dump = format!(
            r#"{{"keyslots":{{}},"tokens":{{"0":{{"type":"systemd-recovery","keyslots":["1"]}},"3":{EXAMPLE}}},"segments":{{}}}}"#
        );
        let (id, found) = find_token(&dump).unwrap().unwrap();
        assert_eq!((id, &found), (3, &token()));
        assert_eq!(found.keyslot(), 0);
        assert_eq!(found.pcr_selection(), "sha256:7");
        assert_eq!(found.blobs(), (vec![1, 2, 3], vec![4, 5]));
        assert_eq!(find_token(r#"{"tokens":{}}"#).unwrap(), None);
        assert_eq!(find_token(r#"{"keyslots":{}}"#).unwrap(), None);
    }

    #[test]
    fn a_slate_token_that_does_not_read_is_an_error_never_none() {
        let bad = |from: &str, to: &str| {
            let dump = format!(r#"{{"tokens":{{"0":{}}}}}"#, EXAMPLE.replace(from, to));
            find_token(&dump).unwrap_err().to_string()
        };
        assert!(bad(r#""slate-version":1"#, r#""slate-version":2"#).contains("version 2"));
        assert!(bad(r#"["0"]"#, r#"["0","1"]"#).contains("one slot number"));
        assert!(bad(r#"["0"]"#, r#"["x"]"#).contains("one slot number"));
        assert!(bad("[7]", "[]").contains("increasing"));
        assert!(bad("[7]", "[7,7]").contains("increasing"));
        assert!(bad("[7]", "[24]").contains("increasing"));
        assert!(bad("\"sha256\"", "\"sha1\"").contains("PCR bank"));
        assert!(bad("AQID", "!!").contains("not base64"));
        assert!(bad("AQID", "").contains("0 bytes"));
        assert!(bad("abab", "ABAB").contains("hex"));
        assert!(bad(r#""tpm2-pcrs""#, r#""extra":1,"tpm2-pcrs""#).contains("unknown field"));
        let two = format!(r#"{{"tokens":{{"0":{EXAMPLE},"1":{EXAMPLE}}}}}"#);
        assert_eq!(find_token(&two), Err(TokenError::Several(2)));
        assert!(matches!(find_token("null"), Err(TokenError::Metadata(_))));
        assert!(matches!(find_token("{"), Err(TokenError::Metadata(_))));
    }

    #[test]
    fn reads_the_label_of_a_luks2_header_only() {
        let mut head = vec![0u8; 4096];
        assert_eq!(luks2_label(&head), None);
        head[..6].copy_from_slice(b"LUKS\xba\xbe");
        head[7] = 2;
        head[24..24 + SETUP_LABEL.len()].copy_from_slice(SETUP_LABEL.as_bytes());
        assert_eq!(luks2_label(&head).as_deref(), Some(SETUP_LABEL));
        head[7] = 1;
        assert_eq!(luks2_label(&head), None);
        assert_eq!(luks2_label(&head[..10]), None);
    }

    #[test]
    fn only_a_blank_head_or_an_unfinished_setup_is_ever_set_up() {
        let luks = Some("crypto_LUKS");
        assert_eq!(classify(None, None, None), Found::Blank);
        assert_eq!(
            classify(luks, Some(LABEL), Some((2, token()))),
            Found::Sealed(0, Box::new(token()))
        );
        // The token is the commit point: found, the volume is slate's whatever the label.
        assert!(matches!(
            classify(luks, Some(SETUP_LABEL), Some((0, token()))),
            Found::Sealed(..)
        ));
        assert_eq!(
            classify(luks, Some(SETUP_LABEL), None),
            Found::SetupInterrupted
        );
        for other in [
            classify(luks, Some(LABEL), None),
            classify(luks, Some(""), None),
            classify(luks, None, None),
            classify(Some("ext2/3/4"), None, None),
        ] {
            assert!(matches!(other, Found::Other(_)), "{other:?}");
        }
    }

    #[test]
    fn key_slots_are_read_as_numbers_and_a_reseal_plans_around_the_two_in_use() {
        let dump = r#"{"keyslots":{"1":{},"0":{},"2":{}},"tokens":{}}"#;
        assert_eq!(key_slots(dump).unwrap(), [0, 1, 2]);
        assert_eq!(key_slots(r#"{"tokens":{}}"#).unwrap(), Vec::<u32>::new());
        assert!(key_slots(r#"{"keyslots":{"x":{}}}"#).is_err());
        assert!(key_slots(r#"{"keyslots":{"32":{}}}"#).is_err());
        assert!(key_slots(r#"{"keyslots":{"007":{}}}"#).is_err());
        assert!(key_slots(r#"{"keyslots":{"01":{},"1":{}}}"#).is_err());
        let plan = |used: &[u32], token| plan_reseal(used, token, 1);
        assert_eq!(
            plan(&[0, 1], 0),
            Ok(ResealPlan {
                new_slot: 2,
                leftovers: vec![]
            })
        );
        assert_eq!(
            plan(&[1, 2], 2),
            Ok(ResealPlan {
                new_slot: 0,
                leftovers: vec![]
            })
        );
        // A reseal cut after its new slot was added and before the token moved.
        assert_eq!(
            plan(&[0, 1, 2], 0),
            Ok(ResealPlan {
                new_slot: 2,
                leftovers: vec![2]
            })
        );
        assert!(plan(&[0], 0).unwrap_err().contains("no recovery key slot"));
        assert!(plan(&[0, 1], 1).unwrap_err().contains("the recovery key's"));
    }

    #[test]
    fn the_recovery_key_is_eight_groups_of_hex() {
        let mut random = [0u8; 32];
        random[0] = 0xde;
        random[31] = 0x01;
        let key = recovery_key(&random);
        assert_eq!(key.len(), 71);
        assert!(key.starts_with("de000000-"), "{key}");
        assert!(key.ends_with("-00000001"), "{key}");
    }
}

//! META values carried on the kernel command line or in `INSTALLER_META_BASE64`:
//! `0x<tag>=<value>` pairs joined by `;`, gzip-compressed when longer than 256 bytes, then
//! standard base64.

use std::io::{Read, Write};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;

use crate::tag::parse_u8_like_go;

/// Longest joined payload sent uncompressed.
pub const COMPRESS_ABOVE: usize = 256;
/// A decoded payload larger than this is refused: it could never fit in META anyway, and a
/// small gzip bomb must not exhaust memory.
const MAX_DECODED: u64 = crate::adv::DATA_LEN as u64;

#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    #[error("the payload is not valid standard base64")]
    Base64(#[from] base64::DecodeError),
    #[error("the payload is gzip-compressed but does not decompress")]
    Gzip(#[source] std::io::Error),
    #[error("the payload decompresses to more than {MAX_DECODED} bytes")]
    TooLarge,
    #[error("the payload is not UTF-8 text")]
    NotText,
    #[error("entry {index} ({entry:?}) has no '='")]
    MissingEquals { index: usize, entry: String },
    #[error("entry {index}: {key:?} is not a tag number from 0 to 255")]
    BadKey { index: usize, key: String },
    #[error("the value of tag {tag:#x} contains ';', which the payload cannot carry")]
    Semicolon { tag: u8 },
}

/// Encode `(tag, value)` pairs in order.
pub fn encode(values: &[(u8, &str)]) -> Result<String, PayloadError> {
    if let Some((tag, _)) = values.iter().find(|(_, v)| v.contains(';')) {
        return Err(PayloadError::Semicolon { tag: *tag });
    }
    let joined = values
        .iter()
        .map(|(tag, value)| format!("{tag:#x}={value}"))
        .collect::<Vec<_>>()
        .join(";");
    let bytes = if joined.len() > COMPRESS_ABOVE {
        let mut gz = GzEncoder::new(Vec::new(), Compression::best());
        gz.write_all(joined.as_bytes())
            .map_err(PayloadError::Gzip)?;
        gz.finish().map_err(PayloadError::Gzip)?
    } else {
        joined.into_bytes()
    };
    Ok(STANDARD.encode(bytes))
}

/// Decode a payload into `(tag, value)` pairs, in payload order.
pub fn decode(payload: &str) -> Result<Vec<(u8, String)>, PayloadError> {
    let raw = STANDARD.decode(payload.trim())?;
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    let raw = if raw.len() >= 10 && raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        GzDecoder::new(raw.as_slice())
            .take(MAX_DECODED + 1)
            .read_to_end(&mut out)
            .map_err(PayloadError::Gzip)?;
        if out.len() as u64 > MAX_DECODED {
            return Err(PayloadError::TooLarge);
        }
        out
    } else {
        raw
    };
    let text = String::from_utf8(raw).map_err(|_| PayloadError::NotText)?;
    text.split(';')
        .enumerate()
        .map(|(index, entry)| {
            let (key, value) =
                entry
                    .split_once('=')
                    .ok_or_else(|| PayloadError::MissingEquals {
                        index,
                        entry: entry.to_string(),
                    })?;
            let tag = parse_u8_like_go(key).ok_or_else(|| PayloadError::BadKey {
                index,
                key: key.to_string(),
            })?;
            Ok((tag, value.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decodes_the_image_factory_vector() {
        let decoded = decode("MHhhPXsiZXh0ZXJuYWxJUHMiOlsiMS4yLjMuNCJdfQ==").unwrap();
        assert_eq!(
            decoded,
            vec![(0x0a, r#"{"externalIPs":["1.2.3.4"]}"#.to_string())]
        );
        assert_eq!(
            encode(&[(0x0a, r#"{"externalIPs":["1.2.3.4"]}"#)]).unwrap(),
            "MHhhPXsiZXh0ZXJuYWxJUHMiOlsiMS4yLjMuNCJdfQ=="
        );
    }

    #[test]
    fn long_payloads_are_gzipped_and_short_ones_are_not() {
        let long = "x".repeat(300);
        let encoded = encode(&[(6, &long)]).unwrap();
        let raw = STANDARD.decode(&encoded).unwrap();
        assert_eq!(&raw[..2], &[0x1f, 0x8b]);
        assert!(encoded.len() < 300);
        assert_eq!(decode(&encoded).unwrap(), vec![(6, long)]);
        let short = STANDARD.decode(encode(&[(6, "A")]).unwrap()).unwrap();
        assert_eq!(short, b"0x6=A");
    }

    #[test]
    fn bad_payloads_get_specific_errors() {
        assert!(matches!(decode("!!!"), Err(PayloadError::Base64(_))));
        assert_eq!(decode("").unwrap(), vec![]);
        let b64 = |s: &str| STANDARD.encode(s);
        assert!(matches!(
            decode(&b64("0x6")),
            Err(PayloadError::MissingEquals { index: 0, .. })
        ));
        assert!(matches!(
            decode(&b64("0x6=a;0x100=b")),
            Err(PayloadError::BadKey { index: 1, .. })
        ));
        let mut gz_junk = vec![0x1f, 0x8b];
        gz_junk.extend([0xff; 20]);
        assert!(matches!(
            decode(&STANDARD.encode(gz_junk)),
            Err(PayloadError::Gzip(_))
        ));
        assert!(matches!(
            encode(&[(6, "a;b")]),
            Err(PayloadError::Semicolon { tag: 6 })
        ));
    }

    #[test]
    fn a_gzip_bomb_is_refused() {
        let mut gz = GzEncoder::new(Vec::new(), Compression::best());
        gz.write_all(&vec![b'a'; 4 << 20]).unwrap();
        let bomb = STANDARD.encode(gz.finish().unwrap());
        assert!(matches!(decode(&bomb), Err(PayloadError::TooLarge)));
    }

    proptest! {
        #[test]
        fn round_trips(values in proptest::collection::vec((any::<u8>(), "[^;]{0,80}"), 0..12)) {
            let borrowed: Vec<(u8, &str)> = values.iter().map(|(t, v)| (*t, v.as_str())).collect();
            let decoded = decode(&encode(&borrowed).unwrap()).unwrap();
            if values.is_empty() {
                prop_assert!(decoded.is_empty());
            } else {
                prop_assert_eq!(decoded, values);
            }
        }

        #[test]
        fn decode_never_panics(input in ".{0,200}") {
            let _ = decode(&input);
        }
    }
}

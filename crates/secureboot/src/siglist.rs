//! EFI signature lists and authenticated variable payloads (docs/formats.md §11.4): the form of
//! the firmware's `db` variable and of the `.auth` files systemd-boot enrols from
//! `ESP/loader/keys/auto/`. Only X.509 entries matter here; hash entries are skipped.

/// `EFI_CERT_X509_GUID` (a5c059a1-94e4-4aa7-87b5-ab155c2bf072) as stored: the first three
/// fields little-endian.
pub const EFI_CERT_X509_GUID: [u8; 16] = [
    0xa1, 0x59, 0xc0, 0xa5, 0xe4, 0x94, 0xa7, 0x4a, 0x87, 0xb5, 0xab, 0x15, 0x5c, 0x2b, 0xf0, 0x72,
];

/// `EFI_SIGNATURE_LIST` header: type GUID, list size, header size, signature size.
const LIST_HEADER: usize = 16 + 4 + 4 + 4;
/// Each `EFI_SIGNATURE_DATA` starts with its owner's GUID.
const OWNER: usize = 16;
/// `EFI_VARIABLE_AUTHENTICATION_2`: an `EFI_TIME`, then a `WIN_CERTIFICATE_UEFI_GUID` whose
/// first field is its own length.
const EFI_TIME: usize = 16;
const WIN_CERTIFICATE_UEFI_GUID_HEADER: usize = 4 + 2 + 2 + 16;
const WIN_CERT_TYPE_EFI_GUID: u16 = 0x0ef1;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SigListError {
    #[error("a signature list at byte {at} is cut short or its sizes are inconsistent")]
    BadList { at: usize },
    #[error("an authenticated variable payload: {0}")]
    BadAuth(String),
}

fn u32_at(bytes: &[u8], at: usize) -> Option<usize> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
}

/// The X.509 certificates (DER) in a sequence of `EFI_SIGNATURE_LIST`s, in order.
pub fn certs_from_signature_lists(bytes: &[u8]) -> Result<Vec<Vec<u8>>, SigListError> {
    let mut certs = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let bad = SigListError::BadList { at };
        let kind = bytes.get(at..at + 16).ok_or(bad.clone())?;
        let list_size = u32_at(bytes, at + 16).ok_or(bad.clone())?;
        let header_size = u32_at(bytes, at + 20).ok_or(bad.clone())?;
        let sig_size = u32_at(bytes, at + 24).ok_or(bad.clone())?;
        let end = at.checked_add(list_size).ok_or(bad.clone())?;
        let first = (at + LIST_HEADER)
            .checked_add(header_size)
            .ok_or(bad.clone())?;
        if list_size < LIST_HEADER || end > bytes.len() || first > end || sig_size <= OWNER {
            return Err(bad);
        }
        if (end - first) % sig_size != 0 {
            return Err(bad);
        }
        if kind == EFI_CERT_X509_GUID {
            certs.extend(
                bytes[first..end]
                    .chunks_exact(sig_size)
                    .map(|sig| sig[OWNER..].to_vec()),
            );
        }
        at = end;
    }
    Ok(certs)
}

/// The certificates in a time-based authenticated variable payload (`PK.auth`, `KEK.auth`,
/// `db.auth`): the `EFI_VARIABLE_AUTHENTICATION_2` header is skipped, its signature not
/// checked (the firmware checks it when it enrols), the signature lists after it read.
pub fn certs_from_auth(bytes: &[u8]) -> Result<Vec<Vec<u8>>, SigListError> {
    let length = u32_at(bytes, EFI_TIME)
        .ok_or_else(|| SigListError::BadAuth("shorter than its header".into()))?;
    let kind = bytes
        .get(EFI_TIME + 6..EFI_TIME + 8)
        .map(|b| u16::from_le_bytes([b[0], b[1]]));
    if kind != Some(WIN_CERT_TYPE_EFI_GUID) {
        return Err(SigListError::BadAuth(
            "not a WIN_CERTIFICATE_UEFI_GUID".into(),
        ));
    }
    let data = EFI_TIME
        .checked_add(length)
        .filter(|&d| length >= WIN_CERTIFICATE_UEFI_GUID_HEADER && d <= bytes.len())
        .ok_or_else(|| SigListError::BadAuth(format!("a certificate length of {length} bytes")))?;
    certs_from_signature_lists(&bytes[data..])
}

/// One `EFI_SIGNATURE_LIST` holding one X.509 certificate owned by `owner`.
pub fn signature_list(cert_der: &[u8], owner: [u8; 16]) -> Vec<u8> {
    let sig_size = OWNER + cert_der.len();
    let mut out = Vec::with_capacity(LIST_HEADER + sig_size);
    out.extend_from_slice(&EFI_CERT_X509_GUID);
    out.extend_from_slice(&((LIST_HEADER + sig_size) as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(sig_size as u32).to_le_bytes());
    out.extend_from_slice(&owner);
    out.extend_from_slice(cert_der);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_round_trip_and_hash_lists_are_skipped() {
        let mut bytes = signature_list(b"cert one", [1; 16]);
        // An EFI_CERT_SHA256_GUID list with one hash: skipped.
        let mut hashes = vec![0x26, 0x16, 0xc4, 0xc1, 0x4c, 0x50, 0x92, 0x40];
        hashes.extend_from_slice(&[0xac, 0xa9, 0x41, 0xf9, 0x36, 0x93, 0x43, 0x28]);
        hashes.extend_from_slice(&((LIST_HEADER + 48) as u32).to_le_bytes());
        hashes.extend_from_slice(&0u32.to_le_bytes());
        hashes.extend_from_slice(&48u32.to_le_bytes());
        hashes.extend_from_slice(&[7; 48]);
        bytes.extend_from_slice(&hashes);
        bytes.extend_from_slice(&signature_list(b"cert two", [2; 16]));
        assert_eq!(
            certs_from_signature_lists(&bytes).unwrap(),
            vec![b"cert one".to_vec(), b"cert two".to_vec()]
        );
    }

    #[test]
    fn inconsistent_sizes_are_refused_not_read_past() {
        let good = signature_list(b"certificate", [1; 16]);
        for cut in 1..good.len() {
            assert!(
                certs_from_signature_lists(&good[..cut]).is_err(),
                "cut at {cut}"
            );
        }
        let mut bad = good.clone();
        bad[24..28].copy_from_slice(&5u32.to_le_bytes()); // signature smaller than its owner
        assert!(certs_from_signature_lists(&bad).is_err());
        let mut bad = good;
        bad[16..20].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(certs_from_signature_lists(&bad).is_err());
    }

    #[test]
    fn auth_header_is_skipped() {
        let list = signature_list(b"db cert", [3; 16]);
        let mut auth = vec![0; EFI_TIME];
        let cert_data = [9u8; 10];
        let length = (WIN_CERTIFICATE_UEFI_GUID_HEADER + cert_data.len()) as u32;
        auth.extend_from_slice(&length.to_le_bytes());
        auth.extend_from_slice(&0x0200u16.to_le_bytes());
        auth.extend_from_slice(&WIN_CERT_TYPE_EFI_GUID.to_le_bytes());
        auth.extend_from_slice(&[0; 16]);
        auth.extend_from_slice(&cert_data);
        auth.extend_from_slice(&list);
        assert_eq!(certs_from_auth(&auth).unwrap(), vec![b"db cert".to_vec()]);
        auth[EFI_TIME..EFI_TIME + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(certs_from_auth(&auth).is_err());
    }
}

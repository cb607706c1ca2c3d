//! Client chains already judged good, remembered by their digest for as long as every
//! certificate in them is valid.
//!
//! A server that hears from a fleet judges each connection's chain again
//! ([`super::ClientTrust::caller`]), a resumed session's too: at 10,000 nodes reporting
//! every 30 s that was two P-256 signature checks per heartbeat, about 7 % of the operator's
//! CPU. Whether a chain verifies is a function of its bytes, the trust anchors and the time
//! alone (no revocation list is consulted), and the time enters only through each
//! certificate's validity. So a chain judged good is good again, with the same caller, while
//! the time stays within the intersection of its certificates' validity periods (a path that
//! used fewer of them is valid for at least that long): outside it, or for bytes that differ
//! in any way, the chain is judged afresh. Each [`super::ClientTrust`] has its own memory, so
//! new trust anchors start with none. The handshake's proof that the client holds the key
//! (its signature over the handshake) is checked on every full handshake regardless.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use rustls_pki_types::{CertificateDer, UnixTime};
use sha2::Digest as _;

use crate::types::Caller;

/// Chains held at most: a fleet's nodes and its people. Past it the memory starts again
/// (each chain is judged once more), which bounds it to a few MiB.
pub(crate) const MAX_JUDGED: usize = 32_768;

/// The digest that names a chain: each certificate's length and bytes, in order.
pub(crate) type ChainDigest = [u8; 32];

pub(crate) fn chain_digest<'c, 'd: 'c>(
    chain: impl IntoIterator<Item = &'c CertificateDer<'d>>,
) -> ChainDigest {
    let mut hash = sha2::Sha256::new();
    for cert in chain {
        hash.update((cert.len() as u64).to_le_bytes());
        hash.update(cert.as_ref());
    }
    hash.finalize().into()
}

/// Seconds since the epoch within which every certificate of a chain is valid, both ends
/// included (as webpki checks them); `None` if one does not parse or they do not overlap.
pub(crate) fn validity_window(chain: &[CertificateDer<'_>]) -> Option<(i64, i64)> {
    let mut from = i64::MIN;
    let mut until = i64::MAX;
    for cert in chain {
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
        let validity = parsed.validity();
        from = from.max(validity.not_before.timestamp());
        until = until.min(validity.not_after.timestamp());
    }
    (from <= until).then_some((from, until))
}

#[derive(Debug, Clone)]
struct Verdict {
    caller: Caller,
    from: i64,
    until: i64,
}

#[derive(Debug, Default)]
pub(crate) struct Judged {
    held: Mutex<HashMap<ChainDigest, Verdict>>,
}

impl Judged {
    /// The caller a chain was judged to be, if it was judged good and `now` is within its
    /// validity.
    pub(crate) fn caller(&self, digest: &ChainDigest, now: UnixTime) -> Option<Caller> {
        let held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let verdict = held.get(digest)?;
        let now = i64::try_from(now.as_secs()).ok()?;
        (verdict.from <= now && now <= verdict.until).then(|| verdict.caller.clone())
    }

    /// Whether a chain was judged good and `now` is within its validity.
    pub(crate) fn holds(&self, digest: &ChainDigest, now: UnixTime) -> bool {
        self.caller(digest, now).is_some()
    }

    /// `chain` was just judged good as `caller`.
    pub(crate) fn remember(
        &self,
        digest: ChainDigest,
        chain: &[CertificateDer<'_>],
        caller: &Caller,
    ) {
        let Some((from, until)) = validity_window(chain) else {
            return;
        };
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.len() >= MAX_JUDGED {
            held.clear();
        }
        held.insert(
            digest,
            Verdict {
                caller: caller.clone(),
                from,
                until,
            },
        );
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::certs::{self, CA_CERT, CLIENT_CA_CERT};
    use crate::tls::{parse_certs, ClientTrust};
    use crate::types::Role;
    use rustls::server::danger::ClientCertVerifier as _;

    fn at(secs: i64) -> UnixTime {
        UnixTime::since_unix_epoch(Duration::from_secs(secs as u64))
    }

    struct Pki {
        _dir: tempfile::TempDir,
        trust: ClientTrust,
        reader: Vec<CertificateDer<'static>>,
        admin: Vec<CertificateDer<'static>>,
        /// The reader's chain from another fleet's client CA.
        stranger: Vec<CertificateDer<'static>>,
    }

    fn pki() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        certs::gen_certs(dir.path(), &[]).unwrap();
        certs::gen_certs(other.path(), &[]).unwrap();
        let read = |dir: &std::path::Path, name: &str| std::fs::read(dir.join(name)).unwrap();
        let trust = ClientTrust::new(
            &read(dir.path(), CLIENT_CA_CERT),
            Some(&read(dir.path(), CA_CERT)),
        )
        .unwrap();
        let chain = |dir: &std::path::Path, role: Role| {
            parse_certs(&read(dir, &certs::client_cert_file(role)), "test").unwrap()
        };
        Pki {
            reader: chain(dir.path(), Role::Reader),
            admin: chain(dir.path(), Role::Admin),
            stranger: chain(other.path(), Role::Reader),
            trust,
            _dir: dir,
        }
    }

    #[test]
    fn a_chain_judged_good_is_remembered_only_while_every_certificate_is_valid() {
        let pki = pki();
        let (from, until) = validity_window(&pki.reader).unwrap();
        let now = at(from + 60);
        let reader = pki.trust.caller_at(&pki.reader, now).unwrap();
        assert_eq!(reader.role, Role::Reader);
        assert_eq!(pki.trust.judged.len(), 1);
        // Answered from memory: the same caller, nothing more held.
        assert_eq!(pki.trust.caller_at(&pki.reader, now), Some(reader.clone()));
        assert_eq!(pki.trust.judged.len(), 1);
        let digest = chain_digest(&pki.reader);
        assert_eq!(pki.trust.judged.caller(&digest, now), Some(reader));
        // Past its end or before its start the memory does not answer, and judged afresh
        // the chain is refused (expired, not yet valid): by the handshake's verifier too.
        for outside in [at(until + 1), at(from - 1)] {
            assert_eq!(pki.trust.judged.caller(&digest, outside), None);
            assert_eq!(pki.trust.caller_at(&pki.reader, outside), None);
            let (end_entity, intermediates) = pki.reader.split_first().unwrap();
            assert!(pki
                .trust
                .verify_client_cert(end_entity, intermediates, outside)
                .is_err());
        }
        // Both ends are inside, as webpki has them.
        assert!(pki.trust.judged.holds(&digest, at(until)));
        assert!(pki.trust.judged.holds(&digest, at(from)));
    }

    #[test]
    fn only_the_same_bytes_are_answered_from_memory_and_a_refused_chain_is_not_held() {
        let pki = pki();
        let now = UnixTime::now();
        pki.trust.caller_at(&pki.reader, now).unwrap();
        // Another chain of the same CA is judged on its own, with its own role.
        let admin = pki.trust.caller_at(&pki.admin, now).unwrap();
        assert_eq!(admin.role, Role::Admin);
        assert_eq!(pki.trust.judged.len(), 2);
        // One byte changed (here in the signature) is another chain: judged, and refused.
        let mut forged = pki.reader.clone();
        let mut bytes = forged[0].as_ref().to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        forged[0] = CertificateDer::from(bytes);
        assert_ne!(chain_digest(&forged), chain_digest(&pki.reader));
        assert_eq!(pki.trust.caller_at(&forged, now), None);
        // Another fleet's reader: refused, and not held.
        assert_eq!(pki.trust.caller_at(&pki.stranger, now), None);
        assert_eq!(pki.trust.judged.len(), 2);
        let (end_entity, intermediates) = pki.stranger.split_first().unwrap();
        assert!(pki
            .trust
            .verify_client_cert(end_entity, intermediates, now)
            .is_err());
    }

    #[test]
    fn the_memory_is_bounded() {
        let pki = pki();
        let caller = pki.trust.caller_at(&pki.reader, UnixTime::now()).unwrap();
        let judged = Judged::default();
        for i in 0..MAX_JUDGED + 10 {
            let mut digest = [0; 32];
            digest[..8].copy_from_slice(&(i as u64).to_le_bytes());
            judged.remember(digest, &pki.reader, &caller);
        }
        assert!(judged.len() <= MAX_JUDGED);
        assert_eq!(judged.len(), 10);
    }
}

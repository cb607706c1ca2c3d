//! A group's rollout as one etcd value: JSON, gzip-compressed once it is large.
//!
//! A rollout holds every node's step and a day of upgrade starts, about 130 bytes a node: at
//! etcd's default request limit (1.5 MiB) plain JSON stopped at about 8,000 nodes in a group.
//! The JSON repeats the same keys for every node and compresses about tenfold, so a value
//! above [`COMPRESS_ABOVE`] is stored gzip-compressed. Small rollouts stay plain JSON, readable
//! by a replica that predates the compression; a reader tells the two apart by gzip's magic
//! bytes, which no JSON text starts with.

use std::io::{Read as _, Write as _};

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use slate_rollout::Rollout;

/// Plain JSON up to this size (about 110 nodes): the simulated-fleet test's groups of 300 and
/// 400 nodes are stored compressed, so the compressed path runs against real etcd there.
pub const COMPRESS_ABOVE: usize = 16 * 1024;
/// The most JSON a compressed value may expand to: a bound against a value crafted to inflate
/// without end (a rollout of 100,000 nodes is about 13 MiB).
pub const MAX_JSON: u64 = 64 << 20;
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The value stored for `rollout`.
pub fn encode(rollout: &Rollout) -> Vec<u8> {
    let text = serde_json::to_vec(rollout).expect("a rollout serializes");
    if text.len() <= COMPRESS_ABOVE {
        return text;
    }
    // Level 1: a tick may write a rollout of many thousand nodes; it still shrinks it about
    // tenfold.
    let mut gz = GzEncoder::new(Vec::with_capacity(text.len() / 8), Compression::fast());
    gz.write_all(&text).expect("writing into memory");
    gz.finish().expect("writing into memory")
}

/// The rollout a stored value holds, or why it holds none.
pub fn decode(value: &[u8]) -> Result<Rollout, String> {
    if !value.starts_with(&GZIP_MAGIC) {
        return serde_json::from_slice(value).map_err(|e| e.to_string());
    }
    let mut text = Vec::new();
    GzDecoder::new(value)
        .take(MAX_JSON + 1)
        .read_to_end(&mut text)
        .map_err(|e| format!("gzip: {e}"))?;
    if text.len() as u64 > MAX_JSON {
        return Err(format!("gzip: expands past {MAX_JSON} bytes"));
    }
    serde_json::from_slice(&text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use slate_rollout::{NodeProgress, RolloutState, Step, Strategy};

    use super::*;

    fn rollout(nodes: usize) -> Rollout {
        let mut progress = BTreeMap::new();
        let mut starts = Vec::new();
        for i in 0..nodes {
            let id = format!("node-{i:06}");
            let started = 1_796_000_000 + i as u64;
            progress.insert(
                id.clone(),
                NodeProgress {
                    from: Some("1.4.0".into()),
                    started: Some(started),
                    strategy: Strategy::InPlace,
                    step: Step::Done { at: started + 90 },
                },
            );
            starts.push((id, started));
        }
        Rollout {
            id: 7,
            group: "workers".into(),
            target: "1.5.0".into(),
            image: format!(
                "registry.lab:5000/slate/os:1.5.0@sha256:{}",
                "ab".repeat(32)
            ),
            created: 1_796_000_000,
            state: RolloutState::Running,
            nodes: progress,
            recent_starts: starts,
            acknowledged: Default::default(),
        }
    }

    #[test]
    fn a_group_of_20000_nodes_fits_the_request_limit_and_small_ones_stay_json() {
        let small = rollout(10);
        let value = encode(&small);
        assert_eq!(value.first(), Some(&b'{'), "plain JSON");
        assert_eq!(decode(&value).unwrap(), small);

        let large = rollout(20_000);
        let plain = serde_json::to_vec(&large).unwrap().len();
        let value = encode(&large);
        assert!(value.starts_with(&GZIP_MAGIC));
        // etcd's default request limit is 1.5 MiB; plain JSON would be far past it.
        assert!(plain > 2 * 1024 * 1024, "{plain}");
        assert!(value.len() < 1024 * 1024, "{} bytes", value.len());
        assert_eq!(decode(&value).unwrap(), large);
    }

    #[test]
    fn damaged_and_inflating_values_are_refused() {
        let value = encode(&rollout(2_000));
        let cut = &value[..value.len() / 2];
        assert!(decode(cut).unwrap_err().starts_with("gzip"));
        assert!(decode(b"{not json").is_err());
        // 65 MiB of spaces in a few KiB: refused at the bound, not inflated.
        let mut gz = GzEncoder::new(Vec::new(), Compression::best());
        gz.write_all(&vec![b' '; (MAX_JSON + (1 << 20)) as usize])
            .unwrap();
        let bomb = gz.finish().unwrap();
        assert!(bomb.len() < 256 * 1024);
        assert!(decode(&bomb).unwrap_err().contains("expands past"));
    }
}

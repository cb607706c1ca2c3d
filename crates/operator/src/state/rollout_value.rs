//! A group's rollout as one etcd value: JSON, gzip-compressed once it is large.
//!
//! A rollout holds every node's step and a day of upgrade starts, about 130 bytes a node: at
//! etcd's default request limit (1.5 MiB) plain JSON stopped at about 8,000 nodes in a group.
//! The JSON repeats the same keys for every node and compresses about tenfold, so a value
//! above [`COMPRESS_ABOVE`] is stored gzip-compressed. Small rollouts stay plain JSON, readable
//! by a replica that predates the compression; a reader tells the two apart by gzip's magic
//! bytes, which no JSON text starts with.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read as _, Write as _};

use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use flate2::Compression;
use serde::Serialize;
use slate_rollout::{NodeProgress, Rollout, RolloutState};

/// Plain JSON up to this size (about 110 nodes): the simulated-fleet test's groups of 300 and
/// 400 nodes are stored compressed, so the compressed path runs against real etcd there.
pub const COMPRESS_ABOVE: usize = 16 * 1024;
/// The most JSON a compressed value may expand to: a bound against a value crafted to inflate
/// without end (a rollout of 100,000 nodes is about 13 MiB).
pub const MAX_JSON: u64 = 64 << 20;
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// The value stored for `rollout`.
pub fn encode(rollout: &Rollout) -> Vec<u8> {
    compressed(serde_json::to_vec(rollout).expect("a rollout serializes"))
}

/// [`encode`], byte for byte, with each node's JSON kept from one call to the next: a leader
/// rewrites a group's whole rollout whenever one of its nodes moves, and most of a 1,000-node
/// rollout's encoding was its nodes' JSON, unchanged since the last time. A node's text is
/// reused only when its progress equals the one it was written from.
#[derive(Debug, Default)]
pub struct Encoder {
    /// By group: each node's id, the progress its text was written from, and the text
    /// (`"id":{…}`), in id order.
    groups: HashMap<String, Vec<(String, NodeProgress, Vec<u8>)>>,
}

/// `"nodes":{}` in a rollout's JSON without its nodes: a `"` inside a JSON string is always
/// escaped, so these bytes are the field itself, never part of a value.
const NO_NODES: &[u8] = br#""nodes":{}"#;

/// A [`Rollout`] as serde writes it, with its nodes left empty (to be spliced in); fields in
/// the same order and with the same attributes (the tests compare the bytes).
#[derive(Serialize)]
struct Shell<'a> {
    id: u64,
    group: &'a str,
    target: &'a str,
    image: &'a str,
    created: u64,
    state: &'a RolloutState,
    nodes: BTreeMap<String, NodeProgress>,
    recent_starts: &'a [(String, u64)],
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    acknowledged: &'a BTreeSet<String>,
}

impl Encoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// The value stored for `rollout`: what [`encode`] gives.
    pub fn encode(&mut self, rollout: &Rollout) -> Vec<u8> {
        compressed(self.json(rollout))
    }

    fn json(&mut self, rollout: &Rollout) -> Vec<u8> {
        let shell = Shell {
            id: rollout.id,
            group: &rollout.group,
            target: &rollout.target,
            image: &rollout.image,
            created: rollout.created,
            state: &rollout.state,
            nodes: BTreeMap::new(),
            recent_starts: &rollout.recent_starts,
            acknowledged: &rollout.acknowledged,
        };
        let head = serde_json::to_vec(&shell).expect("a rollout serializes");
        let Some(at) = head.windows(NO_NODES.len()).position(|w| w == NO_NODES) else {
            unreachable!("a rollout's JSON has its nodes field");
        };
        let split = at + NO_NODES.len() - 1; // just before the map's closing brace
        let known = self.groups.remove(&rollout.group).unwrap_or_default();
        let mut known = known.into_iter().peekable();
        let mut texts = Vec::with_capacity(rollout.nodes.len());
        let mut size = head.len();
        // Both in id order: one walk side by side.
        for (id, progress) in &rollout.nodes {
            while known.next_if(|(k, _, _)| k < id).is_some() {}
            let entry = match known.next_if(|(k, _, _)| k == id) {
                Some(kept) if kept.1 == *progress => kept,
                _ => {
                    let mut text = serde_json::to_vec(id).expect("an id serializes");
                    text.push(b':');
                    serde_json::to_writer(&mut text, progress).expect("a step serializes");
                    (id.clone(), progress.clone(), text)
                }
            };
            size += entry.2.len() + 1;
            texts.push(entry);
        }
        let mut out = Vec::with_capacity(size);
        out.extend_from_slice(&head[..split]);
        for (i, (_, _, text)) in texts.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(text);
        }
        out.extend_from_slice(&head[split..]);
        self.groups.insert(rollout.group.clone(), texts);
        out
    }
}

fn compressed(text: Vec<u8>) -> Vec<u8> {
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
    fn the_encoder_writes_what_encode_does_as_nodes_move() {
        let mut encoder = Encoder::new();
        let mut r = rollout(300);
        r.acknowledged.insert("node-000007".into());
        let check = |encoder: &mut Encoder, r: &Rollout| {
            let value = encoder.encode(r);
            assert_eq!(value, encode(r), "the encoder's bytes differ from encode's");
            assert_eq!(decode(&value).unwrap(), *r);
        };
        check(&mut encoder, &r);
        check(&mut encoder, &r);
        // A node moves: its text must not be the one kept from before.
        r.nodes.get_mut("node-000042").unwrap().step = Step::Failed {
            at: 5,
            reason: "reverted: \"nodes\":{} in a reason".into(),
        };
        check(&mut encoder, &r);
        // Nodes join (first, middle, last) and leave; the rollout's own fields change.
        for id in ["a-first", "node-000100x", "z-last"] {
            let mut p = r.nodes["node-000001"].clone();
            p.step = Step::Upgrading {
                issued: false,
                prior_failure: None,
            };
            r.nodes.insert(id.into(), p);
        }
        r.nodes.remove("node-000000");
        r.nodes.remove("node-000299");
        r.state = RolloutState::Paused {
            reason: "\"nodes\":{}".into(),
            since: 9,
        };
        r.recent_starts.push(("z-last".into(), 1));
        check(&mut encoder, &r);
        // Back to what a node was: the text follows the value, not the history.
        r.nodes.get_mut("node-000042").unwrap().step = Step::Done { at: 1_796_000_132 };
        check(&mut encoder, &r);
        // Another group, and one that emptied.
        let mut other = rollout(3);
        other.group = "other".into();
        check(&mut encoder, &other);
        other.nodes.clear();
        check(&mut encoder, &other);
        check(&mut encoder, &r);
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

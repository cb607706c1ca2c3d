//! How simulated upgrades behave: timing, which versions fail, and the deterministic randomness
//! behind jitter and probabilistic failures.

use std::collections::BTreeSet;
use std::time::Duration;

/// The simulated outcome and timing of upgrades, fleet-wide. Replaceable at runtime
/// ([`crate::Fleet::set_behaviour`]) so that a test can make a version go bad mid-rollout.
#[derive(Clone, Debug, PartialEq)]
pub struct Behaviour {
    /// Versions that always fail their health checks and revert.
    pub fail_versions: BTreeSet<String>,
    /// The chance, for any other version, that an upgrade reverts (0.0 ..= 1.0).
    pub fail_probability: f64,
    /// From the accepted request to the reboot.
    pub upgrade_time: Duration,
    /// How long the node's API is down while it reboots.
    pub reboot_time: Duration,
    /// Each of `upgrade_time` and `reboot_time` is lengthened by a uniform random amount in
    /// `[0, jitter)`, drawn from the node's seeded generator.
    pub jitter: Duration,
}

impl Default for Behaviour {
    fn default() -> Self {
        Behaviour {
            fail_versions: BTreeSet::new(),
            fail_probability: 0.0,
            upgrade_time: Duration::from_secs(2),
            reboot_time: Duration::from_secs(1),
            jitter: Duration::ZERO,
        }
    }
}

impl Behaviour {
    /// Whether an upgrade to `version` reverts, given `draw` uniform in `[0, 1)`. The draw is
    /// taken for every upgrade, failing version or not, so that a node's sequence of random
    /// numbers (and so the rest of the run) does not depend on which versions are bad.
    pub fn reverts(&self, version: &str, draw: f64) -> bool {
        self.fail_versions.contains(version) || draw < self.fail_probability
    }
}

/// The version an image reference names: the tag after the last `:` of its last path
/// component (`registry:5000/slate/installer:1.2.0` → `1.2.0`), ignoring a `@digest`. `None`
/// when it has no tag: a node cannot judge "newer" without one.
pub fn image_version(image: &str) -> Option<&str> {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    let (_, tag) = last.rsplit_once(':')?;
    (!tag.is_empty()).then_some(tag)
}

/// splitmix64: tiny, fast, good enough for simulation, and fully determined by its seed, which
/// is what reproducible fault runs need (`rand` would add a dependency for no gain).
#[derive(Clone, Debug)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator for one node and purpose (`stream`), from the fleet's seed and the node id:
    /// the same node draws the same numbers in every run with the same seed, whatever the
    /// other nodes do.
    pub(crate) fn for_node(seed: u64, id: &str, stream: u64) -> Self {
        // FNV-1a: std's hashers are not guaranteed stable across releases.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in id.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let mut rng =
            SplitMix64(seed ^ h.rotate_left(23) ^ stream.wrapping_mul(0xA24B_AED4_963E_E407));
        rng.next_u64();
        rng
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `[0, max)`.
    pub(crate) fn up_to(&mut self, max: Duration) -> Duration {
        let draw = self.next_f64();
        if max.is_zero() {
            Duration::ZERO
        } else {
            max.mul_f64(draw)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_the_last_tag() {
        assert_eq!(
            image_version("ghcr.io/slate/installer:1.2.0"),
            Some("1.2.0")
        );
        assert_eq!(
            image_version("localhost:5000/slate/installer:v3"),
            Some("v3")
        );
        assert_eq!(image_version("localhost:5000/slate/installer"), None);
        assert_eq!(image_version("r/i:2.0@sha256:abcd"), Some("2.0"));
        assert_eq!(image_version("r/i:"), None);
        assert_eq!(image_version("r/i"), None);
    }

    #[test]
    fn generators_are_deterministic_per_node_and_seed() {
        let draws = |seed, id| {
            let mut r = SplitMix64::for_node(seed, id, 0);
            (0..4).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(draws(1, "a-00000"), draws(1, "a-00000"));
        assert_ne!(draws(1, "a-00000"), draws(1, "a-00001"));
        assert_ne!(draws(1, "a-00000"), draws(2, "a-00000"));
        let mut r = SplitMix64::for_node(7, "x", 0);
        let mean = (0..10_000).map(|_| r.next_f64()).sum::<f64>() / 10_000.0;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }
}

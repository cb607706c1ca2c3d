//! Arbitrary text into the rollout policy parser and arbitrary bytes into the heartbeat's node
//! report: nothing may panic; a policy set that parses has unique names and waves that ascend
//! to 100; a report that parses serializes to JSON that parses back equal.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_rollout::{NodeReport, PolicySet};

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(set) = PolicySet::parse(text) {
            let mut names: Vec<&str> = set.policies.iter().map(|p| p.name.as_str()).collect();
            names.sort();
            names.dedup();
            assert_eq!(names.len(), set.policies.len());
            for p in &set.policies {
                assert!(p.waves.windows(2).all(|w| w[0].percent < w[1].percent));
                assert!(p.waves.last().is_none_or(|w| w.percent == 100));
            }
        }
    }
    if let Ok(report) = serde_json::from_slice::<NodeReport>(data) {
        let json = serde_json::to_vec(&report).expect("a report serializes");
        let again: NodeReport = serde_json::from_slice(&json).expect("its own JSON parses");
        assert_eq!(again, report);
    }
});

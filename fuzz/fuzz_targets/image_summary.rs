//! Arbitrary bytes as a node's `GET /v1/image` answer (the running version's summary, which
//! `slate upgrade --check` decodes): nothing panics, and a summary that decoded encodes and
//! decodes again to the same value, and diffs against itself as unchanged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_bundle_diff::{diff, Summary};

fuzz_target!(|data: &[u8]| {
    let Ok(summary) = serde_json::from_slice::<Summary>(data) else {
        return;
    };
    let json = serde_json::to_vec(&summary).expect("a decoded summary encodes");
    let again: Summary = serde_json::from_slice(&json).expect("and decodes again");
    assert_eq!(again, summary);
    assert!(!diff(&summary, &again).differs());
});

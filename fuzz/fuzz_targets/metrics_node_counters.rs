//! Arbitrary bytes as the node's kept counters (`metrics/counters` on STATE): nothing panics,
//! a record that parsed formats back to the same bytes and holds at most `MAX_COUNTERS`
//! counters, each with valid names.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_metrics::node_counters::{self, NodeCounters};

fuzz_target!(|data: &[u8]| {
    match NodeCounters::parse(data) {
        Ok(counters) => {
            assert_eq!(counters.format(), data);
            let mut again = counters.clone();
            again.merge(&counters);
            assert!(again.format().len() <= node_counters::MAX_RECORD_BYTES);
            assert_eq!(NodeCounters::parse(&again.format()).as_ref(), Ok(&again));
        }
        Err(err) => assert!(!err.to_string().is_empty()),
    }
});

//! Arbitrary bytes as the body of every node API request that has one (what the server hands
//! serde_json after its size cap): nothing panics, and whatever parses serializes and parses
//! back to the same value, so what a handler acts on is what the client meant.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::{de::DeserializeOwned, Serialize};
use slate_api::{
    ApplyConfigRequest, PinRequest, RebootRequest, RollbackRequest, SnapshotUpgradeRequest,
    UpgradeRequest,
};

fn round_trip<T: DeserializeOwned + Serialize + PartialEq + std::fmt::Debug>(data: &[u8]) {
    if let Ok(value) = serde_json::from_slice::<T>(data) {
        // A value that cannot be written (PowerOff is never on the wire) was not read either.
        let text = serde_json::to_vec(&value).expect("a request that parsed serializes");
        let again: T = serde_json::from_slice(&text).expect("what slate writes, slate reads");
        assert_eq!(again, value);
    }
}

fuzz_target!(|data: &[u8]| {
    round_trip::<UpgradeRequest>(data);
    round_trip::<RebootRequest>(data);
    round_trip::<RollbackRequest>(data);
    round_trip::<PinRequest>(data);
    round_trip::<SnapshotUpgradeRequest>(data);
    round_trip::<ApplyConfigRequest>(data);
});

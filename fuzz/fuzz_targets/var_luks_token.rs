//! A tpm2 /var's readers of what EPHEMERAL holds (docs/formats.md §15): the LUKS2 metadata
//! dump cryptsetup prints and slate's token in it, and the binary header's label. Any input,
//! no panic; a token returned reads back to itself, and what it promises holds (one key slot,
//! the sha256 bank, blobs that decode); the key slots it lists are slot numbers, and a
//! reseal's plan over them never puts the new key in a slot in use.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_node_fs::var_crypt::token::{find_token, key_slots, luks2_label, plan_reseal};

fuzz_target!(|data: &[u8]| {
    let _ = luks2_label(data);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(slots) = key_slots(text) {
        assert!(slots.windows(2).all(|w| w[0] < w[1]) && slots.iter().all(|s| *s < 32));
        let token_slot = slots.first().copied().unwrap_or(0);
        if let Ok(plan) = plan_reseal(&slots, token_slot, 1) {
            assert!(plan.new_slot != token_slot && plan.new_slot != 1);
            assert!(!slots.contains(&plan.new_slot) || plan.leftovers.contains(&plan.new_slot));
        }
    }
    if let Ok(Some((_, token))) = find_token(text) {
        let dump = format!(r#"{{"tokens":{{"0":{}}}}}"#, token.to_json());
        let again = find_token(&dump).expect("a token slate read reads again");
        assert_eq!(again.map(|(_, t)| t), Some(token.clone()));
        assert_eq!(token.keyslots.len(), 1);
        assert!(token.pcr_selection().starts_with("sha256:"));
        let (public, private) = token.blobs();
        assert!(!public.is_empty() && !private.is_empty());
    }
});

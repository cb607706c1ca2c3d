//! Arbitrary bytes into slate-bootspec's grubenv reader and GRUB selection model. Nothing may
//! panic; a block that parses writes back byte for byte, stays 1024 bytes through any edit,
//! and every edit that is accepted reads back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_bootspec::{grub_select, GrubEnv, GrubMenuEntry, GRUBENV_LEN};

fuzz_target!(|data: &[u8]| {
    // First byte: how many bytes of edit script follow; the rest padded/cut to a block, so
    // most inputs reach the line parser rather than stopping at the length check.
    let (script, block) = match data.split_first() {
        Some((&n, rest)) => rest.split_at((n as usize).min(rest.len())),
        None => (&[][..], data),
    };
    let _ = GrubEnv::parse(block);
    let mut bytes = b"# GRUB Environment Block\n".to_vec();
    bytes.extend_from_slice(block);
    bytes.resize(GRUBENV_LEN, b'#');
    let Ok(mut env) = GrubEnv::parse(&bytes) else {
        return;
    };
    assert_eq!(
        env.to_bytes(),
        bytes,
        "a parsed block writes back unchanged"
    );
    let menu = [
        GrubMenuEntry {
            title: "slate A".into(),
            id: "A".into(),
        },
        GrubMenuEntry {
            title: "slate B".into(),
            id: "B".into(),
        },
    ];
    let sel = grub_select(Some(&env), &menu).unwrap();
    assert!(sel.index < menu.len());
    if let Some(after) = &sel.env_after {
        assert_eq!(after.to_bytes().len(), GRUBENV_LEN);
        assert_eq!(after.get("next_entry"), Some(""));
    }
    let text = String::from_utf8_lossy(script);
    for op in text.split(';') {
        match op.split_once('=') {
            Some((name, value)) => {
                if env.set(name, value).is_ok() {
                    assert_eq!(env.get(name), Some(value));
                }
            }
            None => {
                env.unset(op);
                assert_eq!(env.get(op), None);
            }
        }
        let out = env.to_bytes();
        assert_eq!(out.len(), GRUBENV_LEN);
        assert_eq!(GrubEnv::parse(&out).as_ref(), Ok(&env));
    }
});

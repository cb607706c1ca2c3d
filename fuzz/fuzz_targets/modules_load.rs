//! init's `modules.load` (docs/formats.md §6.3), any bytes as text: nothing panics; a parsed
//! list names each path once and each module only needs earlier lines; and loading it on two
//! threads starts every module after what it needs and ends with all of them loaded (no
//! deadlock, whatever the dependencies).
#![no_main]

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(modules) = slate_init::parse_modules_load(text) else {
        return;
    };
    for (i, m) in modules.iter().enumerate() {
        assert!(m.after.iter().all(|&d| d < i));
        assert!(!modules[..i].iter().any(|o| o.path == m.path));
    }
    let loaded = Mutex::new(Vec::<&str>::new());
    slate_init::load_in_order(
        &modules,
        2,
        |path| {
            let m = modules.iter().find(|m| m.path == path).unwrap();
            let done = loaded.lock().unwrap();
            assert!(m.after.iter().all(|&d| done.contains(&modules[d].path)));
            Ok(())
        },
        |l| loaded.lock().unwrap().push(l.path),
    )
    .unwrap();
    assert_eq!(loaded.into_inner().unwrap().len(), modules.len());
});

//! init's `modules.load` (docs/formats.md §6.3), any bytes as text: nothing panics; a parsed
//! list names each path once and each module only needs earlier lines; and loading it on two
//! threads starts every module after what it needs and ends with all of them loaded (no
//! deadlock, whatever the dependencies).
#![no_main]

use std::sync::atomic::{AtomicUsize, Ordering};
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
    // A load is recorded as its last act: the loader marks a module done only once `load`
    // returns, and only then may what needs it start. (`report` runs after that, outside the
    // loader's lock, so its order may lag behind the loads'.)
    let loaded = Mutex::new(Vec::<&str>::new());
    let reported = AtomicUsize::new(0);
    slate_init::load_in_order(
        &modules,
        2,
        |path| {
            let m = modules.iter().find(|m| m.path == path).unwrap();
            let mut done = loaded.lock().unwrap();
            assert!(m.after.iter().all(|&d| done.contains(&modules[d].path)));
            done.push(m.path);
            Ok(())
        },
        |_| {
            reported.fetch_add(1, Ordering::Relaxed);
        },
    )
    .unwrap();
    assert_eq!(loaded.into_inner().unwrap().len(), modules.len());
    assert_eq!(reported.into_inner(), modules.len());
});

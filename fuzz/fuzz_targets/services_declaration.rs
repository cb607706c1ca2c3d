//! Arbitrary `[[services]]` documents into the services crate (issue 38): the TOML parse, each
//! declaration's checks and the set's start order. Nothing may panic; an order, when there is
//! one, lists every service once and puts each after the services it depends on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_services::order::service_dependencies;
use slate_services::ServiceSpec;

#[derive(serde::Deserialize)]
struct Document {
    #[serde(default)]
    services: Vec<ServiceSpec>,
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(doc) = toml::from_str::<Document>(text) else {
        return;
    };
    // Programs exist when their path has an even length: both answers are exercised.
    let has_program = |p: &std::path::Path| p.as_os_str().len() % 2 == 0;
    let Ok(order) = slate_services::start_order(&doc.services, &has_program) else {
        return;
    };
    let mut seen = vec![false; doc.services.len()];
    for (position, &index) in order.iter().enumerate() {
        assert!(!seen[index], "listed twice");
        seen[index] = true;
        for dependency in service_dependencies(&doc.services[index]) {
            let before = order[..position]
                .iter()
                .any(|&i| doc.services[i].name == dependency);
            assert!(before, "{dependency} after its dependent");
        }
    }
    assert!(seen.iter().all(|s| *s), "a service left out");
    // What was taken writes back to what parses the same.
    for service in &doc.services {
        let text = toml::to_string(service).expect("a declaration serializes");
        assert_eq!(&toml::from_str::<ServiceSpec>(&text).expect("re-parses"), service);
    }
});

//! Arbitrary bytes into slate-fleetlock's parsers: a request body, a stored semaphore (airlock's
//! value) and the file store's record. Nothing may panic; what parses writes back to bytes
//! that parse equal; a parsed semaphore keeps its invariants through lock and unlock; and a
//! whole request through the service answers a status from the protocol's closed set.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_fleetlock::{
    encode_body, encode_record, parse_body, parse_record, ClientId, ErrorKind, Groups, MemStore,
    Request, Semaphore, Service, Transition,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(params) = parse_body(data) {
        assert_eq!(parse_body(&encode_body(&params)).as_ref(), Ok(&params));
    }

    if let Ok(sem) = Semaphore::parse(data) {
        let again = Semaphore::parse(sem.to_json().as_bytes()).expect("its own JSON parses");
        assert_eq!(again, sem);
        assert!(sem.holders().len() as u64 <= sem.total_slots());
        let id = ClientId::new("fuzz").expect("a valid id");
        match sem.lock(&id, sem.total_slots()) {
            Ok(Transition::Changed(new)) => {
                assert!(new.holds("fuzz") && !sem.holds("fuzz"));
                assert_eq!(
                    Semaphore::parse(new.to_json().as_bytes()).as_ref(),
                    Ok(&new)
                );
            }
            Ok(Transition::Unchanged) => assert!(sem.holds("fuzz")),
            Err(_) => assert_eq!(sem.holders().len() as u64, sem.total_slots()),
        }
        for holder in sem.holders() {
            match sem.unlock(holder) {
                Transition::Changed(new) => {
                    assert_eq!(new.holders().len() + 1, sem.holders().len());
                    assert!(!new.holds(holder));
                }
                Transition::Unchanged => panic!("a holder's unlock changes the value"),
            }
        }
    }

    if let Ok((version, sem)) = parse_record(data) {
        assert_eq!(
            parse_record(&encode_record(version, &sem)),
            Ok((version, sem))
        );
    }

    let service = Service::new(Groups::default(), MemStore::new());
    for path in ["/v1/pre-reboot", "/v1/steady-state"] {
        let answer = service.handle(&Request {
            method: "POST",
            path,
            protocol_header: Some(b"true"),
            body: data,
        });
        assert!(
            answer.status == 200 || ErrorKind::ALL.iter().any(|k| k.status() == answer.status),
            "{}",
            answer.status
        );
        assert_eq!(answer.body.is_empty(), answer.status == 200);
    }
});

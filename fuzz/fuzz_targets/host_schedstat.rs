//! A thread's scheduler statistics line (`/proc/thread-self/schedstat`), any bytes as text:
//! nothing panics, and what parses is the first two numbers the line holds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(clocks) = slate_host::parse_schedstat(text) {
        let mut fields = text.split_ascii_whitespace();
        let ran: u64 = fields.next().unwrap().parse().unwrap();
        let queued: u64 = fields.next().unwrap().parse().unwrap();
        assert_eq!(clocks.ran.as_nanos(), u128::from(ran));
        assert_eq!(clocks.queued.as_nanos(), u128::from(queued));
        let later = slate_host::ThreadClocks {
            ran: clocks.ran * 2,
            queued: clocks.queued,
        };
        assert_eq!(later.since(clocks).ran, clocks.ran);
        assert_eq!(clocks.since(later).ran, std::time::Duration::ZERO);
    }
});

//! What a DHCP client's packet socket hands over comes from anyone on the link: any datagram,
//! no panic; a payload found lies inside both headers' lengths; a reply is only ever one for
//! this exchange, and an ACK read is a usable lease.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slate_dhcp::{udp_payload_to, Exchange, Reply, CLIENT_PORT};

const EXCHANGE: Exchange = Exchange {
    xid: 0x1234_5678,
    mac: [0x52, 0x54, 0x00, 0x12, 0x34, 0x56],
};

fuzz_target!(|data: &[u8]| {
    if let Some(payload) = udp_payload_to(data, CLIENT_PORT) {
        let start = payload.as_ptr() as usize - data.as_ptr() as usize;
        assert!(start >= 28 && start + payload.len() <= data.len());
        let total = usize::from(u16::from_be_bytes([data[2], data[3]]));
        assert!(start + payload.len() <= total);
    }
    if let Ok(Some(reply)) = EXCHANGE.read_reply(data) {
        let payload = udp_payload_to(data, CLIENT_PORT).expect("a reply came through port 68");
        assert!(payload.len() >= 240, "a BOOTP message with its magic cookie");
        assert_eq!(&payload[4..8], &EXCHANGE.xid.to_be_bytes());
        if let Reply::Ack(lease) = reply {
            assert!(!lease.address.is_unspecified() && !lease.address.is_broadcast());
            assert!((1..=32).contains(&lease.prefix_len));
        }
    }
    // The client's own datagrams read back as what they carry.
    let sent = slate_dhcp::broadcast_datagram(data.get(..1400).unwrap_or(data));
    assert_eq!(
        udp_payload_to(&sent, slate_dhcp::SERVER_PORT),
        Some(data.get(..1400).unwrap_or(data))
    );
});

use super::*;
use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable as _, Decoder, Encodable as _, Encoder};

const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 2);
const OFFERED: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 15);

fn exchange() -> Exchange {
    Exchange {
        xid: 0x1234_5678,
        mac: MAC,
    }
}

/// A server's reply as it reaches the packet socket: IPv4 header, UDP header, message.
fn datagram(message: &[u8], dest_port: u16) -> Vec<u8> {
    let udp_len = 8 + message.len();
    let total = 20 + udp_len;
    let mut d = vec![
        0x45,
        0,
        (total >> 8) as u8,
        total as u8,
        0,
        0,
        0x40,
        0,
        64,
        17,
        0,
        0,
    ];
    d.extend_from_slice(&SERVER.octets());
    d.extend_from_slice(&[255, 255, 255, 255]);
    d.extend_from_slice(&SERVER_PORT.to_be_bytes());
    d.extend_from_slice(&dest_port.to_be_bytes());
    d.extend_from_slice(&(udp_len as u16).to_be_bytes());
    d.extend_from_slice(&[0, 0]);
    d.extend_from_slice(message);
    d
}

fn reply(kind: MessageType, xid: u32, mac: &[u8], opts: &[DhcpOption]) -> Vec<u8> {
    let mut msg = Message::new_with_id(
        xid,
        Ipv4Addr::UNSPECIFIED,
        OFFERED,
        SERVER,
        Ipv4Addr::UNSPECIFIED,
        mac,
    );
    msg.set_opcode(Opcode::BootReply);
    msg.opts_mut().insert(DhcpOption::MessageType(kind));
    msg.opts_mut().insert(DhcpOption::ServerIdentifier(SERVER));
    for opt in opts {
        msg.opts_mut().insert(opt.clone());
    }
    let mut bytes = Vec::new();
    msg.encode(&mut Encoder::new(&mut bytes)).unwrap();
    datagram(&bytes, CLIENT_PORT)
}

fn ack(opts: &[DhcpOption]) -> Vec<u8> {
    reply(MessageType::Ack, exchange().xid, &MAC, opts)
}

#[test]
fn requests_carry_what_a_server_needs() {
    let discover = Message::decode(&mut Decoder::new(&exchange().discover())).unwrap();
    assert_eq!(discover.opcode(), Opcode::BootRequest);
    assert_eq!(discover.xid(), 0x1234_5678);
    assert_eq!(&discover.chaddr()[..6], &MAC);
    assert!(discover.flags().broadcast());
    assert_eq!(discover.opts().msg_type(), Some(MessageType::Discover));
    assert!(discover
        .opts()
        .get(OptionCode::RequestedIpAddress)
        .is_none());
    let Some(DhcpOption::ParameterRequestList(asked)) =
        discover.opts().get(OptionCode::ParameterRequestList)
    else {
        panic!("no parameter list")
    };
    assert!(asked.contains(&OptionCode::Router));

    let request = exchange().request(OFFERED, SERVER);
    let request = Message::decode(&mut Decoder::new(&request)).unwrap();
    assert_eq!(request.opts().msg_type(), Some(MessageType::Request));
    assert_eq!(
        request.opts().get(OptionCode::RequestedIpAddress),
        Some(&DhcpOption::RequestedIpAddress(OFFERED))
    );
    assert_eq!(
        request.opts().get(OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(SERVER))
    );
}

#[test]
fn an_offer_an_ack_and_a_nak_are_read() {
    let offer = reply(MessageType::Offer, exchange().xid, &MAC, &[]);
    assert_eq!(
        exchange().read_reply(&offer),
        Ok(Some(Reply::Offer {
            address: OFFERED,
            server: SERVER
        }))
    );
    let lease = ack(&[
        DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)),
        DhcpOption::Router(vec![SERVER, Ipv4Addr::new(10, 0, 2, 1)]),
        DhcpOption::DomainNameServer(vec![Ipv4Addr::new(10, 0, 2, 3)]),
        DhcpOption::AddressLeaseTime(86_400),
    ]);
    assert_eq!(
        exchange().read_reply(&lease),
        Ok(Some(Reply::Ack(Lease {
            address: OFFERED,
            prefix_len: 24,
            router: Some(SERVER),
            dns: vec![Ipv4Addr::new(10, 0, 2, 3)],
            server: SERVER,
            lease_secs: Some(86_400),
        })))
    );
    let nak = reply(
        MessageType::Nak,
        exchange().xid,
        &MAC,
        &[DhcpOption::Message("wrong network".into())],
    );
    assert_eq!(
        exchange().read_reply(&nak),
        Ok(Some(Reply::Nak {
            server: SERVER,
            message: "wrong network".into()
        }))
    );
}

#[test]
fn defaults_when_the_server_says_less() {
    let Ok(Some(Reply::Ack(lease))) = exchange().read_reply(&ack(&[
        DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 240, 0)),
        DhcpOption::AddressLeaseTime(u32::MAX),
    ])) else {
        panic!("no lease")
    };
    assert_eq!((lease.prefix_len, lease.lease_secs), (20, None));
    let Ok(Some(Reply::Ack(lease))) = exchange().read_reply(&ack(&[])) else {
        panic!("no lease")
    };
    assert_eq!(
        (lease.prefix_len, lease.router, lease.dns.len()),
        (24, None, 0)
    );
}

#[test]
fn what_belongs_to_another_exchange_is_passed_over() {
    let other_xid = reply(MessageType::Offer, 7, &MAC, &[]);
    let other_mac = reply(MessageType::Offer, exchange().xid, &[2, 0, 0, 0, 0, 1], &[]);
    let mut request = Message::decode(&mut Decoder::new(&exchange().discover())).unwrap();
    request.set_opcode(Opcode::BootRequest);
    let mut own_request = Vec::new();
    request.encode(&mut Encoder::new(&mut own_request)).unwrap();
    for datagram in [other_xid, other_mac, datagram(&own_request, CLIENT_PORT)] {
        assert_eq!(exchange().read_reply(&datagram), Ok(None));
    }
}

#[test]
fn headers_that_do_not_lead_to_port_68_are_passed_over() {
    let good = reply(MessageType::Offer, exchange().xid, &MAC, &[]);
    let mut wrong_port = good.clone();
    wrong_port[22..24].copy_from_slice(&SERVER_PORT.to_be_bytes());
    let mut tcp = good.clone();
    tcp[9] = 6;
    let mut fragment = good.clone();
    fragment[6] = 0x20; // more fragments
    let mut ipv6 = good.clone();
    ipv6[0] = 0x65;
    let mut long_total = good.clone();
    long_total[2..4].copy_from_slice(&u16::MAX.to_be_bytes());
    let mut short_udp = good.clone();
    short_udp[24..26].copy_from_slice(&4u16.to_be_bytes());
    for bad in [
        wrong_port,
        tcp,
        fragment,
        ipv6,
        long_total,
        short_udp,
        good[..27].to_vec(),
        Vec::new(),
    ] {
        assert_eq!(exchange().read_reply(&bad), Ok(None), "{bad:02x?}");
    }
    // Padding after the IPv4 total length (an Ethernet minimum frame) is not the message's.
    let mut padded = good.clone();
    padded.extend_from_slice(&[0xff; 40]);
    assert!(matches!(
        exchange().read_reply(&padded),
        Ok(Some(Reply::Offer { .. }))
    ));
}

#[test]
fn an_ack_without_a_usable_address_is_refused() {
    let mut zero = Message::decode(&mut Decoder::new(
        udp_payload_to(&ack(&[]), CLIENT_PORT).unwrap(),
    ))
    .unwrap();
    zero.set_yiaddr(Ipv4Addr::UNSPECIFIED);
    let mut bytes = Vec::new();
    zero.encode(&mut Encoder::new(&mut bytes)).unwrap();
    let err = exchange()
        .read_reply(&datagram(&bytes, CLIENT_PORT))
        .unwrap_err();
    assert!(
        err.to_string().contains("no usable address: 0.0.0.0"),
        "{err}"
    );
    let err = exchange()
        .read_reply(&ack(&[DhcpOption::SubnetMask(Ipv4Addr::new(
            255, 0, 255, 0,
        ))]))
        .unwrap_err();
    assert!(
        err.to_string().contains("255.0.255.0 is not a prefix"),
        "{err}"
    );
}

/// A network whose server answers the n-th message the client sends with what `answer` says.
struct Scripted {
    answer: fn(usize, &Message) -> Vec<Vec<u8>>,
    sent: std::cell::RefCell<Vec<Message>>,
    queue: std::cell::RefCell<std::collections::VecDeque<Vec<u8>>>,
}

impl Scripted {
    fn new(answer: fn(usize, &Message) -> Vec<Vec<u8>>) -> Self {
        Self {
            answer,
            sent: Default::default(),
            queue: Default::default(),
        }
    }
}

impl Transport for Scripted {
    fn broadcast(&self, message: &[u8]) -> Result<(), String> {
        let msg = Message::decode(&mut Decoder::new(message)).map_err(|e| e.to_string())?;
        let n = self.sent.borrow().len();
        self.queue.borrow_mut().extend((self.answer)(n, &msg));
        self.sent.borrow_mut().push(msg);
        Ok(())
    }

    fn receive(&self, buf: &mut [u8], _deadline: Instant) -> Result<Option<usize>, String> {
        Ok(self.queue.borrow_mut().pop_front().map(|d| {
            buf[..d.len()].copy_from_slice(&d);
            d.len()
        }))
    }
}

const WAITS: [Duration; 3] = [Duration::from_millis(1); 3];

fn answer(kind: MessageType, to: &Message) -> Vec<u8> {
    reply(kind, to.xid(), &MAC, &[DhcpOption::Router(vec![SERVER])])
}

#[test]
fn a_lease_in_four_messages() {
    let net = Scripted::new(|_, msg| match msg.opts().msg_type() {
        Some(MessageType::Discover) => vec![answer(MessageType::Offer, msg)],
        _ => vec![answer(MessageType::Ack, msg)],
    });
    let lease = obtain_lease(&net, exchange(), &WAITS).unwrap();
    assert_eq!((lease.address, lease.router), (OFFERED, Some(SERVER)));
    assert_eq!(net.sent.borrow().len(), 2);
}

#[test]
fn lost_replies_naks_and_noise_cost_an_attempt_each() {
    let net = Scripted::new(|n, msg| match n {
        // Attempt 1: the offer is lost. Attempt 2: someone else's offer, then a NAK.
        0 => vec![],
        1 => vec![
            reply(MessageType::Offer, msg.xid() ^ 1, &MAC, &[]),
            answer(MessageType::Offer, msg),
        ],
        2 => vec![answer(MessageType::Nak, msg)],
        // Attempt 3 gets through.
        3 => vec![answer(MessageType::Offer, msg)],
        _ => vec![answer(MessageType::Ack, msg)],
    });
    let lease = obtain_lease(&net, exchange(), &WAITS).unwrap();
    assert_eq!(lease.address, OFFERED);
    let xids: Vec<u32> = net.sent.borrow().iter().map(Message::xid).collect();
    let xid = exchange().xid;
    // The retransmitted DISCOVER keeps its id; the NAK ends the transaction.
    assert_eq!(xids, [xid, xid, xid, xid + 1, xid + 1]);
}

#[test]
fn silence_ends_in_an_error_naming_the_last_failure() {
    let net = Scripted::new(|n, msg| match n {
        1 => vec![answer(MessageType::Offer, msg)],
        _ => vec![],
    });
    let err = obtain_lease(&net, exchange(), &WAITS)
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("no DHCP lease after 3 attempt(s)"), "{err}");
    assert!(err.ends_with("no offer within 1ms"), "{err}");
    let net = Scripted::new(|_, msg| match msg.opts().msg_type() {
        Some(MessageType::Discover) => vec![answer(MessageType::Offer, msg)],
        _ => vec![],
    });
    let err = obtain_lease(&net, exchange(), &WAITS)
        .unwrap_err()
        .to_string();
    assert!(
        err.ends_with("10.0.2.2 offered 10.0.2.15, then did not answer the request within 1ms"),
        "{err}"
    );
}

#[test]
fn a_request_leaves_from_0_0_0_0_with_checksums_a_server_accepts() {
    let payload = exchange().discover();
    let datagram = broadcast_datagram(&payload);
    assert_eq!(datagram.len(), 28 + payload.len());
    assert_eq!(&datagram[12..16], &[0, 0, 0, 0], "source address");
    assert_eq!(&datagram[16..20], &[255; 4], "destination address");
    assert_eq!(udp_payload_to(&datagram, SERVER_PORT), Some(&payload[..]));
    assert_eq!(udp_payload_to(&datagram, CLIENT_PORT), None);
    // A receiver sums the header with its checksum in place: all ones, so the complement is 0.
    assert_eq!(internet_checksum(&[&datagram[..20]]), 0);
    let udp_len = (datagram.len() - 20) as u16;
    let pseudo = [&datagram[12..20], &[0, 17], &udp_len.to_be_bytes()[..]].concat();
    assert_eq!(internet_checksum(&[&pseudo, &datagram[20..]]), 0);
    // An odd length pads with a zero byte (RFC 1071's example words, then one byte more).
    assert_eq!(
        internet_checksum(&[&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]]),
        !0xddf2
    );
    assert_eq!(internet_checksum(&[&[0x12]]), !0x1200);
}

fn hex(text: &str) -> Vec<u8> {
    let digits: String = text.split_whitespace().collect();
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&digits[i..i + 2], 16).unwrap())
        .collect()
}

/// docs/formats.md §14's vector: an ACK, then `options` before END (the UDP and IPv4 lengths
/// kept true).
fn vector_ack(options: &str) -> Vec<u8> {
    let mut datagram = hex("45 00 01 2e 00 00 00 00 40 11 00 00 0a 00 02 02 ff ff ff ff
         00 43 00 44 01 1a 00 00
         02 01 06 00 12 34 56 78 00 00 80 00 00 00 00 00 0a 00 02 0f 0a 00 02 02 00 00 00 00
         52 54 00 12 34 56");
    datagram.extend([0; 202]);
    datagram.extend(hex(
        "63 82 53 63 35 01 05 36 04 0a 00 02 02 01 04 ff ff ff 00 03 04 0a 00 02 02
         06 04 0a 00 02 03 33 04 00 00 0e 10",
    ));
    datagram.extend(hex(options));
    datagram.push(0xff);
    let total = datagram.len() as u16;
    datagram[2..4].copy_from_slice(&total.to_be_bytes());
    datagram[24..26].copy_from_slice(&(total - 20).to_be_bytes());
    datagram
}

/// docs/formats.md §14's vector, byte for byte.
#[test]
fn an_ack_as_the_packet_socket_hands_it_over() {
    let mut datagram = vector_ack("");
    assert_eq!(datagram.len(), 302);
    let reply = exchange().read_reply(&datagram).unwrap();
    assert_eq!(
        reply,
        Some(Reply::Ack(Lease {
            address: OFFERED,
            prefix_len: 24,
            router: Some(SERVER),
            dns: vec![Ipv4Addr::new(10, 0, 2, 3)],
            server: SERVER,
            lease_secs: Some(3600),
        }))
    );
    // The same bytes with a byte of trailing link padding: cut at the total length.
    datagram.push(0);
    assert!(exchange().read_reply(&datagram).unwrap().is_some());
    // Another client's MAC in chaddr: passed over.
    datagram[28 + 28] ^= 1;
    assert_eq!(exchange().read_reply(&datagram).unwrap(), None);
}

#[test]
fn malformed_options_are_passed_over_or_refused_never_a_panic() {
    // An option the client does not read, with any length (dhcproto's decoder asserts option
    // 94's length of 3 in debug builds and loses its place in release ones): the lease stands.
    for options in ["5e 00", "5e 01 00", "5e 05 01 02 03 04 05"] {
        let reply = exchange().read_reply(&vector_ack(options)).unwrap();
        assert!(matches!(reply, Some(Reply::Ack(_))), "{options}: {reply:?}");
    }
    // An option that runs past the message: not a message at all.
    let mut truncated = vector_ack("0c 10 6e 6f 64 65");
    truncated.pop(); // END gone too: option 12 says 16 bytes, 4 are there
    let total = truncated.len() as u16;
    truncated[2..4].copy_from_slice(&total.to_be_bytes());
    truncated[24..26].copy_from_slice(&(total - 20).to_be_bytes());
    assert_eq!(exchange().read_reply(&truncated), Ok(None));
    // No magic cookie: not DHCP.
    let mut bootp = vector_ack("");
    bootp[28 + 236] = 0;
    assert_eq!(exchange().read_reply(&bootp), Ok(None));
    // A first option the client reads, with the wrong length: the ACK is refused, not guessed at.
    for (options, name) in [
        ("01 03 ff ff ff", "subnet mask"),
        ("03 06 0a 00 02 02 0a 00", "router"),
        ("06 00", "DNS server"),
        ("33 02 0e 10", "lease time"),
    ] {
        // Put the malformed option first, so it is the one read.
        let mut datagram = vector_ack("");
        let at = 28 + 240 + 3; // after the message type option
        let bad = hex(options);
        datagram.splice(at..at, bad.iter().copied());
        let total = datagram.len() as u16;
        datagram[2..4].copy_from_slice(&total.to_be_bytes());
        datagram[24..26].copy_from_slice(&(total - 20).to_be_bytes());
        let err = exchange().read_reply(&datagram).unwrap_err().to_string();
        assert!(
            err.ends_with(&format!("its {name} option is malformed")),
            "{err}"
        );
    }
}

//! The BOOTP/DHCP message (RFC 2131 §2, RFC 2132 options): the client's two requests written,
//! a server's reply read (docs/formats.md §14).
//!
//! By hand, not `dhcproto` (which the tests still use as the independent implementation on the
//! other end): its decoder checks several fixed option lengths with `debug_assert!` only — a
//! debug build panics on a hostile reply (found by the `dhcp_reply` fuzz target in its first
//! 500 inputs) and a release build reads the fixed size whatever the length byte says, losing
//! its place among the options. machined is PID 1 and reads whatever the link delivers; a
//! client needs seven options, and reading them is a bounds-checked walk.

use std::net::Ipv4Addr;

pub const BOOTREQUEST: u8 = 1;
pub const BOOTREPLY: u8 = 2;
/// Everything before the options: the fixed fields, `sname`, `file`, then the magic cookie.
const FIXED_LEN: usize = 236;
const MAGIC_COOKIE: [u8; 4] = [0x63, 0x82, 0x53, 0x63];

/// Option codes (RFC 2132) the client writes or reads.
pub mod option {
    pub const PAD: u8 = 0;
    pub const SUBNET_MASK: u8 = 1;
    pub const ROUTER: u8 = 3;
    pub const DNS_SERVERS: u8 = 6;
    pub const REQUESTED_ADDRESS: u8 = 50;
    pub const LEASE_TIME: u8 = 51;
    pub const MESSAGE_TYPE: u8 = 53;
    pub const SERVER_ID: u8 = 54;
    pub const PARAMETER_REQUEST_LIST: u8 = 55;
    pub const MESSAGE: u8 = 56;
    pub const CLIENT_ID: u8 = 61;
    pub const END: u8 = 255;
}

/// DHCP message types (option 53).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    Discover = 1,
    Offer = 2,
    Request = 3,
    Ack = 5,
    Nak = 6,
}

/// A client request: BOOTREQUEST from `mac` with the BROADCAST flag, then option 53 `kind`
/// and `options` in order, then END.
pub fn request(kind: MessageType, xid: u32, mac: &[u8; 6], options: &[(u8, &[u8])]) -> Vec<u8> {
    let mut msg = vec![0u8; FIXED_LEN];
    msg[0] = BOOTREQUEST;
    msg[1] = 1; // htype: Ethernet
    msg[2] = 6; // hlen
    msg[4..8].copy_from_slice(&xid.to_be_bytes());
    msg[10] = 0x80; // flags: BROADCAST (answer to broadcast: no address to answer to yet)
    msg[28..34].copy_from_slice(mac);
    msg.extend_from_slice(&MAGIC_COOKIE);
    msg.extend_from_slice(&[option::MESSAGE_TYPE, 1, kind as u8]);
    for (code, value) in options {
        let len = u8::try_from(value.len()).expect("a client option fits in 255 bytes");
        msg.extend_from_slice(&[*code, len]);
        msg.extend_from_slice(value);
    }
    msg.push(option::END);
    msg
}

/// A message as read: the fixed fields the client looks at and the options area.
#[derive(Debug, Clone, Copy)]
pub struct Received<'a> {
    pub op: u8,
    pub xid: u32,
    pub yiaddr: Ipv4Addr,
    pub siaddr: Ipv4Addr,
    /// The first 6 bytes of `chaddr`.
    pub mac: [u8; 6],
    options: &'a [u8],
}

fn ipv4(bytes: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3])
}

/// Reads a message: `None` if it is shorter than the fixed part, lacks the magic cookie, or its
/// options do not parse as code-length-value up to END (or to the end of the message).
pub fn read(msg: &[u8]) -> Option<Received<'_>> {
    let options = msg.get(FIXED_LEN + 4..)?;
    if msg[FIXED_LEN..FIXED_LEN + 4] != MAGIC_COOKIE {
        return None;
    }
    let received = Received {
        op: msg[0],
        xid: u32::from_be_bytes([msg[4], msg[5], msg[6], msg[7]]),
        yiaddr: ipv4(&msg[16..20]),
        siaddr: ipv4(&msg[20..24]),
        mac: [msg[28], msg[29], msg[30], msg[31], msg[32], msg[33]],
        options,
    };
    received.walk().try_for_each(|o| o.map(drop))?;
    Some(received)
}

impl<'a> Received<'a> {
    /// Each option as (code, value) up to END; `None` once an option runs past the message.
    fn walk(&self) -> impl Iterator<Item = Option<(u8, &'a [u8])>> + 'a {
        let mut rest = self.options;
        std::iter::from_fn(move || loop {
            let (&code, tail) = rest.split_first()?;
            match code {
                option::PAD => rest = tail,
                option::END => return None,
                _ => {
                    let Some((&len, tail)) = tail.split_first() else {
                        rest = &[];
                        return Some(None);
                    };
                    let Some((value, tail)) = tail.split_at_checked(usize::from(len)) else {
                        rest = &[];
                        return Some(None);
                    };
                    rest = tail;
                    return Some(Some((code, value)));
                }
            }
        })
    }

    /// The value of the first option `code` (a repeated option is not concatenated: RFC 3396
    /// long options are for values the client does not ask for).
    pub fn option(&self, code: u8) -> Option<&'a [u8]> {
        self.walk()
            .map_while(|o| o)
            .find(|(c, _)| *c == code)
            .map(|(_, value)| value)
    }

    pub fn message_type(&self) -> Option<u8> {
        match self.option(option::MESSAGE_TYPE)? {
            [kind] => Some(*kind),
            _ => None,
        }
    }

    /// An option that is one IPv4 address: `Some(Err(()))` when present with another length.
    pub fn address(&self, code: u8) -> Option<Result<Ipv4Addr, ()>> {
        self.option(code)
            .map(|value| (value.len() == 4).then(|| ipv4(value)).ok_or(()))
    }

    /// An option that is a list of IPv4 addresses (at least one).
    pub fn addresses(&self, code: u8) -> Option<Result<Vec<Ipv4Addr>, ()>> {
        self.option(code).map(|value| {
            if value.is_empty() || value.len() % 4 != 0 {
                return Err(());
            }
            Ok(value.chunks_exact(4).map(ipv4).collect())
        })
    }

    /// An option that is one 32-bit big-endian number.
    pub fn number(&self, code: u8) -> Option<Result<u32, ()>> {
        self.option(code).map(|value| {
            <[u8; 4]>::try_from(value)
                .map(u32::from_be_bytes)
                .map_err(drop)
        })
    }
}

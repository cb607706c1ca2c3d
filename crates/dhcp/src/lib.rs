//! DHCPv4 for machined's network task, without IO (RFC 2131; messages by `dhcproto`).
//!
//! The client is the short exchange a booting node needs: DISCOVER, the first OFFER, REQUEST,
//! then ACK (a lease) or NAK (start over). Replies are read from what a packet socket hands
//! over — the whole IPv4 datagram, since an interface without an address cannot receive them
//! through a UDP socket — so this crate also reads the IPv4 and UDP headers in front of the
//! message (docs/formats.md §14). Requests ask for broadcast replies (the BROADCAST flag) as
//! well, for servers that would otherwise answer to an address the interface does not have yet.
//! The messages are written and read by `message.rs` (by hand; it says why).

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

mod message;

pub use message::MessageType;
use message::{option, Received, BOOTREPLY};

/// The client's UDP port; servers listen on 67.
pub const CLIENT_PORT: u16 = 68;
pub const SERVER_PORT: u16 = 67;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DhcpError {
    #[error("the DHCP ACK from {server} has no usable address: {why}")]
    BadLease { server: Ipv4Addr, why: String },
    #[error("{0}")]
    Transport(String),
    #[error("no DHCP lease after {attempts} attempt(s) in {waited:?}: {last}")]
    NoLease {
        attempts: usize,
        waited: Duration,
        last: String,
    },
}

/// How the exchange reaches the network (`slate_host::DhcpTransport` on a node; a scripted
/// network in the tests).
pub trait Transport {
    /// Sends a message to the servers (255.255.255.255:67).
    fn broadcast(&self, message: &[u8]) -> Result<(), String>;
    /// The next datagram received (the IPv4 header first) into `buf`, or `None` at `deadline`.
    fn receive(&self, buf: &mut [u8], deadline: Instant) -> Result<Option<usize>, String>;
}

/// How long each attempt waits for the offer and then for the ACK: a lost packet costs one
/// attempt, and the attempts together wait about as long as udhcpc's `-t 10` would have.
pub const ATTEMPT_WAITS: [Duration; 7] = [
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(8),
];

/// DISCOVER → OFFER → REQUEST → ACK, starting over after a NAK or a silence. `waits` bounds
/// each attempt's two waits ([`ATTEMPT_WAITS`] on a node).
pub fn obtain_lease(
    transport: &impl Transport,
    exchange: Exchange,
    waits: &[Duration],
) -> Result<Lease, DhcpError> {
    let started = Instant::now();
    let mut buf = vec![0u8; 1536];
    let mut last = String::from("no attempt made");
    // A retransmission keeps the transaction id, so an offer that answers an earlier
    // DISCOVER still counts (a server may first probe the address it offers, for seconds);
    // after a NAK the exchange starts over under a new one.
    let mut exchange = exchange;
    for wait in waits {
        transport
            .broadcast(&exchange.discover())
            .map_err(DhcpError::Transport)?;
        let deadline = Instant::now() + *wait;
        let offer = loop {
            match transport
                .receive(&mut buf, deadline)
                .map_err(DhcpError::Transport)?
            {
                None => break None,
                Some(len) => {
                    if let Some(Reply::Offer { address, server }) =
                        exchange.read_reply(&buf[..len])?
                    {
                        break Some((address, server));
                    }
                }
            }
        };
        let Some((address, server)) = offer else {
            last = format!("no offer within {wait:?}");
            continue;
        };
        transport
            .broadcast(&exchange.request(address, server))
            .map_err(DhcpError::Transport)?;
        let deadline = Instant::now() + *wait;
        last = loop {
            let Some(len) = transport
                .receive(&mut buf, deadline)
                .map_err(DhcpError::Transport)?
            else {
                break format!(
                    "{server} offered {address}, then did not answer the request within {wait:?}"
                );
            };
            match exchange.read_reply(&buf[..len])? {
                Some(Reply::Ack(lease)) => return Ok(lease),
                Some(Reply::Nak { server, message }) => {
                    exchange.xid = exchange.xid.wrapping_add(1);
                    break format!("{server} refused the request for {address}: {message:?}");
                }
                Some(Reply::Offer { .. }) | None => {}
            }
        };
    }
    Err(DhcpError::NoLease {
        attempts: waits.len(),
        waited: started.elapsed(),
        last,
    })
}

/// What the node learned from an ACK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub address: Ipv4Addr,
    /// From the subnet mask option; 24 when the server sends none (udhcpc's default too).
    pub prefix_len: u8,
    /// The first router the server names.
    pub router: Option<Ipv4Addr>,
    pub dns: Vec<Ipv4Addr>,
    pub server: Ipv4Addr,
    /// Seconds; `None` is an infinite lease.
    pub lease_secs: Option<u32>,
}

/// A reply that belongs to this exchange (right transaction id and hardware address).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Offer { address: Ipv4Addr, server: Ipv4Addr },
    Ack(Lease),
    Nak { server: Ipv4Addr, message: String },
}

/// One exchange: its transaction id and the interface's hardware address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exchange {
    pub xid: u32,
    pub mac: [u8; 6],
}

/// What every request asks the server for (option 55).
const PARAMETERS: [u8; 4] = [
    option::SUBNET_MASK,
    option::ROUTER,
    option::DNS_SERVERS,
    option::LEASE_TIME,
];

impl Exchange {
    fn message(&self, kind: MessageType, extra: &[(u8, &[u8])]) -> Vec<u8> {
        // Client identifier: hardware type 1 (Ethernet), then the address.
        let mut client_id = [1u8; 7];
        client_id[1..].copy_from_slice(&self.mac);
        let mut options = vec![
            (option::CLIENT_ID, &client_id[..]),
            (option::PARAMETER_REQUEST_LIST, &PARAMETERS[..]),
        ];
        options.extend_from_slice(extra);
        message::request(kind, self.xid, &self.mac, &options)
    }

    /// The DHCPDISCOVER payload (the UDP datagram's data).
    pub fn discover(&self) -> Vec<u8> {
        self.message(MessageType::Discover, &[])
    }

    /// The DHCPREQUEST for an offer (SELECTING state: requested address and server named).
    pub fn request(&self, address: Ipv4Addr, server: Ipv4Addr) -> Vec<u8> {
        self.message(
            MessageType::Request,
            &[
                (option::REQUESTED_ADDRESS, &address.octets()),
                (option::SERVER_ID, &server.octets()),
            ],
        )
    }

    /// Reads a datagram a packet socket received. `Ok(None)`: not for this exchange (another
    /// protocol or port, a request, another client's transaction, a malformed message — the
    /// client keeps waiting, as the network is shared). `Err`: an ACK for this exchange that
    /// cannot be used.
    pub fn read_reply(&self, datagram: &[u8]) -> Result<Option<Reply>, DhcpError> {
        let Some(payload) = udp_payload_to(datagram, CLIENT_PORT) else {
            return Ok(None);
        };
        let Some(msg) = message::read(payload) else {
            return Ok(None);
        };
        if msg.op != BOOTREPLY || msg.xid != self.xid || msg.mac != self.mac {
            return Ok(None);
        }
        let server = match msg.address(option::SERVER_ID) {
            Some(Ok(ip)) => ip,
            _ => msg.siaddr,
        };
        Ok(match msg.message_type() {
            Some(kind) if kind == MessageType::Offer as u8 => Some(Reply::Offer {
                address: msg.yiaddr,
                server,
            }),
            Some(kind) if kind == MessageType::Ack as u8 => Some(Reply::Ack(lease(&msg, server)?)),
            Some(kind) if kind == MessageType::Nak as u8 => Some(Reply::Nak {
                server,
                message: msg
                    .option(option::MESSAGE)
                    .map(|text| String::from_utf8_lossy(text).into_owned())
                    .unwrap_or_default(),
            }),
            _ => None,
        })
    }
}

fn lease(msg: &Received<'_>, server: Ipv4Addr) -> Result<Lease, DhcpError> {
    let address = msg.yiaddr;
    let bad = |why: String| DhcpError::BadLease { server, why };
    if address.is_unspecified() || address.is_broadcast() || address.is_multicast() {
        return Err(bad(format!("{address}")));
    }
    let malformed = |name: &str| bad(format!("its {name} option is malformed"));
    let prefix_len = match msg.address(option::SUBNET_MASK) {
        Some(Ok(mask)) => {
            let bits = u32::from(mask);
            // A mask is ones then zeros; anything else names no prefix.
            if bits.leading_ones() + bits.trailing_zeros() != 32 || bits == 0 {
                return Err(bad(format!("subnet mask {mask} is not a prefix")));
            }
            bits.leading_ones() as u8
        }
        Some(Err(())) => return Err(malformed("subnet mask")),
        None => 24,
    };
    let router = match msg.addresses(option::ROUTER) {
        Some(Ok(routers)) => routers.first().copied(),
        Some(Err(())) => return Err(malformed("router")),
        None => None,
    };
    let dns = match msg.addresses(option::DNS_SERVERS) {
        Some(Ok(servers)) => servers,
        Some(Err(())) => return Err(malformed("DNS server")),
        None => Vec::new(),
    };
    let lease_secs = match msg.number(option::LEASE_TIME) {
        Some(Ok(u32::MAX)) | None => None,
        Some(Ok(secs)) => Some(secs),
        Some(Err(())) => return Err(malformed("lease time")),
    };
    Ok(Lease {
        address,
        prefix_len,
        router,
        dns,
        server,
        lease_secs,
    })
}

/// The IPv4 datagram that carries `payload` from 0.0.0.0:68 to 255.255.255.255:67, headers
/// and checksums included (docs/formats.md §14). A client without an address must send from
/// 0.0.0.0 (RFC 2131 §4.1); a UDP socket would take the source address of any other
/// interface that has one, so the client writes the headers itself and sends the datagram
/// through a packet socket.
pub fn broadcast_datagram(payload: &[u8]) -> Vec<u8> {
    const HEADERS: usize = 20 + 8;
    let total = u16::try_from(HEADERS + payload.len()).unwrap_or(u16::MAX);
    let udp_len = total - 20;
    let (source, dest) = (Ipv4Addr::UNSPECIFIED.octets(), Ipv4Addr::BROADCAST.octets());
    let mut datagram = Vec::with_capacity(usize::from(total));
    // version 4, 5 words of header; no TOS; total length; id 0; no fragments; TTL 64; UDP
    datagram.extend_from_slice(&[0x45, 0]);
    datagram.extend_from_slice(&total.to_be_bytes());
    datagram.extend_from_slice(&[0, 0, 0, 0, 64, 17, 0, 0]);
    datagram.extend_from_slice(&source);
    datagram.extend_from_slice(&dest);
    let header_sum = internet_checksum(&[&datagram]);
    datagram[10..12].copy_from_slice(&header_sum.to_be_bytes());
    datagram.extend_from_slice(&CLIENT_PORT.to_be_bytes());
    datagram.extend_from_slice(&SERVER_PORT.to_be_bytes());
    datagram.extend_from_slice(&udp_len.to_be_bytes());
    datagram.extend_from_slice(&[0, 0]);
    datagram.extend_from_slice(&payload[..usize::from(udp_len) - 8]);
    // The UDP checksum covers a pseudo-header (addresses, protocol, length), then the segment.
    let pseudo = [&source[..], &dest[..], &[0, 17], &udp_len.to_be_bytes()].concat();
    let udp_sum = match internet_checksum(&[&pseudo, &datagram[20..]]) {
        0 => 0xffff, // 0 means "no checksum" in UDP over IPv4
        sum => sum,
    };
    datagram[26..28].copy_from_slice(&udp_sum.to_be_bytes());
    datagram
}

/// RFC 1071: the ones' complement of the ones' complement sum of 16-bit words, over the
/// concatenation of `parts` (an odd tail padded with a zero byte).
fn internet_checksum(parts: &[&[u8]]) -> u16 {
    let bytes = parts.iter().flat_map(|part| part.iter().copied());
    let (mut sum, mut high) = (0u32, None);
    for byte in bytes {
        match high.take() {
            None => high = Some(byte),
            Some(h) => sum += u32::from(u16::from_be_bytes([h, byte])),
        }
    }
    if let Some(h) = high {
        sum += u32::from(u16::from_be_bytes([h, 0]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The UDP payload of an IPv4 datagram addressed to UDP port `port`, bounded by both headers'
/// lengths; `None` for anything else (docs/formats.md §14).
pub fn udp_payload_to(datagram: &[u8], port: u16) -> Option<&[u8]> {
    let version_ihl = *datagram.first()?;
    let header_len = usize::from(version_ihl & 0x0f) * 4;
    if version_ihl >> 4 != 4 || header_len < 20 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([*datagram.get(2)?, *datagram.get(3)?]));
    // A fragment (more-fragments flag or an offset) is not a whole message.
    let fragment = u16::from_be_bytes([*datagram.get(6)?, *datagram.get(7)?]) & 0x3fff;
    if *datagram.get(9)? != 17 || fragment != 0 || total < header_len + 8 {
        return None;
    }
    let datagram = datagram.get(..total)?;
    let udp = datagram.get(header_len..)?;
    let dest = u16::from_be_bytes([udp[2], udp[3]]);
    let udp_len = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    if dest != port || udp_len < 8 {
        return None;
    }
    udp.get(8..udp_len)
}

#[cfg(test)]
mod tests;

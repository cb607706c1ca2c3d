//! A DHCP client's link to one interface before it has an address: a packet socket bound to
//! the interface. It sends the whole IPv4 datagram `slate_dhcp` built (source 0.0.0.0, which
//! a UDP socket would replace with another interface's address) to the Ethernet broadcast
//! address, and receives the IPv4 datagrams arriving there — a server's answer is addressed
//! to an address the interface does not have yet (or to broadcast), which an unaddressed UDP
//! socket may never see.

use std::os::fd::{AsFd as _, OwnedFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{recv, socket, AddressFamily, MsgFlags, SockFlag, SockProtocol, SockType};

use crate::net::net_err as err;
use crate::{HostError, Result};

#[derive(Debug)]
pub struct DhcpTransport {
    interface: String,
    socket: OwnedFd,
    ifindex: libc::c_int,
}

mod sys {
    #![allow(unsafe_code)]

    use std::os::fd::{AsRawFd as _, OwnedFd};

    use nix::errno::Errno;

    /// The link-layer address of every IPv4 frame on interface `ifindex`; with `broadcast`,
    /// sent to ff:ff:ff:ff:ff:ff.
    fn link_address(ifindex: libc::c_int, broadcast: bool) -> libc::sockaddr_ll {
        libc::sockaddr_ll {
            sll_family: libc::AF_PACKET as libc::c_ushort,
            sll_protocol: (libc::ETH_P_IP as u16).to_be(),
            sll_ifindex: ifindex,
            sll_hatype: 0,
            sll_pkttype: 0,
            sll_halen: if broadcast { 6 } else { 0 },
            sll_addr: if broadcast {
                [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0]
            } else {
                [0; 8]
            },
        }
    }

    const LEN: libc::socklen_t = size_of::<libc::sockaddr_ll>() as libc::socklen_t;

    /// Binds a packet socket to the interface: it then receives only that interface's frames.
    pub fn bind(sock: &OwnedFd, ifindex: libc::c_int) -> nix::Result<()> {
        let addr = link_address(ifindex, false);
        // SAFETY: `addr` is a valid `sockaddr_ll` that outlives the call, and `LEN` its size.
        Errno::result(unsafe {
            libc::bind(sock.as_raw_fd(), std::ptr::from_ref(&addr).cast(), LEN)
        })
        .map(drop)
    }

    /// Sends `datagram` (an IPv4 datagram) to the Ethernet broadcast address.
    pub fn send_broadcast(
        sock: &OwnedFd,
        ifindex: libc::c_int,
        datagram: &[u8],
    ) -> nix::Result<()> {
        let addr = link_address(ifindex, true);
        // SAFETY: `datagram` is readable for its length and `addr` is a valid `sockaddr_ll`
        // of size `LEN`; both outlive the call.
        let sent = Errno::result(unsafe {
            libc::sendto(
                sock.as_raw_fd(),
                datagram.as_ptr().cast(),
                datagram.len(),
                0,
                std::ptr::from_ref(&addr).cast(),
                LEN,
            )
        })?;
        if usize::try_from(sent) == Ok(datagram.len()) {
            Ok(())
        } else {
            Err(Errno::EMSGSIZE)
        }
    }
}

impl DhcpTransport {
    pub fn open(interface: &str) -> Result<Self> {
        let ifindex = nix::net::if_::if_nametoindex(interface)
            .map_err(err("finding the index of", interface))?;
        let ifindex = libc::c_int::try_from(ifindex).map_err(|_| HostError::Network {
            op: "finding the index of",
            interface: interface.to_owned(),
            source: Errno::ERANGE,
        })?;
        let socket = socket(
            AddressFamily::Packet,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::EthIp,
        )
        .map_err(err("opening a packet socket on", interface))?;
        sys::bind(&socket, ifindex).map_err(err("binding a packet socket to", interface))?;
        Ok(Self {
            interface: interface.to_owned(),
            socket,
            ifindex,
        })
    }

    /// Sends a DHCP message to 255.255.255.255:67 from 0.0.0.0:68 through the interface.
    pub fn broadcast(&self, message: &[u8]) -> Result<()> {
        let datagram = slate_dhcp::broadcast_datagram(message);
        sys::send_broadcast(&self.socket, self.ifindex, &datagram)
            .map_err(err("broadcasting a DHCP request on", &self.interface))
    }

    /// The next IPv4 datagram that arrived on the interface, copied into `buf` (its length), or
    /// `None` once `deadline` has passed.
    pub fn receive(&self, buf: &mut [u8], deadline: Instant) -> Result<Option<usize>> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let millis = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.socket.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(millis)) {
                Ok(0) | Err(Errno::EINTR) => continue,
                Ok(_) => {}
                Err(e) => return Err(err("waiting for a DHCP reply on", &self.interface)(e)),
            }
            let len = recv(
                std::os::fd::AsRawFd::as_raw_fd(&self.socket),
                buf,
                MsgFlags::empty(),
            )
            .map_err(err("receiving a DHCP reply on", &self.interface))?;
            return Ok(Some(len));
        }
    }
}

impl slate_dhcp::Transport for DhcpTransport {
    fn broadcast(&self, message: &[u8]) -> std::result::Result<(), String> {
        DhcpTransport::broadcast(self, message).map_err(|e| error_chain(&e))
    }

    fn receive(
        &self,
        buf: &mut [u8],
        deadline: Instant,
    ) -> std::result::Result<Option<usize>, String> {
        DhcpTransport::receive(self, buf, deadline).map_err(|e| error_chain(&e))
    }
}

/// The error and its sources on one line, as the journal shows them.
fn error_chain(err: &HostError) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

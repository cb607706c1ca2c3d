//! Network interfaces without spawning `ip`: a link brought up (`SIOCGIFFLAGS`/`SIOCSIFFLAGS`
//! on a datagram socket), an IPv4 address and a default route set (`SIOCSIFADDR`,
//! `SIOCSIFNETMASK`, `SIOCADDRT`) and an interface's IPv4 addresses listed (`getifaddrs`). Each
//! `ip` machined started cost a process start on the way to Running (issue 17).

use std::net::Ipv4Addr;

use nix::errno::Errno;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

use crate::{HostError, Result};

pub(crate) fn net_err<'a>(
    op: &'static str,
    interface: &'a str,
) -> impl FnOnce(Errno) -> HostError + 'a {
    move |source| HostError::Network {
        op,
        interface: interface.to_owned(),
        source,
    }
}

/// The two ioctls and the union they fill, the only unsafe code here.
mod sys {
    #![allow(unsafe_code)]

    use std::os::fd::{AsRawFd as _, OwnedFd};

    use nix::errno::Errno;

    /// A `struct ifreq` naming `name` (shorter than `IFNAMSIZ`, no NUL: checked by the caller).
    pub fn request(name: &[u8]) -> libc::ifreq {
        // SAFETY: `ifreq` is plain old data (a name and a union of integers and addresses),
        // for which all zero bytes are a valid value.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        for (to, from) in req.ifr_name.iter_mut().zip(name) {
            *to = *from as libc::c_char;
        }
        req
    }

    /// SIOCGIFFLAGS: the interface's flags.
    pub fn flags(sock: &OwnedFd, req: &mut libc::ifreq) -> nix::Result<libc::c_short> {
        // SAFETY: SIOCGIFFLAGS reads `ifr_name` and writes `ifr_flags` of the `ifreq` it is
        // given, which is valid and exclusively borrowed for the call.
        Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut *req) })?;
        // SAFETY: the kernel just filled the union's `ifru_flags` member.
        Ok(unsafe { req.ifr_ifru.ifru_flags })
    }

    /// SIOCSIFFLAGS: set the interface's flags to `flags`.
    pub fn set_flags(
        sock: &OwnedFd,
        req: &mut libc::ifreq,
        flags: libc::c_short,
    ) -> nix::Result<()> {
        req.ifr_ifru.ifru_flags = flags;
        // SAFETY: SIOCSIFFLAGS reads `ifr_name` and `ifr_flags` of the valid `ifreq` it is given.
        Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &*req) }).map(drop)
    }

    fn sockaddr(ip: std::net::Ipv4Addr) -> libc::sockaddr {
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from(ip).to_be(),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: `sockaddr_in` and `sockaddr` are both 16 bytes, and the kernel reads a
        // `sockaddr` whose family is AF_INET as a `sockaddr_in`: the socket API's own cast.
        unsafe { std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sin) }
    }

    /// SIOCSIFADDR or SIOCSIFNETMASK (`request`) with `ip` as the `ifreq`'s address.
    pub fn set_address(
        sock: &OwnedFd,
        req: &mut libc::ifreq,
        request: libc::c_ulong,
        ip: std::net::Ipv4Addr,
    ) -> nix::Result<()> {
        req.ifr_ifru.ifru_addr = sockaddr(ip);
        // SAFETY: both requests read `ifr_name` and `ifr_addr` of the valid `ifreq` given.
        Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), request, &*req) }).map(drop)
    }

    /// SIOCADDRT: a default route through `gateway` on the interface named by `name` (NUL-ended).
    pub fn add_default_route(
        sock: &OwnedFd,
        name: &mut [u8],
        gateway: std::net::Ipv4Addr,
    ) -> nix::Result<()> {
        // SAFETY: `rtentry` is plain old data (addresses, integers and pointers), for which
        // all zero bytes are a valid value (null pointers: no device, no window).
        let mut route: libc::rtentry = unsafe { std::mem::zeroed() };
        route.rt_dst = sockaddr(std::net::Ipv4Addr::UNSPECIFIED);
        route.rt_genmask = sockaddr(std::net::Ipv4Addr::UNSPECIFIED);
        route.rt_gateway = sockaddr(gateway);
        route.rt_flags = libc::RTF_UP | libc::RTF_GATEWAY;
        route.rt_dev = name.as_mut_ptr().cast();
        // SAFETY: SIOCADDRT reads the `rtentry` and the NUL-ended device name it points to;
        // both outlive the call.
        Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCADDRT, &route) }).map(drop)
    }
}

fn checked_name(interface: &str) -> Result<&[u8]> {
    let name = interface.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return Err(net_err("naming", interface)(Errno::EINVAL));
    }
    Ok(name)
}

fn inet_socket(op: &'static str, interface: &str) -> Result<std::os::fd::OwnedFd> {
    socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(net_err(op, interface))
}

/// Give `interface` the address `address/prefix_len` (`ip addr add`; the kernel adds the
/// subnet's route with it).
pub fn set_ipv4_address(interface: &str, address: Ipv4Addr, prefix_len: u8) -> Result<()> {
    let mut req = sys::request(checked_name(interface)?);
    let sock = inet_socket("opening a socket to address", interface)?;
    let mask = u32::MAX
        .checked_shl(32 - u32::from(prefix_len.min(32)))
        .unwrap_or(0);
    sys::set_address(&sock, &mut req, libc::SIOCSIFADDR, address)
        .map_err(net_err("setting the address of", interface))?;
    sys::set_address(&sock, &mut req, libc::SIOCSIFNETMASK, Ipv4Addr::from(mask))
        .map_err(net_err("setting the netmask of", interface))
}

/// A default route through `gateway` on `interface` (`ip route add default via …`); one that
/// is already there is fine.
pub fn add_default_route(interface: &str, gateway: Ipv4Addr) -> Result<()> {
    let mut name = checked_name(interface)?.to_vec();
    name.push(0);
    let sock = inet_socket("opening a socket to route", interface)?;
    match sys::add_default_route(&sock, &mut name, gateway) {
        Ok(()) | Err(Errno::EEXIST) => Ok(()),
        Err(e) => Err(net_err("adding the default route on", interface)(e)),
    }
}

/// Bring `interface` up (`ip link set <interface> up`); nothing to do if it is up.
pub fn set_link_up(interface: &str) -> Result<()> {
    let mut req = sys::request(checked_name(interface)?);
    let sock = inet_socket("opening a socket to bring up", interface)?;
    let flags = sys::flags(&sock, &mut req).map_err(net_err("reading the flags of", interface))?;
    let up = libc::IFF_UP as libc::c_short;
    if flags & up != 0 {
        return Ok(());
    }
    sys::set_flags(&sock, &mut req, flags | up).map_err(net_err("bringing up", interface))
}

/// The interface's Ethernet address (`getifaddrs`: the caller's network namespace, which
/// `/sys/class/net` need not show).
pub fn hardware_address(interface: &str) -> Result<[u8; 6]> {
    checked_name(interface)?;
    nix::ifaddrs::getifaddrs()
        .map_err(net_err("listing the addresses of", interface))?
        .filter(|a| a.interface_name == interface)
        .find_map(|a| a.address?.as_link_addr()?.addr())
        .ok_or_else(|| net_err("finding the Ethernet address of", interface)(Errno::ENODEV))
}

/// The IPv4 addresses of `interface` as `address/prefix` (`10.0.2.15/24`), in the kernel's
/// order (`ip -4 -o addr show <interface>`).
pub fn ipv4_addresses(interface: &str) -> Result<Vec<String>> {
    let all = nix::ifaddrs::getifaddrs().map_err(net_err("listing the addresses of", interface))?;
    Ok(all
        .filter(|a| a.interface_name == interface)
        .filter_map(|a| {
            let address = a.address?.as_sockaddr_in()?.ip();
            let prefix = a
                .netmask
                .and_then(|m| m.as_sockaddr_in().map(|m| u32::from(m.ip()).count_ones()))
                .unwrap_or(32);
            Some(format!("{address}/{prefix}"))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loopback interface every Linux machine has: 127.0.0.1/8 once it is up.
    #[test]
    fn loopback_is_up_with_its_address() {
        if !slate_testkit::require_root() {
            return;
        }
        set_link_up("lo").unwrap();
        assert!(ipv4_addresses("lo")
            .unwrap()
            .contains(&"127.0.0.1/8".to_string()));
        assert!(ipv4_addresses("no-such-if0").unwrap().is_empty());
    }

    #[test]
    fn names_the_kernel_cannot_hold_are_refused() {
        for name in ["", "a-name-of-sixteen", "nul\0"] {
            let err = set_link_up(name).unwrap_err().to_string();
            assert!(err.starts_with("naming "), "{name:?}: {err}");
        }
        let err = set_link_up("no-such-if0").unwrap_err().to_string();
        assert_eq!(err, "reading the flags of no-such-if0");
    }
}

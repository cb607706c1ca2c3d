//! Network interfaces without spawning `ip`: a link brought up (`SIOCGIFFLAGS`/`SIOCSIFFLAGS`
//! on a datagram socket) and an interface's IPv4 addresses listed (`getifaddrs`). Each `ip`
//! machined started cost a process start on the way to Running (issue 17).

use nix::errno::Errno;
use nix::sys::socket::{socket, AddressFamily, SockFlag, SockType};

use crate::{HostError, Result};

fn net_err<'a>(op: &'static str, interface: &'a str) -> impl FnOnce(Errno) -> HostError + 'a {
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
}

/// Bring `interface` up (`ip link set <interface> up`); nothing to do if it is up.
pub fn set_link_up(interface: &str) -> Result<()> {
    let name = interface.as_bytes();
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains(&0) {
        return Err(net_err("naming", interface)(Errno::EINVAL));
    }
    let mut req = sys::request(name);
    let sock = socket(
        AddressFamily::Inet,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(net_err("opening a socket to bring up", interface))?;
    let flags = sys::flags(&sock, &mut req).map_err(net_err("reading the flags of", interface))?;
    let up = libc::IFF_UP as libc::c_short;
    if flags & up != 0 {
        return Ok(());
    }
    sys::set_flags(&sock, &mut req, flags | up).map_err(net_err("bringing up", interface))
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

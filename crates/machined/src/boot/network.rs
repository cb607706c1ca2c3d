//! The Boot sequence's network: DHCP (slate's own client, `slate_dhcp`; busybox's udhcpc
//! where a packet socket cannot be had), or the static address, route and name servers of the
//! machine configuration; the addresses found name the node's certificate.

use std::path::Path;
use std::process::Command;

use slate_sequencer::{TaskContext, TaskError};

use crate::base::node::Node;
use crate::base::task::failed;
use crate::boot::facts::Facts;

/// The first non-loopback interface.
pub(crate) fn first_interface() -> Result<String, TaskError> {
    std::fs::read_dir("/sys/class/net")
        .map_err(|e| failed(format!("listing network interfaces: {e}")))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lo")
        .min()
        .ok_or_else(|| failed("no network interface"))
}

/// Record and log the IPv4 addresses `interface` has.
pub(crate) fn record_addresses(
    ctx: &TaskContext<'_>,
    node: &Node,
    interface: &str,
) -> Result<(), TaskError> {
    let cidrs = slate_host::ipv4_addresses(interface)?;
    ctx.log(&format!(
        "{interface}: {}",
        cidrs.first().map_or("no address", String::as_str)
    ));
    *node
        .machine
        .addresses
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = cidrs
        .iter()
        .filter_map(|c| c.split('/').next())
        .map(str::to_owned)
        .collect();
    Ok(())
}

/// DHCP on `interface` (the first Ethernet interface by default).
pub fn dhcp(ctx: &TaskContext<'_>, node: &Node, interface: Option<&str>) -> Result<(), TaskError> {
    slate_host::set_link_up("lo")?;
    let interface = match interface {
        Some(name) => name.to_owned(),
        None => first_interface()?,
    };
    match lease(&interface) {
        Ok(lease) => apply_lease(ctx, &interface, &lease)?,
        Err(LeaseError::NoLease(e)) => return Err(failed(format!("{interface}: {e}"))),
        Err(LeaseError::NoTransport(e)) => {
            ctx.log(&format!("{interface}: {e}; DHCP with udhcpc instead"));
            slate_host::run_command(Command::new("udhcpc").args([
                "-i",
                &interface,
                "-n",
                "-q",
                "-t",
                "10",
                "-s",
                "/usr/share/udhcpc/default.script",
            ]))?;
        }
    }
    record_addresses(ctx, node, &interface)
}

enum LeaseError {
    /// The exchange ran and no usable lease came of it: udhcpc would fare no better.
    NoLease(slate_dhcp::DhcpError),
    /// The interface could not be used as the client needs (no packet socket, say).
    NoTransport(String),
}

fn lease(interface: &str) -> Result<slate_dhcp::Lease, LeaseError> {
    let setup = |e: slate_host::HostError| LeaseError::NoTransport(e.to_string());
    slate_host::set_link_up(interface).map_err(setup)?;
    let mac = slate_host::hardware_address(interface).map_err(setup)?;
    let transport = slate_host::DhcpTransport::open(interface).map_err(setup)?;
    let exchange = slate_dhcp::Exchange {
        xid: transaction_id(&mac),
        mac,
    };
    slate_dhcp::obtain_lease(&transport, exchange, &slate_dhcp::ATTEMPT_WAITS).map_err(
        |e| match e {
            slate_dhcp::DhcpError::Transport(why) => LeaseError::NoTransport(why),
            e => LeaseError::NoLease(e),
        },
    )
}

/// A transaction id that differs between nodes booting at the same moment (the address) and
/// between boots of one node (the clock's nanoseconds).
fn transaction_id(mac: &[u8; 6]) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let low = u32::from_be_bytes([mac[2], mac[3], mac[4], mac[5]]);
    nanos ^ low.rotate_left(13)
}

/// The lease's address, default route and name servers, set on the node.
fn apply_lease(
    ctx: &TaskContext<'_>,
    interface: &str,
    lease: &slate_dhcp::Lease,
) -> Result<(), TaskError> {
    slate_host::set_ipv4_address(interface, lease.address, lease.prefix_len)?;
    if let Some(router) = lease.router {
        slate_host::add_default_route(interface, router)?;
    }
    ctx.log(&format!(
        "DHCP: {}/{} from {}, router {}, lease {}",
        lease.address,
        lease.prefix_len,
        lease.server,
        lease.router.map_or("none".to_owned(), |r| r.to_string()),
        lease
            .lease_secs
            .map_or("infinite".to_owned(), |s| format!("{s} s")),
    ));
    write_resolv_conf(ctx, &lease.dns);
    Ok(())
}

/// /etc/resolv.conf naming `servers` (left alone when there are none).
fn write_resolv_conf(ctx: &TaskContext<'_>, servers: &[impl std::fmt::Display]) {
    if servers.is_empty() {
        return;
    }
    let text: String = servers
        .iter()
        .map(|d| format!("nameserver {d}\n"))
        .collect();
    if let Err(e) =
        crate::base::files::write_if_changed(Path::new("/etc/resolv.conf"), text.as_bytes(), 0o644)
    {
        ctx.log(&format!("/etc/resolv.conf not written: {e}"));
    }
}

/// The network as the machine configuration says: DHCP, or a static address, default route
/// and name servers.
pub fn network(ctx: &TaskContext<'_>, node: &Node, facts: &Facts) -> Result<(), TaskError> {
    let config = node
        .machine
        .current()
        .ok_or_else(|| failed("no machine configuration"))?;
    let net = &config.network;
    match net.mode {
        slate_machine_config::NetworkMode::Dhcp => {
            if facts.network_up.load(std::sync::atomic::Ordering::SeqCst) && net.interface.is_none()
            {
                ctx.log("network: DHCP, up since maintenance mode");
                return Ok(());
            }
            dhcp(ctx, node, net.interface.as_deref())
        }
        slate_machine_config::NetworkMode::Static => {
            let interface = match &net.interface {
                Some(name) => name.clone(),
                None => first_interface()?,
            };
            let address = net.address.as_deref().unwrap_or_default();
            let ip =
                |args: &[&str]| slate_host::run_command(Command::new("ip").args(args)).map(drop);
            slate_host::set_link_up("lo")?;
            ip(&["addr", "flush", "dev", &interface])?;
            ip(&["addr", "add", address, "dev", &interface])?;
            ip(&["link", "set", &interface, "up"])?;
            if let Some(gateway) = net.gateway {
                ip(&["route", "replace", "default", "via", &gateway.to_string()])?;
            }
            write_resolv_conf(ctx, &net.dns);
            record_addresses(ctx, node, &interface)
        }
    }
}

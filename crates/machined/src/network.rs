//! The Boot sequence's network: DHCP with busybox's udhcpc, or the static address, route and
//! name servers of the machine configuration; the addresses found name the node's certificate.

use std::path::Path;
use std::process::Command;

use slate_sequencer::{TaskContext, TaskError};

use crate::node::Node;
use crate::sequences::Facts;
use crate::task::failed;

/// The first non-loopback interface.
fn first_interface() -> Result<String, TaskError> {
    std::fs::read_dir("/sys/class/net")
        .map_err(|e| failed(format!("listing network interfaces: {e}")))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lo")
        .min()
        .ok_or_else(|| failed("no network interface"))
}

/// Record and log the IPv4 addresses `interface` has.
fn record_addresses(ctx: &TaskContext<'_>, node: &Node, interface: &str) -> Result<(), TaskError> {
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

/// DHCP with busybox's udhcpc on `interface` (the first Ethernet interface by default).
pub fn dhcp(ctx: &TaskContext<'_>, node: &Node, interface: Option<&str>) -> Result<(), TaskError> {
    slate_host::set_link_up("lo")?;
    let interface = match interface {
        Some(name) => name.to_owned(),
        None => first_interface()?,
    };
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
    record_addresses(ctx, node, &interface)
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
            if !net.dns.is_empty() {
                let text: String = net
                    .dns
                    .iter()
                    .map(|d| format!("nameserver {d}\n"))
                    .collect();
                if let Err(e) = crate::machine::write_atomically(
                    Path::new("/etc/resolv.conf"),
                    text.as_bytes(),
                    0o644,
                ) {
                    ctx.log(&format!("/etc/resolv.conf not written: {e}"));
                }
            }
            record_addresses(ctx, node, &interface)
        }
    }
}

//! Version 0 of the machine configuration: one flat table. machined reads it and migrates it
//! forward in memory, so a node configured before version 1 keeps booting after an upgrade;
//! the file on STATE stays as written until the next `apply-config`.
//!
//! ```toml
//! version = 0
//! name = "node1"
//! dhcp = false              # default true
//! address = "10.0.2.15/24"  # with dhcp = false
//! gateway = "10.0.2.2"
//! ca_crt = "-----BEGIN CERTIFICATE-----…"   # issued the serving certificate and the clients'
//! ca_key = "-----BEGIN PRIVATE KEY-----…"
//! channel = "stable"
//! ```

use std::net::IpAddr;

use serde::Deserialize;

use crate::{Api, Etc, MachineConfig, Network, NetworkMode, Node, UpdateSettings, CURRENT_VERSION};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigV0 {
    pub version: u32,
    pub name: String,
    #[serde(default = "yes")]
    pub dhcp: bool,
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub gateway: Option<IpAddr>,
    pub ca_crt: String,
    pub ca_key: String,
    #[serde(default)]
    pub channel: Option<String>,
}

fn yes() -> bool {
    true
}

/// Version 0 → the current version. Version 0 had one CA for both directions.
pub fn migrate(old: ConfigV0) -> MachineConfig {
    MachineConfig {
        version: CURRENT_VERSION,
        node: Node {
            name: old.name,
            hostname: None,
        },
        network: Network {
            mode: if old.dhcp {
                NetworkMode::Dhcp
            } else {
                NetworkMode::Static
            },
            interface: None,
            address: old.address,
            gateway: old.gateway,
            dns: Vec::new(),
        },
        api: Api {
            listen: None,
            client_ca: old.ca_crt.clone(),
            ca_cert: old.ca_crt,
            ca_key: old.ca_key,
            fleet_ca: None,
            extra_sans: Vec::new(),
        },
        update: UpdateSettings {
            channel: old
                .channel
                .unwrap_or_else(|| UpdateSettings::default().channel),
            ..UpdateSettings::default()
        },
        etc: Etc::default(),
        reboot: Default::default(),
        services: Vec::new(),
        drain: None,
        var: None,
    }
}

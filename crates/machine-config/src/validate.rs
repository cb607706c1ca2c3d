//! Every field's rules. Each refusal names the field by its dotted path.

use std::net::IpAddr;

use p256::pkcs8::DecodePrivateKey;
use x509_parser::pem::Pem;

use crate::update::parse_duration;
use crate::{ConfigError, MachineConfig, NetworkMode, Strategy, CURRENT_VERSION};

/// Largest file the configuration may place into /etc.
const MAX_ETC_FILE_BYTES: usize = 64 * 1024;
/// Bounds of `update.poll_interval`. At least 10 s, not to hammer the registry; at most a week
/// (the cycle of maintenance windows), so a node still hears of a release, and the agent's
/// jitter and wake-up arithmetic on the interval stay far from overflowing a `Duration`.
const POLL_INTERVAL_SECS: std::ops::RangeInclusive<u64> = 10..=7 * 24 * 3600;

pub(crate) fn validate(config: &MachineConfig) -> Result<(), ConfigError> {
    if config.version != CURRENT_VERSION {
        return Err(ConfigError::invalid(
            "version",
            format!("{} is not {CURRENT_VERSION}", config.version),
        ));
    }
    if !is_label(&config.node.name) {
        return Err(ConfigError::invalid(
            "node.name",
            format!(
                "{:?} is not a node name (one DNS label: a-z, 0-9 and '-', 1 to 63 characters, \
                 not starting or ending with '-')",
                config.node.name
            ),
        ));
    }
    if let Some(hostname) = &config.node.hostname {
        if !is_hostname(hostname) {
            return Err(ConfigError::invalid(
                "node.hostname",
                format!("{hostname:?} is not a hostname (RFC 1123 labels joined by '.', at most 253 characters)"),
            ));
        }
    }
    network(config)?;
    api(config)?;
    update(config)?;
    etc(config)?;
    check_services(&config.services)?;
    drain(config.drain.as_ref())
}

fn is_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

/// RFC 1123: labels of letters, digits and '-', joined by '.', at most 253 characters.
pub fn is_hostname(text: &str) -> bool {
    text.len() <= 253
        && text
            .split('.')
            .all(|label| is_label(&label.to_ascii_lowercase()))
}

/// `address/prefix`, the prefix within the family's width.
pub fn parse_cidr(text: &str) -> Option<(IpAddr, u8)> {
    let (addr, prefix) = text.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let prefix: u8 = prefix.parse().ok()?;
    let width = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= width).then_some((addr, prefix))
}

fn network(config: &MachineConfig) -> Result<(), ConfigError> {
    let net = &config.network;
    if let Some(name) = &net.interface {
        if name.is_empty()
            || name.len() > 15
            || name.contains(['/', ':'])
            || name.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(ConfigError::invalid(
                "network.interface",
                format!(
                    "{name:?} is not an interface name (1 to 15 characters, no '/', ':' or spaces)"
                ),
            ));
        }
    }
    match net.mode {
        NetworkMode::Dhcp => {
            for (field, set) in [
                ("network.address", net.address.is_some()),
                ("network.gateway", net.gateway.is_some()),
                ("network.dns", !net.dns.is_empty()),
            ] {
                if set {
                    return Err(ConfigError::invalid(
                        field,
                        "only with mode = \"static\" (DHCP brings its own)",
                    ));
                }
            }
        }
        NetworkMode::Static => {
            let address = net.address.as_deref().ok_or_else(|| {
                ConfigError::invalid("network.address", "required with mode = \"static\"")
            })?;
            let (addr, _) = parse_cidr(address).ok_or_else(|| {
                ConfigError::invalid(
                    "network.address",
                    format!("{address:?} is not address/prefix (e.g. \"10.0.2.15/24\")"),
                )
            })?;
            let gateway = net.gateway.ok_or_else(|| {
                ConfigError::invalid("network.gateway", "required with mode = \"static\"")
            })?;
            if gateway.is_ipv4() != addr.is_ipv4() {
                return Err(ConfigError::invalid(
                    "network.gateway",
                    "is not of the address's family",
                ));
            }
        }
    }
    Ok(())
}

fn api(config: &MachineConfig) -> Result<(), ConfigError> {
    let api = &config.api;
    let ca_key = ca_public_key(&api.ca_cert, "api.ca_cert")?;
    let key = p256::SecretKey::from_pkcs8_pem(api.ca_key.trim()).map_err(|e| {
        ConfigError::invalid(
            "api.ca_key",
            format!("not a PKCS#8 ECDSA P-256 private key in PEM: {e}"),
        )
    })?;
    let public = key.public_key().to_sec1_bytes();
    if ca_key.as_deref() != Some(&public[..]) {
        return Err(ConfigError::invalid(
            "api.ca_key",
            "is not the key of api.ca_cert",
        ));
    }
    only_cas(&api.client_ca, "api.client_ca")?;
    // A node CA constrained to other names could issue the node no certificate at all.
    if let Ok(crate::trust::IssuingCa {
        constraints: Some(constraints),
        ..
    }) = crate::trust::issuing_ca(&api.ca_cert)
    {
        if !constraints.permits(&config.node.name) {
            return Err(ConfigError::invalid(
                "node.name",
                format!(
                    "{:?} is not among the names api.ca_cert may certify (its name \
                     constraints): this configuration was made for another node",
                    config.node.name
                ),
            ));
        }
    }
    if let Some(fleet_ca) = &api.fleet_ca {
        only_cas(fleet_ca, "api.fleet_ca")?;
        if !crate::trust::issued_by_any(&api.ca_cert, fleet_ca) {
            return Err(ConfigError::invalid(
                "api.fleet_ca",
                "did not issue api.ca_cert: clients that trust it could not verify this node",
            ));
        }
    }
    // Port 0 asks the kernel for any free port: nobody could find the API there.
    if let Some(listen) = api.listen.filter(|addr| addr.port() == 0) {
        return Err(ConfigError::invalid(
            "api.listen",
            format!("{listen} has port 0; give the port the API listens on (default 50000)"),
        ));
    }
    for name in &api.extra_sans {
        if name.parse::<IpAddr>().is_err() && !is_hostname(name) {
            return Err(ConfigError::invalid(
                "api.extra_sans",
                format!("{name:?} is neither an IP address nor a DNS name"),
            ));
        }
    }
    Ok(())
}

/// `text` holds one or more certificates, every one of a CA.
fn only_cas(text: &str, field: &str) -> Result<(), ConfigError> {
    for (i, der) in pem_certificates(text, field)?.iter().enumerate() {
        let (_, cert) = x509_parser::parse_x509_certificate(der)
            .map_err(|e| ConfigError::invalid(field, format!("certificate {}: {e}", i + 1)))?;
        if !cert.is_ca() {
            return Err(ConfigError::invalid(
                field,
                format!(
                    "certificate {} is not a CA (basic constraints CA:FALSE)",
                    i + 1
                ),
            ));
        }
    }
    Ok(())
}

/// The DER of every CERTIFICATE block (at least one, nothing but certificates).
fn pem_certificates(text: &str, field: &str) -> Result<Vec<Vec<u8>>, ConfigError> {
    let mut out = Vec::new();
    for pem in Pem::iter_from_buffer(text.as_bytes()) {
        let pem = pem.map_err(|e| ConfigError::invalid(field, format!("not PEM: {e}")))?;
        if pem.label != "CERTIFICATE" {
            return Err(ConfigError::invalid(
                field,
                format!("holds a {} block; only certificates belong here", pem.label),
            ));
        }
        out.push(pem.contents);
    }
    if out.is_empty() {
        return Err(ConfigError::invalid(
            field,
            "holds no PEM CERTIFICATE block",
        ));
    }
    Ok(out)
}

/// The CA certificate's public key (SEC1 point), checking it is one certificate of a CA.
fn ca_public_key(text: &str, field: &str) -> Result<Option<Vec<u8>>, ConfigError> {
    let ders = pem_certificates(text, field)?;
    if ders.len() != 1 {
        return Err(ConfigError::invalid(
            field,
            format!(
                "holds {} certificates; exactly one (the issuing CA) belongs here",
                ders.len()
            ),
        ));
    }
    let (_, cert) = x509_parser::parse_x509_certificate(&ders[0])
        .map_err(|e| ConfigError::invalid(field, format!("not an X.509 certificate: {e}")))?;
    if !cert.is_ca() {
        return Err(ConfigError::invalid(
            field,
            "is not a CA certificate (basic constraints CA:FALSE)",
        ));
    }
    Ok(Some(cert.public_key().subject_public_key.data.to_vec()))
}

fn update(config: &MachineConfig) -> Result<(), ConfigError> {
    let update = &config.update;
    if !["alpha", "beta", "stable"].contains(&update.channel.as_str()) {
        return Err(ConfigError::invalid(
            "update.channel",
            format!(
                "{:?} is not a channel (alpha, beta, stable)",
                update.channel
            ),
        ));
    }
    match &update.image {
        Some(image) if !is_repository(image) => {
            return Err(ConfigError::invalid(
                "update.image",
                format!("{image:?} is not a repository (host[:port]/path, no tag or digest)"),
            ))
        }
        None if update.enabled && update.strategy != Strategy::Operator => {
            return Err(ConfigError::invalid(
                "update.image",
                "required when the node updates itself (enabled, strategy other than operator)",
            ))
        }
        _ => {}
    }
    let interval = parse_duration(&update.poll_interval, "update.poll_interval")?;
    if !POLL_INTERVAL_SECS.contains(&interval.as_secs()) {
        return Err(ConfigError::invalid(
            "update.poll_interval",
            format!(
                "{:?} must be at least 10s and at most 7 days",
                update.poll_interval
            ),
        ));
    }
    for (i, window) in update.windows.iter().enumerate() {
        window.parse(&format!("update.windows[{i}]"))?;
    }
    if matches!(update.strategy, Strategy::Periodic | Strategy::FleetLock)
        && update.windows.is_empty()
    {
        return Err(ConfigError::invalid(
            "update.windows",
            "the periodic and fleet-lock strategies need at least one window",
        ));
    }
    match (&update.lock_server, update.strategy) {
        (None, Strategy::FleetLock) => {
            return Err(ConfigError::invalid(
                "update.lock_server",
                "required with strategy = \"fleet-lock\"",
            ))
        }
        (Some(url), _) if !(url.starts_with("http://") || url.starts_with("https://")) => {
            return Err(ConfigError::invalid(
                "update.lock_server",
                format!("{url:?} is not an http:// or https:// URL"),
            ))
        }
        _ => {}
    }
    if let Some(group) = &update.lock_group {
        if !is_label(group) {
            return Err(ConfigError::invalid(
                "update.lock_group",
                format!("{group:?} is not a group name (a-z, 0-9, '-')"),
            ));
        }
    }
    operator_fields(update)?;
    for (field, version) in [
        ("update.pin", &update.pin),
        ("update.max_version", &update.max_version),
    ] {
        if let Some(v) = version {
            if v.is_empty()
                || v.len() > 64
                || !v
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".+~-_".contains(c))
            {
                return Err(ConfigError::invalid(
                    field,
                    format!("{v:?} is not a version"),
                ));
            }
        }
    }
    Ok(())
}

/// `host[:port]/path`: a registry host and a repository path of lower-case components, without
/// a tag or digest (the agent picks the version).
fn is_repository(image: &str) -> bool {
    let Some((host, path)) = image.split_once('/') else {
        return false;
    };
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c));
    let path_ok = !path.is_empty()
        && image.len() <= 255
        && path.split('/').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
        });
    host_ok && path_ok
}

/// A path relative to /etc: no `..`, not absolute, not empty.
fn etc_path(path: &str, field: &str) -> Result<(), ConfigError> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.len() > 255
        || path.contains('\0')
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..");
    if bad {
        return Err(ConfigError::invalid(
            field,
            format!("{path:?} is not a path relative to /etc (no leading '/', no '.' or '..')"),
        ));
    }
    Ok(())
}

fn etc(config: &MachineConfig) -> Result<(), ConfigError> {
    for (i, path) in config.etc.keep.iter().enumerate() {
        etc_path(path, &format!("etc.keep[{i}]"))?;
    }
    for (i, file) in config.etc.files.iter().enumerate() {
        etc_path(&file.path, &format!("etc.files[{i}].path"))?;
        // Two entries for one file: which content wins would be an accident of order.
        if let Some(j) = config.etc.files[..i]
            .iter()
            .position(|f| f.path == file.path)
        {
            return Err(ConfigError::invalid(
                format!("etc.files[{i}].path"),
                format!(
                    "{:?} is etc.files[{j}].path already: one entry per file",
                    file.path
                ),
            ));
        }
        if file.content.len() > MAX_ETC_FILE_BYTES {
            return Err(ConfigError::invalid(
                format!("etc.files[{i}].content"),
                format!("{} bytes; at most {MAX_ETC_FILE_BYTES}", file.content.len()),
            ));
        }
        if file.mode > 0o7777 {
            return Err(ConfigError::invalid(
                format!("etc.files[{i}].mode"),
                format!(
                    "{:o} is not a permission mode (at most 7777 octal)",
                    file.mode
                ),
            ));
        }
    }
    Ok(())
}

/// `HOST:PORT` with a port one can connect to (1 to 65535).
fn is_host_port(text: &str) -> bool {
    text.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.contains(char::is_whitespace)
            && port.parse::<u16>().is_ok_and(|port| port != 0)
    })
}

fn operator_fields(update: &crate::UpdateSettings) -> Result<(), ConfigError> {
    if update.enabled && update.strategy == Strategy::Operator && update.operator.is_empty() {
        return Err(ConfigError::invalid(
            "update.operator",
            "required with strategy = \"operator\": the replicas' HOST:PORT",
        ));
    }
    for endpoint in &update.operator {
        if !is_host_port(endpoint) {
            return Err(ConfigError::invalid(
                "update.operator",
                format!("{endpoint:?} is not HOST:PORT"),
            ));
        }
    }
    if let Some(advertise) = &update.advertise {
        if !is_host_port(advertise) {
            return Err(ConfigError::invalid(
                "update.advertise",
                format!("{advertise:?} is not HOST:PORT"),
            ));
        }
    }
    if let Some(group) = &update.group {
        if !is_label(group) {
            return Err(ConfigError::invalid(
                "update.group",
                format!("{group:?} is not a group name (a-z, 0-9, '-')"),
            ));
        }
    }
    for (key, value) in &update.labels {
        let ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if !ok(key) || !ok(value) {
            return Err(ConfigError::invalid(
                "update.labels",
                format!("{key:?} = {value:?}: keys and values are 1-63 of [A-Za-z0-9-_.]"),
            ));
        }
    }
    Ok(())
}

/// Each service's own checks and no name twice; the programs and the dependencies on the
/// image's services are checked on the node (`slate_services::start_order` over the image's
/// services and these).
fn check_services(services: &[slate_services::ServiceSpec]) -> Result<(), ConfigError> {
    let mut names = std::collections::BTreeSet::new();
    for service in services {
        service
            .check(&|_| true)
            .map_err(|e| ConfigError::invalid("services", e.to_string()))?;
        if !names.insert(service.name.as_str()) {
            return Err(ConfigError::invalid(
                "services",
                slate_services::ServiceError::Duplicate(service.name.clone()).to_string(),
            ));
        }
    }
    Ok(())
}

/// `[drain]`: an argv with an absolute program, a timeout in range. Whether the program
/// exists is the node's to check (its root), as for services.
fn drain(drain: Option<&crate::Drain>) -> Result<(), ConfigError> {
    let Some(drain) = drain else {
        return Ok(());
    };
    slate_services::check_argv(&drain.command)
        .map_err(|e| ConfigError::invalid("drain.command", e))?;
    if !(1..=crate::MAX_DRAIN_TIMEOUT_SECS).contains(&drain.timeout_secs) {
        return Err(ConfigError::invalid(
            "drain.timeout_secs",
            format!(
                "{} is outside 1..={}",
                drain.timeout_secs,
                crate::MAX_DRAIN_TIMEOUT_SECS
            ),
        ));
    }
    Ok(())
}

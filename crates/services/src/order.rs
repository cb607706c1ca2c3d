//! A set of services as a whole: names unique, every dependency a service of the set or a
//! milestone, no circle; and the order they start in (a service after what it depends on,
//! otherwise by name) and stop in (the reverse).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::{ServiceError, ServiceSpec};

/// A point of the boot a service can wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Milestone {
    /// The network is configured (addresses and routes set, or DHCP answered).
    Network,
    /// EPHEMERAL is mounted on /var.
    Var,
    /// /etc is this version's overlay and its setup hooks ran.
    Etc,
}

impl Milestone {
    pub const NAMES: [&'static str; 3] = ["network", "var", "etc"];

    pub fn parse(name: &str) -> Option<Milestone> {
        match name {
            "network" => Some(Milestone::Network),
            "var" => Some(Milestone::Var),
            "etc" => Some(Milestone::Etc),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Milestone::Network => "network",
            Milestone::Var => "var",
            Milestone::Etc => "etc",
        }
    }
}

/// The milestones `service` waits for.
pub fn milestones(service: &ServiceSpec) -> BTreeSet<Milestone> {
    service
        .depends_on
        .iter()
        .filter_map(|d| Milestone::parse(d))
        .collect()
}

/// The services (by name) `service` waits for.
pub fn service_dependencies(service: &ServiceSpec) -> impl Iterator<Item = &str> {
    service
        .depends_on
        .iter()
        .map(String::as_str)
        .filter(|d| Milestone::parse(d).is_none())
}

/// The stop order in waves (indices into `services`, a checked set): the first wave holds the
/// services no other depends on, each next one those whose dependents are all in earlier waves.
/// A wave's services stop together (their grace periods overlap); a service stops only once
/// everything that depends on it is down. Within a wave, by name.
pub fn stop_waves(services: &[ServiceSpec]) -> Vec<Vec<usize>> {
    let mut wave_of: Vec<Option<usize>> = vec![None; services.len()];
    let mut waves: Vec<Vec<usize>> = Vec::new();
    while wave_of.iter().any(Option::is_none) {
        let wave = waves.len();
        let mut this: Vec<usize> = (0..services.len())
            .filter(|&i| wave_of[i].is_none())
            .filter(|&i| {
                // Every service depending on i is in an earlier wave.
                services.iter().enumerate().all(|(j, other)| {
                    j == i
                        || !service_dependencies(other).any(|d| d == services[i].name)
                        || wave_of[j].is_some_and(|w| w < wave)
                })
            })
            .collect();
        if this.is_empty() {
            // A circle (refused when the set was checked): what is left goes last, together.
            this = (0..services.len())
                .filter(|&i| wave_of[i].is_none())
                .collect();
        }
        this.sort_by(|&a, &b| services[a].name.cmp(&services[b].name));
        for &i in &this {
            wave_of[i] = Some(wave);
        }
        waves.push(this);
    }
    waves
}

/// Checks every service and the set, and answers the start order (indices into `services`):
/// a service comes after every service it depends on; among those free to start, by name. The
/// stop order is its reverse.
pub fn start_order(
    services: &[ServiceSpec],
    has_program: &dyn Fn(&Path) -> bool,
) -> Result<Vec<usize>, ServiceError> {
    let mut by_name = BTreeMap::new();
    for (i, service) in services.iter().enumerate() {
        service.check(has_program)?;
        if by_name.insert(service.name.as_str(), i).is_some() {
            return Err(ServiceError::Duplicate(service.name.clone()));
        }
    }
    for service in services {
        for dependency in service_dependencies(service) {
            if !by_name.contains_key(dependency) {
                return Err(ServiceError::UnknownDependency {
                    service: service.name.clone(),
                    dependency: dependency.to_owned(),
                });
            }
        }
    }
    // Kahn's algorithm over names, so that the order does not depend on declaration order.
    let mut waiting: BTreeMap<&str, BTreeSet<&str>> = services
        .iter()
        .map(|s| (s.name.as_str(), service_dependencies(s).collect()))
        .collect();
    let mut order = Vec::with_capacity(services.len());
    while !waiting.is_empty() {
        let Some(next) = waiting
            .iter()
            .find(|(_, deps)| deps.is_empty())
            .map(|(name, _)| *name)
        else {
            return Err(ServiceError::Cycle(a_cycle(&waiting)));
        };
        waiting.remove(next);
        for deps in waiting.values_mut() {
            deps.remove(next);
        }
        order.push(by_name[next]);
    }
    Ok(order)
}

/// One circle among services none of which can start, named from its first name round to it
/// again: `a -> b -> a`.
fn a_cycle(waiting: &BTreeMap<&str, BTreeSet<&str>>) -> Vec<String> {
    // Every waiting service waits for another waiting one, so walking always finds a repeat.
    let mut path: Vec<&str> = Vec::new();
    let mut at = *waiting.keys().next().unwrap_or(&"");
    loop {
        if let Some(start) = path.iter().position(|p| *p == at) {
            let mut cycle: Vec<String> = path[start..].iter().map(|s| (*s).to_owned()).collect();
            cycle.push(at.to_owned());
            return cycle;
        }
        path.push(at);
        match waiting.get(at).and_then(|deps| deps.iter().next()) {
            Some(next) => at = next,
            None => return path.iter().map(|s| (*s).to_owned()).collect(),
        }
    }
}

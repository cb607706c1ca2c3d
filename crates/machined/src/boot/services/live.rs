//! A live apply of the node's services (`apply-config` whose services changed): the set the
//! node runs becomes the new one without a reboot. What was removed or changed is stopped —
//! in reverse start order, as a drain stops it — and its thread retired; what is new or
//! changed starts in the new start order, waiting for its dependencies as at boot; the rest
//! runs on untouched (its pid, restarts and readiness kept). A service depending on a changed
//! one is not restarted: it was started against the old one and goes on.

use std::sync::Arc;

use slate_services::ServiceSpec;

use super::{Service, Supervisor};

/// What a live apply did, by service name.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct LiveChange {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

impl std::fmt::Display for LiveChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = [
            ("added", &self.added),
            ("changed", &self.changed),
            ("removed", &self.removed),
        ]
        .into_iter()
        .filter(|(_, names)| !names.is_empty())
        .map(|(what, names)| format!("{what} {}", names.join(" ")))
        .collect();
        if parts.is_empty() {
            f.write_str("services unchanged")
        } else {
            write!(f, "services applied live: {}", parts.join("; "))
        }
    }
}

impl Supervisor {
    /// Makes `wanted` (checked, in start order) the running set.
    pub(super) fn apply_live(&self, wanted: Vec<ServiceSpec>) -> String {
        let current = self.services();
        let mut change = LiveChange::default();
        for service in current.iter().rev() {
            if wanted.contains(&service.spec) {
                continue;
            }
            let name = &service.spec.name;
            let why = if wanted.iter().any(|w| &w.name == name) {
                change.changed.insert(0, name.clone());
                "the machine configuration changed it"
            } else {
                change.removed.insert(0, name.clone());
                "the machine configuration removed it"
            };
            self.stop(service, why);
            self.retire(service);
        }
        let mut started = Vec::new();
        let next: Vec<Arc<Service>> = wanted
            .into_iter()
            .map(|spec| match current.iter().find(|s| s.spec == spec) {
                Some(kept) => kept.clone(),
                None => {
                    if !change.changed.contains(&spec.name) {
                        change.added.push(spec.name.clone());
                    }
                    let service = self.service(spec);
                    started.push(service.clone());
                    service
                }
            })
            .collect();
        *self.services_mut() = next;
        for service in &started {
            self.run(service);
        }
        let line = change.to_string();
        self.journal.info(&line);
        line
    }

    /// Ends a stopped service's thread and removes its (empty) cgroup, so a service of the same
    /// name starts from a fresh one with only its own limits.
    fn retire(&self, service: &Service) {
        let mut status = service.status();
        status.retired = true;
        service.changed.notify_all();
        drop(status);
        if let Some(cgroup) = &service.cgroup {
            if let Err(e) = cgroup.remove() {
                self.journal.error(format_args!(
                    "service {}: its cgroup stays: {e}",
                    service.spec.name
                ));
            }
        }
    }
}

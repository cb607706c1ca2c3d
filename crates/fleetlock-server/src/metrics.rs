//! The lock server's `/metrics`: requests by operation and outcome and their latency, kept as
//! they happen; the store's errors and lost compare-and-swaps, counted by [`Counted`] around
//! the store; and at each scrape every configured group's slots, read from the store.

use std::sync::Arc;
use std::time::Duration;

use slate_fleetlock::store::Swap;
use slate_fleetlock::{GroupName, Semaphore, SemaphoreStore, Service, StoreError, Version};
use slate_metrics::{
    counter_vec, histogram_vec, HistogramVec, IntCounterVec, Registry, Scrape, LATENCY_BUCKETS,
};

/// What the server counts while it runs (reset when it restarts).
#[derive(Debug, Clone)]
pub struct LockMetrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
    store_errors: IntCounterVec,
    conflicts: IntCounterVec,
}

impl Default for LockMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl LockMetrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let requests = counter_vec(
            &registry,
            "slate_fleetlock_requests_total",
            "FleetLock requests answered, by operation (lock, unlock, other) and outcome \
             (locked, already_held, unlocked, not_held, or the refusal's kind).",
            &["operation", "result"],
        );
        let latency = histogram_vec(
            &registry,
            "slate_fleetlock_request_duration_seconds",
            "Time from a FleetLock request's head to its answer, by operation.",
            &["operation"],
            LATENCY_BUCKETS,
        );
        let store_errors = counter_vec(
            &registry,
            "slate_fleetlock_store_errors_total",
            "Store calls that failed (unreachable, unreadable, refused), by call (load, swap).",
            &["call"],
        );
        let conflicts = counter_vec(
            &registry,
            "slate_fleetlock_cas_conflicts_total",
            "Compare-and-swaps lost to another writer and retried, by group.",
            &["group"],
        );
        LockMetrics {
            registry,
            requests,
            latency,
            store_errors,
            conflicts,
        }
    }

    /// One answered request: `operation` is `lock`, `unlock` or `other` (a refused path).
    pub fn request(&self, operation: &str, outcome: &str, took: Duration) {
        self.requests.with_label_values(&[operation, outcome]).inc();
        self.latency
            .with_label_values(&[operation])
            .observe(took.as_secs_f64());
    }

    /// The text exposition: the counters, and each configured group's slots as the store
    /// holds them now (blocking: a store read per group).
    pub fn scrape<S: SemaphoreStore>(&self, service: &Service<S>) -> String {
        let scrape = Scrape::new();
        let held = scrape.gauge_vec(
            "slate_fleetlock_slots_held",
            "Slots of each configured group held now (read from the store at the scrape).",
            &["group"],
        );
        let limit = scrape.gauge_vec(
            "slate_fleetlock_slots_limit",
            "Slots each configured group has (the server's configuration).",
            &["group"],
        );
        let mut unreadable = 0.0;
        for (group, slots) in service.groups().iter() {
            limit.with_label_values(&[group.as_str()]).set(slots as f64);
            match service.store().load(group) {
                Ok(sem) => {
                    let n = sem.map_or(0, |(_, s)| s.holders().len());
                    held.with_label_values(&[group.as_str()]).set(n as f64);
                }
                Err(_) => {
                    self.store_errors.with_label_values(&["load"]).inc();
                    unreadable += 1.0;
                }
            }
        }
        scrape.gauge(
            "slate_fleetlock_groups_unreadable",
            "Configured groups whose semaphore this scrape could not read from the store.",
            unreadable,
        );
        scrape.encode(&[&self.registry])
    }
}

/// A store that counts, for [`LockMetrics`], its failed calls and lost swaps (each lost swap
/// is one retry of `slate_fleetlock::lock`/`unlock`, or their final conflict).
#[derive(Debug)]
pub struct Counted<S> {
    inner: S,
    metrics: Arc<LockMetrics>,
}

impl<S> Counted<S> {
    pub fn new(inner: S, metrics: Arc<LockMetrics>) -> Self {
        Counted { inner, metrics }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    fn failed<T>(&self, call: &str, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if r.is_err() {
            self.metrics.store_errors.with_label_values(&[call]).inc();
        }
        r
    }
}

impl<S: SemaphoreStore> SemaphoreStore for Counted<S> {
    fn groups(&self) -> Result<Vec<GroupName>, StoreError> {
        self.failed("groups", self.inner.groups())
    }

    fn load(&self, group: &GroupName) -> Result<Option<(Version, Semaphore)>, StoreError> {
        self.failed("load", self.inner.load(group))
    }

    fn compare_and_swap(
        &self,
        group: &GroupName,
        expected: Option<Version>,
        new: &Semaphore,
    ) -> Result<bool, StoreError> {
        let swapped = self.failed("swap", self.inner.compare_and_swap(group, expected, new))?;
        if !swapped {
            self.lost(group);
        }
        Ok(swapped)
    }

    fn swap(
        &self,
        group: &GroupName,
        expected: Option<Version>,
        new: &Semaphore,
    ) -> Result<Swap, StoreError> {
        let swap = self.failed("swap", self.inner.swap(group, expected, new))?;
        if !matches!(swap, Swap::Swapped(_)) {
            self.lost(group);
        }
        Ok(swap)
    }

    fn local(&self) -> Option<&slate_fleetlock::store::Local> {
        self.inner.local()
    }
}

impl<S> Counted<S> {
    fn lost(&self, group: &GroupName) {
        // Groups are the configured ones (an unknown group is refused before the store).
        self.metrics
            .conflicts
            .with_label_values(&[group.as_str()])
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slate_fleetlock::store::MemStore;
    use slate_fleetlock::{GroupSpec, Groups, Operation};

    #[test]
    fn requests_slots_and_lost_swaps_are_counted() {
        let metrics = Arc::new(LockMetrics::new());
        let groups = Groups::new(["workers=2".parse::<GroupSpec>().unwrap()]).unwrap();
        let store = Counted::new(MemStore::new(), metrics.clone());
        let group = GroupName::new("workers").unwrap();
        // Another writer got in first: the swap that expected nothing loses.
        let other = Semaphore::new(2);
        store.compare_and_swap(&group, None, &other).unwrap();
        assert!(!store.compare_and_swap(&group, None, &other).unwrap());
        let service = Service::new(groups, store);
        let body = br#"{"client_params":{"id":"n1","group":"workers"}}"#;
        let a = service.serve(Operation::Lock, Some(b"true"), body);
        metrics.request("lock", a.outcome, Duration::from_millis(3));
        let text = metrics.scrape(&service);
        for line in [
            "slate_fleetlock_slots_held{group=\"workers\"} 1\n",
            "slate_fleetlock_slots_limit{group=\"workers\"} 2\n",
            "slate_fleetlock_requests_total{operation=\"lock\",result=\"locked\"} 1\n",
            "slate_fleetlock_cas_conflicts_total{group=\"workers\"} 1\n",
            "slate_fleetlock_request_duration_seconds_bucket{operation=\"lock\",le=\"0.005\"} 1\n",
            "slate_fleetlock_groups_unreadable 0\n",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}

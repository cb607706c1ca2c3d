//! The etcd store (`docs/formats.md §8`): one key per group, airlock's
//! `com.coreos.airlock/groups/<group>/v1/semaphore`, holding the semaphore in airlock's layout
//! (`{"total_slots":N,"holders":[…]}`, [`Semaphore::to_json`]), so that slate and airlock read
//! each other's values. etcd versions the key itself, so the value needs no version of its own
//! (unlike the file store's record).
//!
//! The compare-and-swap token ([`Version`]) is the key's `mod_revision`: the cluster-wide
//! revision of the key's last write. A swap is one transaction,
//! `If(ModRevision(key) = V) Then(Put(key, value)) Else(Get(key))`, or `If(Version(key) = 0)`
//! for a key expected absent. Not the key's own `version`: that counts writes since the key's
//! creation and starts again at 1 when a key is deleted and created anew (an admin's `etcdctl
//! del`), so a server holding an old read could swap over a value it never saw. A
//! `mod_revision` is never reused. The `Else` read hands a lost swap what won
//! ([`Swap::LostTo`]), read in the same transaction, so the caller's retry needs no read; a
//! swap that is made answers the transaction's revision, the `mod_revision` its put gave the
//! key.
//!
//! The store keeps [`Local`] turns and memory: requests on one group through one store value
//! (one server) queue instead of racing each other's swaps, and swap against the value the
//! last one read or wrote, with no read first while this server is the only writer. Every
//! round trip to etcd is a quorum round (a swap a Raft proposal, lost or not), so with 16
//! requests on a group this is the difference between one round trip per change and most of
//! them wasted.
//!
//! The trait is synchronous and etcd's client is async: the store owns a small runtime
//! ([`slate_etcd_call::CallRuntime`]) and every call runs as a task there while the calling
//! thread waits on a channel, which is correct from any thread (the server calls from tokio's
//! blocking pool; the CLI from main). How calls reach etcd, the timeouts and which failures are
//! repeated within [`RETRY_BUDGET`] are `slate-etcd-call`'s, shared with the operator.
//!
//! Failover: the client balances over every endpoint given, and a call that fails because a
//! member is unreachable, between leaders or too slow is repeated. Repeating a swap whose first
//! attempt may have committed is safe: the repeat's compare then fails, the store answers
//! "lost" with what stands, and the caller's retry finds its own change already made in it
//! (locking again is "already held", unlocking again "not held").

use std::future::Future;

use etcd_client::{
    Client, Compare, CompareOp, Error as EtcdError, GetOptions, GetResponse, Txn, TxnOp,
    TxnOpResponse,
};
use slate_etcd_call::CallRuntime;
use slate_fleetlock::store::{Local, Swap};
use slate_fleetlock::{GroupName, Semaphore, SemaphoreStore, StoreError, Version};

pub use slate_etcd_call::{CONNECT_TIMEOUT, REQUEST_TIMEOUT, RETRY_BUDGET};

/// airlock's key prefix; a group's key is `<prefix><group>/v1/semaphore`.
pub const KEY_PREFIX: &str = "com.coreos.airlock/groups/";
const KEY_SUFFIX: &str = "/v1/semaphore";

/// airlock's key of `group`.
pub fn key(group: &GroupName) -> String {
    format!("{KEY_PREFIX}{group}{KEY_SUFFIX}")
}

/// The group a key names, if it is a group's semaphore key.
fn group_of(key: &[u8]) -> Option<GroupName> {
    let key = std::str::from_utf8(key).ok()?;
    let name = key.strip_prefix(KEY_PREFIX)?.strip_suffix(KEY_SUFFIX)?;
    GroupName::new(name).ok()
}

/// Semaphores in an etcd cluster.
pub struct EtcdStore {
    endpoints: Vec<String>,
    client: Client,
    /// This store value's callers take turns per group rather than race each other's swaps.
    local: Local,
    /// Where every call runs, the calling thread waiting for it (see the module documentation).
    runtime: CallRuntime,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// A client of the cluster at `endpoints` (`http://host:port` each). Nothing is sent yet:
    /// a cluster that is down shows at the first call.
    pub fn connect(endpoints: &[String]) -> Result<Self, StoreError> {
        slate_etcd_call::check_endpoints(endpoints)
            .map_err(|e| StoreError::backend(e.what(), e))?;
        let runtime = CallRuntime::new("slate-fleetlock-etcd")
            .map_err(|e| StoreError::backend("starting the etcd client's runtime", e))?;
        let (eps, options) = (endpoints.to_vec(), slate_etcd_call::connect_options());
        // Created on the store's runtime: the client's channel spawns its workers there.
        let what = || format!("connecting to etcd at {}", endpoints.join(","));
        let client = runtime
            .wait(async move { Client::connect(eps, Some(options)).await })
            .ok_or_else(|| StoreError::backend(what(), "the connect task was abandoned"))?
            .map_err(|e| StoreError::backend(what(), e))?;
        Ok(EtcdStore {
            endpoints: endpoints.to_vec(),
            client,
            local: Local::new(),
            runtime,
        })
    }

    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    fn context(&self, what: &str) -> String {
        format!("etcd {}: {what}", self.endpoints.join(","))
    }

    /// Runs `call` (repeated per [`slate_etcd_call::retrying`]) on the store's runtime and
    /// waits for it.
    fn run<T, F, Fut>(&self, what: impl FnOnce() -> String, call: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnMut(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, EtcdError>> + Send + 'static,
    {
        self.runtime
            .call(&self.client, call)
            .map_err(|e| StoreError::backend(what(), e))
    }
}

impl SemaphoreStore for EtcdStore {
    fn groups(&self) -> Result<Vec<GroupName>, StoreError> {
        let keys = self.run(
            || self.context(&format!("listing the groups under {KEY_PREFIX}")),
            |mut client| async move {
                let options = GetOptions::new().with_prefix().with_keys_only();
                let resp = client.get(KEY_PREFIX, Some(options)).await?;
                Ok(resp
                    .kvs()
                    .iter()
                    .map(|kv| kv.key().to_vec())
                    .collect::<Vec<_>>())
            },
        )?;
        // Other keys under airlock's prefix (none today) are not groups.
        let mut groups: Vec<GroupName> = keys.iter().filter_map(|k| group_of(k)).collect();
        groups.sort();
        groups.dedup();
        Ok(groups)
    }

    fn load(&self, group: &GroupName) -> Result<Option<(Version, Semaphore)>, StoreError> {
        let key = key(group);
        let k = key.clone();
        let found = self.run(
            || self.context(&format!("reading group {group} ({key})")),
            move |mut client| {
                let k = k.clone();
                // A linearizable read (the default): never older than a swap that succeeded.
                async move { Ok(stored(&client.get(k, None).await?)) }
            },
        )?;
        found
            .map(|(revision, value)| decode(group, &key, revision, &value))
            .transpose()
    }

    fn compare_and_swap(
        &self,
        group: &GroupName,
        expected: Option<Version>,
        new: &Semaphore,
    ) -> Result<bool, StoreError> {
        Ok(matches!(self.swap(group, expected, new)?, Swap::Swapped(_)))
    }

    /// One transaction: `If(compare) Then(Put(key, new)) Else(Get(key))`. The `Else` read is
    /// part of the transaction, so it is the value the compare failed on, as linearizable as
    /// a [`load`](SemaphoreStore::load), at no extra round trip.
    fn swap(
        &self,
        group: &GroupName,
        expected: Option<Version>,
        new: &Semaphore,
    ) -> Result<Swap, StoreError> {
        let key = key(group);
        let compare = match expected {
            None => Compare::version(key.as_str(), CompareOp::Equal, 0),
            Some(Version(revision)) => {
                let Ok(revision) = i64::try_from(revision) else {
                    // No etcd revision is this large: the key cannot be at it.
                    return Ok(Swap::Lost);
                };
                Compare::mod_revision(key.as_str(), CompareOp::Equal, revision)
            }
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key.as_str(), new.to_json(), None)])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let answer = self.run(
            || self.context(&format!("swapping group {group} ({key})")),
            move |mut client| {
                let txn = txn.clone();
                async move {
                    let resp = client.txn(txn).await?;
                    if resp.succeeded() {
                        // The header's revision is the transaction's, which a put in it gives
                        // the key as its mod_revision.
                        return Ok(Txned::Swapped(resp.header().map(|h| h.revision())));
                    }
                    Ok(Txned::Lost(resp.op_responses().into_iter().find_map(
                        |op| match op {
                            TxnOpResponse::Get(get) => Some(stored(&get)),
                            _ => None,
                        },
                    )))
                }
            },
        )?;
        Ok(match answer {
            Txned::Swapped(revision) => Swap::Swapped(
                revision
                    .and_then(|r| u64::try_from(r).ok())
                    .filter(|r| *r > 0)
                    .map(Version),
            ),
            // No range answer: not what etcd sends, but then nothing is known.
            Txned::Lost(None) => Swap::Lost,
            Txned::Lost(Some(None)) => Swap::LostTo(None),
            // A value that does not decode is answered as a plain loss: the retry's own read
            // then reports it as the read error it is (`failed_sem_init`), as before.
            Txned::Lost(Some(Some((revision, value)))) => {
                match decode(group, &key, revision, &value) {
                    Ok(current) => Swap::LostTo(Some(current)),
                    Err(_) => Swap::Lost,
                }
            }
        })
    }

    fn local(&self) -> Option<&Local> {
        Some(&self.local)
    }
}

/// What a swap's transaction answered: the revision it wrote at, or the `Else` read
/// (`None`: no range answer; inside, `None`: the key is absent).
enum Txned {
    Swapped(Option<i64>),
    Lost(Option<Option<(i64, Vec<u8>)>>),
}

/// The key's `(mod_revision, value)` in a range answer for that one key.
fn stored(resp: &GetResponse) -> Option<(i64, Vec<u8>)> {
    resp.kvs()
        .first()
        .map(|kv| (kv.mod_revision(), kv.value().to_vec()))
}

/// A stored value and its revision as a version and a semaphore, checked.
fn decode(
    group: &GroupName,
    key: &str,
    revision: i64,
    value: &[u8],
) -> Result<(Version, Semaphore), StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        group: group.to_string(),
        reason: format!("etcd key {key}: {reason}"),
    };
    let revision = u64::try_from(revision)
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(|| corrupt(format!("mod_revision {revision}")))?;
    // Strict, with the size cap: a value written by hand or by a newer airlock is refused,
    // never overwritten.
    let semaphore = Semaphore::parse(value).map_err(|e| corrupt(e.to_string()))?;
    Ok((Version(revision), semaphore))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_airlocks() {
        let g = GroupName::new("workers.eu-1").unwrap();
        assert_eq!(
            key(&g),
            "com.coreos.airlock/groups/workers.eu-1/v1/semaphore"
        );
        assert_eq!(group_of(key(&g).as_bytes()), Some(g));
        for other in [
            &b"com.coreos.airlock/groups/a/v2/semaphore"[..],
            b"com.coreos.airlock/groups/a/b/v1/semaphore",
            b"com.coreos.airlock/groups//v1/semaphore",
            b"other/groups/a/v1/semaphore",
            b"com.coreos.airlock/groups/\xff/v1/semaphore",
        ] {
            assert_eq!(group_of(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    #[test]
    fn bad_endpoints_are_refused_before_connecting() {
        let err = EtcdStore::connect(&[]).unwrap_err().to_string();
        assert!(err.contains("no endpoints"), "{err}");
        let err = EtcdStore::connect(&["https://127.0.0.1:2379".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("TLS to etcd is not implemented"), "{err}");
    }

    /// After the retry budget (slate-etcd-call tests the repeats, and calls from inside
    /// another runtime's async context).
    #[test]
    fn a_dead_cluster_is_an_error_naming_it() {
        // A port nobody listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let url = format!("http://127.0.0.1:{port}");
        let store = EtcdStore::connect(std::slice::from_ref(&url)).unwrap();
        let err = store.load(&GroupName::default_group()).unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains(&url) && err.contains("reading group default"),
            "{err}"
        );
    }

    fn locked(s: &Semaphore, id: &str) -> Semaphore {
        match s
            .lock(&slate_fleetlock::ClientId::new(id).unwrap(), 2)
            .unwrap()
        {
            slate_fleetlock::Transition::Changed(s) => s,
            slate_fleetlock::Transition::Unchanged => panic!("{id} already held"),
        }
    }

    /// The swap's `Else` branch on a real (one-member) cluster: a lost swap answers what
    /// stands, with the version [`SemaphoreStore::load`] reads for it; a swap that is made
    /// answers the version `load` then reads, which is what a turn's memory relies on.
    #[test]
    fn a_lost_swap_answers_what_won() {
        if !slate_testkit::etcd::require_etcd() {
            return;
        }
        let cluster = slate_testkit::etcd::EtcdCluster::start(1).unwrap();
        let store = EtcdStore::connect(&cluster.endpoints()).unwrap();
        let rival = EtcdStore::connect(&cluster.endpoints()).unwrap();
        let g = GroupName::new("workers").unwrap();
        let one = locked(&Semaphore::new(2), "n1");
        let Swap::Swapped(Some(v1)) = store.swap(&g, None, &one).unwrap() else {
            panic!("not created")
        };
        assert_eq!(store.load(&g).unwrap(), Some((v1, one.clone())));
        assert_eq!(
            store.swap(&g, None, &one).unwrap(),
            Swap::LostTo(Some((v1, one.clone()))),
            "no longer absent"
        );
        let two = locked(&one, "n2");
        let Swap::Swapped(Some(v2)) = rival.swap(&g, Some(v1), &two).unwrap() else {
            panic!("not swapped")
        };
        assert_eq!(rival.load(&g).unwrap(), Some((v2, two.clone())));
        assert_eq!(
            store.swap(&g, Some(v1), &one).unwrap(),
            Swap::LostTo(Some((v2, two))),
            "stale: what won, at its version"
        );
        assert!(!store.compare_and_swap(&g, Some(v1), &one).unwrap());

        let k = key(&g);
        let raw = |value: Option<&'static str>| {
            let k = k.clone();
            store
                .run(
                    || "writing by hand".into(),
                    move |mut client| {
                        let k = k.clone();
                        async move {
                            match value {
                                Some(v) => client.put(k, v, None).await.map(drop),
                                None => client.delete(k, None).await.map(drop),
                            }
                        }
                    },
                )
                .unwrap()
        };
        raw(None);
        assert_eq!(
            store.swap(&g, Some(v2), &one).unwrap(),
            Swap::LostTo(None),
            "deleted"
        );
        // A value that does not decode is no answer: the caller's read reports it.
        raw(Some(r#"{"total_slots":1,"holders":["a","b"]}"#));
        assert_eq!(store.swap(&g, Some(v2), &one).unwrap(), Swap::Lost);
        let err = slate_fleetlock::lock(
            &store,
            &g,
            &slate_fleetlock::ClientId::new("n3").unwrap(),
            2,
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                slate_fleetlock::ApplyError::Load(StoreError::Corrupt { .. })
            ),
            "{err}"
        );
    }
}

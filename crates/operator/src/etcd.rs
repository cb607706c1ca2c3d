//! The operator's state in etcd, and the election of the replica that acts on it.
//!
//! # Keys
//!
//! Every key the operator owns lies under one prefix ([`DEFAULT_PREFIX`], `/slate/operator/`,
//! unless configured), and every key this module takes or answers is *relative* to it:
//! `get("rollouts/r1")` reads `/slate/operator/rollouts/r1`, and `list("nodes/")` answers
//! `nodes/n1`, `nodes/n2`, …. Operators that share a cluster (a staging fleet, a test) differ
//! only in their prefix, and the layout below it is the caller's. An election named `leader`
//! keeps its candidates under `leader/` (etcd's election layout, `<name>/<lease id in hex>`),
//! so the caller keeps its own keys in other subtrees.
//!
//! # Revisions
//!
//! An [`Entry`] carries the key's `mod_revision`: the cluster-wide revision of its last write.
//! A [`Commit`] checks keys against what was read with [`Expect::ModRevision`], so a decision
//! made from a read is written only if nothing it read has changed since. Not the key's own
//! `version`: that counts writes since the key's creation and starts again at 1 when a key is
//! deleted and created anew, so a commit holding an old read could pass over a value it never
//! saw. A `mod_revision` is never reused. [`Expect::Absent`] checks that a key does not exist.
//!
//! # The fence
//!
//! Leadership is etcd's election ([`EtcdState::campaign`]): the winner holds the oldest key
//! under the election's name, attached to a lease that its [`Leadership`] keeps alive. The
//! [`Fence`] is that key and its `create_revision`. A fenced commit adds
//! `create_revision(leader key) = R` to its checks, so it applies only while the very key that
//! won still exists: a replica that was paused or cut off long enough for its lease to expire
//! (and another to be elected) can never write, whatever it still believes. Such a commit
//! answers [`Outcome::Deposed`], told from a plain [`Outcome::Conflict`] by the transaction's
//! `Else` branch, which reads the leader key in the same transaction.
//!
//! # Calls and retries
//!
//! The API is synchronous and etcd's client is async: the state owns a small runtime
//! ([`slate_etcd_call::CallRuntime`]) and every call runs as a task there while the calling
//! thread waits on a channel, which is correct from any thread, including one of another
//! runtime's blocking pool. How calls reach etcd, the timeouts ([`CONNECT_TIMEOUT`],
//! [`REQUEST_TIMEOUT`]) and which failures are repeated within [`RETRY_BUDGET`] (a transport
//! error, no leader, the request timeout) are `slate-etcd-call`'s, shared with
//! fleetlock-server's etcd store.
//!
//! Reads and checked commits are safe to repeat. A repeated commit whose first attempt may have
//! committed answers [`Outcome::Conflict`] (its checks now fail on its own writes), so after a
//! conflict the caller re-reads and decides again, and may find its own change already made. A
//! commit with no checks is repeated as is (its puts and deletes write the same values again).

mod election;
mod last;
mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, Error as EtcdError, GetOptions, SortOrder,
    SortTarget, Txn, TxnOp, TxnOpResponse,
};
use slate_etcd_call::{transient, CallError, CallRuntime};

pub use election::Leadership;
pub use slate_etcd_call::{CONNECT_TIMEOUT, REQUEST_TIMEOUT, RETRY_BUDGET};
pub use watch::{Mirror, Mirrored, Snapshot};

/// Where the operator's keys are unless configured otherwise.
pub const DEFAULT_PREFIX: &str = "/slate/operator/";
/// Keys per read when listing: a page of ~500-byte values is about 500 KB.
const PAGE: i64 = 1000;
/// The largest answer a read accepts (tonic's default is 4 MiB): a page of large values.
const MAX_ANSWER: usize = 64 << 20;
/// A listing restarts (at a new revision) at most this often when etcd compacted the
/// revision it was reading at.
const LIST_ATTEMPTS: usize = 3;

/// One key under the prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the prefix.
    pub key: String,
    pub value: Vec<u8>,
    /// The revision of the key's last write: what [`Expect::ModRevision`] checks.
    pub mod_revision: i64,
}

/// What a commit expects of a key (relative to the prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// The key does not exist.
    Absent,
    /// The key exists and was last written at this revision (an [`Entry::mod_revision`]).
    ModRevision(i64),
}

/// One transaction: if every check holds (and the fence, if any, still stands), every put and
/// delete is applied, atomically; otherwise nothing is written. Keys are relative; a key may
/// appear once among the puts and deletes (etcd refuses duplicates).
#[derive(Debug, Clone, Default)]
pub struct Commit {
    pub fence: Option<Fence>,
    pub checks: Vec<(String, Expect)>,
    pub puts: Vec<(String, Vec<u8>)>,
    pub deletes: Vec<String>,
    /// Every key in `[from, to)` deleted (relative keys; the event log's pruning).
    pub delete_ranges: Vec<(String, String)>,
}

/// What a commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Applied; every put key now has this `mod_revision`.
    Committed { revision: i64 },
    /// A check failed (the fence stands): nothing was written; re-read and decide again.
    Conflict,
    /// The fence no longer stands (the leadership it came from is over): nothing was written,
    /// and the caller must stop acting as the leader.
    Deposed,
}

/// A leadership as commits check it: the election key that won (absolute) and its
/// `create_revision`. Outlives the [`Leadership`] it came from on purpose: a commit fenced by
/// an old leadership answers [`Outcome::Deposed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    key: String,
    revision: i64,
}

impl Fence {
    /// The leader's key, absolute (`<prefix><election>/<lease id>`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The key's `create_revision`: when this leadership began.
    pub fn revision(&self) -> i64 {
        self.revision
    }
}

/// Why a call failed. Each message names the endpoints and what was being done (the key).
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Refused before anything was sent: no endpoints, a TLS endpoint, an empty key.
    #[error("{0}")]
    Invalid(String),
    /// No member answered, or none had a leader, for the whole [`RETRY_BUDGET`].
    #[error("etcd {endpoints}: {what}: unavailable: {source}")]
    Unavailable {
        endpoints: String,
        what: String,
        source: BoxError,
    },
    /// etcd answered with an error (a refused request, a lease not found, …).
    #[error("etcd {endpoints}: {what}: {source}")]
    Etcd {
        endpoints: String,
        what: String,
        source: BoxError,
    },
    /// What etcd holds is not what this module writes (a key or leader value not UTF-8).
    #[error("etcd {endpoints}: {what}: {reason}")]
    Corrupt {
        endpoints: String,
        what: String,
        reason: String,
    },
    /// The client's own machinery failed (its runtime is gone, a task panicked).
    #[error("etcd {endpoints}: {what}: {reason}")]
    Client {
        endpoints: String,
        what: String,
        reason: String,
    },
}

/// An error from the etcd client, kept opaque so that its types stay out of this API.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The operator's state in an etcd cluster, every key under a prefix. Cheap to clone: clones
/// share one client and runtime.
#[derive(Clone)]
pub struct EtcdState {
    shared: Arc<Shared>,
}

/// What the state and its leaderships share; the runtime lives as long as any of them.
struct Shared {
    endpoints: Vec<String>,
    prefix: String,
    /// Every request but the campaign: bounded by [`REQUEST_TIMEOUT`].
    client: Client,
    /// The campaign, which waits server-side until it wins: no request timeout (a timed-out
    /// campaign is cancelled, and etcd then withdraws the candidate).
    waiting: Client,
    /// Every call's and background task's (the campaign's, the lease keep-alive's).
    runtime: CallRuntime,
}

impl std::fmt::Debug for EtcdState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdState")
            .field("endpoints", &self.shared.endpoints)
            .field("prefix", &self.shared.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdState {
    /// A client of the cluster at `endpoints` (`http://host:port` each) for the keys under
    /// `prefix` (a `/` is added if it does not end with one). Nothing is sent yet: a cluster
    /// that is down shows at the first call.
    pub fn connect(endpoints: &[String], prefix: &str) -> Result<Self, StateError> {
        let shown = endpoints.join(",");
        slate_etcd_call::check_endpoints(endpoints)
            .map_err(|e| StateError::Invalid(format!("{}: {e}", e.what())))?;
        if prefix.is_empty() {
            return Err(StateError::Invalid(format!(
                "etcd {shown}: an empty key prefix; the operator's keys need one of their own \
                 (default {DEFAULT_PREFIX})"
            )));
        }
        let mut prefix = prefix.to_owned();
        if !prefix.ends_with('/') {
            prefix.push('/');
        }
        let failed = |reason: String| StateError::Client {
            endpoints: shown.clone(),
            what: "connecting".into(),
            reason,
        };
        let runtime = CallRuntime::new("slate-operator-etcd")
            .map_err(|e| failed(format!("starting the client's runtime: {e}")))?;
        // A campaign may wait for hours on one connection: HTTP/2 pings notice a member that
        // vanished without closing it (no more often than etcd's 5 s ping policy allows).
        let waiting = slate_etcd_call::waiting_options()
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        let eps = endpoints.to_vec();
        // Created on the state's runtime: the clients' channels spawn their workers there.
        let clients = runtime
            .wait(async move {
                let bounded = slate_etcd_call::connect_options();
                let client = Client::connect(&eps, Some(bounded)).await?;
                let waiting = Client::connect(&eps, Some(waiting)).await?;
                Ok::<_, EtcdError>((client, waiting))
            })
            .ok_or_else(|| failed("the connect task was abandoned".into()))?;
        let (client, waiting) = clients.map_err(|e| failed(e.to_string()))?;
        Ok(EtcdState {
            shared: Arc::new(Shared {
                endpoints: endpoints.to_vec(),
                prefix,
                client,
                waiting,
                runtime,
            }),
        })
    }

    /// The prefix every key is relative to (ends with `/`).
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    pub fn endpoints(&self) -> &[String] {
        &self.shared.endpoints
    }

    /// One key: its value and `mod_revision`, or `None` if absent. A linearizable read: never
    /// older than a commit that was answered before it began.
    pub fn get(&self, key: &str) -> Result<Option<Entry>, StateError> {
        let absolute = self.absolute(key)?;
        let k = absolute.clone();
        let found = self.shared.run(
            || format!("reading {absolute}"),
            move |mut client| {
                let k = k.clone();
                async move {
                    let resp = client.get(k, None).await?;
                    Ok(resp
                        .kvs()
                        .first()
                        .map(|kv| (kv.value().to_vec(), kv.mod_revision())))
                }
            },
        )?;
        Ok(found.map(|(value, mod_revision)| Entry {
            key: key.to_owned(),
            value,
            mod_revision,
        }))
    }

    /// Every key that starts with `key_prefix` (relative; `""` for all), sorted by key, as of
    /// one revision: read in pages, every page after the first at the first one's revision.
    pub fn list(&self, key_prefix: &str) -> Result<Vec<Entry>, StateError> {
        let start = format!("{}{key_prefix}", self.shared.prefix);
        let from = start.clone().into_bytes();
        let found = self
            .shared
            .run(
                || format!("listing the keys under {start}"),
                move |client| read_range(client, from.clone()),
            )?
            .0;
        let prefix = self.shared.prefix.as_bytes();
        found
            .into_iter()
            .map(|(key, value, mod_revision)| {
                let relative = key.strip_prefix(prefix).unwrap_or(&key);
                match String::from_utf8(relative.to_vec()) {
                    Ok(key) => Ok(Entry {
                        key,
                        value,
                        mod_revision,
                    }),
                    Err(_) => Err(self.shared.corrupt(
                        format!("listing the keys under {start}"),
                        format!("key {} is not UTF-8", String::from_utf8_lossy(&key)),
                    )),
                }
            })
            .collect()
    }

    /// Applies `commit` as one transaction: `If(checks, fence) Then(puts, deletes)
    /// Else(Get(fence key))`. See [`Outcome`], and the module documentation for repeats.
    pub fn commit(&self, commit: &Commit) -> Result<Outcome, StateError> {
        let mut compares = Vec::with_capacity(commit.checks.len() + 1);
        for (key, expect) in &commit.checks {
            let key = self.absolute(key)?;
            compares.push(match *expect {
                Expect::Absent => Compare::version(key, CompareOp::Equal, 0),
                Expect::ModRevision(r) => Compare::mod_revision(key, CompareOp::Equal, r),
            });
        }
        let mut ops = Vec::with_capacity(commit.puts.len() + commit.deletes.len());
        for (key, value) in &commit.puts {
            ops.push(TxnOp::put(self.absolute(key)?, value.clone(), None));
        }
        for key in &commit.deletes {
            ops.push(TxnOp::delete(self.absolute(key)?, None));
        }
        for (from, to) in &commit.delete_ranges {
            let range = DeleteOptions::new().with_range(self.absolute(to)?);
            ops.push(TxnOp::delete(self.absolute(from)?, Some(range)));
        }
        let fenced = commit.fence.as_ref().map(|f| f.revision);
        let mut otherwise = Vec::new();
        if let Some(fence) = &commit.fence {
            compares.push(Compare::create_revision(
                fence.key.as_str(),
                CompareOp::Equal,
                fence.revision,
            ));
            otherwise.push(TxnOp::get(fence.key.as_str(), None));
        }
        // In this order: etcd-client's builder refuses `when` after `or_else`.
        let txn = Txn::new().when(compares).and_then(ops).or_else(otherwise);
        self.shared.run(
            || format!("committing {}", describe(commit, &self.shared.prefix)),
            move |mut client| {
                let txn = txn.clone();
                async move {
                    let resp = client.txn(txn).await?;
                    if resp.succeeded() {
                        // The transaction's revision, which its puts gave their keys.
                        let revision = resp.header().map_or(0, |h| h.revision());
                        return Ok(Outcome::Committed { revision });
                    }
                    let Some(revision) = fenced else {
                        return Ok(Outcome::Conflict);
                    };
                    let stands = resp.op_responses().iter().any(|op| match op {
                        TxnOpResponse::Get(get) => get
                            .kvs()
                            .first()
                            .is_some_and(|kv| kv.create_revision() == revision),
                        _ => false,
                    });
                    Ok(if stands {
                        Outcome::Conflict
                    } else {
                        Outcome::Deposed
                    })
                }
            },
        )
    }

    /// `key` under the prefix; an empty key is refused.
    fn absolute(&self, key: &str) -> Result<String, StateError> {
        if key.is_empty() {
            return Err(StateError::Invalid(format!(
                "etcd {}: an empty key under {}",
                self.shared.endpoints.join(","),
                self.shared.prefix
            )));
        }
        Ok(format!("{}{key}", self.shared.prefix))
    }
}

/// The keys a commit touches, for messages: the first few, absolute.
fn describe(commit: &Commit, prefix: &str) -> String {
    const SHOWN: usize = 3;
    let keys: Vec<&str> = commit
        .puts
        .iter()
        .map(|(k, _)| k.as_str())
        .chain(commit.deletes.iter().map(String::as_str))
        .chain(commit.delete_ranges.iter().map(|(from, _)| from.as_str()))
        .chain(commit.checks.iter().map(|(k, _)| k.as_str()))
        .collect();
    let mut shown: Vec<String> = keys
        .iter()
        .take(SHOWN)
        .map(|k| format!("{prefix}{k}"))
        .collect();
    if keys.len() > SHOWN {
        shown.push(format!("and {} more", keys.len() - SHOWN));
    }
    if let Some(fence) = &commit.fence {
        shown.push(format!("fenced by {}@{}", fence.key, fence.revision));
    }
    format!("a transaction on {}", shown.join(", "))
}

/// `(key, value, mod_revision)` of every key starting with `start`, at one revision, and
/// that revision.
async fn read_range(client: Client, start: Vec<u8>) -> Result<(Vec<RawEntry>, i64), EtcdError> {
    let end = prefix_end(&start);
    let mut kv = client.kv_client().max_decoding_message_size(MAX_ANSWER);
    let mut attempt = 1;
    'listing: loop {
        let mut found = Vec::new();
        let mut from = start.clone();
        let mut revision = 0;
        loop {
            let mut options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(PAGE)
                .with_sort(SortTarget::Key, SortOrder::Ascend);
            if revision > 0 {
                options = options.with_revision(revision);
            }
            let resp = match kv.get(from.clone(), Some(options)).await {
                Err(e) if compacted(&e) && attempt < LIST_ATTEMPTS => {
                    attempt += 1;
                    continue 'listing;
                }
                answer => answer?,
            };
            if revision == 0 {
                revision = resp.header().map_or(0, |h| h.revision());
            }
            found.extend(
                resp.kvs()
                    .iter()
                    .map(|kv| (kv.key().to_vec(), kv.value().to_vec(), kv.mod_revision())),
            );
            match found.last() {
                Some((last, _, _)) if resp.more() => {
                    // The next key after `last`.
                    from = last.clone();
                    from.push(0);
                }
                _ => return Ok((found, revision)),
            }
        }
    }
}

type RawEntry = (Vec<u8>, Vec<u8>, i64);

/// The end of the range of keys that start with `prefix` (non-empty, and ours ends in `/`):
/// `prefix` with its last byte that is not 0xff incremented, the rest dropped.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xff: to the end of the keyspace.
    vec![0]
}

/// etcd no longer has the revision a paged listing reads at.
fn compacted(e: &EtcdError) -> bool {
    matches!(e, EtcdError::GRpcStatus(s)
        if s.code() == tonic::Code::OutOfRange && s.message().contains("compacted"))
}

impl Shared {
    /// Runs `call` (repeated while the failure is transient) on the runtime and waits for it.
    fn run<T, F, Fut>(&self, what: impl FnOnce() -> String, call: F) -> Result<T, StateError>
    where
        T: Send + 'static,
        F: FnMut(Client) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, EtcdError>> + Send + 'static,
    {
        self.runtime.call(&self.client, call).map_err(|e| match e {
            CallError::Etcd(e) => self.error(what(), e),
            abandoned @ CallError::Abandoned => self.failed(what(), abandoned.to_string()),
        })
    }

    fn error(&self, what: String, e: EtcdError) -> StateError {
        let endpoints = self.endpoints.join(",");
        if transient(&e) {
            StateError::Unavailable {
                endpoints,
                what,
                source: Box::new(e),
            }
        } else {
            StateError::Etcd {
                endpoints,
                what,
                source: Box::new(e),
            }
        }
    }

    fn failed(&self, what: String, reason: String) -> StateError {
        StateError::Client {
            endpoints: self.endpoints.join(","),
            what,
            reason,
        }
    }

    fn corrupt(&self, what: String, reason: String) -> StateError {
        StateError::Corrupt {
            endpoints: self.endpoints.join(","),
            what,
            reason,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"/slate/operator/"), b"/slate/operator0");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }

    #[test]
    fn bad_configuration_is_refused_before_connecting() {
        let err = EtcdState::connect(&[], DEFAULT_PREFIX)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no endpoints"), "{err}");
        let err = EtcdState::connect(&["https://127.0.0.1:2379".into()], DEFAULT_PREFIX)
            .unwrap_err()
            .to_string();
        assert!(err.contains("TLS to etcd is not implemented"), "{err}");
        let err = EtcdState::connect(&["http://127.0.0.1:2379".into()], "")
            .unwrap_err()
            .to_string();
        assert!(err.contains("empty key prefix"), "{err}");
    }

    /// After the retry budget (slate-etcd-call tests the repeats, and calls from inside
    /// another runtime's async context).
    #[test]
    fn a_dead_cluster_is_unavailable_naming_it_and_the_key() {
        let unused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", unused.local_addr().unwrap());
        drop(unused);
        let state = EtcdState::connect(std::slice::from_ref(&url), "/t").unwrap();
        assert_eq!(state.prefix(), "/t/");
        let err = state.get("rollouts/r1").unwrap_err();
        assert!(matches!(err, StateError::Unavailable { .. }), "{err:?}");
        let err = err.to_string();
        assert!(
            err.contains(&url) && err.contains("/t/rollouts/r1"),
            "{err}"
        );
    }
}

//! Leader election with etcd's election API: a candidate grants a lease, keeps it alive in the
//! background, and campaigns with it; etcd answers the campaign once the candidate's key
//! (`<election>/<lease id>`) is the oldest under the election's name. The lease is the
//! leadership's life: revoking it (a resignation, a stopped campaign) deletes the key and lets
//! the next candidate win at once; a lease that expires (the holder paused, partitioned or
//! dead) does the same after its ttl.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use etcd_client::{
    CampaignResponse, Client, Error as EtcdError, GetOptions, LeaseKeepAliveStream, LeaseKeeper,
};
use slate_etcd_call::{retrying, Backoff};
use tokio::task::JoinHandle;

use super::{EtcdState, Fence, Shared, StateError, REQUEST_TIMEOUT};

/// How often a waiting campaign looks at its `stop` flag.
const POLL: Duration = Duration::from_millis(100);
/// The pause before a failed keep-alive is tried again (on a new stream).
const RENEW_RETRY: Duration = Duration::from_millis(200);

impl EtcdState {
    /// Campaigns for leadership of `election` (relative, e.g. `"leader"`) with `value` (this
    /// replica's name or address, what [`EtcdState::leader`] answers), on a lease of `ttl`
    /// (whole seconds, rounded up) kept alive in the background. Blocks until elected, or
    /// until `stop` is set (looked at every 100 ms): then the candidate is withdrawn (its
    /// lease revoked) and the answer is `Ok(None)`.
    ///
    /// A lease lost while waiting (etcd unreachable for longer than `ttl`) is replaced and the
    /// campaign goes on; a failure that outlasts the retry budget is an error.
    pub fn campaign(
        &self,
        election: &str,
        value: &str,
        ttl: Duration,
        stop: &AtomicBool,
    ) -> Result<Option<Leadership>, StateError> {
        let name = self.absolute(election)?;
        let ttl = Duration::from_secs(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
            .max(Duration::from_secs(1));
        let what = || format!("campaigning for {name} as {value:?}");
        loop {
            if stop.load(Ordering::Relaxed) {
                return Ok(None);
            }
            let mut lease = Lease::grant(&self.shared, ttl, &what)?;
            let (tx, rx) = mpsc::sync_channel(1);
            let campaign = campaigning(
                self.shared.client.clone(),
                self.shared.waiting.clone(),
                name.clone(),
                value.to_owned(),
                lease.id,
            );
            let task = Aborting(self.shared.runtime.spawn(async move {
                let _ = tx.send(campaign.await);
            }));
            loop {
                match rx.recv_timeout(POLL) {
                    Ok(Ok(won)) => {
                        let Some(key) = won.leader() else {
                            return Err(self.shared.failed(what(), "etcd elected nobody".into()));
                        };
                        let fence = Fence {
                            key: String::from_utf8_lossy(key.key()).into_owned(),
                            revision: key.rev(),
                        };
                        drop(task);
                        if stop.load(Ordering::Relaxed) {
                            lease.revoke();
                            return Ok(None);
                        }
                        return Ok(Some(Leadership { lease, fence }));
                    }
                    // The lease ran out under the campaign: a new one, a new campaign.
                    Ok(Err(e)) if lease.life.is_lost() || lease_gone(&e) => break,
                    Ok(Err(e)) => {
                        lease.revoke();
                        return Err(self.shared.error(what(), e));
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if stop.load(Ordering::Relaxed) {
                            // Cancelling the campaign withdraws it server-side; the revoke
                            // makes sure, before answering.
                            drop(task);
                            lease.revoke();
                            return Ok(None);
                        }
                        if lease.life.is_lost() {
                            break;
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => {
                        return Err(self
                            .shared
                            .failed(what(), "the campaign was abandoned".into()));
                    }
                }
            }
        }
    }

    /// The value of the current leader of `election`, if any.
    pub fn leader(&self, election: &str) -> Result<Option<String>, StateError> {
        let name = self.absolute(election)?;
        let n = name.clone();
        let found = self.shared.run(
            || format!("reading the leader of {name}"),
            move |mut client| {
                let n = n.clone();
                async move {
                    match client.leader(n).await {
                        Ok(resp) => Ok(resp.kv().map(|kv| kv.value().to_vec())),
                        Err(e) if no_leader(&e) => Ok(None),
                        Err(e) => Err(e),
                    }
                }
            },
        )?;
        found
            .map(|v| {
                String::from_utf8(v).map_err(|_| {
                    self.shared.corrupt(
                        format!("reading the leader of {name}"),
                        "the leader's value is not UTF-8".into(),
                    )
                })
            })
            .transpose()
    }
}

/// Campaigns for `name` with lease `id` until elected, repeating attempts that failed for
/// want of a member or a leader (the budget counts from the first failure). Repeating is safe:
/// a repeat with the same lease finds the candidate key the first attempt may have made, and
/// waits with it.
///
/// Each attempt first waits, with bounded requests, for the cluster to have a leader: the
/// campaign's own requests are not bounded (it waits for its turn server-side), and one made
/// just after the etcd leader died would hang in etcd until etcd gives up on it, seconds later.
async fn campaigning(
    bounded: Client,
    mut waiting: Client,
    name: String,
    value: String,
    id: i64,
) -> Result<CampaignResponse, EtcdError> {
    let mut backoff: Option<Backoff> = None;
    // The candidates' keys: a cheap linearizable read, answered only with a leader.
    let candidates = format!("{name}/");
    loop {
        let n = candidates.clone();
        retrying(bounded.clone(), move |mut client| {
            let options = GetOptions::new()
                .with_prefix()
                .with_keys_only()
                .with_limit(1);
            let n = n.clone();
            async move { client.get(n, Some(options)).await }
        })
        .await?;
        match waiting.campaign(name.clone(), value.clone(), id).await {
            Err(e) if backoff.get_or_insert_with(Backoff::new).again(&e).await => {}
            answer => return answer,
        }
    }
}

/// etcd's answer to `leader` when there are no candidates ("election: no leader").
fn no_leader(e: &EtcdError) -> bool {
    matches!(e, EtcdError::GRpcStatus(s) if s.message().contains("election: no leader"))
}

/// Leadership of an election, won by [`EtcdState::campaign`]. Its lease is kept alive in the
/// background until it is resigned or dropped.
pub struct Leadership {
    lease: Lease,
    fence: Fence,
}

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("fence", &self.fence)
            .field("lease", &self.lease.id)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl Leadership {
    /// What every commit made as the leader carries.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// The leadership is over, or may be, and the holder must stop acting at once: etcd said
    /// the lease is gone, or no keep-alive has been answered for the lease's ttl (etcd may
    /// have let it expire). Once lost, always lost: drop it and campaign again. Fenced commits
    /// stay safe either way (they answer [`super::Outcome::Deposed`]).
    pub fn is_lost(&self) -> bool {
        self.lease.life.is_lost()
    }

    /// Ends the leadership now: the lease is revoked, so its key goes and the next candidate
    /// is elected at once instead of after the ttl.
    pub fn resign(mut self) -> Result<(), StateError> {
        self.lease.revoke_checked()
    }

    /// Stops the keep-alive without revoking the lease, as a paused or partitioned holder
    /// would: the lease expires after its ttl. For tests.
    #[doc(hidden)]
    pub fn pause_keepalive_for_test(&self) {
        self.lease.keeper.0.abort();
    }
}

/// A lease kept alive by a background task until revoked or dropped (dropping revokes it,
/// once, waiting at most [`REQUEST_TIMEOUT`]).
struct Lease {
    shared: Arc<Shared>,
    id: i64,
    life: Arc<Life>,
    keeper: Aborting,
    revoked: bool,
}

impl Lease {
    fn grant(
        shared: &Arc<Shared>,
        ttl: Duration,
        what: &impl Fn() -> String,
    ) -> Result<Lease, StateError> {
        let secs = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
        let sent = Instant::now();
        let granted = shared.run(
            || format!("{}: granting a lease of {secs} s", what()),
            move |mut client| async move { client.lease_grant(secs, None).await },
        )?;
        let ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));
        let life = Arc::new(Life::new(sent + ttl));
        let keeper = Aborting(shared.runtime.spawn(keep_alive(
            shared.client.clone(),
            granted.id(),
            ttl,
            life.clone(),
        )));
        Ok(Lease {
            shared: shared.clone(),
            id: granted.id(),
            life,
            keeper,
            revoked: false,
        })
    }

    /// Stops the keep-alive and revokes the lease (repeated within the retry budget); a lease
    /// that etcd no longer has counts as revoked.
    fn revoke_checked(&mut self) -> Result<(), StateError> {
        self.keeper.0.abort();
        self.life.lose();
        self.revoked = true;
        let id = self.id;
        self.shared.run(
            || format!("revoking lease {id:x}"),
            move |mut client| async move {
                match client.lease_revoke(id).await {
                    Err(e) if lease_gone(&e) => Ok(()),
                    answer => answer.map(drop),
                }
            },
        )
    }

    /// [`Lease::revoke_checked`], best effort: a lease not revoked expires after its ttl.
    fn revoke(&mut self) {
        let _ = self.revoke_checked();
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.keeper.0.abort();
        self.life.lose();
        if self.revoked {
            return;
        }
        let (mut client, id) = (self.shared.client.clone(), self.id);
        let (tx, rx) = mpsc::sync_channel(1);
        self.shared.runtime.spawn(async move {
            let _ = tx.send(client.lease_revoke(id).await);
        });
        let _ = rx.recv_timeout(REQUEST_TIMEOUT);
    }
}

/// A task aborted when this handle is dropped.
struct Aborting(JoinHandle<()>);

impl Drop for Aborting {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What the holder knows of its lease: until when it surely lives, and whether etcd said it
/// is gone.
#[derive(Debug)]
struct Life {
    base: Instant,
    /// Milliseconds after `base`.
    valid_until: AtomicU64,
    lost: AtomicBool,
}

impl Life {
    fn new(valid_until: Instant) -> Life {
        let life = Life {
            base: Instant::now(),
            valid_until: AtomicU64::new(0),
            lost: AtomicBool::new(false),
        };
        life.extend(valid_until);
        life
    }

    /// The lease surely lives until `until`: a keep-alive sent before it was answered.
    fn extend(&self, until: Instant) {
        let ms = until.saturating_duration_since(self.base).as_millis();
        self.valid_until
            .fetch_max(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::SeqCst);
    }

    fn lose(&self) {
        self.lost.store(true, Ordering::SeqCst);
    }

    fn is_lost(&self) -> bool {
        let now = u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.lost.load(Ordering::SeqCst) || now >= self.valid_until.load(Ordering::SeqCst)
    }
}

/// Renews lease `id` about every ttl/3 on one keep-alive stream, opening a new one (another
/// member) when it breaks. A renewal sent at `t` and answered means the lease lives until at
/// least `t + ttl`; when that passes unrenewed, or etcd says the lease is gone, the lease is
/// lost and the task ends (the lease is left to expire: a holder that stopped acting must not
/// keep others from being elected).
async fn keep_alive(mut client: Client, id: i64, ttl: Duration, life: Arc<Life>) {
    let period = ttl / 3;
    let mut stream: Option<(LeaseKeeper, LeaseKeepAliveStream)> = None;
    loop {
        if life.is_lost() {
            life.lose();
            return;
        }
        let sent = Instant::now();
        let renewed =
            tokio::time::timeout(REQUEST_TIMEOUT, renew(&mut client, id, ttl, &mut stream)).await;
        match renewed {
            Ok(Ok(left)) if left > 0 => {
                life.extend(sent + Duration::from_secs(left.unsigned_abs()));
                tokio::time::sleep_until((sent + period).into()).await;
            }
            Ok(Ok(_)) => return life.lose(),
            Ok(Err(e)) if lease_gone(&e) => return life.lose(),
            Ok(Err(_)) | Err(_) => {
                stream = None;
                tokio::time::sleep(RENEW_RETRY).await;
            }
        }
    }
}

/// One renewal: the ttl etcd answers (0 or less: the lease is gone).
async fn renew(
    client: &mut Client,
    id: i64,
    ttl: Duration,
    stream: &mut Option<(LeaseKeeper, LeaseKeepAliveStream)>,
) -> Result<i64, EtcdError> {
    let Some((keeper, answers)) = stream else {
        // Opening the stream renews once and checks the answer (a lease that is gone is an
        // error); the lease then has its whole ttl again.
        *stream = Some(client.lease_keep_alive(id).await?);
        return Ok(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX));
    };
    keeper.keep_alive().await?;
    match answers.message().await? {
        Some(answer) => Ok(answer.ttl()),
        None => Err(EtcdError::LeaseKeepAliveError(
            "the keep-alive stream ended".into(),
        )),
    }
}

/// etcd no longer has the lease (it expired or was revoked).
fn lease_gone(e: &EtcdError) -> bool {
    match e {
        // The election service passes etcd's error on as `Unknown`, with its text.
        EtcdError::GRpcStatus(s) => {
            s.code() == tonic::Code::NotFound || s.message().contains("requested lease not found")
        }
        EtcdError::LeaseKeepAliveError(m) => m.contains("not found"),
        _ => false,
    }
}

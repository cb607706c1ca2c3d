//! The etcd store against a real three-member etcd cluster on loopback
//! (`slate_testkit::etcd`): the store's contract, the protocol over HTTP with etcd behind it,
//! 200 clients racing through three servers that share the cluster, and members killed while
//! clients lock (a follower, then the leader). Every claim is read back from what the clients
//! saw and from etcd itself.

#![cfg(feature = "etcd")]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use slate_fleetlock::{
    ClientId, GroupName, GroupSpec, Groups, Semaphore, SemaphoreStore, Service, StoreError,
    Transition, Version,
};
use slate_fleetlock_server::{etcd_store, EtcdStore, Server, ServerHandle};
use slate_testkit::etcd::{one_at_a_time as serial, three_members as cluster, EtcdCluster};
use slate_testkit::fleetlock::{check_exclusion, Client, Hold, LOCK, UNLOCK};

/// etcd as any other client sees it, to check what the store wrote.
struct Raw {
    rt: tokio::runtime::Runtime,
    client: etcd_client::Client,
}

impl Raw {
    fn new(endpoints: &[String]) -> Raw {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt
            .block_on(etcd_client::Client::connect(endpoints, None))
            .unwrap();
        Raw { rt, client }
    }

    /// (mod_revision, version, value) of `key`.
    fn get(&self, key: &str) -> Option<(i64, i64, String)> {
        let mut c = self.client.clone();
        let resp = self.rt.block_on(c.get(key, None)).unwrap();
        resp.kvs().first().map(|kv| {
            let value = String::from_utf8(kv.value().to_vec()).unwrap();
            (kv.mod_revision(), kv.version(), value)
        })
    }

    fn put(&self, key: &str, value: &str) {
        let mut c = self.client.clone();
        self.rt.block_on(c.put(key, value, None)).unwrap();
    }

    fn delete(&self, key: &str) {
        let mut c = self.client.clone();
        self.rt.block_on(c.delete(key, None)).unwrap();
    }
}

fn group(name: &str) -> GroupName {
    GroupName::new(name).unwrap()
}

fn locked(s: &Semaphore, id: &str, slots: u64) -> Semaphore {
    match s.lock(&ClientId::new(id).unwrap(), slots).unwrap() {
        Transition::Changed(s) => s,
        Transition::Unchanged => panic!("{id} already held"),
    }
}

#[test]
fn the_store_contract_on_a_real_cluster() {
    let _serial = serial();
    let Some(cluster) = cluster() else { return };
    let store = EtcdStore::connect(&cluster.endpoints()).unwrap();
    let raw = Raw::new(&cluster.endpoints());
    let g = group("workers");
    let key = "com.coreos.airlock/groups/workers/v1/semaphore";
    assert_eq!(etcd_store::key(&g), key);

    assert_eq!(store.load(&g).unwrap(), None);
    assert!(store.groups().unwrap().is_empty());
    let one = locked(&Semaphore::new(2), "n1", 2);
    assert!(
        !store.compare_and_swap(&g, Some(Version(1)), &one).unwrap(),
        "absent is not version 1"
    );
    assert!(store.compare_and_swap(&g, None, &one).unwrap(), "created");
    assert!(
        !store.compare_and_swap(&g, None, &one).unwrap(),
        "no longer absent"
    );
    let (v1, read) = store.load(&g).unwrap().unwrap();
    assert_eq!(read, one);
    let (rev, _, value) = raw.get(key).unwrap();
    assert_eq!(
        v1,
        Version(rev as u64),
        "the version is the key's mod_revision"
    );
    assert_eq!(
        value, r#"{"total_slots":2,"holders":["n1"]}"#,
        "airlock's value"
    );

    let two = locked(&one, "n2", 2);
    assert!(store.compare_and_swap(&g, Some(v1), &two).unwrap());
    assert!(
        !store.compare_and_swap(&g, Some(v1), &one).unwrap(),
        "stale"
    );
    let (v2, read) = store.load(&g).unwrap().unwrap();
    assert_eq!(read, two);
    assert!(v2 > v1);

    // Deleted and created anew (an admin's `etcdctl del`, then a server's first lock): the
    // key's own `version` starts at 1 again, its mod_revision does not repeat, so a server
    // still holding the read from before cannot swap over a value it never saw.
    raw.delete(key);
    assert!(store.compare_and_swap(&g, None, &one).unwrap());
    let (v3, _) = store.load(&g).unwrap().unwrap();
    assert_eq!(
        raw.get(key).unwrap().1,
        1,
        "etcd's per-key version restarted"
    );
    assert!(
        !store.compare_and_swap(&g, Some(v1), &two).unwrap(),
        "stale across delete"
    );
    assert!(store.compare_and_swap(&g, Some(v3), &two).unwrap());

    // Groups: one key per group; other keys under airlock's prefix are not groups.
    assert!(store
        .compare_and_swap(&group("default"), None, &Semaphore::new(1))
        .unwrap());
    raw.put("com.coreos.airlock/groups/x/v2/semaphore", "{}");
    raw.put("com.coreos.airlock/groups/bad name/v1/semaphore", "{}");
    assert_eq!(store.groups().unwrap(), [group("default"), g.clone()]);

    // airlock's own writing (other field order, spaces) is read; a bad value is refused,
    // never overwritten.
    raw.put(
        "com.coreos.airlock/groups/airlock/v1/semaphore",
        r#"{"holders": ["b", "c"], "total_slots": 3}"#,
    );
    let (_, s) = store.load(&group("airlock")).unwrap().unwrap();
    assert_eq!(
        (s.total_slots(), s.holders()),
        (3, &["b".to_owned(), "c".to_owned()][..])
    );
    let bad = r#"{"total_slots":1,"holders":["a","b"]}"#;
    raw.put(key, bad);
    let err = store.load(&g).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(
        err.to_string().contains("2 holders but only 1 slots"),
        "{err}"
    );
    let service = Service::new(Groups::new(["workers=2".parse().unwrap()]).unwrap(), store);
    let answer = service.serve(
        slate_fleetlock::Operation::Lock,
        Some(b"true"),
        br#"{"client_params":{"id":"n3","group":"workers"}}"#,
    );
    assert_eq!(answer.status, 500);
    assert!(String::from_utf8_lossy(&answer.body).contains("failed_sem_init"));
    assert_eq!(raw.get(key).unwrap().2, bad);
}

/// A server in this process over its own store (its own etcd client).
fn server(endpoints: &[String], groups: &[&str], log: Arc<Mutex<Vec<String>>>) -> ServerHandle {
    let specs = groups.iter().map(|g| g.parse::<GroupSpec>().unwrap());
    let store = EtcdStore::connect(endpoints).unwrap();
    let service = Arc::new(Service::new(Groups::new(specs).unwrap(), store));
    Server::bind("127.0.0.1:0".parse().unwrap())
        .unwrap()
        .spawn(
            service,
            Arc::new(move |line: &str| log.lock().unwrap().push(line.to_owned())),
        )
        .unwrap()
}

#[test]
fn the_protocol_over_http_with_etcd_behind_it() {
    let _serial = serial();
    let Some(cluster) = cluster() else { return };
    let log = Arc::new(Mutex::new(Vec::new()));
    let handle = server(&cluster.endpoints(), &["default=1"], log.clone());
    let raw = Raw::new(&cluster.endpoints());
    let key = "com.coreos.airlock/groups/default/v1/semaphore";
    let mut c = Client::new(handle.local_addr());
    let mut post = |path, id| c.post(path, id, "default").unwrap();

    assert_eq!(post(LOCK, "a"), (200, String::new()));
    let (rev, _, value) = raw.get(key).unwrap();
    assert_eq!(value, r#"{"total_slots":1,"holders":["a"]}"#);
    assert_eq!(post(LOCK, "a"), (200, String::new()), "recursive lock");
    assert_eq!(
        raw.get(key).unwrap().0,
        rev,
        "a recursive lock writes nothing"
    );
    assert_eq!(
        post(LOCK, "b"),
        (
            500,
            r#"{"kind":"failed_lock","value":"all 1 semaphore slots currently locked"}"#.into()
        )
    );
    assert_eq!(
        post(UNLOCK, "b"),
        (200, String::new()),
        "unlock by a non-holder"
    );
    assert_eq!(raw.get(key).unwrap(), (rev, 1, value), "…changes nothing");
    assert_eq!(post(UNLOCK, "a"), (200, String::new()));
    assert_eq!(raw.get(key).unwrap().2, r#"{"total_slots":1,"holders":[]}"#);
    assert_eq!(post(UNLOCK, "a"), (200, String::new()), "unlock again");
    assert_eq!(post(LOCK, "b"), (200, String::new()));
    assert_eq!(
        raw.get(key).unwrap().2,
        r#"{"total_slots":1,"holders":["b"]}"#
    );
    handle.shutdown().unwrap();
    let log = log.lock().unwrap().join("\n");
    assert!(
        log.contains("lock default/b: all 1 semaphore slots currently locked -> 500"),
        "{log}"
    );
}

#[derive(Debug, Default)]
struct Tally {
    events: Vec<Hold>,
    /// Lock refusals by body (kind and value).
    refusals: std::collections::BTreeMap<String, usize>,
    connection_errors: usize,
}

/// `clients` threads race for the 2 slots of group `race`, client `n` speaking to
/// `addrs[n % len]`, each holding for `hold`. Once `fault_after` clients have acquired,
/// `fault` runs on this thread; the answer is the tally and the index of the first event after
/// the fault. Each observed holding interval (200 received → unlock sent) lies inside the real
/// one, so more than 2 overlapping observed intervals would prove a third holder admitted.
fn race(
    addrs: &[SocketAddr],
    clients: usize,
    hold: Duration,
    fault_after: usize,
    fault: impl FnOnce(),
) -> (Tally, usize) {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let deadline = Instant::now() + Duration::from_secs(90);
    let threads: Vec<_> = (0..clients)
        .map(|n| {
            let tally = tally.clone();
            let addr = addrs[n % addrs.len()];
            std::thread::spawn(move || {
                let id = format!("node-{n:03}");
                let mut c = Client::new(addr);
                let mut tries = 0u64;
                loop {
                    match c.post(LOCK, &id, "race") {
                        Ok((200, _)) => break,
                        Ok((_, body)) => {
                            *tally.lock().unwrap().refusals.entry(body).or_default() += 1
                        }
                        Err(_) => tally.lock().unwrap().connection_errors += 1,
                    }
                    assert!(Instant::now() < deadline, "{id} never got a slot");
                    tries += 1;
                    // Spread the retries (as zincati's backoff does), so that the unlocks of
                    // the holders are not stuck behind a wall of refused locks.
                    std::thread::sleep(Duration::from_millis(
                        50 + (n as u64 * 7 + tries * 13) % 100,
                    ));
                }
                tally.lock().unwrap().events.push(Hold::Acquired(n));
                std::thread::sleep(hold);
                tally.lock().unwrap().events.push(Hold::Releasing(n));
                loop {
                    match c.post(UNLOCK, &id, "race") {
                        Ok((200, _)) => break,
                        Ok((_, body)) => {
                            *tally.lock().unwrap().refusals.entry(body).or_default() += 1
                        }
                        Err(_) => tally.lock().unwrap().connection_errors += 1,
                    }
                    assert!(Instant::now() < deadline, "{id} could not unlock");
                    std::thread::sleep(Duration::from_millis(10));
                }
            })
        })
        .collect();
    let acquired = || {
        let t = tally.lock().unwrap();
        t.events
            .iter()
            .filter(|e| matches!(e, Hold::Acquired(_)))
            .count()
    };
    while acquired() < fault_after && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    fault();
    let fault_at = tally.lock().unwrap().events.len();
    for t in threads {
        t.join().unwrap();
    }
    let tally = Arc::into_inner(tally).unwrap().into_inner().unwrap();
    let _ = check_exclusion(&tally.events, clients, 2);
    (tally, fault_at)
}

fn final_semaphore(raw: &Raw) -> String {
    raw.get("com.coreos.airlock/groups/race/v1/semaphore")
        .unwrap()
        .2
}

#[test]
fn two_hundred_clients_through_three_servers_share_two_slots() {
    let _serial = serial();
    let Some(cluster) = cluster() else { return };
    let log = Arc::new(Mutex::new(Vec::new()));
    let servers: Vec<ServerHandle> = (0..3)
        .map(|_| server(&cluster.endpoints(), &["race=2"], log.clone()))
        .collect();
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.local_addr()).collect();
    let start = Instant::now();
    let (tally, _) = race(&addrs, 200, Duration::from_millis(20), 0, || {});
    let took = start.elapsed();
    assert_eq!(
        final_semaphore(&Raw::new(&cluster.endpoints())),
        r#"{"total_slots":2,"holders":[]}"#
    );
    // Every id was admitted exactly once, by whichever server it spoke to (a swap repeated
    // after a broken connection could make one "already held"; a healthy run has none).
    let log = log.lock().unwrap();
    assert_eq!(log.iter().filter(|l| l.contains(": locked (")).count(), 200);
    assert_eq!(
        log.iter().filter(|l| l.contains(": unlocked (")).count(),
        200
    );
    // The only refusals: the group was full, or a request lost its compare-and-swap to the
    // other servers 8 times in a row (airlock's "conflict"; the client retries).
    for (body, n) in &tally.refusals {
        assert!(body == FULL || body == CONFLICT, "{n} × {body}");
    }
    assert_eq!(tally.connection_errors, 0);
    let count = |body| tally.refusals.get(body).copied().unwrap_or(0);
    eprintln!(
        "200 clients, 3 servers, 2 slots: {took:.1?}; refused: {} full, {} conflict",
        count(FULL),
        count(CONFLICT)
    );
    for s in servers {
        s.shutdown().unwrap();
    }
}

const FULL: &str = r#"{"kind":"failed_lock","value":"all 2 semaphore slots currently locked"}"#;
const CONFLICT: &str =
    r#"{"kind":"failed_lock","value":"conflict on semaphore detected, aborting"}"#;

/// Clients race through two servers while `kill` picks a member to SIGKILL after 10 of them
/// got their slot; every client is still served. The answer: the refusals other than "full"
/// and "conflict" (what the crash cost the clients).
fn race_through_a_crash(
    kill: impl FnOnce(&EtcdCluster) -> usize,
) -> Option<std::collections::BTreeMap<String, usize>> {
    let mut cluster = cluster()?;
    let log = Arc::new(Mutex::new(Vec::new()));
    let servers: Vec<ServerHandle> = (0..2)
        .map(|_| server(&cluster.endpoints(), &["race=2"], log.clone()))
        .collect();
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.local_addr()).collect();
    let leader_before = cluster.leader().unwrap();
    let victim = kill(&cluster);
    let (tally, fault_at) = race(&addrs, 60, Duration::from_millis(20), 10, || {
        cluster.kill(victim)
    });
    let after: Vec<usize> = tally.events[fault_at..]
        .iter()
        .filter_map(|e| match e {
            Hold::Acquired(n) => Some(*n),
            Hold::Releasing(_) => None,
        })
        .collect();
    assert!(after.len() >= 40, "locks went on after the kill: {after:?}");
    let leader_after = cluster.leader().unwrap();
    assert_ne!(leader_after, victim, "a running member leads");
    if victim == leader_before {
        assert_ne!(leader_after, leader_before, "a new leader was elected");
    }
    // The survivors hold the whole story…
    let survivors: Vec<String> = (0..3)
        .filter(|i| *i != victim)
        .map(|i| cluster.endpoint(i))
        .collect();
    let empty = r#"{"total_slots":2,"holders":[]}"#;
    assert_eq!(final_semaphore(&Raw::new(&survivors)), empty);
    // …and the killed member catches up when it comes back.
    cluster.restart(victim).unwrap();
    assert_eq!(
        final_semaphore(&Raw::new(&[cluster.endpoint(victim)])),
        empty
    );
    eprintln!(
        "member {victim} killed (leader before: {leader_before}, after: {leader_after}) after \
         {fault_at} events; refused: {:?}; connection errors: {}",
        tally.refusals, tally.connection_errors
    );
    for s in servers {
        s.shutdown().unwrap();
    }
    let mut refusals = tally.refusals;
    refusals.retain(|body, _| body != FULL && body != CONFLICT);
    Some(refusals)
}

#[test]
fn a_follower_killed_mid_run_changes_nothing_for_clients() {
    let _serial = serial();
    let Some(errors) = race_through_a_crash(|cluster| (cluster.leader().unwrap() + 1) % 3) else {
        return;
    };
    // The store repeated whatever went to the dead member on another: no client saw it.
    assert!(errors.is_empty(), "{errors:#?}");
}

#[test]
fn the_leader_killed_mid_run_is_replaced_and_clients_are_served() {
    let _serial = serial();
    let Some(errors) = race_through_a_crash(|cluster| cluster.leader().unwrap()) else {
        return;
    };
    // An election within the store's retry budget is invisible too; a slower one may cost
    // some clients a 500 (they retry), but never a wrong answer.
    for body in errors.keys() {
        assert!(body.contains("failed_"), "{body}");
    }
}

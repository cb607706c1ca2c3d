//! The supervisor with real processes: order and readiness, restarts with backoff, output in
//! the journal, stops within the grace period (and past it, the kill), and — in a cgroup of
//! this host's unified hierarchy — nothing left behind.

use std::sync::Arc;
use std::time::{Duration, Instant};

use slate_services::{ReadyCheck, RestartPolicy, ServiceSpec};

use super::*;

fn journal() -> Arc<Journal> {
    Arc::new(Journal::new(slate_host::KmsgLogger::stderr("test")))
}

fn sh(name: &str, script: &str) -> ServiceSpec {
    ServiceSpec::new(name, &["/bin/sh", "-c", script])
}

fn lines(journal: &Journal) -> Vec<String> {
    journal.read_from(0, None).0
}

/// Waits up to 20 s for `what` of the supervisor to hold.
fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn state(sup: &Supervisor, name: &str) -> NodeServiceStatus {
    sup.list().into_iter().find(|s| s.name == name).unwrap()
}

#[test]
fn a_service_waits_for_what_it_depends_on_to_be_ready() {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("db-ready");
    let mut db = sh(
        "db",
        &format!("sleep 0.3; touch {}; exec sleep 300", flag.display()),
    );
    db.ready = Some(ReadyCheck::File(flag.clone()));
    let mut web = sh("web", "echo web up; exec sleep 300");
    web.depends_on = vec!["db".into()];
    let journal = journal();
    let order = merged(&[db, web], &[], &has_program).unwrap();
    let sup = Supervisor::start(journal.clone(), order, None);
    eventually("web runs", || state(&sup, "web").state == "running");
    assert!(flag.exists(), "web started before db was ready");
    let log = lines(&journal);
    let pos = |needle: &str| log.iter().position(|l| l.contains(needle)).unwrap();
    assert!(
        pos("service db: ready (file") < pos("service web: started"),
        "{log:#?}"
    );
    eventually("web's output", || {
        lines(&journal).contains(&"web: web up".to_owned())
    });
    sup.stop_all("the test ends");
    assert!(
        sup.list().iter().all(|s| s.state == "stopped"),
        "{:?}",
        sup.list()
    );
}

#[test]
fn a_crashing_service_is_restarted_with_growing_delays() {
    let mut crash = sh("crash", "echo crashing; exit 3");
    crash.restart_delay_ms = 50;
    crash.restart_delay_max_ms = 400;
    let journal = journal();
    let sup = Supervisor::start(journal.clone(), vec![crash], None);
    eventually("three restarts", || state(&sup, "crash").restarts >= 3);
    let status = state(&sup, "crash");
    assert_eq!(status.last_exit.as_deref(), Some("exit code 3"));
    let delays: Vec<String> = lines(&journal)
        .into_iter()
        .filter_map(|l| l.split(" in ").nth(1).map(str::to_owned))
        .collect();
    assert_eq!(delays[..3], ["50 ms", "100 ms", "200 ms"], "{delays:?}");
    sup.stop_all("the test ends");
    assert_eq!(state(&sup, "crash").state, "stopped");
    // A service its policy does not restart ends as exited.
    let mut once = sh("once", "exit 0");
    once.restart = RestartPolicy::OnFailure;
    let sup = Supervisor::start(journal.clone(), vec![once], None);
    eventually("exited", || state(&sup, "once").state == "exited");
    assert_eq!(state(&sup, "once").restarts, 0);
}

#[test]
fn a_stop_sends_the_signal_then_kills_past_the_grace_period() {
    let polite = sh("polite", "trap 'exit 0' TERM; while :; do sleep 0.05; done");
    let mut stubborn = sh("stubborn", "trap '' TERM; while :; do sleep 0.05; done");
    stubborn.stop_grace_secs = 1;
    let journal = journal();
    let sup = Supervisor::start(journal.clone(), vec![polite, stubborn], None);
    eventually("both run", || {
        sup.list().iter().all(|s| s.state == "running")
    });
    let started = Instant::now();
    let stopped = sup.control("polite", ServiceAction::Stop).unwrap();
    assert_eq!(stopped.state, "stopped");
    assert_eq!(stopped.last_exit.as_deref(), Some("exit code 0"));
    assert!(started.elapsed() < Duration::from_secs(5));
    let started = Instant::now();
    let killed = sup.control("stubborn", ServiceAction::Stop).unwrap();
    assert_eq!(killed.state, "stopped");
    assert_eq!(killed.last_exit.as_deref(), Some("signal 9"));
    assert!(started.elapsed() >= Duration::from_secs(1));
    assert!(lines(&journal)
        .iter()
        .any(|l| l == "service stubborn: still running 1 s after signal 15; killed"));
    // Started again, it runs again; an unknown name is refused.
    let again = sup.control("polite", ServiceAction::Start).unwrap();
    assert_ne!(again.state, "stopped");
    eventually("polite runs again", || {
        state(&sup, "polite").state == "running"
    });
    assert!(sup.control("nope", ServiceAction::Stop).is_err());
    sup.stop_all("the test ends");
}

#[test]
fn in_a_cgroup_a_stopped_service_leaves_no_process_behind() {
    if !slate_testkit::require_root() {
        return;
    }
    let mount = slate_host::cgroup2_mount_point();
    if !slate_testkit::require(mount.is_some(), "a cgroup2 mount", "mount cgroup2") {
        return;
    }
    let parent = mount
        .unwrap()
        .join(format!("slate-test-supervisor-{}", std::process::id()));
    let parent = Cgroup::create(&parent).unwrap();
    // The daemon leaves the service's session and ignores TERM: only the cgroup finds it.
    let forks = sh(
        "forks",
        "setsid sh -c 'trap \"\" TERM; while :; do sleep 0.05; done' & exec sleep 300",
    );
    let journal = journal();
    let sup = Supervisor::start(journal.clone(), vec![forks], Some(parent.clone()));
    let cgroup = Cgroup::create(&parent.path().join("forks")).unwrap();
    eventually("two processes in its cgroup", || {
        cgroup.pids().unwrap_or_default().len() >= 2
    });
    sup.stop_all("the test ends");
    assert_eq!(state(&sup, "forks").state, "stopped");
    assert_eq!(cgroup.pids().unwrap(), Vec::<i32>::new());
    cgroup.remove().unwrap();
    parent.remove().unwrap();
}

#[test]
fn a_live_apply_restarts_only_what_changed_and_stops_what_went() {
    if !slate_testkit::require_root() {
        return;
    }
    let mount = slate_host::cgroup2_mount_point();
    if !slate_testkit::require(mount.is_some(), "a cgroup2 mount", "mount cgroup2") {
        return;
    }
    let parent = mount
        .unwrap()
        .join(format!("slate-test-live-{}", std::process::id()));
    let parent = Cgroup::create(&parent).unwrap();
    let keep = sh("keep", "exec sleep 300");
    let change = sh("change", "exec sleep 301");
    let remove = sh("remove", "exec sleep 302");
    let journal = journal();
    let sup = Supervisor::start(
        journal.clone(),
        vec![keep.clone(), change, remove],
        Some(parent.clone()),
    );
    eventually("all three run", || {
        sup.list().iter().all(|s| s.state == "running")
    });
    let pid = |name: &str| state(&sup, name).pid.unwrap();
    let (kept_pid, changed_pid, removed_pid) = (pid("keep"), pid("change"), pid("remove"));

    let wanted = merged(
        &[
            keep,
            sh("change", "exec sleep 303"),
            sh("add", "exec sleep 304"),
        ],
        &[],
        &has_program,
    )
    .unwrap();
    let line = sup.replace(wanted);
    assert_eq!(
        line,
        "services applied live: added add; changed change; removed remove"
    );
    let mut names: Vec<String> = sup.list().into_iter().map(|s| s.name).collect();
    names.sort();
    assert_eq!(names, ["add", "change", "keep"]);
    eventually("the new set runs", || {
        sup.list().iter().all(|s| s.state == "running")
    });
    assert_eq!(pid("keep"), kept_pid, "an unchanged service was restarted");
    assert_ne!(pid("change"), changed_pid);
    assert!(
        !Path::new(&format!("/proc/{removed_pid}")).exists(),
        "the removed service's process lives on"
    );
    // Its cgroup went with it (a changed service's is made afresh, with only its own limits:
    // this host's cgroup2 has no controllers to show them, the VM's has).
    assert!(!parent.path().join("remove").exists());
    let cgroup = Cgroup::create(&parent.path().join("change")).unwrap();
    assert_eq!(cgroup.pids().unwrap(), [pid("change") as i32]);
    let log = lines(&journal);
    assert!(
        log.contains(&"service remove: stopping (the machine configuration removed it)".to_owned())
            && log.contains(
                &"service change: stopping (the machine configuration changed it)".to_owned()
            ),
        "{log:#?}"
    );
    // The same set again changes nothing.
    let same = merged(
        &[
            sh("keep", "exec sleep 300"),
            sh("change", "exec sleep 303"),
            sh("add", "exec sleep 304"),
        ],
        &[],
        &has_program,
    )
    .unwrap();
    assert_eq!(sup.replace(same), "services unchanged");
    assert_eq!(pid("keep"), kept_pid);
    sup.stop_all("the test ends");
    for name in ["add", "change", "keep"] {
        Cgroup::create(&parent.path().join(name))
            .unwrap()
            .remove()
            .unwrap();
    }
    parent.remove().unwrap();
}

#[test]
fn a_drain_stops_independent_services_together_and_a_dependency_after_its_dependents() {
    let stubborn = |name: &str| {
        let mut s = sh(name, "trap '' TERM; while :; do sleep 0.05; done");
        s.stop_grace_secs = 1;
        s
    };
    let (a, b) = (stubborn("a"), stubborn("b"));
    let mut base = sh("base", "trap 'exit 0' TERM; while :; do sleep 0.05; done");
    base.depends_on = vec![];
    let (mut a, mut b) = (a, b);
    a.depends_on = vec!["base".into()];
    b.depends_on = vec!["base".into()];
    let journal = journal();
    let order = merged(&[base, a, b], &[], &has_program).unwrap();
    let sup = Supervisor::start(journal.clone(), order, None);
    eventually("all run", || {
        sup.list().iter().all(|s| s.state == "running")
    });
    let started = Instant::now();
    sup.stop_all("the test drains");
    let took = started.elapsed();
    // Two stubborn services of 1 s grace each, stopped together: about 1 s, not 2.
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_millis(1900),
        "{took:?}"
    );
    let log = lines(&journal);
    let pos = |needle: &str| log.iter().position(|l| l.contains(needle)).unwrap();
    assert!(
        pos("service a: stopped (") < pos("service base: stopping")
            && pos("service b: stopped (") < pos("service base: stopping"),
        "base stops after both that depend on it: {log:#?}"
    );
}

//! A supervised process in a cgroup of its own, on this host's unified hierarchy: its exit is
//! seen by its supervisor even with a reaper sweeping, and a kill of the cgroup leaves nothing
//! behind — neither the children it waits for nor a daemon that left its session.

use std::io::{BufRead, BufReader};
use std::process::Command;
use std::time::Duration;

use slate_host::{cgroup2_mount_point, reap_zombies, spawn_supervised, Cgroup, ProcessExit};

/// A fresh cgroup for one test under the unified hierarchy, or `None` (skipped; a failure
/// under CI) without root or cgroup2.
fn test_cgroup(name: &str) -> Option<Cgroup> {
    if !slate_testkit::require_root() {
        return None;
    }
    let mount = cgroup2_mount_point();
    if !slate_testkit::require(
        mount.is_some(),
        "a cgroup2 mount",
        "mount -t cgroup2 none /sys/fs/cgroup/unified",
    ) {
        return None;
    }
    let path = mount
        .unwrap()
        .join(format!("slate-test-{name}-{}", std::process::id()));
    Some(Cgroup::create(&path).expect("creating a test cgroup"))
}

fn first_line(child: &mut slate_host::SupervisedChild) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.trim().to_owned()
}

#[test]
fn killing_the_cgroup_leaves_no_process_not_even_a_daemon() {
    let Some(cgroup) = test_cgroup("kill") else {
        return;
    };
    // Two children it waits for, and a daemon in a session of its own that outlives the shell.
    let script = "sleep 300 & sleep 300 & setsid sh -c 'sleep 300' & echo started; wait";
    let mut child = spawn_supervised(Command::new("sh").args(["-c", script]), Some(&cgroup))
        .expect("spawning in the cgroup");
    assert_eq!(first_line(&mut child), "started");
    let pids = cgroup.pids().unwrap();
    assert!(pids.contains(&child.pid()), "{pids:?}");
    assert!(
        pids.len() >= 4,
        "the shell, two sleeps and the daemon: {pids:?}"
    );
    assert_eq!(child.try_wait(), None);

    assert!(cgroup.kill_all(Duration::from_secs(10)).unwrap());
    assert_eq!(cgroup.pids().unwrap(), Vec::<i32>::new());
    assert_eq!(
        child.wait_timeout(Duration::from_secs(10)),
        Some(ProcessExit::Signal(9))
    );
    reap_zombies();
    cgroup.remove().unwrap();
}

#[test]
fn the_exit_status_survives_the_reaper() {
    let Some(cgroup) = test_cgroup("reaper") else {
        return;
    };
    let mut child =
        spawn_supervised(Command::new("sh").args(["-c", "exit 7"]), Some(&cgroup)).unwrap();
    // The reaper sweeps before the supervisor asks: the status is kept for it.
    let mut reaped = 0;
    for _ in 0..500 {
        reaped += reap_zombies();
        if reaped > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(reaped > 0, "the shell never exited");
    assert_eq!(
        child.wait_timeout(Duration::from_secs(5)),
        Some(ProcessExit::Code(7))
    );
    // The cgroup's memory accounting answers when the controller is on, and nothing else
    // breaks when it is not (a v1 host keeps memory to itself).
    let _ = cgroup.memory_current();
    cgroup.remove().unwrap();
}

/// machined blocks the signals it reads through a signalfd in every thread, and a child
/// inherits the mask: the stop signal must reach the service all the same.
#[test]
fn the_stop_signal_reaches_a_service_started_by_a_thread_that_blocks_it() {
    use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
    let Some(cgroup) = test_cgroup("mask") else {
        return;
    };
    let inside = cgroup.clone();
    let mut child = std::thread::spawn(move || {
        let mut blocked = SigSet::empty();
        for signal in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
            blocked.add(signal);
        }
        pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&blocked), None).unwrap();
        spawn_supervised(Command::new("sleep").arg("300"), Some(&inside)).unwrap()
    })
    .join()
    .unwrap();
    cgroup.signal(15).unwrap();
    assert_eq!(
        child.wait_timeout(Duration::from_secs(10)),
        Some(ProcessExit::Signal(15))
    );
    cgroup.remove().unwrap();
}

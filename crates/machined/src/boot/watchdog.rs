//! The hardware watchdog, from machined's side.
//!
//! Armed at startup, before the boot sequences, when the image configures one
//! (`[watchdog]` in `/etc/slate/node.toml`), and **not fed until the boot is committed** (stage
//! Running, health checks passed, entry blessed). A boot that hangs anywhere before its commit
//! is therefore reset by the hardware, and systemd-boot's boot counting takes it from there.
//! After the commit a feeder thread keeps it alive for as long as machined's main loop holds
//! the [`Feeder`]; it is never disarmed.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use slate_host::Watchdog;
use slate_profile::NodeConfig;

use crate::base::node::Node;

/// Arm the configured watchdog. A node whose watchdog cannot be armed still boots (it would
/// otherwise fail on every version alike and never settle): the error is logged.
pub fn arm(node: &Node, config: &NodeConfig) -> Option<Arc<Watchdog>> {
    let wanted = config.enabled_watchdog()?;
    match Watchdog::arm(&wanted.device, wanted.timeout_secs) {
        Ok(dog) => {
            node.journal.counters.watchdog(dog.timeout());
            node.journal.info(format_args!(
                "watchdog armed: {}, {}s (fed from the commit on)",
                dog.device().display(),
                dog.timeout().as_secs()
            ));
            Some(Arc::new(dog))
        }
        Err(err) => {
            node.journal.error(format_args!(
                "watchdog not armed: {:#}",
                anyhow::Error::from(err)
            ));
            None
        }
    }
}

/// Feeds the watchdog from a thread of its own until dropped.
#[derive(Debug)]
pub struct Feeder {
    stop: Arc<(Mutex<bool>, Condvar)>,
}

impl Drop for Feeder {
    fn drop(&mut self) {
        let (stopped, wake) = &*self.stop;
        *stopped.lock().unwrap_or_else(|p| p.into_inner()) = true;
        wake.notify_all();
    }
}

/// How often to feed a watchdog with `timeout`: three times per period.
pub fn interval(timeout: Duration) -> Duration {
    (timeout / 3).max(Duration::from_millis(500))
}

/// Start feeding (the boot is committed).
pub fn feed(node: &Node, dog: &Arc<Watchdog>) -> Feeder {
    let every = interval(dog.timeout());
    node.journal.info(format_args!(
        "watchdog: committed; fed every {}s from now on",
        every.as_secs_f64()
    ));
    let stop = Arc::new((Mutex::new(false), Condvar::new()));
    let (dog, journal, flag) = (dog.clone(), node.journal.clone(), stop.clone());
    let spawned = std::thread::Builder::new()
        .name("watchdog".into())
        .spawn(move || {
            let mut reported = false;
            let (stopped, wake) = &*flag;
            let mut done = stopped.lock().unwrap_or_else(|p| p.into_inner());
            while !*done {
                match dog.keepalive() {
                    Ok(()) => reported = false,
                    Err(err) if !reported => {
                        journal.error(format_args!("watchdog keepalive failed: {err}"));
                        reported = true;
                    }
                    Err(_) => {}
                }
                done = wake
                    .wait_timeout_while(done, every, |d| !*d)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        });
    if let Err(err) = spawned {
        node.journal.error(format_args!(
            "watchdog: cannot start the feeder thread ({err}); the hardware will reset the node"
        ));
    }
    Feeder { stop }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fed_three_times_per_period() {
        assert_eq!(interval(Duration::from_secs(45)), Duration::from_secs(15));
        assert_eq!(interval(Duration::from_secs(1)), Duration::from_millis(500));
    }
}

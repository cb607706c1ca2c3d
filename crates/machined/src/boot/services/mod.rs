//! The node's services (docs/node.md, "Services"): the image's `[[services]]` and the machine
//! configuration's, started by the Boot sequence in dependency order, each supervised by a
//! thread of its own ([`runner`]) in a cgroup of its own under `/sys/fs/cgroup/slate.services`,
//! restarted by its policy with backoff, its output in the journal, and stopped — stop signal,
//! grace period, then a kill of the whole cgroup — when the node drains before a reboot, an
//! upgrade, a reset or a shutdown.

mod live;
mod ready;
mod runner;

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use slate_api::{NodeServiceStatus, ServiceAction};
use slate_host::Cgroup;
use slate_services::ServiceSpec;

use slate_sequencer::{TaskContext, TaskError};

use crate::base::journal::Journal;
use crate::base::node::Node;
use crate::base::services::Workload;
use crate::base::task::failed;

/// The cgroup every service's own cgroup lives in.
const SERVICES_CGROUP: &str = "slate.services";
/// The controllers the services' limits need.
const CONTROLLERS: &[&str] = &["memory", "cpu", "pids"];
/// How long a control request waits beyond a service's grace period for the stop to show.
const CONTROL_SLACK: Duration = Duration::from_secs(10);

/// Where a service is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Running,
    Backoff,
    Stopping,
    Stopped,
    Exited,
    Failed,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Waiting => "waiting",
            State::Running => "running",
            State::Backoff => "backoff",
            State::Stopping => "stopping",
            State::Stopped => "stopped",
            State::Exited => "exited",
            State::Failed => "failed",
        }
    }

    /// Not running and not about to: what a stop waits for.
    fn is_down(self) -> bool {
        matches!(self, State::Stopped | State::Exited | State::Failed)
    }
}

#[derive(Debug)]
struct Status {
    state: State,
    since: SystemTime,
    pid: Option<u32>,
    restarts: u32,
    ready: bool,
    last_exit: Option<String>,
    restart_at: Option<Instant>,
    /// The service should run (cleared by a stop, or when its policy lets it end).
    wanted: bool,
    /// A stop is asked of the run in progress.
    stop_now: bool,
    /// Gone from the node's set (a live apply removed or replaced it): its thread ends once
    /// the service is down.
    retired: bool,
}

/// One service: its declaration and where it is.
#[derive(Debug)]
struct Service {
    spec: ServiceSpec,
    status: Mutex<Status>,
    changed: Condvar,
    cgroup: Option<Cgroup>,
}

impl Service {
    fn status(&self) -> MutexGuard<'_, Status> {
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_state(&self, status: &mut Status, state: State) {
        if status.state != state {
            status.state = state;
            status.since = SystemTime::now();
        }
        self.changed.notify_all();
    }

    /// Waits on the service's condition for up to `wait`.
    fn wait<'a>(&self, guard: MutexGuard<'a, Status>, wait: Duration) -> MutexGuard<'a, Status> {
        self.changed
            .wait_timeout(guard, wait)
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0)
    }

    fn view(&self) -> NodeServiceStatus {
        let status = self.status();
        NodeServiceStatus {
            name: self.spec.name.clone(),
            state: status.state.name().to_owned(),
            pid: status.pid,
            since: status
                .since
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            restarts: status.restarts,
            ready: status.ready,
            last_exit: status.last_exit.clone(),
            memory_bytes: self.cgroup.as_ref().and_then(Cgroup::memory_current),
            restart_in_ms: status
                .restart_at
                .filter(|_| status.state == State::Backoff)
                .map(|at| at.saturating_duration_since(Instant::now()).as_millis() as u64),
        }
    }
}

/// Every service of the node, in start order.
#[derive(Debug)]
pub struct Supervisor {
    journal: Arc<Journal>,
    services: RwLock<Vec<Arc<Service>>>,
    /// Where each service's cgroup is made (none: no cgroup2, no limits).
    parent: Option<Cgroup>,
    /// Itself, for the threads of services a live apply adds.
    me: Weak<Supervisor>,
    /// When they started, and whether all have been ready since ([`ready::note_ready`]).
    all_ready: ready::AllReady,
}

/// The services to run: the image's, with the machine configuration's added (one of the same
/// name replaces the image's), checked as a set against this root's programs; in start order.
pub fn merged(
    image: &[ServiceSpec],
    machine: &[ServiceSpec],
    has_program: &dyn Fn(&Path) -> bool,
) -> Result<Vec<ServiceSpec>, slate_services::ServiceError> {
    let mut all: Vec<ServiceSpec> = image
        .iter()
        .filter(|s| !machine.iter().any(|m| m.name == s.name))
        .cloned()
        .collect();
    all.extend(machine.iter().cloned());
    let order = slate_services::start_order(&all, has_program)?;
    Ok(order.into_iter().map(|i| all[i].clone()).collect())
}

/// Whether this root holds an executable file at `path` (symbolic links followed).
pub fn has_program(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The services' parent cgroup under `root` with the controllers their limits need, or why
/// there is none (the services then run without limits, stopped by process group).
pub fn services_cgroup(root: &Path) -> Result<Cgroup, String> {
    let top = Cgroup::create(root).map_err(|e| e.to_string())?;
    top.delegate(CONTROLLERS).map_err(|e| e.to_string())?;
    let services = top.child(SERVICES_CGROUP).map_err(|e| e.to_string())?;
    services.delegate(CONTROLLERS).map_err(|e| e.to_string())?;
    Ok(services)
}

impl Supervisor {
    /// Starts `services` (in start order), each in a cgroup under `parent` when there is one.
    pub fn start(
        journal: Arc<Journal>,
        services: Vec<ServiceSpec>,
        parent: Option<Cgroup>,
    ) -> Arc<Supervisor> {
        let supervisor = Arc::new_cyclic(|me| Supervisor {
            journal,
            services: RwLock::new(Vec::new()),
            parent,
            me: me.clone(),
            all_ready: ready::AllReady::new(),
        });
        let services: Vec<Arc<Service>> = services
            .into_iter()
            .map(|s| supervisor.service(s))
            .collect();
        *supervisor.services_mut() = services.clone();
        for service in &services {
            supervisor.run(service);
        }
        supervisor
    }

    /// A service for `spec`, not started yet, with its cgroup made.
    fn service(&self, spec: ServiceSpec) -> Arc<Service> {
        let cgroup = self
            .parent
            .as_ref()
            .and_then(|p| match runner::service_cgroup(p, &spec) {
                Ok(cgroup) => Some(cgroup),
                Err(e) => {
                    self.journal.error(format_args!(
                        "service {}: no cgroup of its own ({e}); it runs without limits",
                        spec.name
                    ));
                    None
                }
            });
        Arc::new(Service {
            spec,
            status: Mutex::new(Status {
                state: State::Waiting,
                since: SystemTime::now(),
                pid: None,
                restarts: 0,
                ready: false,
                last_exit: None,
                restart_at: None,
                wanted: true,
                stop_now: false,
                retired: false,
            }),
            changed: Condvar::new(),
            cgroup,
        })
    }

    /// The thread that runs `service` for as long as it is in the set.
    fn run(&self, service: &Arc<Service>) {
        let Some(sup) = self.me.upgrade() else {
            return;
        };
        let me = service.clone();
        std::thread::Builder::new()
            .name(format!("svc-{}", service.spec.name))
            .spawn(move || runner::run(&sup, &me))
            .expect("spawning a service's thread");
    }

    fn services(&self) -> Vec<Arc<Service>> {
        self.services
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn services_mut(&self) -> std::sync::RwLockWriteGuard<'_, Vec<Arc<Service>>> {
        self.services.write().unwrap_or_else(|p| p.into_inner())
    }

    fn find(&self, name: &str) -> Option<Arc<Service>> {
        self.services
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .find(|s| s.spec.name == name)
            .cloned()
    }

    /// Asks `service` to stop and waits until it is down (up to its grace period and some).
    fn stop(&self, service: &Service, why: &str) {
        let deadline = Instant::now()
            + Duration::from_secs(u64::from(service.spec.stop_grace_secs))
            + CONTROL_SLACK;
        let mut status = service.status();
        if status.state.is_down() && !status.wanted {
            return;
        }
        self.journal.info(format_args!(
            "service {}: stopping ({why})",
            service.spec.name
        ));
        status.wanted = false;
        status.stop_now = matches!(status.state, State::Running | State::Stopping);
        service.changed.notify_all();
        while !status.state.is_down() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.journal.error(format_args!(
                    "service {}: still {} after its grace period",
                    service.spec.name,
                    status.state.name()
                ));
                return;
            }
            status = service.wait(status, left.min(Duration::from_millis(100)));
        }
    }

    /// Asks `service` to run; with `wait`, waits (a while) until its program runs, or it could
    /// not start, or it ended already.
    fn start_one(&self, service: &Service, wait: Option<Duration>) {
        let mut status = service.status();
        status.wanted = true;
        if status.state.is_down() {
            status.state = State::Waiting;
            status.since = SystemTime::now();
        }
        service.changed.notify_all();
        let Some(wait) = wait else {
            return;
        };
        let deadline = Instant::now() + wait;
        while matches!(status.state, State::Waiting | State::Stopping) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            status = service.wait(status, left.min(Duration::from_millis(100)));
        }
    }
}

impl Workload for Supervisor {
    fn list(&self) -> Vec<NodeServiceStatus> {
        self.services().iter().map(|s| s.view()).collect()
    }

    fn control(&self, name: &str, action: ServiceAction) -> Result<NodeServiceStatus, String> {
        let service = self
            .find(name)
            .ok_or_else(|| format!("this node runs no service {name:?}"))?;
        match action {
            ServiceAction::Stop => self.stop(&service, "asked over the API"),
            ServiceAction::Start => self.start_one(&service, Some(CONTROL_SLACK)),
            ServiceAction::Restart => {
                self.stop(&service, "restart asked over the API");
                self.start_one(&service, Some(CONTROL_SLACK));
            }
        }
        Ok(service.view())
    }

    fn is_ready(&self, name: &str) -> Option<bool> {
        self.find(name).map(|s| s.status().ready)
    }

    fn stop_all(&self, why: &str) {
        let services = self.services();
        let specs: Vec<ServiceSpec> = services.iter().map(|s| s.spec.clone()).collect();
        // Wave by wave, each wave's services at once: their grace periods overlap, and a
        // service still stops only after everything that depends on it.
        for wave in slate_services::stop_waves(&specs) {
            std::thread::scope(|scope| {
                for &i in &wave {
                    let service = &services[i];
                    scope.spawn(move || self.stop(service, why));
                }
            });
        }
    }

    fn start_all(&self) {
        for service in &self.services() {
            self.start_one(service, None);
        }
    }

    fn replace(&self, services: Vec<ServiceSpec>) -> String {
        self.apply_live(services)
    }
}

/// Boot's task `startServices`: the image's services and the machine configuration's, checked
/// as a set against this root, started in order, and handed to the node. A set that does not
/// hold (a program the new version lacks, a dependency gone) fails the boot: the version that
/// cannot run the node's workload is not committed.
pub fn start_task(
    ctx: &TaskContext<'_>,
    node: &Node,
    image: &[ServiceSpec],
) -> Result<(), TaskError> {
    let machine = node
        .machine
        .current()
        .map(|c| c.services)
        .unwrap_or_default();
    let services = merged(image, &machine, &has_program)
        .map_err(|e| failed(format!("the services cannot start: {e}")))?;
    let parent = slate_host::mount_cgroup2()
        .map_err(|e| slate_sequencer::error_chain(&e))
        .and_then(|root| services_cgroup(&root));
    let parent = match parent {
        Ok(parent) => Some(parent),
        Err(why) => {
            ctx.log(&format!(
                "services run without cgroups ({why}): no limits, stopped by process group"
            ));
            None
        }
    };
    if services.is_empty() {
        // Started all the same: a live apply of the machine configuration may add some.
        ctx.log("no services");
    } else {
        let names: Vec<&str> = services.iter().map(|s| s.name.as_str()).collect();
        ctx.log(&format!("starting services in order: {}", names.join(" ")));
    }
    let supervisor = Supervisor::start(node.journal.clone(), services, parent);
    let _ = node.services.set(supervisor);
    Ok(())
}

/// A drain task: every service stopped, in reverse start order, before the node goes down
/// or writes a new version (`why` says which).
pub fn drain(ctx: &TaskContext<'_>, node: &Node, why: &str) {
    if let Some(services) = node.services.get() {
        let started = Instant::now();
        services.stop_all(why);
        ctx.log(&format!(
            "services stopped in {} ms",
            started.elapsed().as_millis()
        ));
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;

//! Declarations as TOML: what is taken, the bad-input table (each refusal names the service and
//! the field), the start order and its circles, and the restart policy and backoff.

use std::path::Path;
use std::time::Duration;

use slate_services::order::{milestones, start_order};
use slate_services::{
    Backoff, Exit, Milestone, ReadyCheck, RestartPolicy, ServiceError, ServiceSpec, StopSignal,
};

#[derive(serde::Deserialize)]
struct Doc {
    services: Vec<ServiceSpec>,
}

fn parse(text: &str) -> Result<Vec<ServiceSpec>, String> {
    toml::from_str::<Doc>(text)
        .map(|d| d.services)
        .map_err(|e| e.message().to_owned())
}

/// The image holds /bin/busybox and /usr/bin/web only.
fn image(path: &Path) -> bool {
    path == Path::new("/bin/busybox") || path == Path::new("/usr/bin/web")
}

fn order(text: &str) -> Result<Vec<String>, ServiceError> {
    let services = parse(text).unwrap();
    let order = start_order(&services, &image)?;
    Ok(order
        .into_iter()
        .map(|i| services[i].name.clone())
        .collect())
}

const WEB: &str = r#"
[[services]]
name = "web"
command = ["/bin/busybox", "httpd", "-f", "-p", "8080", "-h", "/var/www"]
environment = { LANG = "C" }
working_directory = "/var/www"
user = 33
group = 33
restart = "on-failure"
restart_delay_ms = 200
restart_delay_max_ms = 5000
depends_on = ["var", "network"]
ready = { http = "http://127.0.0.1:8080/index.html" }
ready_timeout_secs = 30
stop_signal = "INT"
stop_grace_secs = 5
limits = { memory_max = 67108864, cpu_weight = 200, pids_max = 32 }
"#;

#[test]
fn a_full_declaration_is_taken_and_written_back_the_same() {
    let services = parse(WEB).unwrap();
    let web = &services[0];
    assert_eq!(web.command[1], "httpd");
    assert_eq!(web.restart, RestartPolicy::OnFailure);
    assert_eq!(web.stop_signal, StopSignal::Int);
    assert_eq!(web.stop_signal.number(), 2);
    assert_eq!(
        web.ready,
        Some(ReadyCheck::Http {
            addr: "127.0.0.1:8080".parse().unwrap(),
            path: "/index.html".into()
        })
    );
    assert_eq!(
        milestones(web).into_iter().collect::<Vec<_>>(),
        [Milestone::Network, Milestone::Var]
    );
    assert_eq!(web.limits.memory_max, Some(64 << 20));
    web.check(&image).unwrap();
    let text = toml::to_string(&Doc2 {
        services: services.clone(),
    })
    .unwrap();
    assert_eq!(parse(&text).unwrap(), services);
    // Defaults: restart always, 500 ms doubling to 30 s, TERM and 10 s, ready when started.
    let plain = &parse("[[services]]\nname = \"a\"\ncommand = [\"/usr/bin/web\"]\n").unwrap()[0];
    assert_eq!(plain, &ServiceSpec::new("a", &["/usr/bin/web"]));
    assert_eq!(
        (
            plain.restart,
            plain.restart_delay_ms,
            plain.restart_delay_max_ms
        ),
        (RestartPolicy::Always, 500, 30_000)
    );
    assert_eq!(
        (plain.stop_signal, plain.stop_grace_secs),
        (StopSignal::Term, 10)
    );
}

#[derive(serde::Serialize)]
struct Doc2 {
    services: Vec<ServiceSpec>,
}

/// Each bad declaration and the words its refusal must carry: the parser's for an unknown key
/// or a bad value type, [`ServiceSpec::check`]'s (service and field) for the rest.
#[test]
fn bad_declarations_are_refused_naming_the_service_and_the_field() {
    let base = "name = \"web\"\ncommand = [\"/usr/bin/web\"]\n";
    let cases: &[(&str, &str)] = &[
        ("colour = \"red\"\n", "unknown field `colour`"),
        ("restart = \"sometimes\"\n", "unknown variant `sometimes`"),
        ("stop_signal = \"SIGTERM\"\n", "unknown variant `SIGTERM`"),
        ("limits = { swap = 1 }\n", "unknown field `swap`"),
        (
            "ready = { tcp = \"localhost:80\" }\n",
            "ready.tcp: \"localhost:80\" is not an IP address",
        ),
        ("ready = { tcp = \"127.0.0.1:0\" }\n", "has port 0"),
        (
            "ready = { http = \"https://127.0.0.1:1/\" }\n",
            "not an http:// URL",
        ),
        (
            "ready = { file = \"ready\" }\n",
            "ready.file: ready is not an absolute path",
        ),
        (
            "ready = { command = [] }\n",
            "ready.command: names no program",
        ),
        (
            "ready = { tcp = \"127.0.0.1:1\", file = \"/x\" }\n",
            "exactly one of",
        ),
        ("user = -1\n", "invalid value"),
    ];
    for (extra, words) in cases {
        let text = format!("[[services]]\n{base}{extra}");
        let err = parse(&text).expect_err(extra);
        assert!(err.contains(words), "{extra}: {err}");
    }
    let checked: &[(&str, &str)] = &[
        ("name = \"Web\"\ncommand = [\"/usr/bin/web\"]\n", "service \"Web\": name: \"Web\" is not 1 to 63"),
        ("name = \"network\"\ncommand = [\"/usr/bin/web\"]\n", "name: \"network\" is a milestone's name"),
        ("name = \"web\"\ncommand = []\n", "service \"web\": command: names no program"),
        ("name = \"web\"\ncommand = [\"busybox\"]\n", "command: \"busybox\" is not an absolute path"),
        ("name = \"web\"\ncommand = [\"/bin/nginx\"]\n", "command: the image holds no executable /bin/nginx"),
        ("name = \"web\"\ncommand = [\"/usr/bin/web\", \"a\\u0000b\"]\n", "command: an argument contains a NUL byte"),
        ("name = \"web\"\ncommand = [\"/usr/bin/web\"]\nenvironment = { \"A-B\" = \"1\" }\n", "environment: \"A-B\" is not a variable name"),
        ("name = \"web\"\ncommand = [\"/usr/bin/web\"]\nworking_directory = \"www\"\n", "working_directory: www is not an absolute path"),
        ("name = \"web\"\ncommand = [\"/usr/bin/web\"]\nrestart_delay_ms = 0\n", "restart_delay_ms: 0 is outside 10..=3600000 ms"),
        ("name = \"web\"\ncommand = [\"/usr/bin/web\"]\nrestart_delay_ms = 1000\nrestart_delay_max_ms = 100\n", "restart_delay_max_ms: 100 is below restart_delay_ms (1000)"),
        ("name = \"web\"\ncommand = [\"/usr/bin/web\"]\ndepends_on = [\"web\"]\n", "depends_on: a service cannot depend on itself"),
        ("name = \"web\"\ncommand = [\"/usr/bin/web\"]\nready = { command = [\"/bin/curl\"] }\n", "ready.command: the image holds no executable /bin/curl"),
        ("name = \"web\"\ncommand = [\"/usr/bin/web\"]\nready_timeout_secs = 0\n", "ready_timeout_secs: 0 is outside 1..=3600 s"),
        ("name = \"web\"\ncommand = [\"/usr/bin/web\"]\nstop_grace_secs = 601\n", "stop_grace_secs: 601 is outside 1..=600 s"),
        ("name = \"web\"\ncommand = [\"/usr/bin/web\"]\nlimits = { memory_max = 4096 }\n", "limits.memory_max: 4096 bytes is below 1 MiB"),
        ("name = \"web\"\ncommand = [\"/usr/bin/web\"]\nlimits = { cpu_weight = 0 }\n", "limits.cpu_weight: 0 is outside 1..=10000"),
        ("name = \"web\"\ncommand = [\"/usr/bin/web\"]\nlimits = { pids_max = 0 }\n", "limits.pids_max: 0 would"),
    ];
    for (text, words) in checked {
        let services = parse(&format!("[[services]]\n{text}")).expect(text);
        let err = services[0].check(&image).expect_err(text).to_string();
        assert!(err.contains(words), "{text}: {err}");
    }
}

#[test]
fn services_start_after_what_they_depend_on_then_by_name() {
    let text = "
[[services]]
name = \"web\"
command = [\"/usr/bin/web\"]
depends_on = [\"db\", \"network\"]
[[services]]
name = \"db\"
command = [\"/bin/busybox\"]
depends_on = [\"var\"]
[[services]]
name = \"cache\"
command = [\"/bin/busybox\"]
[[services]]
name = \"api\"
command = [\"/bin/busybox\"]
depends_on = [\"web\", \"cache\"]
";
    assert_eq!(order(text).unwrap(), ["cache", "db", "web", "api"]);
    assert_eq!(order("services = []").unwrap(), Vec::<String>::new());
    // Stopped in waves: api first (nothing depends on it), then web and cache together, then db.
    let services = parse(text).unwrap();
    let waves: Vec<Vec<&str>> = slate_services::stop_waves(&services)
        .into_iter()
        .map(|w| w.into_iter().map(|i| services[i].name.as_str()).collect())
        .collect();
    assert_eq!(waves, [vec!["api"], vec!["cache", "web"], vec!["db"]]);
    assert!(slate_services::stop_waves(&[]).is_empty());
}

#[test]
fn a_set_with_a_circle_a_stranger_or_a_twin_is_refused() {
    let svc = |name: &str, deps: &str| {
        format!("[[services]]\nname = \"{name}\"\ncommand = [\"/bin/busybox\"]\ndepends_on = [{deps}]\n")
    };
    let cycle = format!(
        "{}{}{}",
        svc("a", "\"b\""),
        svc("b", "\"c\""),
        svc("c", "\"a\"")
    );
    assert_eq!(
        order(&cycle).unwrap_err(),
        ServiceError::Cycle(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(
        order(&cycle).unwrap_err().to_string(),
        "services depend on each other in a circle: a -> b -> c -> a"
    );
    // A circle below a free service is still found.
    let deep = format!(
        "{}{}{}",
        svc("x", ""),
        svc("y", "\"x\", \"z\""),
        svc("z", "\"y\"")
    );
    assert!(matches!(order(&deep).unwrap_err(), ServiceError::Cycle(c) if c == ["y", "z", "y"]));
    let stranger = svc("a", "\"db\"");
    assert_eq!(
        order(&stranger).unwrap_err().to_string(),
        "service \"a\": depends_on: \"db\" is neither a service nor a milestone (network, var, etc)"
    );
    let twins = format!("{}{}", svc("a", ""), svc("a", ""));
    assert_eq!(
        order(&twins).unwrap_err(),
        ServiceError::Duplicate("a".into())
    );
}

#[test]
fn the_policy_decides_whether_and_the_backoff_when() {
    use RestartPolicy::*;
    for (policy, exit, restarts) in [
        (Always, Exit::Code(0), true),
        (Always, Exit::Signal(9), true),
        (OnFailure, Exit::Code(0), false),
        (OnFailure, Exit::Code(1), true),
        (OnFailure, Exit::Signal(11), true),
        (Never, Exit::Code(1), false),
    ] {
        assert_eq!(policy.restarts(exit), restarts, "{policy:?} {exit}");
    }
    let backoff = Backoff::new(500, 30_000);
    let delays: Vec<u64> = (1..=9)
        .map(|n| backoff.delay(n).as_millis() as u64)
        .collect();
    assert_eq!(
        delays,
        [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
    );
    assert_eq!(backoff.delay(u32::MAX), Duration::from_millis(30_000));
    // A fake clock: a crash loop climbs, a stable run starts over.
    let mut row = 0;
    for ran in [Duration::from_millis(50); 4] {
        row = Backoff::failures_after(row, ran);
    }
    assert_eq!((row, backoff.delay(row)), (4, Duration::from_secs(4)));
    row = Backoff::failures_after(row, Backoff::STABLE);
    assert_eq!((row, backoff.delay(row)), (1, Duration::from_millis(500)));
}

//! Whether a service is ready: its `ready` check, tried until it passes or the service's
//! `ready_timeout_secs` runs out.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use slate_services::ReadyCheck;

use super::Supervisor;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// A ready command that has not exited by then failed this try.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// One try of `check`.
pub fn try_once(check: &ReadyCheck) -> bool {
    match check {
        ReadyCheck::Tcp(addr) => TcpStream::connect_timeout(addr, CONNECT_TIMEOUT).is_ok(),
        ReadyCheck::Http { addr, path } => http_ok(*addr, path).unwrap_or(false),
        ReadyCheck::File(path) => Path::new(path).exists(),
        ReadyCheck::Command(argv) => {
            let mut cmd = Command::new(&argv[0]);
            cmd.args(&argv[1..]);
            matches!(
                slate_host::run_command_logged(&mut cmd, COMMAND_TIMEOUT, &|| false, &mut |_| {}),
                Ok(slate_host::CommandEnd::Exited(status)) if status.success()
            )
        }
    }
}

/// `GET path` over HTTP/1.0 answers 2xx.
fn http_ok(addr: SocketAddr, path: &str) -> std::io::Result<bool> {
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)?;
    stream.set_read_timeout(Some(CONNECT_TIMEOUT))?;
    stream.set_write_timeout(Some(CONNECT_TIMEOUT))?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    // The status line is all that is needed: `HTTP/1.x 200 …`.
    let mut head = [0u8; 16];
    let mut read = 0;
    while read < head.len() {
        match stream.read(&mut head[read..])? {
            0 => break,
            n => read += n,
        }
    }
    Ok(status_is_success(&head[..read]))
}

fn status_is_success(head: &[u8]) -> bool {
    let text = String::from_utf8_lossy(head);
    let mut words = text.split(' ');
    words.next().is_some_and(|v| v.starts_with("HTTP/1."))
        && words
            .next()
            .and_then(|code| code.get(..3))
            .is_some_and(|code| code.starts_with('2') && code.bytes().all(|b| b.is_ascii_digit()))
}

/// Tries `check` every `interval` until it passes (true), `stop` says give up, or `timeout`
/// passes (false).
pub fn wait_ready(
    check: &ReadyCheck,
    timeout: Duration,
    interval: Duration,
    stop: &dyn Fn() -> bool,
) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if try_once(check) {
            return true;
        }
        if stop() || Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(interval);
    }
}

/// When a supervisor's services started, and whether all of them have been ready since.
#[derive(Debug)]
pub(super) struct AllReady {
    started: Instant,
    logged: AtomicBool,
}

impl AllReady {
    pub(super) fn new() -> AllReady {
        AllReady {
            started: Instant::now(),
            logged: AtomicBool::new(false),
        }
    }
}

/// A service of `sup` became ready (called with no service's status locked): when every
/// service is ready now, logs `services: all N ready X ms after their start`, once per
/// supervisor — the moment a boot's workload is up (`xtask bench-services` reads it).
pub(super) fn note_ready(sup: &Supervisor) {
    let all = &sup.all_ready;
    if all.logged.load(Ordering::Acquire) {
        return;
    }
    let services = sup.services();
    if !services.iter().all(|s| s.status().ready) {
        return;
    }
    if !all.logged.swap(true, Ordering::AcqRel) {
        sup.journal.info(format_args!(
            "services: all {} ready {} ms after their start",
            services.len(),
            all.started.elapsed().as_millis()
        ));
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    #[test]
    fn an_http_check_wants_a_2xx_status_line() {
        assert!(status_is_success(b"HTTP/1.0 200 OK\r\n"));
        assert!(status_is_success(b"HTTP/1.1 204 No"));
        assert!(!status_is_success(b"HTTP/1.1 404 Not Found"));
        assert!(!status_is_success(b"HTTP/1.1 2"));
        assert!(!status_is_success(b"SSH-2.0-OpenSSH"));
        assert!(!status_is_success(b""));
    }

    #[test]
    fn checks_pass_against_what_is_there_and_fail_otherwise() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let mut stream = stream.unwrap();
                let mut request = [0u8; 256];
                let n = stream.read(&mut request).unwrap();
                let ok = String::from_utf8_lossy(&request[..n]).starts_with("GET /ready ");
                let answer: &[u8] = if ok {
                    b"HTTP/1.0 200 OK\r\n\r\nready"
                } else {
                    b"HTTP/1.0 503 Busy\r\n\r\n"
                };
                stream.write_all(answer).unwrap();
            }
        });
        // Tried a few times, as the service's probe does: a loaded machine may take the read
        // past its 1 s timeout once.
        assert!((0..5).any(|_| try_once(&ReadyCheck::Http {
            addr,
            path: "/ready".into()
        })));
        assert!(!try_once(&ReadyCheck::Http {
            addr,
            path: "/other".into()
        }));
        assert!(try_once(&ReadyCheck::File("/".into())));
        assert!(!try_once(&ReadyCheck::File("/no/such/file".into())));
        assert!(try_once(&ReadyCheck::Command(vec![
            "/bin/sh".into(),
            "-c".into(),
            "exit 0".into()
        ])));
        assert!(!try_once(&ReadyCheck::Command(vec![
            "/bin/sh".into(),
            "-c".into(),
            "exit 1".into()
        ])));
        let closed = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let started = Instant::now();
        assert!(!wait_ready(
            &ReadyCheck::Tcp(closed),
            Duration::from_millis(200),
            Duration::from_millis(20),
            &|| false
        ));
        assert!(started.elapsed() >= Duration::from_millis(200));
    }

    /// The line comes once, when the last service (here one with a file check) is ready.
    #[test]
    fn all_ready_is_logged_once_when_the_last_service_is_ready() {
        use crate::base::services::Workload as _;
        use slate_services::ServiceSpec;
        use std::sync::Arc;

        let dir = tempfile::tempdir().unwrap();
        let flag = dir.path().join("ready");
        let plain = ServiceSpec::new("plain", &["/bin/sh", "-c", "exec sleep 300"]);
        let mut late = ServiceSpec::new("late", &["/bin/sh", "-c", "sleep 0.3; exec sleep 300"]);
        late.ready = Some(ReadyCheck::File(flag.clone()));
        let journal = Arc::new(crate::base::journal::Journal::new(
            slate_host::KmsgLogger::stderr("test"),
        ));
        let sup = Supervisor::start(journal.clone(), vec![plain, late], None);
        let all = |journal: &crate::base::journal::Journal| -> Vec<String> {
            let (lines, _) = journal.read_from(0, None);
            lines
                .into_iter()
                .filter(|l| l.starts_with("services: all"))
                .collect()
        };
        std::thread::sleep(Duration::from_millis(600));
        assert!(all(&journal).is_empty(), "late is not ready yet");
        std::fs::write(&flag, "").unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while all(&journal).is_empty() {
            assert!(Instant::now() < deadline, "never all ready");
            std::thread::sleep(Duration::from_millis(20));
        }
        sup.stop_all("the test ends");
        let lines = all(&journal);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("services: all 2 ready ")
                && lines[0].ends_with(" ms after their start"),
            "{lines:?}"
        );
    }
}

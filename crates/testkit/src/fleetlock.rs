//! FleetLock for tests: a client that speaks the wire by hand (so a test sees exactly what the
//! server sent, including on a connection a killed server cut), and the exclusion check that
//! the race tests judge an event log with.

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

pub const LOCK: &str = "/v1/pre-reboot";
pub const UNLOCK: &str = "/v1/steady-state";

/// A FleetLock client on one keep-alive connection, reconnecting after an error.
#[derive(Debug)]
pub struct Client {
    addr: SocketAddr,
    conn: Option<BufReader<TcpStream>>,
}

impl Client {
    pub fn new(addr: SocketAddr) -> Client {
        Client { addr, conn: None }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Status and body; an error when there was no answer (the request may have reached the
    /// server, and its store, or not).
    pub fn post(&mut self, path: &str, id: &str, group: &str) -> std::io::Result<(u16, String)> {
        let result = self.try_post(path, id, group);
        if result.is_err() {
            self.conn = None;
        }
        result
    }

    fn try_post(&mut self, path: &str, id: &str, group: &str) -> std::io::Result<(u16, String)> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => {
                let tcp = TcpStream::connect(self.addr)?;
                tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
                tcp.set_nodelay(true)?;
                self.conn.insert(BufReader::new(tcp))
            }
        };
        let body = format!(r#"{{"client_params":{{"id":"{id}","group":"{group}"}}}}"#);
        let request = format!(
            "POST {path} HTTP/1.1\r\nhost: {}\r\nfleet-lock-protocol: true\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        conn.get_mut().write_all(request.as_bytes())?;
        let mut line = String::new();
        conn.read_line(&mut line)?;
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("no status line: {line:?}")))?;
        let mut len = 0;
        loop {
            line.clear();
            conn.read_line(&mut line)?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    len = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; len];
        conn.read_exact(&mut body)?;
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// What a racing client saw, in one total order (recorded under one lock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// After the 200 of its lock: the slot is surely held from here…
    Acquired(usize),
    /// …until before its unlock is sent.
    Releasing(usize),
}

/// Panics unless: at no point more than `slots` holders; every one of `clients` acquired and
/// released exactly once; all slots were in use at some point (the clients did contend).
/// Answers the most holders seen at once.
pub fn check_exclusion(events: &[Hold], clients: usize, slots: usize) -> usize {
    let mut holding = BTreeSet::new();
    let mut most = 0;
    for e in events {
        match *e {
            Hold::Acquired(n) => assert!(holding.insert(n), "{n} acquired twice"),
            Hold::Releasing(n) => assert!(holding.remove(&n), "{n} released unheld"),
        }
        assert!(
            holding.len() <= slots,
            "{} holders at once: {holding:?}",
            holding.len()
        );
        most = most.max(holding.len());
    }
    assert_eq!(events.len(), 2 * clients, "every client was served");
    assert_eq!(most, slots, "the clients contended for every slot");
    most
}

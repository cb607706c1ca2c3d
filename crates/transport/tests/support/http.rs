//! Small HTTP/1.1 pieces for tests: a proxy in front of the real registry that can cut a blob
//! download short or hide `Range` headers, and a fake "registry" answering whatever a test says.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

/// Read an HTTP head (through the blank line); `None` at a clean end of stream.
pub fn read_head(reader: &mut impl BufRead) -> Option<String> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        head.push_str(&line);
        if line == "\r\n" || line == "\n" {
            return Some(head);
        }
    }
}

pub fn header_value<'h>(head: &'h str, name: &str) -> Option<&'h str> {
    head.lines().skip(1).find_map(|line| {
        let (k, v) = line.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

/// What the proxy does to the traffic.
#[derive(Debug, Clone)]
pub enum ProxyMode {
    /// Forward everything, but close the connection after `after` body bytes of a `GET` whose
    /// path contains `path`.
    Cut { path: String, after: u64 },
    /// Drop `Range` headers, so the registry answers 200 with the whole blob.
    StripRange,
}

/// A proxy on a free 127.0.0.1 port in front of `upstream`; stops accepting when dropped.
#[derive(Debug)]
pub struct Proxy {
    pub host: String,
    stop: Arc<AtomicBool>,
    /// How many times the cut happened.
    pub cuts: Arc<AtomicU64>,
}

impl Proxy {
    pub fn start(upstream: &str, mode: ProxyMode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        let host = listener.local_addr().expect("an address").to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicU64::new(0));
        let (stop2, cuts2, upstream) = (stop.clone(), cuts.clone(), upstream.to_owned());
        thread::spawn(move || {
            for client in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let (upstream, mode, cuts) = (upstream.clone(), mode.clone(), cuts2.clone());
                thread::spawn(move || {
                    let _ = proxy_connection(client, &upstream, &mode, &cuts);
                });
            }
        });
        Proxy { host, stop, cuts }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.host); // wake the accept loop
    }
}

fn proxy_connection(
    client: TcpStream,
    upstream: &str,
    mode: &ProxyMode,
    cuts: &AtomicU64,
) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    let mut client_in = BufReader::new(client.try_clone()?);
    let mut client_out = client;
    let mut server_in = BufReader::new(server.try_clone()?);
    let mut server_out = server;
    while let Some(head) = read_head(&mut client_in) {
        let request_line = head.lines().next().unwrap_or_default().to_owned();
        let mut parts = request_line.split(' ');
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let forwarded: String = match mode {
            ProxyMode::StripRange => head
                .split_inclusive("\r\n")
                .filter(|l| !l.to_ascii_lowercase().starts_with("range:"))
                .collect(),
            ProxyMode::Cut { .. } => head.clone(),
        };
        server_out.write_all(forwarded.as_bytes())?;
        let request_body: u64 = header_value(&head, "content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        std::io::copy(&mut (&mut client_in).take(request_body), &mut server_out)?;

        let Some(response) = read_head(&mut server_in) else {
            return Ok(());
        };
        client_out.write_all(response.as_bytes())?;
        let length: u64 = if method == "HEAD" {
            0
        } else {
            header_value(&response, "content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        let limit = match mode {
            ProxyMode::Cut { path: p, after } if method == "GET" && path.contains(p.as_str()) => {
                Some(*after)
            }
            _ => None,
        };
        match limit {
            Some(after) if after < length => {
                std::io::copy(&mut (&mut server_in).take(after), &mut client_out)?;
                client_out.flush()?;
                cuts.fetch_add(1, Ordering::SeqCst);
                let _ = client_out.shutdown(Shutdown::Both);
                return Ok(());
            }
            _ => {
                std::io::copy(&mut (&mut server_in).take(length), &mut client_out)?;
            }
        }
    }
    Ok(())
}

/// A request as the fake registry saw it.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub head: String,
}

/// A fake registry: every request (its body read first) gets the raw bytes `answer` returns,
/// and the connection is closed after each answer.
#[derive(Debug)]
pub struct FakeServer {
    pub host: String,
    stop: Arc<AtomicBool>,
}

impl FakeServer {
    pub fn start(answer: impl Fn(&Request, &str) -> Vec<u8> + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        let host = listener.local_addr().expect("an address").to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let answer = Arc::new(answer);
        let (stop2, host2) = (stop.clone(), host.clone());
        thread::spawn(move || {
            for stream in listener.incoming() {
                if stop2.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(mut stream) = stream else { continue };
                let (answer, host) = (answer.clone(), host2.clone());
                thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().expect("a stream"));
                    if let Some(head) = read_head(&mut reader) {
                        // The body is read before answering: closing a socket with unread
                        // bytes would reset the connection under the client.
                        let length: u64 = header_value(&head, "content-length")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        let _ =
                            std::io::copy(&mut (&mut reader).take(length), &mut std::io::sink());
                        let line = head.lines().next().unwrap_or_default().to_owned();
                        let mut parts = line.split(' ');
                        let request = Request {
                            method: parts.next().unwrap_or_default().to_owned(),
                            path: parts.next().unwrap_or_default().to_owned(),
                            head: head.clone(),
                        };
                        let _ = stream.write_all(&answer(&request, &host));
                        let _ = stream.flush();
                    }
                    let _ = stream.shutdown(Shutdown::Both);
                });
            }
        });
        FakeServer { host, stop }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.host);
    }
}

/// A complete response with `Content-Length` and `Connection: close`.
pub fn response(status: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

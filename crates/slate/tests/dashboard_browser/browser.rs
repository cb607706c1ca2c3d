//! A headless Chromium driven over WebDriver (Debian's `chromium` and `chromium-driver`, through
//! `fantoccini`) that presents one role's client certificate, as a person's browser would:
//! the certificate and the fleet CA sit in an NSS database under a HOME of its own
//! (`certutil`, `pk12util`), and the profile's `auto_select_certificate` content setting (what
//! Chrome's AutoSelectCertificateForUrls policy sets) picks it for the operator's origin without
//! a dialog. The server sees a real certificate and checks its role; nothing is bypassed.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};
use slate_api::{client_cert_file, client_key_file, Role};

/// The tools the browser needs; under `CI=true` each one's absence fails the test.
pub fn available() -> bool {
    [
        "chromium",
        "chromedriver",
        "certutil",
        "pk12util",
        "openssl",
    ]
    .iter()
    .all(|tool| slate_testkit::require_tool(tool))
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One browser with one role's certificate.
pub struct Browser {
    pub client: Client,
    rt: tokio::runtime::Runtime,
    driver: Child,
    _home: tempfile::TempDir,
}

impl Browser {
    /// A browser that trusts the fleet CA of `certs` and presents `role`'s certificate to
    /// `origin` (`https://HOST:PORT`).
    pub fn start(certs: &Path, role: Role, origin: &str) -> Browser {
        let home = tempfile::tempdir().unwrap();
        let nssdb = home.path().join(".pki/nssdb");
        std::fs::create_dir_all(&nssdb).unwrap();
        let db = format!("sql:{}", nssdb.display());
        run(Command::new("certutil").args(["-N", "-d", &db, "--empty-password"]));
        run(Command::new("certutil")
            .args(["-A", "-d", &db, "-n", "slate fleet CA", "-t", "C,,", "-i"])
            .arg(certs.join(slate_api::CA_CERT)));
        let p12 = home.path().join("client.p12");
        run(Command::new("openssl")
            .args(["pkcs12", "-export", "-passout", "pass:", "-name"])
            .arg(format!("slate {role}"))
            .arg("-in")
            .arg(certs.join(client_cert_file(role)))
            .arg("-inkey")
            .arg(certs.join(client_key_file(role)))
            .arg("-out")
            .arg(&p12));
        run(Command::new("pk12util")
            .args(["-d", &db, "-W", "", "-i"])
            .arg(&p12));
        let profile = home.path().join("profile");
        std::fs::create_dir_all(profile.join("Default")).unwrap();
        let preferences = json!({"profile": {"content_settings": {"exceptions": {
            "auto_select_certificate": {
                format!("{origin},*"): {"setting": {"filters": [{}]}}
            }
        }}}});
        std::fs::write(profile.join("Default/Preferences"), preferences.to_string()).unwrap();

        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            // Chromium reads its NSS database from $HOME/.pki/nssdb.
            .env("HOME", home.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": slate_testkit::find_tool("chromium").unwrap(),
                "args": [
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--window-size=1280,2200",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        let url = format!("http://127.0.0.1:{port}");
        let start = Instant::now();
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            let attempt = rt.block_on(
                ClientBuilder::new(connector)
                    .capabilities(caps.clone())
                    .connect(&url),
            );
            match attempt {
                Ok(client) => break client,
                Err(e) if start.elapsed() < Duration::from_secs(30) => {
                    let _ = e;
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("chromedriver on {url}: {e}"),
            }
        };
        Browser {
            client,
            rt,
            driver,
            _home: home,
        }
    }

    pub fn goto(&self, url: &str) {
        self.rt.block_on(self.client.goto(url)).unwrap();
    }

    /// Runs `script` (a function body) and returns what it returns.
    pub fn js(&self, script: &str) -> Value {
        self.rt
            .block_on(self.client.execute(script, Vec::new()))
            .unwrap()
    }

    /// Clicks the element `css` finds, finding it again if the page's refresh replaced it
    /// between the find and the click.
    pub fn click(&self, css: &str) {
        let mut tries = 0;
        loop {
            tries += 1;
            let clicked = self.rt.block_on(async {
                self.client
                    .wait()
                    .at_most(Duration::from_secs(10))
                    .for_element(Locator::Css(css))
                    .await?
                    .click()
                    .await
            });
            match clicked {
                Ok(()) => return,
                Err(e) if tries < 3 => eprintln!("click {css}: {e}; again"),
                Err(e) => panic!("click {css}: {e}"),
            }
        }
    }

    /// The text of `#message` once the page has put one there (a button's answer).
    pub fn message(&self) -> String {
        let start = Instant::now();
        loop {
            let text = self.js("var m = document.getElementById('message'); \
                 return m && !m.hidden ? m.textContent : '';");
            let text = text.as_str().unwrap_or("").to_owned();
            if !text.is_empty() {
                return text;
            }
            assert!(start.elapsed() < Duration::from_secs(15), "no answer shown");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A PNG of the window, written to `path`.
    pub fn screenshot(&self, path: &Path) -> PathBuf {
        let png = self.rt.block_on(self.client.screenshot()).unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, &png).unwrap();
        path.to_owned()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.rt.block_on(self.client.clone().close());
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

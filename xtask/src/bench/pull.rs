//! Pull benchmark (not a test): a bundle with a 256 MiB blob, pushed to a local docker-registry;
//! then `slate_transport::pull` (fetch, hash while writing, flush, rename) against the same blob
//! fetched by `curl`, hashed by `sha256sum` and copied by `cp`. Each run of either side starts
//! with nothing pulled: the cache, or the baseline's files, removed before the clock starts.

use std::fs;
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use slate_bundle::{BlobInput, BundleSpec, BINARY_MEDIA_TYPE, UKI_MEDIA_TYPE};
use slate_transport::Reference;

use crate::bench::{noise, stopwatch, Bench, Comparison, Sample, Side};
use crate::util::{output, repo_root, run};

const BLOB_MIB: usize = 256;
const REGISTRY: &str = "/usr/bin/docker-registry";

/// docker-registry on a free loopback port, killed on drop.
struct Registry {
    host: String,
    child: Child,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn answers(host: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(host) else {
        return false;
    };
    let request = format!("GET /v2/ HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    let mut answer = Vec::new();
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_to_end(&mut answer).is_ok()
        && answer.starts_with(b"HTTP/1.1 200")
}

fn start_registry(dir: &Path) -> Result<Registry> {
    ensure!(
        Path::new(REGISTRY).exists(),
        "{REGISTRY} is missing: run scripts/install-deps (Debian's docker-registry)"
    );
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let host = format!("127.0.0.1:{port}");
    let config = dir.join("registry.yml");
    fs::write(
        &config,
        format!(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: true\nstorage:\n  \
             filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {host}\n",
            dir.join("storage").display()
        ),
    )?;
    let child = Command::new(REGISTRY)
        .arg("serve")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting docker-registry")?;
    let registry = Registry { host, child };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !answers(&registry.host) {
        if Instant::now() > deadline {
            bail!("docker-registry did not answer on {}", registry.host);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(registry)
}

/// A run's figure, and its throughput as a further figure.
fn with_rate(bytes: u64, secs: f64) -> Sample {
    Sample::new(secs).with(
        "throughput",
        "MiB/s",
        bytes as f64 / (1024.0 * 1024.0) / secs,
    )
}

pub fn bench_pull() -> Result<Vec<Comparison>> {
    let work = repo_root().join("target/bench/pull");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let blob = noise(BLOB_MIB * 1024 * 1024);
    let bundle = work.join("bundle");
    slate_bundle::write_bundle(
        &bundle,
        BundleSpec {
            name: "bench",
            version: "1.0.0",
            arch: "x86_64",
            variant: "generic",
        },
        &[
            BlobInput {
                role: slate_bundle::UKI_ROLE,
                file_name: "slate.efi",
                media_type: UKI_MEDIA_TYPE,
                bytes: &blob,
            },
            BlobInput {
                role: slate_bundle::INSTALLER_ROLE,
                file_name: "slate",
                media_type: BINARY_MEDIA_TYPE,
                bytes: b"installer",
            },
        ],
    )?;
    let digest = slate_bundle::sha256_digest(&blob);
    drop(blob);

    let registry = start_registry(&work)?;
    let image = Reference::parse(&format!("{}/bench/installer:1.0.0", registry.host))?;
    let (pushed, push_secs) =
        stopwatch(|| Ok(slate_transport::push(&bundle, &image, &mut |_| {})?))?;

    // slate: manifest, config, the blob and the installer; every byte hashed on its way to
    // disk, flushed, renamed into the layout; the signature tag asked for (absent).
    let cache = work.join("cache");
    let slate = Side::new("slate pull", |_| {
        let _ = fs::remove_dir_all(&cache);
        let (pulled, secs) = stopwatch(|| Ok(slate_transport::pull(&image, &cache, &mut |_| {})?))?;
        ensure!(pulled.fetched_bytes >= (BLOB_MIB * 1024 * 1024) as u64);
        Ok(with_rate(pulled.fetched_bytes, secs))
    });
    // The same blob with curl, then sha256sum, then cp into place.
    let url = format!("http://{}/v2/bench/installer/blobs/{digest}", registry.host);
    let (download, copy) = (work.join("curl.blob"), work.join("copied.blob"));
    let baseline = Side::new("curl + sha256sum + cp", |_| {
        let _ = fs::remove_file(&download);
        let _ = fs::remove_file(&copy);
        let (sum, secs) = stopwatch(|| {
            run(Command::new("curl")
                .args(["-sSf", "-o"])
                .arg(&download)
                .arg(&url))?;
            let sum = output(Command::new("sha256sum").arg(&download))?;
            run(Command::new("cp").arg(&download).arg(&copy))?;
            Ok(sum)
        })?;
        ensure!(
            sum.split_whitespace().next() == digest.strip_prefix("sha256:"),
            "sha256sum disagrees: {sum}"
        );
        Ok(with_rate(
            fs::metadata(&copy).context("the copy")?.len(),
            secs,
        ))
    });
    let mut c = Bench::new(&format!("pull {BLOB_MIB} MiB"), "s")
        .about(format!(
            "a bundle blob from docker-registry on {}",
            registry.host
        ))
        .about("slate: fetch + sha256 while writing + fsync + rename into the cache")
        .run(slate, baseline, vec![])?;
    c.extra(
        "push_s",
        serde_json::json!(push_secs),
        format!(
            "push beforehand (once): {push_secs:.2} s, {} bytes",
            pushed.uploaded_bytes
        ),
    );
    c.print();
    drop(registry);
    fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    Ok(vec![c])
}

//! `xtask bench-var` (issue 40; not a test): /var in LUKS2 (`tpm2`, dm-crypt's aes-xts under
//! TCG) against a plain ext4 /var (`persistent`), in the same run, on the same image
//! (profiles/tpm2.toml; the persistent node's machine configuration overrides its mode): a
//! service of each node writes 64 MiB with `conv=fsync`, reads it back after dropping the page
//! cache, and times 20 4-KiB writes each followed by an fsync, three rounds, timed by
//! /proc/uptime (10 ms) inside the guest. Also the unlock at boot: the tpm2 node's second boot
//! (`unlocked with the TPM … in N ms`, the `mountEphemeral` task against the persistent one's).

use std::fs;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context as _, Result};

use crate::bench::{ratio_text, Stats};
use crate::util::repo_root;
use crate::vm::{Running, Vm};
use crate::vm_test::{
    install_blank_disk, node_config, prepare, require_tpm2_tools, running, tpm2_bundle, Node,
};

/// The workload: three rounds, each a line `bench N: write A B read C D fsync20 E F` of
/// /proc/uptime readings.
const SERVICE: &str = "\n[[services]]\nname = \"bench\"\ncommand = ['/bin/sh', '-c', 't() { \
                       read u _ < /proc/uptime; echo $u; }; for i in 1 2 3; do a=$(t); dd \
                       if=/dev/zero of=/var/bench bs=1M count=64 conv=fsync 2>/dev/null; b=$(t); \
                       sync; echo 3 > /proc/sys/vm/drop_caches; c=$(t); dd if=/var/bench \
                       of=/dev/null bs=1M 2>/dev/null; d=$(t); rm -f /var/bench; sync; e=$(t); \
                       j=0; while [ $j -lt 20 ]; do dd if=/dev/zero of=/var/f bs=4096 count=1 \
                       conv=fsync 2>/dev/null; j=$((j+1)); done; f=$(t); echo \"bench $i: \
                       write $a $b read $c $d fsync20 $e $f\"; done; echo \"bench finished\"']\n\
                       restart = \"never\"\ndepends_on = [\"var\"]\n";

/// One side's figures: MB/s written, MB/s read, ms per fsync'd 4 KiB write.
#[derive(Debug, Default)]
struct Figures {
    write: Vec<f64>,
    read: Vec<f64>,
    fsync_ms: Vec<f64>,
}

fn parse(logs: &str) -> Result<Figures> {
    let mut figures = Figures::default();
    for line in logs
        .lines()
        .filter(|l| l.contains("bench ") && l.contains(" write "))
    {
        let words: Vec<&str> = line.split_whitespace().collect();
        let at = |name: &str| -> Result<(f64, f64)> {
            let i = words
                .iter()
                .position(|w| *w == name)
                .with_context(|| format!("no {name} in {line:?}"))?;
            Ok((words[i + 1].parse()?, words[i + 2].parse()?))
        };
        let rate = |(a, b): (f64, f64)| 64.0 * 1.048_576 / (b - a).max(0.01);
        figures.write.push(rate(at("write")?));
        figures.read.push(rate(at("read")?));
        let (e, f) = at("fsync20")?;
        figures.fsync_ms.push((f - e) * 1000.0 / 20.0);
    }
    ensure!(figures.write.len() == 3, "three rounds: {logs}");
    Ok(figures)
}

/// Wait for the bench service to finish; its logs.
fn bench_logs(node: &Node<'_>) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let out = node.command(&["logs", "--service", "bench"]).output()?;
        let logs = String::from_utf8_lossy(&out.stdout).into_owned();
        if logs.contains("bench finished") {
            return Ok(logs);
        }
        ensure!(
            Instant::now() < deadline,
            "the bench service did not finish: {logs}"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The `mountEphemeral` task's duration on the console, in ms.
fn mount_ms(boot: &Running) -> Result<f64> {
    let serial = boot.serial();
    let line = serial
        .lines()
        .find(|l| l.contains("task mountEphemeral (1/1) done in "))
        .context("mountEphemeral's duration on the console")?;
    let ms = line
        .rsplit("done in ")
        .next()
        .and_then(|t| t.trim().strip_suffix("ms"))
        .context("a duration in ms")?;
    Ok(ms.parse()?)
}

fn reboot(node: &Node<'_>, vm: &mut Vm, mut boot: Running) -> Result<Running> {
    ensure!(
        node.command(&["reboot"]).status()?.success(),
        "slate reboot"
    );
    boot.wait_exit(Duration::from_secs(90))?;
    running(vm)
}

fn stats(values: &[f64]) -> Stats {
    Stats::of(values).unwrap_or(Stats {
        median: 0.0,
        min: 0.0,
        max: 0.0,
    })
}

pub fn bench_var() -> Result<()> {
    require_tpm2_tools()?;
    let prepared = prepare()?;
    let work = repo_root().join("target/bench/var");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work)?;
    let bundle = work.join("bundle");
    tpm2_bundle(&prepared, &work, "1.0.0", &[], &bundle)?;
    let mut sides = Vec::new();
    for mode in ["tpm2", "persistent"] {
        let config = node_config(&prepared.slate, &work, &format!("bench-{mode}"))?;
        let mut text = fs::read_to_string(&config)?;
        text.push_str(SERVICE);
        text.push_str(&format!("\n[var]\nmode = \"{mode}\"\n"));
        fs::write(&config, text)?;
        let image = work.join(format!("{mode}.raw"));
        install_blank_disk(&prepared.slate, &image, &bundle, "1.0.0", &config)?;
        let dir = work.join(format!("vm-{mode}"));
        let mut vm = Vm::new(&image, &dir)?.with_tpm(Some(&dir.join("tpm")));
        let node = Node {
            prepared: &prepared,
            port: vm.api_port,
            name: crate::vm_test::node_name(&format!("bench-{mode}")),
        };
        let first = running(&mut vm)?;
        // The first boot formats /var (and seals the tpm2 key): the second is what a node
        // sees at every boot.
        let boot = reboot(&node, &mut vm, first)?;
        let unlock = boot
            .serial()
            .lines()
            .find(|l| l.contains("unlocked with the TPM"))
            .map(|l| l.split_once("] ").map_or(l, |(_, r)| r).trim().to_owned());
        let mount = mount_ms(&boot)?;
        let figures = parse(&bench_logs(&node)?)?;
        ensure!(
            node.command(&["shutdown"]).status()?.success(),
            "slate shutdown"
        );
        let mut boot = boot;
        boot.wait_exit(Duration::from_secs(90))?;
        sides.push((mode, figures, mount, unlock));
    }
    println!("bench-var: /var tpm2 (LUKS2, dm-crypt aes-xts-plain64) vs persistent (plain ext4), same image, QEMU TCG");
    for (mode, f, mount, unlock) in &sides {
        let (w, r, s) = (stats(&f.write), stats(&f.read), stats(&f.fsync_ms));
        println!(
            "  {mode:<10} write {:.1} MB/s ({:.1}–{:.1}), read {:.1} MB/s ({:.1}–{:.1}), fsync'd 4 KiB write {:.1} ms ({:.1}–{:.1}); mountEphemeral {mount:.0} ms{}",
            w.median, w.min, w.max, r.median, r.min, r.max, s.median, s.min, s.max,
            unlock.as_ref().map_or(String::new(), |u| format!(" (`{u}`)"))
        );
    }
    if let [(_, t, tm, _), (_, p, pm, _)] = sides.as_slice() {
        let ratio = |a: &[f64], b: &[f64]| ratio_text(stats(a).median / stats(b).median.max(1e-9));
        println!(
            "  tpm2/persistent: write {}, read {}, fsync latency {}, mountEphemeral {}",
            ratio(&t.write, &p.write),
            ratio(&t.read, &p.read),
            ratio(&t.fsync_ms, &p.fsync_ms),
            ratio_text(tm / pm.max(1e-9))
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_service_lines() {
        let logs = "x marker: bench 1: write 10.00 11.00 read 11.50 12.00 fsync20 12.00 12.40\n\
                    bench 2: write 20.00 22.00 read 22.00 22.50 fsync20 22.50 23.00\n\
                    bench 3: write 30.00 31.00 read 31.00 31.50 fsync20 31.50 31.90\n";
        let f = parse(logs).unwrap();
        assert!((f.write[0] - 67.108_864).abs() < 1e-6, "{:?}", f.write);
        assert!((f.read[1] - 134.217_728).abs() < 1e-6, "{:?}", f.read);
        assert!((f.fsync_ms[0] - 20.0).abs() < 1e-6, "{:?}", f.fsync_ms);
    }
}

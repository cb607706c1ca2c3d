//! `tick` at fleet scale, timed (not a test of behaviour: `#[ignore]`d, run by hand with
//! `cargo test -p slate-rollout --test scale -- --ignored --nocapture`): 10,000 nodes in 10
//! groups under bench-operator's policy, a whole rollout ticked through, and p50/p99 of each
//! call printed. The figures in docs/testing.md compare runs of this before and after a change.

mod common;

use std::time::{Duration, Instant};

use common::World;
use slate_rollout::{
    tick, tick_explained, tick_in_place, tick_marked, RolloutState, TickCache, TickPart,
};

const POLICY: &str = "[[policy]]\nname = \"bench\"\nmax_unavailable = \"10%\"\n\
    waves = [{ percent = 1, soak = \"10s\" }, { percent = 10, soak = \"10s\" }, \
    { percent = 100 }]\nupgrade_timeout = \"10m\"\n";

fn pct(sorted: &[Duration], p: usize) -> f64 {
    let i = (sorted.len() * p).div_ceil(100).saturating_sub(1);
    sorted[i.min(sorted.len() - 1)].as_secs_f64() * 1e3
}

#[test]
#[ignore = "a timing, run by hand"]
fn tick_at_ten_thousand_nodes() {
    let mut w = World::new(POLICY, &["1", "2"]);
    for g in 0..10 {
        w.add_group(&format!("g{g}"), 1000, "1");
    }
    let mut busy = Vec::new();
    let mut quiet = Vec::new();
    let mut explained = Vec::new();
    // The leader's call: each group's wave order kept between ticks, each part timed; and
    // the same with the cache emptied first (what every tick cost before the cache).
    let mut cache = TickCache::new();
    let mut cached = Vec::new();
    let mut parts_cached: Vec<[Duration; 4]> = Vec::new();
    let mut parts_fresh: Vec<[Duration; 4]> = Vec::new();
    let mut leader_cache = TickCache::new();
    let mut in_place = Vec::new();
    let timed = |cache: &mut TickCache, parts: &mut Vec<[Duration; 4]>, w: &World| {
        let mut p = [Duration::ZERO; 4];
        let start = Instant::now();
        let mut last = start;
        let d = tick_marked(&w.tick_input(), cache, &mut |part: TickPart| {
            let now = Instant::now();
            p[part.index()] += now - last;
            last = now;
        });
        let took = start.elapsed();
        parts.push(p);
        (d, took)
    };
    for _ in 0..200 {
        let (fresh, _) = timed(&mut TickCache::new(), &mut parts_fresh, &w);
        let (d, took) = timed(&mut cache, &mut parts_cached, &w);
        cached.push(took);
        assert_eq!(d, fresh, "a cached wave order decided otherwise");
        // The leader's own call: the rollouts changed where they lie (their copy is not timed).
        let mut lent = w.rollouts.clone();
        let t = Instant::now();
        let d_in_place = tick_in_place(&w.tick_input(), &mut lent, &mut leader_cache, &mut |_| {});
        in_place.push(t.elapsed());
        drop((d_in_place, lent));
        let t = Instant::now();
        let d = tick(&w.tick_input());
        busy.push(t.elapsed());
        // Most of the leader's ticks see nothing new: the same input again.
        let t = Instant::now();
        std::hint::black_box(tick(&w.tick_input()));
        quiet.push(t.elapsed());
        // The same decision with every waiting node's reason (`slate fleet plan`'s).
        let t = Instant::now();
        std::hint::black_box(tick_explained(&w.tick_input()));
        explained.push(t.elapsed());
        drop(d);
        w.tick();
        w.advance(5);
        if w.rollouts.len() == 10
            && w.rollouts
                .values()
                .all(|r| matches!(r.state, RolloutState::Completed { .. }))
        {
            break;
        }
    }
    assert_eq!(w.versions("g0").get("2").copied(), Some(1000));
    for (name, mut d) in [
        ("after a change", busy),
        ("unchanged input", quiet),
        ("tick_explained after a change", explained),
        ("tick_marked with the cache, after a change", cached),
        ("tick_in_place with the cache (the leader's call)", in_place),
    ] {
        d.sort();
        println!(
            "tick, 10,000 nodes, {name}: {} ticks, p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            d.len(),
            pct(&d, 50),
            pct(&d, 99),
            d.last().unwrap().as_secs_f64() * 1e3
        );
    }
    for (name, parts) in [("no cache", parts_fresh), ("cached", parts_cached)] {
        let line: Vec<String> = TickPart::ALL
            .iter()
            .map(|part| {
                let mut d: Vec<Duration> = parts.iter().map(|p| p[part.index()]).collect();
                d.sort();
                format!(
                    "{part:?} p50 {:.2} / p99 {:.2} ms",
                    pct(&d, 50),
                    pct(&d, 99)
                )
            })
            .collect();
        println!("tick by part, {name}: {}", line.join(", "));
    }
}

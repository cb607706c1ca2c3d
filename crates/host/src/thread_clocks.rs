//! How a thread shared the CPU, from the kernel's scheduler statistics
//! (`/proc/thread-self/schedstat`): the time it ran, and the time it was ready to run and
//! waited for a CPU. What is left of a span's wall time is waiting on something else (the
//! operator's leader: etcd's answers). On a machine shared with other work, the wait for a
//! CPU is the machine's, not the thread's code's.

use std::time::Duration;

/// The calling thread's scheduler clocks so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadClocks {
    /// Time on a CPU.
    pub ran: Duration,
    /// Time runnable but waiting for a CPU.
    pub queued: Duration,
}

impl ThreadClocks {
    /// The calling thread's clocks, or `None` where the kernel does not keep them.
    pub fn now() -> Option<ThreadClocks> {
        parse_schedstat(&std::fs::read_to_string("/proc/thread-self/schedstat").ok()?)
    }

    /// The time since `earlier`.
    pub fn since(self, earlier: ThreadClocks) -> ThreadClocks {
        ThreadClocks {
            ran: self.ran.saturating_sub(earlier.ran),
            queued: self.queued.saturating_sub(earlier.queued),
        }
    }
}

/// `schedstat`'s line: nanoseconds on a CPU, nanoseconds waiting on a run queue, time slices
/// (the third and anything after it are not read).
pub fn parse_schedstat(text: &str) -> Option<ThreadClocks> {
    let mut fields = text.split_ascii_whitespace().map(str::parse::<u64>);
    let ran = fields.next()?.ok()?;
    let queued = fields.next()?.ok()?;
    Some(ThreadClocks {
        ran: Duration::from_nanos(ran),
        queued: Duration::from_nanos(queued),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_gives_time_on_a_cpu_and_time_queued() {
        assert_eq!(
            parse_schedstat("419515429 1077800 99\n"),
            Some(ThreadClocks {
                ran: Duration::from_nanos(419_515_429),
                queued: Duration::from_nanos(1_077_800),
            })
        );
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("12"), None);
        assert_eq!(parse_schedstat("12 x 3"), None);
    }

    /// The kernel keeps them here (Linux with `CONFIG_SCHED_INFO`, as Debian's): a thread that
    /// spins is always either on a CPU or waiting for one, however loaded the machine, and a
    /// thread that sleeps is neither (but for the wait to run again once woken).
    #[test]
    fn a_spinning_thread_runs_or_waits_and_a_sleeping_one_does_neither() {
        // Whatever the clocks count lies within `outer`; the spin alone is most of it.
        let outer = std::time::Instant::now();
        let before = ThreadClocks::now().expect("/proc/thread-self/schedstat");
        let spun = std::time::Instant::now();
        while spun.elapsed() < Duration::from_millis(100) {
            std::hint::black_box(0u64);
        }
        let spin = spun.elapsed();
        let took = ThreadClocks::now().unwrap().since(before);
        let counted = took.ran + took.queued;
        assert!(took.ran > Duration::ZERO, "{took:?}");
        assert!(counted >= spin * 8 / 10, "spun {spin:?}: {took:?}");
        // The scheduler's clock is the run queue's, not the monotonic clock: under load the two
        // were seen a millisecond or two apart over 100 ms.
        let slack = Duration::from_millis(5);
        assert!(
            counted <= outer.elapsed() + slack,
            "spun {spin:?}: {took:?}"
        );

        let outer = std::time::Instant::now();
        let before = ThreadClocks::now().unwrap();
        std::thread::sleep(Duration::from_millis(200));
        let took = ThreadClocks::now().unwrap().since(before);
        assert!(
            took.ran + took.queued < outer.elapsed() / 2,
            "slept: {took:?}"
        );
    }
}

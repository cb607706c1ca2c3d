//! Signals a PID 1 is asked to stop by, read one at a time from a `signalfd(2)` instead of
//! being delivered to a handler: no `unsafe`, no async-signal-safety rules.
//!
//! The kernel drops a signal sent to PID 1 for which PID 1 has no handler, unless it is
//! blocked: a blocked signal stays pending until the signalfd reads it. The mask is per thread
//! and inherited by the threads a thread starts, so [`SignalReader::block`] must run before the
//! process starts any thread (a thread that does not block the signal could be picked to take
//! it, and would drop it). Programs PID 1 runs start with an empty mask: std's `Command`
//! clears it in the child.

use nix::sys::signal::SigSet;
use nix::sys::signalfd::{SfdFlags, SignalFd};

pub use nix::sys::signal::Signal;

use crate::error::{HostError, Result};

/// Blocked signals, read in order from a signalfd.
#[derive(Debug)]
pub struct SignalReader {
    fd: SignalFd,
}

impl SignalReader {
    /// Block `signals` in the calling thread (and so in every thread it starts from now on)
    /// and open a signalfd for them.
    pub fn block(signals: &[Signal]) -> Result<Self> {
        let mask: SigSet = signals.iter().copied().collect();
        mask.thread_block().map_err(|source| HostError::Signals {
            op: "blocking signals",
            source,
        })?;
        let fd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).map_err(|source| {
            HostError::Signals {
                op: "signalfd",
                source,
            }
        })?;
        Ok(Self { fd })
    }

    /// Like [`Self::block`], but the signalfd never waits: [`Self::pending`] polls it. For a
    /// program that must notice SIGINT/SIGTERM between steps of its own (and clean up) rather
    /// than die in the middle of one.
    pub fn block_polled(signals: &[Signal]) -> Result<Self> {
        let mask: SigSet = signals.iter().copied().collect();
        mask.thread_block().map_err(|source| HostError::Signals {
            op: "blocking signals",
            source,
        })?;
        let fd = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
            .map_err(|source| HostError::Signals {
                op: "signalfd",
                source,
            })?;
        Ok(Self { fd })
    }

    /// The next pending signal, if any, without waiting (on a [`Self::block_polled`] reader).
    pub fn pending(&mut self) -> Result<Option<Signal>> {
        loop {
            match self.fd.read_signal() {
                Ok(Some(info)) => {
                    if let Ok(signal) = Signal::try_from(info.ssi_signo as i32) {
                        return Ok(Some(signal));
                    }
                }
                Ok(None) | Err(nix::errno::Errno::EAGAIN) => return Ok(None),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(source) => {
                    return Err(HostError::Signals {
                        op: "reading the signalfd",
                        source,
                    })
                }
            }
        }
    }

    /// Wait for the next signal; its number, and the PID that sent it (0: the kernel).
    pub fn wait(&mut self) -> Result<(Signal, u32)> {
        loop {
            let info = match self.fd.read_signal() {
                Ok(Some(info)) => info,
                Ok(None) | Err(nix::errno::Errno::EINTR) => continue,
                Err(source) => {
                    return Err(HostError::Signals {
                        op: "reading the signalfd",
                        source,
                    })
                }
            };
            // The signalfd reports only signals of its mask, all of which `Signal` names.
            if let Ok(signal) = Signal::try_from(info.ssi_signo as i32) {
                return Ok((signal, info.ssi_pid));
            }
        }
    }
}

/// Turn the kernel's ctrl-alt-del off: the keys then send SIGINT to PID 1 instead of
/// restarting the machine at once, without a sync.
pub fn disable_ctrl_alt_del() -> Result<()> {
    nix::sys::reboot::set_cad_enabled(false).map_err(|source| HostError::Reboot {
        how: "disabling ctrl-alt-del",
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_polled_reader_never_waits() {
        // Its own thread, for the same reason as below.
        std::thread::spawn(|| {
            let mut reader = SignalReader::block_polled(&[Signal::SIGUSR1]).unwrap();
            assert_eq!(reader.pending().unwrap(), None);
            nix::sys::signal::raise(Signal::SIGUSR1).unwrap();
            assert_eq!(reader.pending().unwrap(), Some(Signal::SIGUSR1));
            assert_eq!(reader.pending().unwrap(), None);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_blocked_signal_waits_for_the_reader() {
        // In a thread of its own: the mask is the thread's, and the test harness's other
        // threads must keep theirs. `raise` sends to the calling thread only.
        std::thread::spawn(|| {
            let mut reader = SignalReader::block(&[Signal::SIGUSR1, Signal::SIGUSR2]).unwrap();
            nix::sys::signal::raise(Signal::SIGUSR2).unwrap();
            nix::sys::signal::raise(Signal::SIGUSR1).unwrap();
            let (first, from) = reader.wait().unwrap();
            let (second, _) = reader.wait().unwrap();
            // Pending standard signals are taken lowest number first.
            assert_eq!((first, second), (Signal::SIGUSR1, Signal::SIGUSR2));
            assert_eq!(from, std::process::id());
        })
        .join()
        .unwrap();
    }
}

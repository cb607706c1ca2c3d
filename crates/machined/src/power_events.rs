//! Shutdown and reboot asked for from outside the API: SIGTERM and SIGPWR shut the node down
//! (what `docker stop`, `lxc-stop` and UPS daemons send an init), SIGINT reboots it (the kernel
//! sends it for ctrl-alt-del once its own immediate restart is turned off), and the ACPI power
//! button shuts it down (the kernel's `button` driver makes it an input device named "Power
//! Button"; QEMU's `system_powerdown` presses it).
//!
//! Each becomes the request the API's reboot makes: the lock taken — over whatever runs, as
//! [`PriorityLock::lock_with_takeover`](slate_sequencer::PriorityLock::lock_with_takeover)
//! allows for exactly this —, the sequence run by the main loop, then the handler's teardown
//! (stop every process, unmount, sync) and the power-off or restart. The first event wins;
//! later ones are logged and ignored.

use std::fs::File;
use std::io::{ErrorKind, Read as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use slate_api::Stage;
use slate_host::{HostError, Signal, SignalReader};
use slate_sequencer::{RebootMode, SequenceKind};

use crate::base::node::{Node, Request};

/// The signals machined takes: blocked before any thread starts, read from a signalfd.
const SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGPWR, Signal::SIGINT];

/// Where the kernel lists input devices, and the name its ACPI button driver gives the power
/// button (`drivers/acpi/button.c`).
const INPUT_CLASS: &str = "/sys/class/input";
const POWER_BUTTON: &str = "Power Button";
/// The button driver is loaded by init before machined starts; this is slack for the input
/// device's registration.
const FIND_BUTTON_FOR: Duration = Duration::from_secs(10);

/// `<linux/input-event-codes.h>`.
const EV_KEY: u16 = 0x01;
const KEY_POWER: u16 = 116;
/// `struct input_event`: a `struct timeval` (two `long`s), then `__u16 type`, `__u16 code`,
/// `__s32 value`, in the machine's byte order (24 bytes on x86-64 and arm64).
const EVENT_SIZE: usize = 2 * size_of::<std::ffi::c_long>() + 8;

/// Something from outside asking the node to go down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A signal, and the PID that sent it (0: the kernel).
    Signal { signal: Signal, from: u32 },
    /// The ACPI power button was pressed.
    PowerButton,
}

/// The sequence an event asks for and how the machine goes down: a shutdown powers off, a
/// reboot restarts. `None` for a signal machined does not take.
pub fn request_for(event: Event) -> Option<(SequenceKind, RebootMode)> {
    match event {
        Event::PowerButton
        | Event::Signal {
            signal: Signal::SIGTERM | Signal::SIGPWR,
            ..
        } => Some((SequenceKind::Shutdown, RebootMode::PowerOff)),
        Event::Signal {
            signal: Signal::SIGINT,
            ..
        } => Some((SequenceKind::Reboot, RebootMode::Default)),
        Event::Signal { .. } => None,
    }
}

/// What happened, as the journal says it.
pub fn describe(event: Event) -> String {
    match event {
        Event::PowerButton => "power button pressed".into(),
        Event::Signal { signal, from } => {
            let what = match signal {
                Signal::SIGINT => "ctrl-alt-del (SIGINT)".to_string(),
                other => other.as_str().to_string(),
            };
            match from {
                0 => format!("{what} received"),
                pid => format!("{what} received from PID {pid}"),
            }
        }
    }
}

/// One `struct input_event` record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InputEvent {
    kind: u16,
    code: u16,
    value: i32,
}

/// Parse one record of [`EVENT_SIZE`] bytes.
fn parse_event(record: &[u8]) -> Option<InputEvent> {
    let tail = record.get(EVENT_SIZE - 8..)?;
    if record.len() != EVENT_SIZE {
        return None;
    }
    Some(InputEvent {
        kind: u16::from_ne_bytes([tail[0], tail[1]]),
        code: u16::from_ne_bytes([tail[2], tail[3]]),
        value: i32::from_ne_bytes([tail[4], tail[5], tail[6], tail[7]]),
    })
}

/// How many presses of the power key `bytes` (whole records, as one `read` returns them)
/// hold. Releases (value 0) and autorepeats (2) are not presses.
fn power_presses(bytes: &[u8]) -> usize {
    bytes
        .chunks_exact(EVENT_SIZE)
        .filter_map(parse_event)
        .filter(|e| e.kind == EV_KEY && e.code == KEY_POWER && e.value == 1)
        .count()
}

/// Turns events into requests, once.
#[derive(Debug)]
pub struct PowerEvents {
    node: Arc<Node>,
    going_down: AtomicBool,
}

impl PowerEvents {
    pub fn new(node: Arc<Node>) -> Self {
        Self {
            node,
            going_down: AtomicBool::new(false),
        }
    }

    /// Ask the main loop for the event's sequence, taking the lock over whatever runs. Blocks
    /// while a taken-over sequence stops (at most the lock's takeover timeout). When the lock
    /// cannot be had, or the node has already failed, the machine goes down here, without a
    /// sequence: a power button must power the machine off.
    pub fn handle(&self, event: Event) {
        let Some((kind, mode)) = request_for(event) else {
            return;
        };
        let journal = &self.node.journal;
        let what = describe(event);
        if self.going_down.swap(true, Ordering::SeqCst) {
            journal.info(format_args!("{kind}: {what} while going down; ignored"));
            return;
        }
        journal.info(format_args!("{kind}: {what}"));
        match self.node.stage() {
            Stage::Rebooting | Stage::ShuttingDown => {
                journal.info(format_args!("{kind}: the node is already going down"));
                return;
            }
            Stage::Failed => {
                journal.info(format_args!(
                    "{kind}: the node has failed; going down without a sequence"
                ));
                crate::handler::reboot(&self.node, mode)
            }
            _ => {}
        }
        let sent = self
            .node
            .lock
            .lock_with_takeover(kind)
            .map_err(|e| e.to_string())
            .and_then(|guard| self.node.request(Request::Reboot(mode, guard)));
        if let Err(err) = sent {
            journal.error(format_args!("{kind}: {err}; going down without a sequence"));
            crate::handler::reboot(&self.node, mode)
        }
    }
}

/// Block the signals machined takes. Call first thing, before any thread starts (see
/// [`SignalReader::block`]); hand the result to [`start`].
pub fn block_signals() -> Result<SignalReader, HostError> {
    SignalReader::block(&SIGNALS)
}

/// Listen for the signals (when they could be blocked) and the power button, each in a thread
/// of its own.
pub fn start(node: &Arc<Node>, signals: Result<SignalReader, HostError>) {
    let events = Arc::new(PowerEvents::new(node.clone()));
    match signals {
        Ok(reader) => {
            // Only now that SIGINT is taken: without a reader it would be dropped, and
            // ctrl-alt-del would do nothing at all.
            if let Err(err) = slate_host::disable_ctrl_alt_del() {
                node.journal.error(format_args!("{err}"));
            }
            let events = events.clone();
            spawn("signals", move || watch_signals(&events, reader));
        }
        Err(err) => node.journal.error(format_args!(
            "{err}: SIGTERM, SIGPWR and SIGINT are not handled"
        )),
    }
    spawn("power-button", move || watch_power_button(events));
}

fn spawn(name: &str, body: impl FnOnce() + Send + 'static) {
    let _ = std::thread::Builder::new().name(name.into()).spawn(body);
}

fn watch_signals(events: &PowerEvents, mut reader: SignalReader) {
    loop {
        match reader.wait() {
            Ok((signal, from)) => events.handle(Event::Signal { signal, from }),
            Err(err) => {
                events.node.journal.error(format_args!("{err}"));
                return;
            }
        }
    }
}

/// The event devices of input devices named "Power Button" under `class` (there may be two:
/// the fixed-feature button and a PNP0C0C device), as paths under /dev/input.
fn power_buttons(class: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(class) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("event"))
        .filter(|name| {
            std::fs::read_to_string(class.join(name).join("device/name"))
                .is_ok_and(|text| text.trim_end() == POWER_BUTTON)
        })
        .map(|name| Path::new("/dev/input").join(name))
        .collect();
    found.sort();
    found
}

fn watch_power_button(events: Arc<PowerEvents>) {
    let journal = &events.node.journal;
    let started = Instant::now();
    let buttons = loop {
        let found = power_buttons(Path::new(INPUT_CLASS));
        if !found.is_empty() || started.elapsed() > FIND_BUTTON_FOR {
            break found;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    if buttons.is_empty() {
        journal.info(format_args!(
            "power button: no input device named {POWER_BUTTON:?} (the `button` and `evdev` \
             modules load it); the ACPI power button is not handled"
        ));
        return;
    }
    for device in buttons {
        let events = events.clone();
        spawn("power-button", move || read_button(&events, &device));
    }
}

/// Open `device`, waiting briefly for devtmpfs to create it, and read its events until an
/// error.
fn read_button(events: &PowerEvents, device: &Path) {
    let journal = &events.node.journal;
    let started = Instant::now();
    let mut file = loop {
        match File::open(device) {
            Ok(file) => break file,
            Err(err) if err.kind() == ErrorKind::NotFound && started.elapsed().as_secs() < 2 => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(err) => {
                journal.error(format_args!(
                    "power button: opening {}: {err}",
                    device.display()
                ));
                return;
            }
        }
    };
    journal.info(format_args!("power button: watching {}", device.display()));
    // evdev returns whole records only, as many as fit.
    let mut buffer = [0u8; EVENT_SIZE * 16];
    loop {
        match file.read(&mut buffer) {
            Ok(0) => return,
            Ok(n) => {
                for _ in 0..power_presses(&buffer[..n]) {
                    events.handle(Event::PowerButton);
                }
            }
            Err(err) if err.kind() == ErrorKind::Interrupted => {}
            Err(err) => {
                journal.error(format_args!(
                    "power button: reading {}: {err}",
                    device.display()
                ));
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u16, code: u16, value: i32) -> Vec<u8> {
        let mut bytes = vec![0x5a; EVENT_SIZE - 8]; // the timestamp: not read
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(&code.to_ne_bytes());
        bytes.extend_from_slice(&value.to_ne_bytes());
        bytes
    }

    fn signal(signal: Signal) -> Event {
        Event::Signal { signal, from: 0 }
    }

    #[test]
    #[cfg(all(target_pointer_width = "64", target_endian = "little"))]
    fn parses_a_power_key_press_as_the_kernel_writes_it() {
        // tv_sec 1700000000, tv_usec 250000, EV_KEY, KEY_POWER, 1 (x86-64).
        let bytes = [
            0x00, 0xf1, 0x53, 0x65, 0, 0, 0, 0, 0x90, 0xd0, 0x03, 0, 0, 0, 0, 0, 0x01, 0x00, 0x74,
            0x00, 0x01, 0x00, 0x00, 0x00,
        ];
        assert_eq!(EVENT_SIZE, 24);
        assert_eq!(
            parse_event(&bytes),
            Some(InputEvent {
                kind: EV_KEY,
                code: KEY_POWER,
                value: 1
            })
        );
        assert_eq!(power_presses(&bytes), 1);
    }

    #[test]
    fn counts_presses_not_releases_repeats_syncs_or_other_keys() {
        let mut bytes = Vec::new();
        for (kind, code, value) in [
            (EV_KEY, KEY_POWER, 1),
            (0, 0, 0), // EV_SYN
            (EV_KEY, KEY_POWER, 2),
            (EV_KEY, KEY_POWER, 0),
            (0, 0, 0),
            (EV_KEY, 142, 1),     // KEY_SLEEP
            (0x04, KEY_POWER, 1), // EV_MSC
            (EV_KEY, KEY_POWER, 1),
        ] {
            bytes.extend(record(kind, code, value));
        }
        assert_eq!(power_presses(&bytes), 2);
        assert_eq!(power_presses(&[]), 0);
        // A short or long record is not a record.
        let one = record(EV_KEY, KEY_POWER, 1);
        assert_eq!(parse_event(&one[..EVENT_SIZE - 1]), None);
        assert_eq!(parse_event(&[one.clone(), vec![0]].concat()), None);
        assert_eq!(power_presses(&one[..EVENT_SIZE - 1]), 0);
    }

    #[test]
    fn signals_and_the_button_map_to_shutdown_or_reboot() {
        let shutdown = Some((SequenceKind::Shutdown, RebootMode::PowerOff));
        assert_eq!(request_for(signal(Signal::SIGTERM)), shutdown);
        assert_eq!(request_for(signal(Signal::SIGPWR)), shutdown);
        assert_eq!(request_for(Event::PowerButton), shutdown);
        assert_eq!(
            request_for(signal(Signal::SIGINT)),
            Some((SequenceKind::Reboot, RebootMode::Default))
        );
        assert_eq!(request_for(signal(Signal::SIGHUP)), None);
        for taken in SIGNALS {
            assert!(request_for(signal(taken)).is_some(), "{taken}");
        }
        assert_eq!(describe(Event::PowerButton), "power button pressed");
        assert_eq!(describe(signal(Signal::SIGTERM)), "SIGTERM received");
        assert_eq!(
            describe(Event::Signal {
                signal: Signal::SIGINT,
                from: 0
            }),
            "ctrl-alt-del (SIGINT) received"
        );
        assert_eq!(
            describe(Event::Signal {
                signal: Signal::SIGPWR,
                from: 42
            }),
            "SIGPWR received from PID 42"
        );
    }

    fn journal_lines(node: &Node) -> Vec<String> {
        node.journal.read_from(0, None).0
    }

    #[test]
    fn sigterm_asks_the_main_loop_to_power_off_once() {
        let (node, requests) = Node::for_tests("");
        let events = PowerEvents::new(node.clone());
        events.handle(signal(Signal::SIGTERM));
        let Ok(Request::Reboot(mode, guard)) = requests.try_recv() else {
            panic!("expected a power-off request");
        };
        assert_eq!(mode, RebootMode::PowerOff);
        assert_eq!(guard.kind(), SequenceKind::Shutdown);
        // A second signal, or the button, while going down: logged, nothing asked.
        events.handle(signal(Signal::SIGTERM));
        events.handle(Event::PowerButton);
        assert!(requests.try_recv().is_err());
        assert_eq!(
            journal_lines(&node),
            [
                "shutdown: SIGTERM received",
                "shutdown: SIGTERM received while going down; ignored",
                "shutdown: power button pressed while going down; ignored",
            ]
        );
    }

    #[test]
    fn the_power_button_takes_over_a_running_sequence() {
        let (node, requests) = Node::for_tests("");
        // An upgrade holds the lock; the API's reboot would be refused as locked.
        let upgrade = node.lock.try_lock(SequenceKind::Upgrade).unwrap();
        assert!(node.lock.try_lock(SequenceKind::Reboot).is_err());
        let cancelled = upgrade.token().clone();
        let pressed = std::thread::spawn({
            let node = node.clone();
            move || PowerEvents::new(node).handle(Event::PowerButton)
        });
        // The takeover cancels the upgrade and waits for it to let go.
        let started = Instant::now();
        while !cancelled.is_cancelled() {
            assert!(started.elapsed() < Duration::from_secs(10), "not cancelled");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(upgrade);
        pressed.join().unwrap();
        let Ok(Request::Reboot(mode, guard)) = requests.try_recv() else {
            panic!("expected a power-off request");
        };
        assert_eq!(
            (mode, guard.kind()),
            (RebootMode::PowerOff, SequenceKind::Shutdown)
        );
        assert_eq!(journal_lines(&node), ["shutdown: power button pressed"]);
    }

    #[test]
    fn ctrl_alt_del_reboots_and_a_node_going_down_is_left_to_it() {
        let (node, requests) = Node::for_tests("");
        PowerEvents::new(node.clone()).handle(signal(Signal::SIGINT));
        let Ok(Request::Reboot(mode, guard)) = requests.try_recv() else {
            panic!("expected a reboot request");
        };
        assert_eq!(
            (mode, guard.kind()),
            (RebootMode::Default, SequenceKind::Reboot)
        );
        drop(guard);

        let (node, requests) = Node::for_tests("");
        node.set_stage(Stage::Rebooting);
        PowerEvents::new(node.clone()).handle(Event::PowerButton);
        assert!(requests.try_recv().is_err());
        assert!(
            journal_lines(&node).contains(&"shutdown: the node is already going down".to_string())
        );
    }

    #[test]
    fn finds_power_buttons_by_their_input_device_name() {
        let class = tempfile::tempdir().unwrap();
        for (entry, name) in [
            ("event0", "Power Button\n"),
            ("event1", "AT Translated Set 2 keyboard\n"),
            ("event2", "Power Button\n"),
            ("input0", "Power Button\n"),
        ] {
            let device = class.path().join(entry).join("device");
            std::fs::create_dir_all(&device).unwrap();
            std::fs::write(device.join("name"), name).unwrap();
        }
        std::fs::create_dir_all(class.path().join("event3")).unwrap(); // no name
        assert_eq!(
            power_buttons(class.path()),
            [
                PathBuf::from("/dev/input/event0"),
                PathBuf::from("/dev/input/event2")
            ]
        );
        assert!(power_buttons(&class.path().join("absent")).is_empty());
    }
}

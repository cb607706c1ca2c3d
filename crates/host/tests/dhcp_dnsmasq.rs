//! machined's DHCP client against a real server: dnsmasq on one end of a veth pair, the client
//! on the other, both in a network namespace of the test's own (root). The lease is then set
//! with the same calls machined makes, and read back with `ip`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sched::{unshare, CloneFlags};
use slate_dhcp::{obtain_lease, Exchange};
use slate_host::{
    add_default_route, hardware_address, ipv4_addresses, set_ipv4_address, set_link_up,
    DhcpTransport,
};
use slate_testkit::sh;

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_lease_from_dnsmasq_is_obtained_and_set() {
    if !slate_testkit::require_root()
        || !slate_testkit::require_tool("dnsmasq")
        || !slate_testkit::require_tool("ip")
        || !slate_testkit::require_tool("nsenter")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let leases = dir.path().join("leases");
    let log = dir.path().join("dnsmasq.log");
    // A thread of its own: a network namespace belongs to the thread that unshares it, and
    // what it spawns starts in it. The server gets a namespace of its own too, as on a real
    // network: its address must be neither a source nor a gateway the client already has.
    std::thread::spawn(move || {
        unshare(CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
        let server_ns = Killed(
            Command::new("unshare")
                .args(["--net", "sleep", "600"])
                .spawn()
                .expect("starting the server's namespace"),
        );
        let ns = format!("/proc/{}/ns/net", server_ns.0.id());
        let ours = std::fs::read_link("/proc/thread-self/ns/net").unwrap();
        while std::fs::read_link(&ns)
            .ok()
            .is_none_or(|theirs| theirs == ours)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let pid = server_ns.0.id().to_string();
        sh(
            "ip",
            &[
                "link", "add", "client0", "type", "veth", "peer", "name", "server0", "netns", &pid,
            ],
        );
        let in_server_ns = |program: &str| {
            let mut command = Command::new("nsenter");
            command.arg(format!("--net={ns}")).arg(program);
            command
        };
        for args in [
            &["addr", "add", "192.168.77.1/24", "dev", "server0"][..],
            &["link", "set", "server0", "up"],
        ] {
            let status = in_server_ns("ip").args(args).status().unwrap();
            assert!(status.success(), "ip {args:?} in the server's namespace");
        }
        let _server = Killed(
            in_server_ns("dnsmasq")
                .args([
                    "--no-daemon",
                    "--conf-file=/dev/null",
                    "--port=0",
                    "--interface=server0",
                    "--bind-interfaces",
                    "--dhcp-range=192.168.77.50,192.168.77.59,255.255.255.0,1h",
                    "--dhcp-option=option:router,192.168.77.1",
                    "--dhcp-option=option:dns-server,192.168.77.53",
                    "--pid-file=",
                ])
                .arg(format!("--dhcp-leasefile={}", leases.display()))
                .arg("--log-dhcp")
                .arg(format!("--log-facility={}", log.display()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("starting dnsmasq"),
        );
        set_link_up("client0").unwrap();
        let mac = hardware_address("client0").unwrap();
        let transport = DhcpTransport::open("client0").unwrap();
        // dnsmasq may still be starting, and it probes an address (ARP, 3 s) before it
        // offers it: the first DISCOVERs go unanswered.
        let waits = [Duration::from_millis(500); 16];
        let lease =
            obtain_lease(&transport, Exchange { xid: 0x5eed, mac }, &waits).unwrap_or_else(|e| {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("no lease from dnsmasq: {e}\ndnsmasq's log:\n{log}")
            });
        let octets = lease.address.octets();
        assert_eq!(octets[..3], [192, 168, 77], "{lease:?}");
        assert!((50..=59).contains(&octets[3]), "{lease:?}");
        assert_eq!(lease.prefix_len, 24);
        assert_eq!(lease.router, Some([192, 168, 77, 1].into()));
        assert_eq!(lease.dns, [std::net::Ipv4Addr::new(192, 168, 77, 53)]);
        assert_eq!(lease.server, std::net::Ipv4Addr::new(192, 168, 77, 1));
        assert_eq!(lease.lease_secs, Some(3600));
        let mac_text = mac.map(|b| format!("{b:02x}")).join(":");
        let recorded = std::fs::read_to_string(&leases).unwrap();
        assert!(
            recorded.contains(&format!("{mac_text} {}", lease.address)),
            "dnsmasq's leases: {recorded}"
        );

        set_ipv4_address("client0", lease.address, lease.prefix_len).unwrap();
        add_default_route("client0", lease.router.unwrap()).unwrap();
        // Again, as a second boot's task would after maintenance mode: already there is fine.
        add_default_route("client0", lease.router.unwrap()).unwrap();
        assert_eq!(
            ipv4_addresses("client0").unwrap(),
            [format!("{}/24", lease.address)]
        );
        let routes = sh("ip", &["-4", "route", "show", "dev", "client0"]);
        assert!(routes.contains("default via 192.168.77.1"), "{routes}");
        assert!(routes.contains("192.168.77.0/24"), "{routes}");
    })
    .join()
    .unwrap();
}

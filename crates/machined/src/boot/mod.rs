//! The boot layer: machined's sequences ([`sequences`]: Initialize, Install, Boot, Reboot,
//! Shutdown, Reset; [`upgrade`]: Upgrade and its staged form) and the tasks they run — the
//! volumes, the machine configuration and its apply, /etc, the network, maintenance mode, the
//! replacement of data partitions, the random seed, the watchdog, health checks and Secure Boot
//! checks. Imports `settle` and `base`, never the top (API backend, agent, handler).

pub mod boot_config;
pub mod drain;
pub mod etc;
pub mod facts;
pub mod health;
pub mod machine;
pub mod maintenance;
pub mod network;
pub mod random_seed;
pub mod replace;
pub mod secure_boot;
pub mod sequences;
pub mod services;
pub mod snapshot_volumes;
pub mod under_systemd;
pub mod upgrade;
pub mod volumes;
pub mod watchdog;

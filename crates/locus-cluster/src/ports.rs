//! Loopback ports chosen before their server binds them (the members of a group must
//! know each other's addresses before any starts).
//!
//! A port taken from the kernel with a bind to port 0 lies in its ephemeral range, from
//! which it also picks the source port of every outgoing connection: between the pick
//! and the server's bind, a member's connection to another could take it ("Address
//! already in use", seen in CI). So the port comes from below that range, where no
//! connection's source port falls, never the same one twice in this process. The e2e
//! suite's `free_port` draws from the same range for the same reason.

use std::collections::BTreeSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use locus_common::{Error, Result};

/// The lowest port handed out.
const LOW: u16 = 10_000;
/// The highest, if the ephemeral range starts above it.
const HIGH: u16 = 32_000;

static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// The first port of the kernel's ephemeral range (Linux's default where it cannot be read).
fn ephemeral_floor() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A free `127.0.0.1:PORT` below the ephemeral range, not handed out before by this process.
pub fn free_address() -> Result<String> {
    let high = HIGH.min(ephemeral_floor()).max(LOW + 1_000);
    let span = u64::from(high - LOW);
    let start = RandomState::new().hash_one(std::process::id()) % span;
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..span {
        // In range: `(start + i) % span` is below `span`, itself below `high - LOW`.
        let port = LOW + u16::try_from((start + i) % span).unwrap_or(0);
        if given.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.insert(port);
            return Ok(format!("127.0.0.1:{port}"));
        }
    }
    Err(Error::io(
        "pick a free port",
        std::io::Error::new(std::io::ErrorKind::AddrInUse, format!("every port from {LOW} to {high} is taken")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_free_and_never_repeated() {
        let floor = ephemeral_floor();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..200 {
            let a = free_address().unwrap();
            let port: u16 = a.rsplit(':').next().unwrap().parse().unwrap();
            assert!((LOW..floor.max(LOW + 1_000)).contains(&port), "{a}");
            assert!(seen.insert(port), "{a} handed out twice");
            std::net::TcpListener::bind(&a).unwrap();
        }
    }
}

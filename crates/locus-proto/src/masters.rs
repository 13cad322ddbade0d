//! A caller's view of its masters (one, or the members of a group): a client of each it
//! knows, and the one that led last, which calls go to first. A member that does not
//! lead names the leader; the caller follows it, adding a master it was not given.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use locus_common::security::Identity;
use locus_common::{Error, Result};

use crate::auth::AuthedMasterClient;
use crate::tls::Tls;

pub struct Masters {
    list: parking_lot::RwLock<Vec<(String, AuthedMasterClient)>>,
    leader: AtomicUsize,
    identity: Identity,
    tls: Tls,
    /// Each call's time limit.
    timeout: Duration,
}

impl Masters {
    /// Clients of the masters `addresses` lists (`host:port`, comma-separated), proving
    /// `identity`, each call limited to `timeout`. Connects lazily; empty when it lists none.
    pub fn new(addresses: &str, identity: Identity, tls: Tls, timeout: Duration) -> Result<Masters> {
        let mut list = Vec::new();
        let addrs: Vec<&str> = addresses.split(',').map(str::trim).filter(|a| !a.is_empty()).collect();
        let group = addrs.len() > 1;
        for addr in addrs {
            list.push((addr.to_string(), connect(addr, &identity, &tls, timeout, group)?));
        }
        Ok(Masters { list: parking_lot::RwLock::new(list), leader: AtomicUsize::new(0), identity, tls, timeout })
    }

    pub fn is_empty(&self) -> bool {
        self.list.read().is_empty()
    }

    /// How many masters it knows.
    pub fn len(&self) -> usize {
        self.list.read().len()
    }

    /// The master calls go to now: its index, address and client.
    pub fn current(&self) -> (usize, String, AuthedMasterClient) {
        let list = self.list.read();
        let i = self.leader.load(Relaxed) % list.len();
        (i, list[i].0.clone(), list[i].1.clone())
    }

    /// Every master but the one calls go to now: their addresses and clients.
    pub fn others(&self) -> Vec<(String, AuthedMasterClient)> {
        let list = self.list.read();
        let i = self.leader.load(Relaxed) % list.len().max(1);
        list.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, m)| m.clone()).collect()
    }

    /// After master `i` refused a call naming `leader` ("" for none): calls go to the
    /// leader named (a master of the group not known yet is added), else to the next.
    pub fn follow(&self, i: usize, leader: &str) {
        let mut list = self.list.write();
        let mut next = list.iter().position(|(a, _)| a == leader);
        if next.is_none()
            && !leader.is_empty()
            && let Ok(c) = connect(leader, &self.identity, &self.tls, self.timeout, true)
        {
            list.push((leader.to_string(), c));
            next = Some(list.len() - 1);
        }
        self.leader.store(next.unwrap_or((i + 1) % list.len()), Relaxed);
    }
}

/// The pause after a round of the masters in which none took a call. It doubles from
/// 50 ms, up to 1 s with one master (a restart takes seconds) and up to 200 ms with a
/// group, whose election ends well within a second (`locus-master`'s raft timers): a
/// caller pausing a whole second would add most of it to every failover.
#[derive(Debug, Clone)]
pub struct Pause {
    next: Duration,
    most: Duration,
}

impl Pause {
    /// The pauses of a caller of `masters` masters.
    pub fn new(masters: usize) -> Pause {
        let most = if masters > 1 { Duration::from_millis(200) } else { Duration::from_secs(1) };
        Pause { next: Duration::from_millis(50), most }
    }

    /// The pause to take now (the next one is longer).
    pub fn take(&mut self) -> Duration {
        let now = self.next;
        self.next = (now * 2).min(self.most);
        now
    }
}

/// How often a caller of a group pings each master it is connected to, and how long it
/// waits for the answer. A member that stopped (SIGSTOP) or was cut off still holds its
/// connections open: without the ping, a call to it would wait for its whole time limit
/// (`rpc_timeout`, 30 s); with it, the connection fails within 3 s and the call goes to
/// the next member (a call that may not go twice fails as before).
const PING_EVERY: Duration = Duration::from_secs(1);
const PING_WAIT: Duration = Duration::from_secs(2);

/// A client of the master at `addr`, proving `identity`; pinged when it is a `group`'s
/// member.
fn connect(addr: &str, identity: &Identity, tls: &Tls, timeout: Duration, group: bool) -> Result<AuthedMasterClient> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| Error::invalid(format!("bad master address {addr:?}: {e}")))?
        .connect_timeout(Duration::from_secs(3))
        .timeout(timeout);
    if group {
        endpoint = endpoint.http2_keep_alive_interval(PING_EVERY).keep_alive_timeout(PING_WAIT);
    }
    let ch = tls.master_channel(addr, endpoint);
    Ok(crate::auth::master_client_as(ch, identity.clone()).max_decoding_message_size(64 << 20))
}

#[cfg(test)]
mod tests {
    use super::Pause;
    use std::time::Duration;

    #[test]
    fn a_group_pauses_at_most_200_ms_and_one_master_a_second() {
        let ms = |p: &mut Pause| (0..8).map(|_| p.take().as_millis()).collect::<Vec<_>>();
        assert_eq!(ms(&mut Pause::new(3)), [50, 100, 200, 200, 200, 200, 200, 200]);
        assert_eq!(ms(&mut Pause::new(1)), [50, 100, 200, 400, 800, 1000, 1000, 1000]);
        assert_eq!(Pause::new(2).take(), Duration::from_millis(50));
    }
}

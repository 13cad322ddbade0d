//! What a worker checks before it acts for a caller: the caller's role against the
//! data path's table (`locus_proto::roles`), the master's grant on every write, every
//! UFS path it is sent, a read-only mount before any UFS write, and the address of
//! every member it dials (resolved by id through the master's registry, never taken
//! from a request).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use locus_common::security::Role;
use locus_common::{Error, ErrorKind, Result};
use locus_proto::pb::data_request::Req;
use locus_proto::{from_status, pb};
use locus_ufs::Ufs;

use crate::Inner;

/// A mount as this worker holds it: its UFS, and whether it is read-only.
#[derive(Clone)]
pub(crate) struct MountUfs {
    ufs: Ufs,
    readonly: bool,
    fetched: Instant,
}

/// How long a mount's description is kept before the master is asked again (an
/// unmounted mount stops being served within it).
const MOUNT_TTL: Duration = Duration::from_secs(60);

/// What a UFS access will do.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Access {
    Read,
    Write,
}

/// How long the member list fetched from the master is trusted for a lookup that finds
/// its id (one that does not refetches at once, at most every [`MEMBERS_RETRY`]; a
/// member that does not answer at its address is forgotten at once).
const MEMBERS_TTL: Duration = Duration::from_secs(30);
const MEMBERS_RETRY: Duration = Duration::from_millis(500);

/// The most further workers a write's pipeline may name.
const MAX_PIPELINE: usize = 16;

/// The registered workers: id → data address, and when the list was fetched.
#[derive(Default)]
pub(crate) struct Members {
    addrs: HashMap<u64, String>,
    fetched: Option<Instant>,
}

impl Inner {
    /// Whether `role` may send `req` on this port (`uds`: the Unix socket), and for a
    /// write whether the master granted it. Refusals are logged with `peer`.
    pub(crate) fn authorize(&self, role: Role, req: &Req, uds: bool, peer: &str) -> Result<()> {
        let Some(allowed) = locus_proto::roles::data_request(req, uds) else {
            return Ok(()); // not served on this port: the dispatch answers that
        };
        let kind = request_name(req);
        if !allowed.contains(&role) {
            tracing::warn!(peer, request = kind, %role, "refused a data-path request its caller's role may not send");
            return Err(Error::new(ErrorKind::PermissionDenied, format!("a {role} may not send {kind} requests")));
        }
        let read = match req {
            Req::Read(r) => Some(r),
            Req::Compute(c) => c.block.as_ref(),
            _ => None,
        };
        if let Some(r) = read {
            self.check_ticket(r, peer)?;
        }
        if let Req::Write(w) = req {
            self.check_pipeline(&w.pipeline)?;
            if !self.verifier.check_grant(w.mount_id, &w.ufs_path, w.version, &w.grant) {
                tracing::warn!(peer, path = %w.ufs_path, "refused a write the master did not grant");
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "no valid grant from the master to write {:?} (create the file at the master first)",
                        w.ufs_path
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A read that may fill its block from the UFS names the origin the master bound to
    /// the block id (its ticket): otherwise a client could cache another file's bytes, or
    /// a range of its choosing, under a block id others read. A read of an unpersisted
    /// file never touches the UFS and needs none.
    fn check_ticket(&self, r: &pb::ReadBlockRequest, peer: &str) -> Result<()> {
        if r.fingerprint == locus_common::UNPERSISTED_FINGERPRINT || self.verifier.check_ticket(&r.origin(), &r.ticket)
        {
            return Ok(());
        }
        tracing::warn!(peer, block = r.block_id, path = %r.ufs_path, "refused a read whose block origin the master did not sign");
        Err(Error::new(
            ErrorKind::PermissionDenied,
            format!(
                "block {} of {:?}: no valid ticket from the master (read the file's status with its blocks first)",
                r.block_id, r.ufs_path
            ),
        ))
    }

    /// A write's further workers: each one member at most once, never this worker, and
    /// no more than [`MAX_PIPELINE`] (each hop dials the next: a list that names one
    /// worker again and again would have it dial itself without end).
    fn check_pipeline(&self, pipeline: &[pb::WorkerAddress]) -> Result<()> {
        let me = self.id.load(std::sync::atomic::Ordering::Relaxed);
        let mut seen = std::collections::HashSet::new();
        let ok =
            pipeline.len() <= MAX_PIPELINE && pipeline.iter().all(|w| w.worker_id != me && seen.insert(w.worker_id));
        match ok {
            true => Ok(()),
            false => Err(Error::invalid(format!(
                "a write's pipeline names each other worker at most once, and at most {MAX_PIPELINE} of them"
            ))),
        }
    }

    /// A mount as the master describes it (asked again after [`MOUNT_TTL`]).
    async fn mount(&self, mount_id: u64) -> Result<MountUfs> {
        let kept = self.ufs.lock().get(&mount_id).cloned();
        if let Some(m) = kept.as_ref().filter(|m| m.fetched.elapsed() < MOUNT_TTL) {
            return Ok(m.clone());
        }
        let got = self.call(|mut m| async move { m.get_mount(pb::GetMountRequest { mount_id }).await }).await;
        let info = match got.map_err(from_status) {
            Ok(r) => r,
            // A master away for a moment does not stop what this worker serves.
            Err(e) => return kept.filter(|_| e.kind() == ErrorKind::Unavailable).ok_or(e),
        };
        let opts = info.options.into_iter().collect();
        locus_ufs::check_mount_target(&info.uri, &opts, &self.protected)?;
        let m = MountUfs {
            ufs: Ufs::new(&info.uri, &opts, Duration::from_secs(60))?,
            readonly: info.readonly,
            fetched: Instant::now(),
        };
        self.ufs.lock().insert(mount_id, m.clone());
        Ok(m)
    }

    /// The UFS of mount `mount_id` for an access to `ufs_path`: refused unless the path
    /// is one below the mount's root that the UFS can hold, and for a write unless the
    /// mount is writable. Every UFS access of this worker goes through here.
    pub(crate) async fn ufs_at(&self, mount_id: u64, ufs_path: &str, access: Access) -> Result<Ufs> {
        locus_common::path::check_ufs_rel(ufs_path)?;
        let m = self.mount(mount_id).await?;
        m.ufs.check_name(ufs_path, false)?;
        if access == Access::Write && m.readonly {
            tracing::warn!(mount_id, path = ufs_path, "refused a UFS write to a read-only mount");
            return Err(Error::new(ErrorKind::PermissionDenied, format!("mount {mount_id} is read-only")));
        }
        Ok(m.ufs)
    }

    /// The data address the master registered for worker `id`. A request names members
    /// by id only: an address in it is never dialed (this worker presents a proof there).
    pub(crate) async fn member_address(&self, id: u64) -> Result<String> {
        {
            let m = self.members.lock();
            let fresh = m.fetched.is_some_and(|t| t.elapsed() < MEMBERS_TTL);
            let recent = m.fetched.is_some_and(|t| t.elapsed() < MEMBERS_RETRY);
            match m.addrs.get(&id) {
                Some(a) if fresh => return Ok(a.clone()),
                None if recent => return Err(not_a_member(id)),
                _ => {}
            }
        }
        let list =
            self.call(|mut m| async move { m.get_workers(pb::Empty {}).await }).await.map_err(from_status)?.workers;
        let mut m = self.members.lock();
        m.addrs = list.into_iter().map(|w| (w.worker_id, w.data_address)).collect();
        m.fetched = Some(Instant::now());
        m.addrs.get(&id).cloned().ok_or_else(|| not_a_member(id))
    }
}

impl Inner {
    /// Drop what is known of member `id`'s address (it did not answer there: it may have
    /// restarted at another), so the next dial asks the master again.
    pub(crate) fn forget_member(&self, id: u64) {
        self.members.lock().addrs.remove(&id);
    }
}

#[cfg(test)]
impl Inner {
    /// Serve mount `id` from `ufs`, writable, without asking the master.
    pub(crate) fn serve_mount(&self, id: u64, ufs: Ufs) {
        self.ufs.lock().insert(id, MountUfs { ufs, readonly: false, fetched: Instant::now() });
    }

    /// Know member `id` at `addr` (and no other), without asking the master.
    pub(crate) fn know_member(&self, id: u64, addr: &str) {
        let mut m = self.members.lock();
        m.addrs = HashMap::from([(id, addr.to_string())]);
        m.fetched = Some(Instant::now());
    }
}

fn not_a_member(id: u64) -> Error {
    Error::unavailable(format!("worker {id} is not a live member of this cluster"))
}

/// A request's kind, for logs and errors.
fn request_name(req: &Req) -> &'static str {
    match req {
        Req::Read(_) => "read",
        Req::Lease(_) => "lease",
        Req::Write(_) => "write",
        Req::Hello(_) => "hello",
        Req::Persist(_) => "persist",
        Req::Replicate(_) => "replicate",
        Req::Auth(_) => "auth",
        Req::Compute(_) => "compute",
        Req::Fragment(_) => "fragment",
        Req::LeaseEnd(_) => "lease-end",
        Req::BlockWritten(_) => "block-written",
    }
}

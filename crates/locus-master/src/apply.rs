//! The namespace's changes as typed commands ([`pb::Command`]; docs/design/ha-plan.md,
//! stage 1). [`Namespace::apply`] makes one inside a change's transaction, reading only
//! the transaction and the command: its time, and the mount's and the config's values
//! the change needs, travel in it. One command stream applied to two stores that agree
//! leaves them agreeing, which a replicated log asks of it (a test holds it to that).
//!
//! One file, about 800 lines: every durable change the namespace knows, side by side, so
//! that what each command does to the tables is read in one place.
//!
//! This module must not reach the [`crate::Master`]: not the worker registry, the
//! mounts' UFS handles, the config, the persist scheduler or the clock. What a change
//! leaves to them goes into its [`Effects`].

use locus_common::{Error, ErrorKind, Result, UNPERSISTED_FINGERPRINT};
use locus_proto::pb::{self, command::Op};
use locus_ufs::UfsStatus;
use prost::Message;
use redb::{ReadableTable, ReadableTableMetadata, WriteTransaction};

use crate::is_persisted;
use crate::namespace::{Effects, Namespace, put_inode};
use crate::store::*;

impl Namespace {
    /// Make the change `cmd` describes inside `w`, leaving what follows it in `fx`. May
    /// run more than once for one command (when another change of its group fails).
    pub(crate) fn apply(&self, w: &WriteTransaction, cmd: &pb::Command, fx: &mut Effects) -> Result<pb::CommandResult> {
        let id = cmd.request_id.as_slice();
        if !id.is_empty()
            && let Some(first) = retried(w, id)?
        {
            // A resend of a call whose change committed: its effects are carried out.
            return Ok(first);
        }
        let r = self.apply_op(w, cmd, fx)?;
        if !id.is_empty() {
            // A resend of a namespace change answers only that it was made: its entry is
            // not kept (the cache holds each result 10 minutes).
            let kept = match cmd.op {
                Some(Op::Mkdir(_) | Op::Delete(_) | Op::Rename(_)) => done(),
                _ => r.clone(),
            };
            remember(w, id, cmd.now_ms, &kept)?;
        }
        Ok(r)
    }

    fn apply_op(&self, w: &WriteTransaction, cmd: &pb::Command, fx: &mut Effects) -> Result<pb::CommandResult> {
        let now = cmd.now_ms;
        match cmd.op.as_ref().ok_or_else(|| Error::invalid("a namespace command without an operation"))? {
            Op::OpenWrite(c) => self.open_write(w, c, now),
            Op::QueuePersist(c) => queue_persist(w, c, now, fx),
            Op::SetReplication(c) => set_replication(w, c),
            Op::SetObjectMeta(c) => set_object_meta(w, c, now, fx),
            Op::SetPinned(c) => self.set_pinned(w, c),
            Op::DateBuckets(c) => date_buckets(w, c, now),
            Op::AddMount(c) => self.add_mount(w, c, now),
            Op::RemoveMount(c) => self.remove_mount(w, c, fx),
            Op::RemoveOp(c) => remove_op(w, c.seq).map(|()| done()),
            Op::OpDone(c) => op_done(w, c),
            Op::MetaRewritten(c) => meta_rewritten(w, c, now),
            Op::ReapWrites(c) => self.reap_writes(w, c, fx),
            Op::GiveUpOp(c) => give_up_op(w, c, now),
            Op::ResolveFailures(c) => resolve_failures(w, c),
            Op::CompleteFile(c) => self.complete_file(w, c, now, fx),
            Op::Persisted(c) => self.persisted(w, c, now, fx),
            Op::SetLost(c) => set_lost(w, c, now, fx),
            Op::RegisterWorker(c) => register_worker(w, c),
            Op::Mkdir(c) => self.mkdir(w, c, now, fx),
            Op::Delete(c) => self.delete(w, c, now, fx),
            Op::Rename(c) => rename(w, c, now, fx),
            Op::SyncFile(c) => self.sync_file(w, c, now, fx),
            Op::LoadEntry(c) => self.load_entry(w, c, now, fx),
            Op::MergeListing(c) => self.merge_listing(w, c, fx),
            Op::FinishListing(c) => self.finish_listing(w, c, fx),
        }
    }

    fn open_write(&self, w: &WriteTransaction, c: &pb::OpenWrite, now: i64) -> Result<pb::CommandResult> {
        let version = next_id(w, "version", 1)?;
        w.open_table(VERSIONS).map_err(db_err)?.insert(version, 0).map_err(db_err)?;
        w.open_table(PENDING_WRITES).map_err(db_err)?.insert(version, now).map_err(db_err)?;
        if c.pin {
            w.open_table(PINNED).map_err(db_err)?.insert(version, ()).map_err(db_err)?;
            self.bump_pin_epoch(w)?;
        }
        Ok(pb::CommandResult { id: version, pin_epoch: pin_epoch(w)?, ..done() })
    }

    /// Record a written file (see `Master::complete_file`), replacing an older version.
    fn complete_file(
        &self,
        w: &WriteTransaction,
        c: &pb::CompleteFile,
        now: i64,
        fx: &mut Effects,
    ) -> Result<pb::CommandResult> {
        let req = c.req.as_ref().ok_or_else(|| Error::invalid("a completion without its request"))?;
        let path = &c.path;
        let version = if req.version == 0 {
            next_id(w, "version", 1)?
        } else {
            if w.open_table(PENDING_WRITES).map_err(db_err)?.remove(req.version).map_err(db_err)?.is_none() {
                return Err(Error::new(
                    ErrorKind::FailedPrecondition,
                    format!("the write of {path} is unknown or was abandoned (see master.abandoned_write_timeout)"),
                ));
            }
            req.version
        };
        if !is_dir(w, c.parent_id)? {
            return Err(Error::not_found(format!("the directory of {path} was deleted")));
        }
        let existing = get_child(&w.open_table(CHILDREN).map_err(db_err)?, c.parent_id, &c.name)?;
        let mut rec = match existing {
            Some(id) => {
                let mut old = load_inode(w, id)?.ok_or_else(|| Error::internal("dangling child"))?;
                if old.is_dir {
                    return Err(Error::new(ErrorKind::IsADirectory, format!("{path} is a directory")));
                }
                self.drop_version(w, &old, fx)?;
                old.ufs_older |= is_persisted(&old);
                old
            }
            None => self.new_inode(w, c.parent_id, &c.name, false, 0, String::new(), now, now, Some(version))?,
        };
        rec.version = version;
        w.open_table(VERSIONS).map_err(db_err)?.insert(version, rec.id).map_err(db_err)?;
        rec.length = req.length;
        rec.block_size = c.block_size;
        rec.mtime_ms = if req.mtime_ms > 0 { req.mtime_ms } else { now };
        rec.meta = req.meta.clone().filter(|m| *m != pb::ObjectMeta::default());
        rec.synced_ms = now;
        match req.write_type() {
            pb::WriteType::AsyncThrough => {
                rec.fingerprint = UNPERSISTED_FINGERPRINT.into();
                rec.set_persist_state(pb::PersistState::ToBePersisted);
                let mut op = persist_op(&rec, c.mount_id, &c.ufs_path, path);
                if req.persist_wait_ms > 0 {
                    op.not_before_ms = now + req.persist_wait_ms.min(i64::MAX as u64 / 2) as i64;
                }
                fx.ops.push(enqueue(w, op, now)?);
            }
            pb::WriteType::MustCache => {
                rec.fingerprint = UNPERSISTED_FINGERPRINT.into();
                rec.set_persist_state(pb::PersistState::NotPersisted);
            }
            // THROUGH, CACHE_THROUGH: the bytes are in the UFS.
            _ => {
                let st = UfsStatus {
                    path: c.name.clone(),
                    is_dir: false,
                    length: req.length,
                    etag: req.etag.clone(),
                    mtime_ms: req.mtime_ms,
                };
                rec.fingerprint = st.fingerprint();
                rec.set_persist_state(pb::PersistState::Persisted);
                // Pinned at create for an ASYNC_THROUGH write that went through instead.
                if w.open_table(PINNED).map_err(db_err)?.remove(version).map_err(db_err)?.is_some() {
                    self.bump_pin_epoch(w)?;
                }
            }
        }
        if rec.pinned {
            w.open_table(PINNED).map_err(db_err)?.insert(version, ()).map_err(db_err)?;
            self.bump_pin_epoch(w)?;
        }
        if rec.replication_min != 0 || rec.replication_max != 0 {
            w.open_table(REPLICATED).map_err(db_err)?.insert(version, ()).map_err(db_err)?;
        }
        put_inode(w, &rec)?;
        Ok(pb::CommandResult { record: Some(rec), ..done() })
    }

    /// End a persist: the operation leaves the queue and the file, while it is still the
    /// version written, is persisted and unpinned.
    fn persisted(
        &self,
        w: &WriteTransaction,
        c: &pb::Persisted,
        now: i64,
        fx: &mut Effects,
    ) -> Result<pb::CommandResult> {
        remove_op(w, c.seq)?;
        let cur = load_inode(w, c.inode_id)?;
        let Some(mut cur) =
            cur.filter(|r| r.version == c.version && r.persist_state() == pb::PersistState::ToBePersisted)
        else {
            return Ok(done());
        };
        // Metadata changed while the bytes were on their way (PutObjectTagging during the
        // persist): the object gets it in a rewrite, queued behind this entry.
        if cur.meta != c.meta_sent && c.stores_metadata {
            fx.ops.push(enqueue(w, meta_op(&cur, c.mount_id, &c.ufs_path, &c.path), now)?);
        }
        cur.fingerprint = c.fingerprint.clone();
        cur.set_persist_state(pb::PersistState::Persisted);
        cur.ufs_older = false;
        cur.synced_ms = now;
        put_inode(w, &cur)?;
        if !cur.pinned {
            w.open_table(PINNED).map_err(db_err)?.remove(cur.version).map_err(db_err)?;
            self.bump_pin_epoch(w)?;
        }
        Ok(pb::CommandResult { record: Some(cur), ..done() })
    }

    fn mkdir(&self, w: &WriteTransaction, c: &pb::Mkdir, now: i64, fx: &mut Effects) -> Result<pb::CommandResult> {
        if !is_dir(w, c.parent_id)? {
            return Err(Error::not_found(format!("{} was deleted", c.parent_path)));
        }
        if get_child(&w.open_table(CHILDREN).map_err(db_err)?, c.parent_id, &c.name)?.is_some() {
            return Ok(done());
        }
        let mut rec = self.new_inode(w, c.parent_id, &c.name, true, 0, String::new(), now, now, None)?;
        rec.children_loaded = true;
        let side = c.ufs.clone().unwrap_or_default();
        if c.staging {
            rec.set_persist_state(pb::PersistState::NotPersisted);
        } else if side.queued {
            rec.set_persist_state(pb::PersistState::ToBePersisted);
        }
        put_inode(w, &rec)?;
        if !c.staging {
            let op = side.op.clone().map(|op| pb::PersistOp { inode_id: rec.id, ..op });
            queue_side(w, &side, op, now, fx)?;
        }
        Ok(pb::CommandResult { record: Some(rec), ..done() })
    }

    fn delete(&self, w: &WriteTransaction, c: &pb::Delete, now: i64, fx: &mut Effects) -> Result<pb::CommandResult> {
        // (the lookups' tables close before the removal opens them again)
        let parent = lookup(&w.open_table(CHILDREN).map_err(db_err)?, &c.parent_path)?;
        if let Some(parent) = parent {
            if c.only_empty {
                let ch = w.open_table(CHILDREN).map_err(db_err)?;
                if let Some(id) = get_child(&ch, parent, &c.name)?
                    && ch.range((id, "")..(id + 1, "")).map_err(db_err)?.next().is_some()
                {
                    return Err(Error::new(
                        ErrorKind::DirectoryNotEmpty,
                        format!("{}/{} is a non-empty directory (use -R)", c.parent_path, c.name),
                    ));
                }
            }
            self.remove_subtree(w, parent, &c.name, fx)?;
        }
        let side = c.ufs.clone().unwrap_or_default();
        queue_side(w, &side, side.op.clone(), now, fx)?;
        Ok(done())
    }

    fn sync_file(
        &self,
        w: &WriteTransaction,
        c: &pb::SyncFile,
        now: i64,
        fx: &mut Effects,
    ) -> Result<pb::CommandResult> {
        let parent = lookup(&w.open_table(CHILDREN).map_err(db_err)?, &c.parent_path)?;
        let child = match parent {
            Some(p) => get_child(&w.open_table(CHILDREN).map_err(db_err)?, p, &c.name)?,
            None => None,
        };
        let cur = child.map(|id| load_inode(w, id)).transpose()?.flatten();
        if cur.as_ref().is_some_and(|r| r.id != c.inode_id || r.version != c.version || !is_persisted(r)) {
            // Written or changed since the check read it: what the UFS said is older.
            return Ok(pb::CommandResult { record: cur, ..done() });
        }
        let record = match (&c.stat, parent) {
            (Some(st), Some(parent)) => {
                let id = self.upsert_from_ufs(w, parent, &c.name, &ufs_status(st), now, fx)?;
                load_inode(w, id)?
            }
            (None, Some(parent)) => {
                self.remove_subtree(w, parent, &c.name, fx)?;
                None
            }
            _ => None,
        };
        Ok(pb::CommandResult { record, ..done() })
    }

    fn load_entry(
        &self,
        w: &WriteTransaction,
        c: &pb::LoadEntry,
        now: i64,
        fx: &mut Effects,
    ) -> Result<pb::CommandResult> {
        let st = c.stat.as_ref().ok_or_else(|| Error::invalid("an import without the UFS's status"))?;
        if !is_dir(w, c.parent_id)? {
            return Ok(done()); // the directory went meanwhile
        }
        let id = self.upsert_from_ufs(w, c.parent_id, &st.name, &ufs_status(st), now, fx)?;
        Ok(pb::CommandResult { id, ..done() })
    }

    fn merge_listing(&self, w: &WriteTransaction, c: &pb::MergeListing, fx: &mut Effects) -> Result<pb::CommandResult> {
        if !is_dir(w, c.dir_id)? {
            return Ok(done()); // the directory went meanwhile
        }
        for st in &c.entries {
            self.upsert_from_ufs(w, c.dir_id, &st.name, &ufs_status(st), c.start_ms, fx)?;
        }
        Ok(done())
    }

    fn finish_listing(
        &self,
        w: &WriteTransaction,
        c: &pb::FinishListing,
        fx: &mut Effects,
    ) -> Result<pb::CommandResult> {
        let stale: Vec<String> = {
            let ch = w.open_table(CHILDREN).map_err(db_err)?;
            let inodes = w.open_table(INODES).map_err(db_err)?;
            let mut v = Vec::new();
            for name in &c.gone {
                if let Some(id) = get_child(&ch, c.dir_id, name)?
                    && let Some(r) = get_inode(&inodes, id)?
                    && r.synced_ms < c.start_ms
                    && is_persisted(&r)
                {
                    v.push(name.clone());
                }
            }
            v
        };
        for name in stale {
            self.remove_subtree(w, c.dir_id, &name, fx)?;
        }
        // (A directory deleted meanwhile stays deleted.)
        if let Some(mut d) = load_inode(w, c.dir_id)? {
            d.children_loaded = true;
            d.synced_ms = c.start_ms;
            put_inode(w, &d)?;
        }
        Ok(done())
    }

    /// Insert or refresh `name` under `parent` from a UFS status, as of `now`. Returns the
    /// child id. A file whose fingerprint changed drops its cached blocks (`fx`).
    pub(crate) fn upsert_from_ufs(
        &self,
        w: &WriteTransaction,
        parent: u64,
        name: &str,
        st: &UfsStatus,
        now: i64,
        fx: &mut Effects,
    ) -> Result<u64> {
        let existing = get_child(&w.open_table(CHILDREN).map_err(db_err)?, parent, name)?;
        let fp = st.fingerprint();
        let Some(id) = existing else {
            // An S3 prefix has no time of its own: a directory gets the time Locus first saw
            // it (what S3 clients show as a bucket's creation date).
            let mtime = if st.is_dir && st.mtime_ms <= 0 { now } else { st.mtime_ms };
            let rec = self.new_inode(w, parent, name, st.is_dir, st.length, fp, mtime, now, None)?;
            fx.loaded += 1;
            return Ok(rec.id);
        };
        let mut rec = load_inode(w, id)?.ok_or_else(|| Error::internal("dangling child"))?;
        if !is_persisted(&rec) {
            // Locus holds newer bytes than the UFS until the persist lands.
            return Ok(id);
        }
        if rec.is_dir != st.is_dir {
            // A file became a directory or back: replace the entry.
            self.remove_subtree(w, parent, name, fx)?;
            return self.upsert_from_ufs(w, parent, name, st, now, fx);
        }
        if !rec.is_dir && rec.fingerprint != fp {
            self.drop_version(w, &rec, fx)?;
            rec.version = next_id(w, "version", 1)?;
            w.open_table(VERSIONS).map_err(db_err)?.insert(rec.version, rec.id).map_err(db_err)?;
            if rec.pinned {
                w.open_table(PINNED).map_err(db_err)?.insert(rec.version, ()).map_err(db_err)?;
                self.bump_pin_epoch(w)?;
            }
            rec.length = st.length;
            rec.fingerprint = fp;
            rec.mtime_ms = st.mtime_ms;
            // The object changed behind Locus: what was known about it is stale.
            rec.meta = None;
        }
        rec.synced_ms = now;
        put_inode(w, &rec)?;
        Ok(id)
    }

    fn set_pinned(&self, w: &WriteTransaction, c: &pb::SetPinned) -> Result<pb::CommandResult> {
        for &id in &c.inode_ids {
            let Some(mut r) = load_inode(w, id)? else { continue };
            r.pinned = c.pinned;
            put_inode(w, &r)?;
            let mut p = w.open_table(PINNED).map_err(db_err)?;
            if c.pinned {
                p.insert(r.version, ()).map_err(db_err)?;
            } else if is_persisted(&r) {
                // Bytes not persisted yet stay pinned whatever the user says.
                p.remove(r.version).map_err(db_err)?;
            }
        }
        self.bump_pin_epoch(w)?;
        Ok(pb::CommandResult { pin_epoch: pin_epoch(w)?, ..done() })
    }

    fn add_mount(&self, w: &WriteTransaction, c: &pb::AddMount, now: i64) -> Result<pb::CommandResult> {
        let info = c.info.as_ref().ok_or_else(|| Error::invalid("a mount command without the mount"))?;
        let info = pb::MountInfo { id: next_id(w, "mount", 1)?, ..info.clone() };
        w.open_table(MOUNTS).map_err(db_err)?.insert(info.id, info.encode_to_vec().as_slice()).map_err(db_err)?;
        if let Some((parent_path, name)) = locus_common::path::split_parent(&info.path) {
            let parent = lookup(&w.open_table(CHILDREN).map_err(db_err)?, parent_path)?
                .ok_or_else(|| Error::not_found(parent_path.to_string()))?;
            // Its time is the mount's (an S3 bucket's listing gives directories none): S3
            // clients show it as the bucket's creation date.
            self.new_inode(w, parent, name, true, 0, String::new(), now, now, None)?;
        }
        Ok(pb::CommandResult { mount: Some(info), ..done() })
    }

    fn remove_mount(&self, w: &WriteTransaction, c: &pb::RemoveMount, fx: &mut Effects) -> Result<pb::CommandResult> {
        // (the lookup's table closes before the removal opens it again)
        let parent = lookup(&w.open_table(CHILDREN).map_err(db_err)?, &c.parent_path)?;
        if let Some(parent) = parent {
            self.remove_subtree(w, parent, &c.name, fx)?;
        }
        w.open_table(MOUNTS).map_err(db_err)?.remove(c.mount_id).map_err(db_err)?;
        Ok(done())
    }

    fn reap_writes(&self, w: &WriteTransaction, c: &pb::ReapWrites, fx: &mut Effects) -> Result<pb::CommandResult> {
        let mut loc = w.open_table(LOCATIONS).map_err(db_err)?;
        let mut wb = w.open_table(WORKER_BLOCKS).map_err(db_err)?;
        for &v in &c.versions {
            // Completed since the reaper looked: it stays.
            if w.open_table(PENDING_WRITES).map_err(db_err)?.remove(v).map_err(db_err)?.is_none() {
                continue;
            }
            w.open_table(VERSIONS).map_err(db_err)?.remove(v).map_err(db_err)?;
            w.open_table(PINNED).map_err(db_err)?.remove(v).map_err(db_err)?;
            let (first, last) = (locus_common::block_id(v, 0), locus_common::block_id(v + 1, 0));
            let keys: Vec<(u64, u64)> = loc
                .range((first, 0)..(last, 0))
                .map_err(db_err)?
                .map(|e| e.map(|(k, _)| k.value()).map_err(db_err))
                .collect::<Result<_>>()?;
            for (b, wk) in keys {
                loc.remove((b, wk)).map_err(db_err)?;
                wb.remove((wk, b)).map_err(db_err)?;
                fx.dropped.push((wk, b));
            }
        }
        drop((loc, wb));
        self.bump_pin_epoch(w)?;
        Ok(done())
    }
}

/// The entry a command wrote, from its result.
pub(crate) fn written(r: pb::CommandResult) -> Result<pb::InodeRecord> {
    r.record.ok_or_else(|| Error::internal("a namespace command returned no entry"))
}

/// A UFS's status as a command carries it.
pub(crate) fn ufs_entry(st: &UfsStatus) -> pb::UfsEntry {
    pb::UfsEntry {
        name: st.path.clone(),
        is_dir: st.is_dir,
        length: st.length,
        etag: st.etag.clone(),
        mtime_ms: st.mtime_ms,
    }
}

fn ufs_status(e: &pb::UfsEntry) -> UfsStatus {
    UfsStatus { path: e.name.clone(), is_dir: e.is_dir, length: e.length, etag: e.etag.clone(), mtime_ms: e.mtime_ms }
}

/// How long the retry cache keeps a result: longer than a caller goes on resending.
pub(crate) const RETRY_KEEP_MS: i64 = 10 * 60 * 1000;
/// Most results the retry cache keeps (the oldest go first).
pub(crate) const RETRY_MOST: u64 = 100_000;
/// Most entries one command trims from the retry cache (it never grows by more than one).
const RETRY_TRIM: usize = 8;

/// The first result of the command with request id `id`, if it committed and is kept.
fn retried(w: &WriteTransaction, id: &[u8]) -> Result<Option<pb::CommandResult>> {
    crate::calls::cached(&w.open_table(RETRY_CACHE).map_err(db_err)?, id)
}

/// Keep result `r` of the command with request id `id`, made at `now`, and drop the
/// entries older than [`RETRY_KEEP_MS`] or beyond [`RETRY_MOST`], a few at a time.
fn remember(w: &WriteTransaction, id: &[u8], now: i64, r: &pb::CommandResult) -> Result<()> {
    let mut cache = w.open_table(RETRY_CACHE).map_err(db_err)?;
    let mut by_time = w.open_table(RETRY_BY_TIME).map_err(db_err)?;
    let e = pb::RetryEntry { at_ms: now, result: Some(r.clone()) };
    cache.insert(id, e.encode_to_vec().as_slice()).map_err(db_err)?;
    by_time.insert((now, id), ()).map_err(db_err)?;
    let over = cache.len().map_err(db_err)?.saturating_sub(RETRY_MOST);
    let mut old = Vec::new();
    for (i, k) in by_time.iter().map_err(db_err)?.take(RETRY_TRIM).enumerate() {
        let (k, _) = k.map_err(db_err)?;
        let (at, key) = k.value();
        if at >= now - RETRY_KEEP_MS && i as u64 >= over {
            break;
        }
        old.push((at, key.to_vec()));
    }
    for (at, key) in old {
        by_time.remove((at, key.as_slice())).map_err(db_err)?;
        cache.remove(key.as_slice()).map_err(db_err)?;
    }
    Ok(())
}

/// Whether entry `id` is there and a directory.
fn is_dir(w: &WriteTransaction, id: u64) -> Result<bool> {
    Ok(load_inode(w, id)?.is_some_and(|r| r.is_dir))
}

/// A command's result with nothing in it.
fn done() -> pb::CommandResult {
    pb::CommandResult::default()
}

fn pin_epoch(w: &WriteTransaction) -> Result<u64> {
    get_counter(&w.open_table(COUNTERS).map_err(db_err)?, "pin_epoch")
}

/// The queue record of a UFS change at `ufs_path` (of mount `mount_id`), Locus path `path`.
pub(crate) fn op_at(mount_id: u64, ufs_path: &str, path: &str) -> pb::PersistOp {
    pb::PersistOp { mount_id, ufs_path: ufs_path.to_string(), path: path.to_string(), ..Default::default() }
}

/// The queue record that persists file `rec` (its current version).
pub(crate) fn persist_op(rec: &pb::InodeRecord, mount_id: u64, ufs_path: &str, path: &str) -> pb::PersistOp {
    pb::PersistOp {
        kind: pb::PersistOpKind::Persist.into(),
        inode_id: rec.id,
        version: rec.version,
        length: rec.length,
        ..op_at(mount_id, ufs_path, path)
    }
}

/// The queue record that rewrites persisted file `rec`'s object with its metadata.
fn meta_op(rec: &pb::InodeRecord, mount_id: u64, ufs_path: &str, path: &str) -> pb::PersistOp {
    pb::PersistOp {
        kind: pb::PersistOpKind::Meta.into(),
        inode_id: rec.id,
        version: rec.version,
        ..op_at(mount_id, ufs_path, path)
    }
}

/// Journal a persist queue operation inside `w`, queued at `now`. The change's caller
/// hands it to the scheduler after the commit (it goes into [`Effects::ops`]).
pub(crate) fn enqueue(w: &WriteTransaction, mut op: pb::PersistOp, now: i64) -> Result<pb::PersistOp> {
    op.seq = next_id(w, "persist_seq", 1)?;
    op.enqueued_ms = now;
    w.open_table(PERSIST_QUEUE).map_err(db_err)?.insert(op.seq, op.encode_to_vec().as_slice()).map_err(db_err)?;
    Ok(op)
}

/// Take operation `seq` off the persist queue.
pub(crate) fn remove_op(w: &WriteTransaction, seq: u64) -> Result<()> {
    w.open_table(PERSIST_QUEUE).map_err(db_err)?.remove(seq).map_err(db_err)?;
    Ok(())
}

fn queued_op(w: &WriteTransaction, seq: u64) -> Result<Option<pb::PersistOp>> {
    let q = w.open_table(PERSIST_QUEUE).map_err(db_err)?;
    let v = q.get(seq).map_err(db_err)?;
    v.map(|v| decode(v.value())).transpose()
}

fn put_op(w: &WriteTransaction, op: &pb::PersistOp) -> Result<()> {
    w.open_table(PERSIST_QUEUE).map_err(db_err)?.insert(op.seq, op.encode_to_vec().as_slice()).map_err(db_err)?;
    Ok(())
}

fn must_load(w: &WriteTransaction, id: u64, path: &str) -> Result<pb::InodeRecord> {
    load_inode(w, id)?.ok_or_else(|| Error::not_found(format!("{path} does not exist")))
}

fn queue_persist(w: &WriteTransaction, c: &pb::QueuePersist, now: i64, fx: &mut Effects) -> Result<pb::CommandResult> {
    let mut rec = must_load(w, c.inode_id, &c.path)?;
    rec.set_persist_state(pb::PersistState::ToBePersisted);
    fx.ops.push(enqueue(w, persist_op(&rec, c.mount_id, &c.ufs_path, &c.path), now)?);
    put_inode(w, &rec)?;
    Ok(pb::CommandResult { record: Some(rec), ..done() })
}

fn set_replication(w: &WriteTransaction, c: &pb::SetReplication) -> Result<pb::CommandResult> {
    for &id in &c.inode_ids {
        let Some(mut r) = load_inode(w, id)? else { continue };
        r.replication_min = c.min;
        r.replication_max = c.max;
        put_inode(w, &r)?;
        let mut t = w.open_table(REPLICATED).map_err(db_err)?;
        if c.min != 0 || c.max != 0 {
            t.insert(r.version, ()).map_err(db_err)?;
        } else {
            t.remove(r.version).map_err(db_err)?;
        }
    }
    Ok(done())
}

fn set_object_meta(
    w: &WriteTransaction,
    c: &pb::SetObjectMeta,
    now: i64,
    fx: &mut Effects,
) -> Result<pb::CommandResult> {
    let mut rec = must_load(w, c.inode_id, &c.path)?;
    let meta = c.meta.clone().unwrap_or_default();
    if c.tags_only {
        rec.meta.get_or_insert_with(Default::default).tags = meta.tags;
    } else {
        rec.meta = Some(meta);
    }
    if rec.meta.as_ref().is_some_and(|m| *m == pb::ObjectMeta::default()) {
        rec.meta = None;
    }
    // A persisted object in a store that keeps metadata gets it too (a file still to be
    // persisted takes it with its persist).
    if !rec.is_dir && is_persisted(&rec) && c.stores_metadata {
        fx.ops.push(enqueue(w, meta_op(&rec, c.mount_id, &c.ufs_path, &c.path), now)?);
    }
    put_inode(w, &rec)?;
    Ok(pb::CommandResult { record: Some(rec), ..done() })
}

fn rename(w: &WriteTransaction, c: &pb::Rename, now: i64, fx: &mut Effects) -> Result<pb::CommandResult> {
    {
        let mut ch = w.open_table(CHILDREN).map_err(db_err)?;
        let sparent = lookup(&ch, &c.src_parent_path)?.ok_or_else(|| Error::not_found(c.src_parent_path.clone()))?;
        ch.remove((sparent, c.src_name.as_str())).map_err(db_err)?;
        ch.insert((c.dst_parent_id, c.dst_name.as_str()), c.inode_id).map_err(db_err)?;
    }
    crate::journal::rename(w, &c.src, &c.dst)?;
    // The entry as it is now (a persist may have committed since the caller looked it up).
    let mut r = load_inode(w, c.inode_id)?.ok_or_else(|| Error::not_found(format!("{} was deleted", c.src)))?;
    r.parent = c.dst_parent_id;
    r.name = c.dst_name.clone();
    put_inode(w, &r)?;
    let side = c.ufs.clone().unwrap_or_default();
    queue_side(w, &side, side.op.clone(), now, fx)?;
    Ok(pb::CommandResult { record: Some(r), ..done() })
}

/// A change's UFS side, when it is queued: its record `op` (if it has one) goes into the
/// queue, and a rename's claimed persists are queued again at their new paths.
fn queue_side(
    w: &WriteTransaction,
    side: &pb::UfsSide,
    op: Option<pb::PersistOp>,
    now: i64,
    fx: &mut Effects,
) -> Result<()> {
    if !side.queued {
        return Ok(());
    }
    if let Some(op) = op {
        fx.ops.push(enqueue(w, op, now)?);
    }
    for &seq in &side.claimed {
        let Some(mut op) = queued_op(w, seq)? else { continue };
        remove_op(w, seq)?;
        // Claimed persists lie at or below the source, so this is their rest.
        let suffix = op.ufs_path.strip_prefix(&side.src_ufs_path).unwrap_or_default().to_string();
        op.ufs_path = format!("{}{suffix}", side.dst_ufs_path);
        op.path = format!("{}{suffix}", side.dst);
        // A persist waiting out the staging wait keeps it while its new path is still in a
        // committer's staging area, and starts at once when it leaves it.
        if !locus_common::path::is_staged(&op.path) {
            op.not_before_ms = 0;
        }
        // At its new path it starts over (a persist given up at the old one included).
        (op.failures, op.failed_ms) = (0, 0);
        op.last_error.clear();
        fx.ops.push(enqueue(w, op, now)?);
    }
    Ok(())
}

fn set_lost(w: &WriteTransaction, c: &pb::SetLost, now: i64, fx: &mut Effects) -> Result<pb::CommandResult> {
    let mut out = done();
    for &id in &c.lost {
        if let Some(mut rec) = load_inode(w, id)? {
            rec.lost_from = std::mem::replace(&mut rec.persist_state, pb::PersistState::Lost.into());
            put_inode(w, &rec)?;
            out.records.push(rec);
        }
    }
    for &id in &c.found {
        let Some(mut rec) = load_inode(w, id)? else { continue };
        let Some(path) = crate::journal::path_of(&w.open_table(INODES).map_err(db_err)?, &rec)? else { continue };
        let Some((mount_id, rel)) = mount_of(w, &path)? else { continue };
        rec.persist_state = std::mem::take(&mut rec.lost_from);
        if rec.persist_state() == pb::PersistState::ToBePersisted {
            fx.ops.push(enqueue(w, persist_op(&rec, mount_id, &rel, &path), now)?);
        }
        put_inode(w, &rec)?;
        out.paths.push(path);
    }
    Ok(out)
}

/// The mount holding `path` (the longest mount path that is a prefix of it), from the
/// mounts table: its id and the path relative to its UFS root.
fn mount_of(w: &WriteTransaction, path: &str) -> Result<Option<(u64, String)>> {
    let t = w.open_table(MOUNTS).map_err(db_err)?;
    let mut best: Option<(usize, u64, String)> = None;
    for e in t.iter().map_err(db_err)? {
        let (_, v) = e.map_err(db_err)?;
        let info: pb::MountInfo = decode(v.value())?;
        if let Some(rel) = locus_common::path::strip_prefix(path, &info.path)
            && best.as_ref().is_none_or(|(len, _, _)| info.path.len() > *len)
        {
            best = Some((info.path.len(), info.id, rel.to_string()));
        }
    }
    Ok(best.map(|(_, id, rel)| (id, rel)))
}

fn register_worker(w: &WriteTransaction, c: &pb::RegisterWorker) -> Result<pb::CommandResult> {
    let mut workers = w.open_table(WORKERS).map_err(db_err)?;
    let known = c.worker_id != 0 && workers.get(c.worker_id).map_err(db_err)?.is_some();
    let id = if known { c.worker_id } else { next_id(w, "worker", 1)? };
    let addr = pb::WorkerAddress { worker_id: id, ..c.address.clone().unwrap_or_default() };
    workers.insert(id, addr.encode_to_vec().as_slice()).map_err(db_err)?;
    Ok(pb::CommandResult { id, ..done() })
}

fn date_buckets(w: &WriteTransaction, c: &pb::DateBuckets, now: i64) -> Result<pb::CommandResult> {
    for &id in &c.inode_ids {
        if let Some(mut rec) = load_inode(w, id)? {
            rec.mtime_ms = now;
            put_inode(w, &rec)?;
        }
    }
    Ok(done())
}

fn op_done(w: &WriteTransaction, c: &pb::OpDone) -> Result<pb::CommandResult> {
    remove_op(w, c.seq)?;
    if c.mkdir_inode != 0
        && let Some(mut rec) = load_inode(w, c.mkdir_inode)?
        && rec.persist_state() == pb::PersistState::ToBePersisted
    {
        rec.set_persist_state(pb::PersistState::Persisted);
        put_inode(w, &rec)?;
    }
    Ok(done())
}

fn meta_rewritten(w: &WriteTransaction, c: &pb::MetaRewritten, now: i64) -> Result<pb::CommandResult> {
    remove_op(w, c.seq)?;
    if let Some(mut cur) = load_inode(w, c.inode_id)?.filter(|r| r.version == c.version) {
        // Same bytes, new object: the cached blocks stay valid.
        cur.fingerprint = c.fingerprint.clone();
        cur.synced_ms = now;
        put_inode(w, &cur)?;
    }
    Ok(done())
}

fn give_up_op(w: &WriteTransaction, c: &pb::GiveUpOp, now: i64) -> Result<pb::CommandResult> {
    if let Some(mut op) = queued_op(w, c.seq)? {
        op.failures = c.failures;
        op.last_error = c.message.clone();
        op.last_error_kind = c.kind;
        op.failed_ms = now;
        put_op(w, &op)?;
    }
    Ok(done())
}

fn resolve_failures(w: &WriteTransaction, c: &pb::ResolveFailures) -> Result<pb::CommandResult> {
    for &seq in &c.seqs {
        let Some(mut op) = queued_op(w, seq)? else { continue };
        if c.retry {
            op.failures = 0;
            op.last_error.clear();
            op.set_last_error_kind(pb::ErrorKind::Unspecified);
            op.failed_ms = 0;
            put_op(w, &op)?;
            continue;
        }
        remove_op(w, seq)?;
        // The file stays, as a file never persisted (still pinned: its cached copies are
        // its only ones); `locus fs persist` queues it again.
        if op.kind() == pb::PersistOpKind::Persist
            && let Some(mut rec) = load_inode(w, op.inode_id)?
            && rec.version == op.version
            && rec.persist_state() == pb::PersistState::ToBePersisted
        {
            rec.set_persist_state(pb::PersistState::NotPersisted);
            put_inode(w, &rec)?;
        }
    }
    Ok(done())
}

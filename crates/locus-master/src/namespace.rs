//! The namespace: its state type ([`Namespace`], the metadata store and the record edits
//! changes share) and the one path by which a change commits and then carries out its
//! effects ([`Master::propose`]).
//!
//! Every durable change is a typed command ([`pb::Command`], applied by
//! [`Namespace::apply`] in `apply.rs`) run on the store's committer thread
//! ([`Store::submit`]), group committed with the changes that arrive meanwhile, and its
//! caller hears back once it is on disk; nothing waits for redb's lock or its fsync on
//! the async runtime. A command may be applied more than once (when another change of its
//! group fails), so it reads what it checks inside its transaction and records what is
//! left to do after the commit in its [`Effects`], never acting outside the transaction.
//! Block locations, soft state, change through [`Master::commit_soft`].

use locus_common::Result;
use locus_proto::pb;
use redb::{ReadableTable, WriteTransaction};

use crate::calls::CallId;
use crate::journal;
use crate::store::*;
use crate::*;

/// The namespace's state: the inode records, their versions, pins and block locations,
/// and the persist queue, all in the metadata store (whose other tables, such as the
/// mounts, pending writes and counters, callers read through it too). Its methods read
/// the store or edit records inside a change's transaction; what a change leaves to
/// others (the workers, the persist scheduler) goes into its [`Effects`]. It knows
/// nothing of the worker registry, the mounts' UFS handles or the jobs, which the
/// [`Master`] holds beside it.
pub(crate) struct Namespace {
    store: Store,
    /// The block size of new files.
    block_size: u64,
}

/// What a committed namespace change leaves to do: see [`Master::carry_out`].
#[derive(Debug, Default)]
pub(crate) struct Effects {
    /// (worker, block) copies their workers must delete.
    pub dropped: Vec<(u64, u64)>,
    /// (worker, block) copies of file versions overwritten or deleted: their workers
    /// retire them (kept for a grace period for readers under way, then deleted).
    pub retired: Vec<(u64, u64)>,
    /// Persist-queue operations journaled by the change, for the scheduler.
    pub ops: Vec<pb::PersistOp>,
    /// Entries loaded from a UFS (counted in the metrics).
    pub loaded: u64,
}

impl Namespace {
    /// The namespace over `store`; files made from now on get blocks of `block_size`.
    pub(crate) fn new(store: Store, block_size: u64) -> Namespace {
        Namespace { store, block_size }
    }

    /// The metadata store (the search catalog reads its journal).
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// A read snapshot of the metadata store as of now.
    pub(crate) fn read(&self) -> Result<redb::ReadTransaction> {
        self.store.read()
    }

    /// The block size of new files.
    pub(crate) fn block_size(&self) -> u64 {
        self.block_size
    }

    /// The cluster's id, made when the store was.
    pub(crate) fn cluster_id(&self) -> u64 {
        self.store.cluster_id()
    }

    /// Insert a new entry; a file gets `version`, or a new one when `None`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new_inode(
        &self,
        w: &WriteTransaction,
        parent: u64,
        name: &str,
        is_dir: bool,
        length: u64,
        fingerprint: String,
        mtime_ms: i64,
        now: i64,
        version: Option<u64>,
    ) -> Result<pb::InodeRecord> {
        let id = next_id(w, "inode", ROOT_ID + 1)?;
        let version = match version {
            _ if is_dir => 0,
            Some(v) => v,
            None => next_id(w, "version", 1)?,
        };
        let rec = pb::InodeRecord {
            id,
            parent,
            name: name.into(),
            is_dir,
            length,
            block_size: if is_dir { 0 } else { self.block_size },
            fingerprint,
            mtime_ms,
            pinned: false,
            version,
            synced_ms: now,
            children_loaded: false,
            meta: None,
            ..Default::default()
        };
        put_inode(w, &rec)?;
        w.open_table(CHILDREN).map_err(db_err)?.insert((parent, name), id).map_err(db_err)?;
        if !is_dir {
            w.open_table(VERSIONS).map_err(db_err)?.insert(version, id).map_err(db_err)?;
        }
        Ok(rec)
    }

    /// Forget every cached block of a file version that is gone (overwritten, deleted,
    /// changed in the UFS): the workers holding them retire them (`fx.retired`), so that
    /// reads already under way can finish.
    pub(crate) fn drop_version(&self, w: &WriteTransaction, rec: &pb::InodeRecord, fx: &mut Effects) -> Result<()> {
        if rec.is_dir {
            return Ok(());
        }
        self.drop_copies(w, rec, true, fx)?;
        w.open_table(VERSIONS).map_err(db_err)?.remove(rec.version).map_err(db_err)?;
        w.open_table(REPLICATED).map_err(db_err)?.remove(rec.version).map_err(db_err)?;
        if w.open_table(PINNED).map_err(db_err)?.remove(rec.version).map_err(db_err)?.is_some() {
            self.bump_pin_epoch(w)?;
        }
        Ok(())
    }

    /// Forget the cached copies of a file version's blocks; their workers retire them
    /// (`retire`: the version is gone) or delete them at once (`fx.dropped`: `free`).
    pub(crate) fn drop_copies(
        &self,
        w: &WriteTransaction,
        rec: &pb::InodeRecord,
        retire: bool,
        fx: &mut Effects,
    ) -> Result<()> {
        let mut loc = w.open_table(LOCATIONS).map_err(db_err)?;
        let mut wb = w.open_table(WORKER_BLOCKS).map_err(db_err)?;
        for i in 0..block_count(rec.length, rec.block_size) {
            let b = locus_common::block_id(rec.version, i);
            for wk in second_keys(&loc, b)? {
                loc.remove((b, wk)).map_err(db_err)?;
                wb.remove((wk, b)).map_err(db_err)?;
                if retire { fx.retired.push((wk, b)) } else { fx.dropped.push((wk, b)) }
            }
        }
        Ok(())
    }

    /// A new pin epoch: the pinned set changed, and workers holding an older epoch take
    /// the new set at their next heartbeat.
    pub(crate) fn bump_pin_epoch(&self, w: &WriteTransaction) -> Result<()> {
        next_id(w, "pin_epoch", 1).map(|_| ())
    }

    /// Whether the UFS may hold something at the path of entry `id`, as the namespace is
    /// now: it, or anything below it, is persisted, or is a file written over since a
    /// version was persisted. Only right while no UFS change of the path is queued or
    /// under way (which may yet put something there, or have moved it in the namespace
    /// already).
    fn ufs_may_hold(&self, id: u64) -> Result<bool> {
        let r = self.store.read()?;
        let ch = r.open_table(CHILDREN).map_err(db_err)?;
        let inodes = r.open_table(INODES).map_err(db_err)?;
        let Some(rec) = get_inode(&inodes, id)? else { return Ok(true) };
        let mut stack = vec![rec];
        while let Some(rec) = stack.pop() {
            if is_persisted(&rec) || rec.ufs_older {
                return Ok(true);
            }
            if rec.is_dir {
                for e in ch.range((rec.id, "")..(rec.id + 1, "")).map_err(db_err)? {
                    let (_, id) = e.map_err(db_err)?;
                    stack.extend(get_inode(&inodes, id.value())?);
                }
            }
        }
        Ok(false)
    }

    /// Whether a rename of entry `id` from `path`, made now with no UFS change queued on
    /// its paths, needs no UFS change: a committer's staged output that never reached the
    /// UFS (its directories are not made there, its files wait to be persisted at their
    /// final paths). A queued rename is never judged so: by the time it runs, what it
    /// moved may have moved on in the namespace (a persisted file renamed out of it, as
    /// a job commit does after a task commit), while the UFS still holds it at the source.
    pub(crate) fn rename_stays_in_locus(&self, path: &str, id: u64) -> Result<bool> {
        Ok(locus_common::path::in_staging(path) && !self.ufs_may_hold(id)?)
    }

    /// Remove `name` under `parent` and everything below it from the namespace.
    pub(crate) fn remove_subtree(&self, w: &WriteTransaction, parent: u64, name: &str, fx: &mut Effects) -> Result<()> {
        let Some(id) = get_child(&w.open_table(CHILDREN).map_err(db_err)?, parent, name)? else {
            return Ok(());
        };
        w.open_table(CHILDREN).map_err(db_err)?.remove((parent, name)).map_err(db_err)?;
        let path = {
            let inodes = w.open_table(INODES).map_err(db_err)?;
            match get_inode(&inodes, id)? {
                Some(rec) => journal::path_of(&inodes, &rec)?,
                None => None,
            }
        };
        if let Some(path) = path {
            journal::remove_subtree(w, &path)?;
        }
        let mut stack = vec![id];
        while let Some(id) = stack.pop() {
            let rec = get_inode(&w.open_table(INODES).map_err(db_err)?, id)?;
            if let Some(rec) = rec {
                if rec.is_dir {
                    let mut ch = w.open_table(CHILDREN).map_err(db_err)?;
                    let kids: Vec<(String, u64)> = ch
                        .range((id, "")..(id + 1, ""))
                        .map_err(db_err)?
                        .map(|e| e.map(|(k, v)| (k.value().1.to_string(), v.value())))
                        .collect::<std::result::Result<_, _>>()
                        .map_err(db_err)?;
                    for (n, c) in kids {
                        ch.remove((id, n.as_str())).map_err(db_err)?;
                        stack.push(c);
                    }
                } else {
                    self.drop_version(w, &rec, fx)?;
                }
                w.open_table(INODES).map_err(db_err)?.remove(id).map_err(db_err)?;
            }
        }
        Ok(())
    }

    /// The inode at `path` as of now (a fresh snapshot).
    pub(crate) fn inode_by_path(&self, path: &str) -> Result<Option<pb::InodeRecord>> {
        self::inode_by_path(&self.store.read()?, path)
    }
}

impl Master {
    /// The namespace's state.
    pub(crate) fn ns(&self) -> &Namespace {
        &self.inner.ns
    }

    /// Put command `op` of call `id`, at time `now_ms`, in the commit order (changes
    /// commit in the order they are submitted, group committed: see the module doc; with
    /// a replicated group, the log's order); the future answers with its result and its
    /// effects, not carried out yet, once it is on disk.
    fn submit(
        &self,
        now_ms: i64,
        id: &CallId,
        op: pb::command::Op,
    ) -> Result<impl std::future::Future<Output = Result<(pb::CommandResult, Effects)>> + use<>> {
        use futures::future::Either;
        let cmd = pb::Command { request_id: id.key().to_vec(), now_ms, op: Some(op) };
        if let Some(g) = &self.inner.group {
            return Ok(Either::Left(g.submit(cmd)?));
        }
        let me = self.clone();
        let applied = self.ns().store().submit(move |w| {
            let mut fx = Effects::default();
            let r = me.ns().apply(w, &cmd, &mut fx)?;
            Ok((r, fx))
        })?;
        Ok(Either::Right(applied))
    }

    /// Make the change `op` describes ([`Namespace::apply`], given this master's time)
    /// durably, then carry out its effects.
    pub(crate) async fn propose(&self, op: pb::command::Op) -> Result<pb::CommandResult> {
        self.propose_at(now_ms(), op).await
    }

    /// [`Master::propose`] at time `now_ms` (a caller that records the same time).
    pub(crate) async fn propose_at(&self, now_ms: i64, op: pb::command::Op) -> Result<pb::CommandResult> {
        let (r, fx) = self.submit(now_ms, &CallId::NONE, op)?.await?;
        self.carry_out(fx);
        Ok(r)
    }

    /// [`Master::propose`] for a client's call `id`: a resend of it answers this result
    /// ([`crate::calls`]).
    pub(crate) async fn propose_call(&self, id: &CallId, op: pb::command::Op) -> Result<pb::CommandResult> {
        let (r, fx) = self.propose_only(id, op).await?;
        self.carry_out(fx);
        Ok(r)
    }

    /// [`Master::propose_call`], leaving the effects to the caller.
    pub(crate) async fn propose_only(&self, id: &CallId, op: pb::command::Op) -> Result<(pb::CommandResult, Effects)> {
        self.submit(now_ms(), id, op)?.await
    }

    /// Propose the command `build` makes from the UFS paths of mount `mount_id` that
    /// changes hold for a reader of the UFS that began at `mark` ([`Master::held_ufs_paths`]),
    /// judged as the command takes its place in the commit order (under the persist
    /// tracker's lock): a UFS change that begins later commits after the command, and one
    /// that began before is among the paths. `None` (from `build` and here): no change.
    pub(crate) async fn propose_unheld(
        &self,
        mount_id: u64,
        mark: u64,
        build: impl FnOnce(&[String]) -> Option<pb::command::Op>,
    ) -> Result<Option<pb::CommandResult>> {
        let committed = {
            let t = self.inner.persist.lock();
            let Some(op) = build(&crate::persist::held_in(&t, mount_id, mark)) else { return Ok(None) };
            self.submit(now_ms(), &CallId::NONE, op)?
        };
        let (r, fx) = committed.await?;
        self.carry_out(fx);
        Ok(Some(r))
    }

    /// Change soft state (block locations) without an fsync ([`Store::mutate_soft`]), then
    /// carry out the change's effects.
    pub(crate) async fn commit_soft<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Master, &WriteTransaction, &mut Effects) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let me = self.clone();
        let (v, fx) = self
            .ns()
            .store()
            .mutate_soft(move |w| {
                let mut fx = Effects::default();
                let v = f(&me, w, &mut fx)?;
                Ok((v, fx))
            })
            .await?;
        self.carry_out(fx);
        Ok(v)
    }

    /// Carry out what a committed change left to do: tell workers to delete dropped
    /// blocks, hand journaled operations to the persist scheduler, count loaded entries.
    pub(crate) fn carry_out(&self, fx: Effects) {
        self.queue_removals(fx.dropped, fx.retired);
        self.track(fx.ops);
        self.inner.metrics.files_loaded.inc_by(fx.loaded);
    }

    /// Tell workers (through their next heartbeat) to delete these blocks (`dropped`), or
    /// to retire them (`retired`: blocks of versions gone, which readers that resolved
    /// them before may still need for a while).
    pub(crate) fn queue_removals(&self, dropped: Vec<(u64, u64)>, retired: Vec<(u64, u64)>) {
        if dropped.is_empty() && retired.is_empty() {
            return;
        }
        self.inner.workers.queue_removals(dropped, retired);
    }
}

/// How many blocks a file of `len` bytes in blocks of `bs` has.
pub(crate) fn block_count(len: u64, bs: u64) -> u64 {
    len.div_ceil(bs.max(1))
}

/// Writes a namespace record and journals what a search sees of the change, in the same
/// transaction (every record a change writes goes through here).
pub(crate) fn put_inode(w: &WriteTransaction, rec: &pb::InodeRecord) -> Result<()> {
    let old = write_inode(w, rec)?;
    journal::on_put(w, old.as_ref(), rec)
}

/// The inode at `path` as of snapshot `r`.
pub(crate) fn inode_by_path(r: &redb::ReadTransaction, path: &str) -> Result<Option<pb::InodeRecord>> {
    let ch = r.open_table(CHILDREN).map_err(db_err)?;
    let Some(id) = lookup(&ch, path)? else {
        return Ok(None);
    };
    get_inode(&r.open_table(INODES).map_err(db_err)?, id)
}

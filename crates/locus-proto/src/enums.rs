//! The one place where the protocol's enums meet the Rust enums of `locus-common`:
//! conversions both ways, and the accessors that read a message's enum field as the
//! Rust enum. An UNSPECIFIED value reads as `None` (the caller's default applies).

use locus_common::ErrorKind;
use locus_common::config::{ReadType, TierAlias, WriteType};
use locus_common::job::{JobState, JobStatus};
use locus_common::metrics::{HostKey, ReadReason, ReadSource};
use locus_common::security::Role;

use crate::pb;

impl From<ErrorKind> for pb::ErrorKind {
    fn from(k: ErrorKind) -> Self {
        match k {
            ErrorKind::NotFound => pb::ErrorKind::NotFound,
            ErrorKind::AlreadyExists => pb::ErrorKind::AlreadyExists,
            ErrorKind::InvalidArgument => pb::ErrorKind::InvalidArgument,
            ErrorKind::NameTooLong => pb::ErrorKind::NameTooLong,
            ErrorKind::PermissionDenied => pb::ErrorKind::PermissionDenied,
            ErrorKind::Unauthenticated => pb::ErrorKind::Unauthenticated,
            ErrorKind::ResourceExhausted => pb::ErrorKind::ResourceExhausted,
            ErrorKind::FailedPrecondition => pb::ErrorKind::FailedPrecondition,
            ErrorKind::DirectoryNotEmpty => pb::ErrorKind::DirectoryNotEmpty,
            ErrorKind::IsADirectory => pb::ErrorKind::IsADirectory,
            ErrorKind::NotADirectory => pb::ErrorKind::NotADirectory,
            ErrorKind::Unavailable => pb::ErrorKind::Unavailable,
            ErrorKind::Ufs => pb::ErrorKind::Ufs,
            ErrorKind::Corrupt => pb::ErrorKind::Corrupt,
            ErrorKind::Io => pb::ErrorKind::Io,
            ErrorKind::Internal => pb::ErrorKind::Internal,
        }
    }
}

impl From<pb::ErrorKind> for ErrorKind {
    fn from(k: pb::ErrorKind) -> Self {
        match k {
            pb::ErrorKind::NotFound => ErrorKind::NotFound,
            pb::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
            pb::ErrorKind::InvalidArgument => ErrorKind::InvalidArgument,
            pb::ErrorKind::NameTooLong => ErrorKind::NameTooLong,
            pb::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            pb::ErrorKind::Unauthenticated => ErrorKind::Unauthenticated,
            pb::ErrorKind::ResourceExhausted => ErrorKind::ResourceExhausted,
            pb::ErrorKind::FailedPrecondition => ErrorKind::FailedPrecondition,
            pb::ErrorKind::DirectoryNotEmpty => ErrorKind::DirectoryNotEmpty,
            pb::ErrorKind::IsADirectory => ErrorKind::IsADirectory,
            pb::ErrorKind::NotADirectory => ErrorKind::NotADirectory,
            pb::ErrorKind::Unavailable => ErrorKind::Unavailable,
            pb::ErrorKind::Ufs => ErrorKind::Ufs,
            pb::ErrorKind::Corrupt => ErrorKind::Corrupt,
            pb::ErrorKind::Io => ErrorKind::Io,
            pb::ErrorKind::Internal | pb::ErrorKind::Unspecified => ErrorKind::Internal,
        }
    }
}

impl From<Role> for pb::PeerRole {
    fn from(r: Role) -> Self {
        match r {
            Role::Client => pb::PeerRole::Client,
            Role::Worker => pb::PeerRole::Worker,
            Role::Master => pb::PeerRole::Master,
        }
    }
}

impl pb::PeerRole {
    /// The Rust enum; `None` for UNSPECIFIED.
    pub fn typed(self) -> Option<Role> {
        match self {
            pb::PeerRole::Unspecified => None,
            pb::PeerRole::Client => Some(Role::Client),
            pb::PeerRole::Worker => Some(Role::Worker),
            pb::PeerRole::Master => Some(Role::Master),
        }
    }
}

impl From<WriteType> for pb::WriteType {
    fn from(w: WriteType) -> Self {
        match w {
            WriteType::MustCache => pb::WriteType::MustCache,
            WriteType::CacheThrough => pb::WriteType::CacheThrough,
            WriteType::Through => pb::WriteType::Through,
            WriteType::AsyncThrough => pb::WriteType::AsyncThrough,
        }
    }
}

impl pb::WriteType {
    /// The Rust enum; `None` for UNSPECIFIED.
    pub fn typed(self) -> Option<WriteType> {
        match self {
            pb::WriteType::Unspecified => None,
            pb::WriteType::MustCache => Some(WriteType::MustCache),
            pb::WriteType::CacheThrough => Some(WriteType::CacheThrough),
            pb::WriteType::Through => Some(WriteType::Through),
            pb::WriteType::AsyncThrough => Some(WriteType::AsyncThrough),
        }
    }
    /// `Some(w)` on the wire; UNSPECIFIED for `None`.
    pub fn from_opt(w: Option<WriteType>) -> pb::WriteType {
        w.map(Into::into).unwrap_or(pb::WriteType::Unspecified)
    }
}

impl From<ReadType> for pb::ReadType {
    fn from(r: ReadType) -> Self {
        match r {
            ReadType::Cache => pb::ReadType::Cache,
            ReadType::CachePromote => pb::ReadType::CachePromote,
            ReadType::NoCache => pb::ReadType::NoCache,
        }
    }
}

impl From<pb::ReadType> for ReadType {
    /// UNSPECIFIED reads as the default, CACHE.
    fn from(r: pb::ReadType) -> Self {
        match r {
            pb::ReadType::Unspecified | pb::ReadType::Cache => ReadType::Cache,
            pb::ReadType::CachePromote => ReadType::CachePromote,
            pb::ReadType::NoCache => ReadType::NoCache,
        }
    }
}

impl From<TierAlias> for pb::Tier {
    fn from(t: TierAlias) -> Self {
        match t {
            TierAlias::Mem => pb::Tier::Mem,
            TierAlias::Ssd => pb::Tier::Ssd,
            TierAlias::Hdd => pb::Tier::Hdd,
        }
    }
}

impl pb::Tier {
    /// The Rust enum; `None` for UNSPECIFIED.
    pub fn typed(self) -> Option<TierAlias> {
        match self {
            pb::Tier::Unspecified => None,
            pb::Tier::Mem => Some(TierAlias::Mem),
            pb::Tier::Ssd => Some(TierAlias::Ssd),
            pb::Tier::Hdd => Some(TierAlias::Hdd),
        }
    }
    /// The user-facing name (`MEM`, `SSD`, `HDD`; `-` when unspecified).
    pub fn name(self) -> &'static str {
        self.typed().map(TierAlias::as_str).unwrap_or("-")
    }
}

impl pb::PersistState {
    /// The user-facing name, as `stat` prints it.
    pub fn name(self) -> &'static str {
        match self {
            pb::PersistState::Persisted => "PERSISTED",
            pb::PersistState::NotPersisted => "NOT_PERSISTED",
            pb::PersistState::ToBePersisted => "TO_BE_PERSISTED",
            pb::PersistState::Lost => "LOST",
        }
    }
    /// Whether the UFS holds what the namespace says.
    pub fn is_persisted(self) -> bool {
        self == pb::PersistState::Persisted
    }
    /// Inverse of [`pb::PersistState::name`] (records stored before the typed protocol
    /// kept the name; "" meant PERSISTED).
    pub fn parse(s: &str) -> Option<pb::PersistState> {
        match s {
            "" | "PERSISTED" => Some(pb::PersistState::Persisted),
            "NOT_PERSISTED" => Some(pb::PersistState::NotPersisted),
            "TO_BE_PERSISTED" => Some(pb::PersistState::ToBePersisted),
            "LOST" => Some(pb::PersistState::Lost),
            _ => None,
        }
    }
}

impl pb::PersistOpKind {
    /// The short name: logs and the `kind` label of the persist metrics.
    pub fn name(self) -> &'static str {
        match self {
            pb::PersistOpKind::Unspecified => "UNSPECIFIED",
            pb::PersistOpKind::Persist => "PERSIST",
            pb::PersistOpKind::Mkdir => "MKDIR",
            pb::PersistOpKind::Delete => "DELETE",
            pb::PersistOpKind::Rename => "RENAME",
            pb::PersistOpKind::Meta => "META",
        }
    }
    /// Inverse of [`pb::PersistOpKind::name`] (ops queued before the typed protocol
    /// stored the name).
    pub fn parse(s: &str) -> Option<pb::PersistOpKind> {
        [
            pb::PersistOpKind::Persist,
            pb::PersistOpKind::Mkdir,
            pb::PersistOpKind::Delete,
            pb::PersistOpKind::Rename,
            pb::PersistOpKind::Meta,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }
}

impl From<JobState> for pb::JobState {
    fn from(s: JobState) -> Self {
        match s {
            JobState::Idle => pb::JobState::Idle,
            JobState::Running => pb::JobState::Running,
            JobState::Stopped => pb::JobState::Stopped,
        }
    }
}

impl pb::JobState {
    /// The lower-case name reports print.
    pub fn name(self) -> &'static str {
        match self {
            pb::JobState::Unspecified => "unknown",
            pb::JobState::Idle => JobState::Idle.as_str(),
            pb::JobState::Running => JobState::Running.as_str(),
            pb::JobState::Stopped => JobState::Stopped.as_str(),
        }
    }
}

impl From<JobStatus> for pb::JobInfo {
    fn from(s: JobStatus) -> Self {
        pb::JobInfo {
            name: s.name,
            state: pb::JobState::from(s.state).into(),
            runs: s.runs,
            failures: s.failures,
            last_error: s.last_error.unwrap_or_default(),
            last_run_ms: s.last_run_ms,
            backlog: s.backlog,
        }
    }
}

impl From<ReadSource> for pb::ReadSource {
    fn from(s: ReadSource) -> Self {
        match s {
            ReadSource::ShortCircuit => pb::ReadSource::ShortCircuit,
            ReadSource::LocalWorker => pb::ReadSource::LocalWorker,
            ReadSource::RemoteWorker => pb::ReadSource::RemoteWorker,
            ReadSource::Ufs => pb::ReadSource::Ufs,
        }
    }
}

impl pb::ReadSource {
    /// The Rust enum; `None` for UNSPECIFIED.
    pub fn typed(self) -> Option<ReadSource> {
        match self {
            pb::ReadSource::Unspecified => None,
            pb::ReadSource::ShortCircuit => Some(ReadSource::ShortCircuit),
            pb::ReadSource::LocalWorker => Some(ReadSource::LocalWorker),
            pb::ReadSource::RemoteWorker => Some(ReadSource::RemoteWorker),
            pb::ReadSource::Ufs => Some(ReadSource::Ufs),
        }
    }
}

impl pb::HostReads {
    /// The row of `key`: `reads` block reads of `bytes` bytes.
    pub fn row((host, source, reason): &HostKey, (reads, bytes): (u64, u64)) -> pb::HostReads {
        pb::HostReads {
            host: host.clone(),
            source: pb::ReadSource::from(*source).into(),
            reason: pb::ReadReason::from(*reason).into(),
            reads,
            bytes,
        }
    }

    /// The row's key; `None` for a source this build does not know.
    pub fn key(&self) -> Option<HostKey> {
        Some((self.host.clone(), self.source().typed()?, ReadReason::from(self.reason())))
    }
}

impl From<ReadReason> for pb::ReadReason {
    fn from(r: ReadReason) -> Self {
        match r {
            ReadReason::ShortCircuit => pb::ReadReason::ShortCircuit,
            ReadReason::NoLocalWorker => pb::ReadReason::NoLocalWorker,
            ReadReason::SocketNotVisible => pb::ReadReason::SocketNotVisible,
            ReadReason::NotCached => pb::ReadReason::NotCached,
            ReadReason::CachedElsewhere => pb::ReadReason::CachedElsewhere,
            ReadReason::LeaseRefused => pb::ReadReason::LeaseRefused,
            ReadReason::Disabled => pb::ReadReason::Disabled,
            ReadReason::Unknown => pb::ReadReason::Unspecified,
        }
    }
}

impl From<pb::ReadReason> for ReadReason {
    /// UNSPECIFIED (a client that did not say) reads as `Unknown`.
    fn from(r: pb::ReadReason) -> Self {
        match r {
            pb::ReadReason::Unspecified => ReadReason::Unknown,
            pb::ReadReason::ShortCircuit => ReadReason::ShortCircuit,
            pb::ReadReason::NoLocalWorker => ReadReason::NoLocalWorker,
            pb::ReadReason::SocketNotVisible => ReadReason::SocketNotVisible,
            pb::ReadReason::NotCached => ReadReason::NotCached,
            pb::ReadReason::CachedElsewhere => ReadReason::CachedElsewhere,
            pb::ReadReason::LeaseRefused => ReadReason::LeaseRefused,
            pb::ReadReason::Disabled => ReadReason::Disabled,
        }
    }
}

impl pb::ReadBlockRequest {
    /// Where the block this read names comes from, as its ticket binds it.
    pub fn origin(&self) -> locus_common::security::BlockOrigin<'_> {
        locus_common::security::BlockOrigin {
            block_id: self.block_id,
            mount_id: self.mount_id,
            ufs_path: &self.ufs_path,
            file_offset: self.file_offset,
            block_length: self.block_length,
            fingerprint: &self.fingerprint,
        }
    }
}

impl pb::FileInfo {
    /// Where block `b` of this file comes from, as its ticket binds it.
    pub fn origin<'a>(&'a self, b: &pb::BlockInfo) -> locus_common::security::BlockOrigin<'a> {
        locus_common::security::BlockOrigin {
            block_id: b.block_id,
            mount_id: self.mount_id,
            ufs_path: &self.ufs_path,
            file_offset: b.offset,
            block_length: b.length,
            fingerprint: &self.fingerprint,
        }
    }

    /// Bytes of the file whose block some worker caches (blocks listed with a location;
    /// `status(path, true)` lists them).
    pub fn cached_bytes(&self) -> u64 {
        self.blocks.iter().filter(|b| !b.locations.is_empty()).map(|b| b.length).sum()
    }

    /// [`cached_bytes`](pb::FileInfo::cached_bytes) over the length (0 for an empty file).
    pub fn cached_fraction(&self) -> f64 {
        if self.length == 0 { 0.0 } else { self.cached_bytes() as f64 / self.length as f64 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rust_enum_value_survives_the_wire() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::from(pb::ErrorKind::from(k)), k);
        }
        for w in [WriteType::MustCache, WriteType::CacheThrough, WriteType::Through, WriteType::AsyncThrough] {
            let wire = pb::WriteType::from(w);
            assert_eq!(pb::WriteType::try_from(wire as i32).unwrap().typed(), Some(w));
            assert_eq!(wire.as_str_name().strip_prefix("WRITE_TYPE_"), Some(w.as_str()));
        }
        assert_eq!(pb::WriteType::Unspecified.typed(), None);
        for r in [ReadType::Cache, ReadType::CachePromote, ReadType::NoCache] {
            assert_eq!(ReadType::from(pb::ReadType::from(r)), r);
            assert_eq!(pb::ReadType::from(r).as_str_name().strip_prefix("READ_TYPE_"), Some(r.as_str()));
        }
        assert_eq!(ReadType::from(pb::ReadType::Unspecified), ReadType::Cache);
        for r in ReadReason::ALL {
            assert_eq!(ReadReason::from(pb::ReadReason::from(r)), r);
        }
        for s in ReadSource::ALL {
            assert_eq!(pb::ReadSource::from(s).typed(), Some(s));
        }
        for t in [TierAlias::Mem, TierAlias::Ssd, TierAlias::Hdd] {
            assert_eq!(pb::Tier::from(t).typed(), Some(t));
            assert_eq!(pb::Tier::from(t).name(), t.as_str());
        }
        for s in [
            pb::PersistState::Persisted,
            pb::PersistState::NotPersisted,
            pb::PersistState::ToBePersisted,
            pb::PersistState::Lost,
        ] {
            assert_eq!(pb::PersistState::parse(s.name()), Some(s));
        }
        assert_eq!(pb::PersistState::parse(""), Some(pb::PersistState::Persisted));
        for k in [
            pb::PersistOpKind::Persist,
            pb::PersistOpKind::Mkdir,
            pb::PersistOpKind::Delete,
            pb::PersistOpKind::Rename,
            pb::PersistOpKind::Meta,
        ] {
            assert_eq!(k.as_str_name().strip_prefix("PERSIST_OP_KIND_"), Some(k.name()));
            assert_eq!(pb::PersistOpKind::parse(k.name()), Some(k));
        }
    }
}

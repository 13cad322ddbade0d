//! The one structured error type of Locus.
//!
//! Every error has a [`ErrorKind`], a retryable flag, a human context string and an
//! optional source. Front ends map kinds to their own conventions in one place each
//! (gRPC status in `locus-proto`, CLI exit codes in the binary, S3 codes in the gateway).

use std::fmt;

/// What went wrong, independent of where.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// A path, block, worker or mount does not exist.
    NotFound,
    /// The thing to create exists already.
    AlreadyExists,
    /// The caller passed something malformed (bad path, bad option, garbled message).
    InvalidArgument,
    /// A name longer than the under file system can store (a path component past the
    /// file system's limit, an S3 key past 1024 bytes). Otherwise like `InvalidArgument`.
    NameTooLong,
    /// The operation is not allowed (read-only mount, path escapes a mount).
    PermissionDenied,
    /// The caller presented no valid cluster credentials (secret or client token).
    Unauthenticated,
    /// Out of space: a quota cannot be met because blocks are pinned or in use.
    ResourceExhausted,
    /// The state does not allow it (contains a mount point, not yet persisted, ...).
    FailedPrecondition,
    /// A directory to remove without `recursive` has entries.
    DirectoryNotEmpty,
    /// A file operation (open for reading, write, truncate) named a directory.
    IsADirectory,
    /// A path goes through a file as if it were a directory, or a directory operation
    /// (list, remove a directory) named a file.
    NotADirectory,
    /// A peer (master, worker, UFS) cannot be reached right now.
    Unavailable,
    /// The under file system returned an error.
    Ufs,
    /// Data failed a checksum or a size check.
    Corrupt,
    /// Local I/O failed.
    Io,
    /// A bug or an unexpected state.
    Internal,
}

impl ErrorKind {
    /// Stable lower-case name, used in logs, JSON output and on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::NameTooLong => "name_too_long",
            ErrorKind::PermissionDenied => "permission_denied",
            ErrorKind::Unauthenticated => "unauthenticated",
            ErrorKind::ResourceExhausted => "resource_exhausted",
            ErrorKind::FailedPrecondition => "failed_precondition",
            ErrorKind::DirectoryNotEmpty => "directory_not_empty",
            ErrorKind::IsADirectory => "is_a_directory",
            ErrorKind::NotADirectory => "not_a_directory",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Ufs => "ufs",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Io => "io",
            ErrorKind::Internal => "internal",
        }
    }

    /// The POSIX errno of this kind: what the FUSE mount answers and what the Python
    /// client's `OSError` carries (so Python raises `FileNotFoundError` for `ENOENT`).
    pub fn errno(self) -> i32 {
        match self {
            ErrorKind::NotFound => libc::ENOENT,
            ErrorKind::AlreadyExists => libc::EEXIST,
            ErrorKind::InvalidArgument | ErrorKind::FailedPrecondition => libc::EINVAL,
            ErrorKind::NameTooLong => libc::ENAMETOOLONG,
            ErrorKind::PermissionDenied | ErrorKind::Unauthenticated => libc::EACCES,
            ErrorKind::ResourceExhausted => libc::ENOSPC,
            ErrorKind::DirectoryNotEmpty => libc::ENOTEMPTY,
            ErrorKind::IsADirectory => libc::EISDIR,
            ErrorKind::NotADirectory => libc::ENOTDIR,
            ErrorKind::Unavailable | ErrorKind::Ufs | ErrorKind::Corrupt | ErrorKind::Io | ErrorKind::Internal => {
                libc::EIO
            }
        }
    }

    /// Whether an error of this kind is worth retrying by default.
    pub fn default_retryable(self) -> bool {
        matches!(self, ErrorKind::Unavailable | ErrorKind::Io)
    }

    /// All kinds, for round-trip tests of the front-end mappings.
    pub const ALL: [ErrorKind; 16] = [
        ErrorKind::NotFound,
        ErrorKind::AlreadyExists,
        ErrorKind::InvalidArgument,
        ErrorKind::NameTooLong,
        ErrorKind::PermissionDenied,
        ErrorKind::Unauthenticated,
        ErrorKind::ResourceExhausted,
        ErrorKind::FailedPrecondition,
        ErrorKind::DirectoryNotEmpty,
        ErrorKind::IsADirectory,
        ErrorKind::NotADirectory,
        ErrorKind::Unavailable,
        ErrorKind::Ufs,
        ErrorKind::Corrupt,
        ErrorKind::Io,
        ErrorKind::Internal,
    ];

    /// Inverse of [`ErrorKind::as_str`].
    pub fn parse(s: &str) -> Option<ErrorKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// The Locus error: kind, retryable or not, context, source.
pub struct Error {
    kind: ErrorKind,
    retryable: bool,
    context: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// Result alias used across the crates.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Self {
        Error { kind, retryable: kind.default_retryable(), context: context.into(), source: None }
    }
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }
    pub fn set_retryable(mut self, retryable: bool) -> Self {
        self.retryable = retryable;
        self
    }
    /// Prefix more context, keeping kind and source.
    pub fn context(mut self, ctx: impl fmt::Display) -> Self {
        self.context = format!("{ctx}: {}", self.context);
        self
    }
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
    pub fn is_retryable(&self) -> bool {
        self.retryable
    }
    pub fn message(&self) -> &str {
        &self.context
    }

    pub fn not_found(ctx: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, ctx)
    }
    pub fn invalid(ctx: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, ctx)
    }
    pub fn internal(ctx: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, ctx)
    }
    pub fn unavailable(ctx: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, ctx)
    }
    pub fn io(ctx: impl Into<String>, e: std::io::Error) -> Self {
        let kind = match e.kind() {
            std::io::ErrorKind::NotFound => ErrorKind::NotFound,
            std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded => ErrorKind::ResourceExhausted,
            std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::BrokenPipe
            | std::io::ErrorKind::UnexpectedEof
            | std::io::ErrorKind::TimedOut => ErrorKind::Unavailable,
            _ => ErrorKind::Io,
        };
        Self::new(kind, ctx).with_source(e)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.context)?;
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({}, retryable={}, {})", self.kind.as_str(), self.retryable, self)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::io("i/o error", e)
    }
}

/// Shorthand: `bail!(Kind, "fmt", args)` returns an `Err(Error)`.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)*) => {
        return Err($crate::Error::new($crate::ErrorKind::$kind, format!($($arg)*)))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_round_trip() {
        for k in ErrorKind::ALL {
            assert_eq!(ErrorKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(ErrorKind::parse("nope"), None);
    }

    #[test]
    fn io_errors_map_to_kinds() {
        let e = Error::io("open", std::io::Error::from(std::io::ErrorKind::NotFound));
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(!e.is_retryable());
        let e = Error::io("conn", std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(e.is_retryable());
        assert!(e.to_string().starts_with("conn"));
    }
}

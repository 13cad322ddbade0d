//! A client's change, known again when it is sent again (docs/design/ha-plan.md, stage
//! 2). A client sends each change call with a request id, the same on every resend
//! ([`locus_proto::REQUEST_ID_KEY`]). The command the call makes carries it, and the
//! store keeps the command's result under it in the same transaction (`retry_cache`,
//! `apply.rs`). A resend after a lost reply (a dropped connection, a master killed
//! between its commit and its answer) is answered from that result before the handler's
//! checks, which would refuse it (a rename's source is gone), and changes nothing
//! ([`Master::once`]).
//!
//! Only the call's own command carries the id: never the ancestors' `Mkdir`s a write
//! makes on its way, which are made again harmlessly.

use locus_common::{Error, Result};
use locus_proto::pb;
use prost::Message;
use redb::ReadableTable;
use sha2::{Digest, Sha256};

use crate::Master;
use crate::store::*;

/// Bytes of a call's key in the retry cache.
const KEY_LEN: usize = 16;

/// The calls whose change a resend does not make twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum CallKind {
    CreateFile = 1,
    CompleteFile = 2,
    CreateDirectory = 3,
    Delete = 4,
    Rename = 5,
    Mount = 6,
    Unmount = 7,
}

/// A change call's key in the retry cache: SHA-256 of its kind, the client's id and the
/// request's bytes, cut to 128 bits. A resend is the same request, so it finds its first result; another
/// request sent with the same id (a client's bug, or a caller trying to have another
/// call's result, such as a write's version, answered for its own path) does not. Empty
/// for a call sent without an id (older clients, the master's own changes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CallId(Vec<u8>);

impl CallId {
    /// No id: the change is made again if sent again.
    pub(crate) const NONE: CallId = CallId(Vec::new());

    /// The id of a `kind` call of `request` (its bytes) whose request id header is
    /// `header` (none: [`CallId::NONE`]).
    pub(crate) fn parse(kind: CallKind, header: Option<&str>, request: &[u8]) -> Result<CallId> {
        let Some(h) = header else { return Ok(CallId::NONE) };
        let id = locus_proto::parse_request_id(h).ok_or_else(|| {
            Error::invalid(format!(
                "{} must be {} hex digits, the same on every resend of one call",
                locus_proto::REQUEST_ID_KEY,
                2 * locus_proto::REQUEST_ID_LEN
            ))
        })?;
        let mut d = Sha256::new();
        d.update([kind as u8]);
        d.update(id);
        d.update(request);
        // 128 bits: two requests that share a key take about 2^64 tries to find; each
        // byte less is a byte less in both retry tables, kept 10 minutes.
        Ok(CallId(d.finalize()[..KEY_LEN].to_vec()))
    }

    /// The bytes a command carries as its `request_id`.
    pub(crate) fn key(&self) -> &[u8] {
        &self.0
    }
}

impl Master {
    /// Runs call `id`'s handler `f`; a call made before is answered from its first result
    /// (`first`) instead: found before `f` runs (a resend), or after `f` failed (its checks
    /// refused what a first try, running beside it, has just done).
    pub(crate) async fn once<T>(
        &self,
        id: &CallId,
        first: impl Fn(pb::CommandResult) -> Result<T>,
        f: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        if let Some(r) = self.first_result(id)? {
            return first(r);
        }
        match f.await {
            Err(e) => match self.first_result(id)? {
                Some(r) => first(r),
                None => Err(e),
            },
            done => done,
        }
    }

    /// The result the change of call `id` committed with, if it did: `id` is a resend.
    pub(crate) fn first_result(&self, id: &CallId) -> Result<Option<pb::CommandResult>> {
        if id.0.is_empty() {
            return Ok(None);
        }
        cached(&self.ns().read()?.open_table(RETRY_CACHE).map_err(db_err)?, id.key())
    }
}

/// The result kept in retry cache `t` for request id `key`.
pub(crate) fn cached(
    t: &impl ReadableTable<&'static [u8], &'static [u8]>,
    key: &[u8],
) -> Result<Option<pb::CommandResult>> {
    let Some(v) = t.get(key).map_err(db_err)? else { return Ok(None) };
    let e = pb::RetryEntry::decode(v.value()).map_err(|e| Error::internal(format!("retry cache entry: {e}")))?;
    Ok(Some(e.result.unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resend_has_its_key_and_any_other_call_another() {
        let h = "0123456789abcdef0123456789ABCDEF";
        let a = CallId::parse(CallKind::Delete, Some(h), b"/a").unwrap();
        assert_eq!(a, CallId::parse(CallKind::Delete, Some(h), b"/a").unwrap());
        assert_eq!(a.key().len(), KEY_LEN);
        for other in [
            CallId::parse(CallKind::Rename, Some(h), b"/a"),
            CallId::parse(CallKind::Delete, Some(h), b"/b"),
            CallId::parse(CallKind::Delete, Some("0123456789abcdef0123456789abcdee"), b"/a"),
        ] {
            assert_ne!(a, other.unwrap());
        }
        assert_eq!(CallId::parse(CallKind::Delete, None, b"/a").unwrap(), CallId::NONE);
        let e = CallId::parse(CallKind::Delete, Some("../../etc"), b"/a").unwrap_err();
        assert_eq!(e.kind(), locus_common::ErrorKind::InvalidArgument);
        assert!(e.to_string().contains("x-locus-request-id"), "{e}");
    }
}

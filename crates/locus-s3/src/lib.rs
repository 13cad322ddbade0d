//! The S3-compatible gateway: S3 requests in, Locus client calls out.
//!
//! A bucket is a top-level directory of the Locus namespace (a mount at `/sales` is
//! bucket `sales`), and an object key is the path below it. Reads stream through the
//! Locus cache; writes stream through a worker to the UFS. The wire format, SigV4
//! (header, presigned and streaming chunked) and the XML bodies come from `s3s`; this
//! crate maps S3 operations onto the client and Locus errors onto S3 codes, in one
//! place ([`s3_error`]). It holds no cache or storage logic of its own.
//!
//! Depends on `locus-client`, `locus-common` and `locus-proto` only; never on the
//! master, worker, block store or UFS crates.

mod answer;
mod conn;
mod early;
mod framing;
mod limits;
mod s3;

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use locus_client::Client;
use locus_common::config::GatewayConfig;
use locus_common::{Error, ErrorKind, Result};
use s3s::host::{S3Host, VirtualHost};
use s3s::{S3Error, S3ErrorCode, S3Result};
use tokio::net::TcpListener;

/// Request header choosing the read type of one GET: `CACHE` (default), `CACHE_PROMOTE`
/// or `NO_CACHE`.
pub const READ_TYPE_HEADER: &str = "x-locus-read-type";

/// Request header choosing the write type of one PUT, copy or multipart completion:
/// `MUST_CACHE`, `CACHE_THROUGH`, `THROUGH` or `ASYNC_THROUGH` (default: the mount's,
/// else the cluster's).
pub const WRITE_TYPE_HEADER: &str = "x-locus-write-type";

/// Directory at the root of each bucket holding multipart uploads in progress. Hidden
/// from listings; keys through it are refused.
pub(crate) const UPLOADS_DIR: &str = ".locus-uploads";

/// Builds a [`Gateway`].
pub struct GatewayBuilder {
    client: Arc<Client>,
    cfg: GatewayConfig,
}

impl GatewayBuilder {
    pub fn new(client: Arc<Client>, cfg: GatewayConfig) -> Self {
        GatewayBuilder { client, cfg }
    }

    pub fn build(self) -> Result<Gateway> {
        let cfg = self.cfg;
        let mut b = s3s::service::S3ServiceBuilder::new(s3::LocusS3::new(self.client, cfg.clone()));
        if !cfg.access_key_id.is_empty() {
            b.set_auth(Keys(Some((cfg.access_key_id.clone(), cfg.secret_access_key.clone()))));
            b.set_access(limits::Access { anonymous: cfg.anonymous });
        } else if !cfg.anonymous {
            // No keys and no anonymous access: an auth provider that knows nobody, so
            // every request is refused.
            b.set_auth(Keys(None));
            b.set_access(limits::Access { anonymous: false });
        }
        b.set_host(Hosts { domains: cfg.domains.clone() });
        Ok(Gateway { service: b.build(), cfg })
    }
}

/// An S3 gateway, ready to serve.
pub struct Gateway {
    service: s3s::service::S3Service,
    cfg: GatewayConfig,
}

impl Gateway {
    /// Bind the configured address.
    pub async fn bind(&self) -> Result<TcpListener> {
        TcpListener::bind(&self.cfg.address)
            .await
            .map_err(|e| Error::io(format!("cannot listen on {} (gateway.address)", self.cfg.address), e))
    }

    /// Serve connections from `listener` until `shutdown` resolves, then let requests in
    /// flight finish (for up to 10 s).
    pub async fn serve(self, listener: TcpListener, shutdown: impl Future<Output = ()>) -> Result<()> {
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        tokio::pin!(shutdown);
        // At most `gateway.max_connections` served at once: the next is accepted when one
        // closes (meanwhile clients wait in the listen backlog).
        let slots = Arc::new(tokio::sync::Semaphore::new(self.cfg.max_connections));
        // And at most `gateway.max_connections_per_client` of them from one address.
        let per_client = limits::PerClient::new(self.cfg.max_connections_per_client);
        let (idle, head_timeout) = (self.cfg.body_idle_timeout, self.cfg.header_read_timeout);
        loop {
            let slot = tokio::select! {
                s = slots.clone().acquire_owned() => s.expect("the semaphore is never closed"),
                _ = &mut shutdown => break,
            };
            let (stream, peer) = tokio::select! {
                r = listener.accept() => match r {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "gateway accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                _ = &mut shutdown => break,
            };
            let _ = stream.set_nodelay(true);
            let Some(client_slot) = per_client.admit(peer.ip()) else {
                tracing::debug!(%peer, "refused a connection over its address's cap");
                let cap = self.cfg.max_connections_per_client;
                tokio::spawn(async move {
                    limits::refuse_busy(stream, cap).await;
                    drop(slot);
                });
                continue;
            };
            let conn = conn::Conn { service: self.service.clone(), peer, head_timeout, idle };
            let watcher = graceful.watcher();
            tokio::spawn(async move {
                conn.serve(stream, watcher).await;
                drop((slot, client_slot));
            });
        }
        tokio::select! {
            _ = graceful.shutdown() => {}
            _ = tokio::time::sleep(Duration::from_secs(10)) => {
                tracing::warn!("gateway requests still running after 10 s; stopping anyway");
            }
        }
        Ok(())
    }
}

/// The configured key pair (if any).
struct Keys(Option<(String, String)>);

#[async_trait::async_trait]
impl s3s::auth::S3Auth for Keys {
    async fn get_secret_key(&self, access_key: &str) -> S3Result<s3s::auth::SecretKey> {
        match &self.0 {
            Some((k, s)) if k == access_key => Ok(s.clone().into()),
            _ => Err(s3s::s3_error!(InvalidAccessKeyId)),
        }
    }
}

/// Virtual-hosted-style for `BUCKET.DOMAIN[:port]`, path-style for everything else (an
/// IP address, a base domain, any other name).
struct Hosts {
    domains: Vec<String>,
}

impl S3Host for Hosts {
    fn parse_host_header<'a>(&'a self, host: &'a str) -> S3Result<VirtualHost<'a>> {
        if host.starts_with('[') {
            return Ok(VirtualHost::new(host)); // an IPv6 literal
        }
        let name = match host.rsplit_once(':') {
            Some((h, port)) if port.parse::<u16>().is_ok() => h,
            _ => host,
        };
        if name.parse::<IpAddr>().is_err() {
            for d in &self.domains {
                if let Some(bucket) = name.strip_suffix(d.as_str()).and_then(|b| b.strip_suffix('.'))
                    && !bucket.is_empty()
                {
                    return Ok(VirtualHost::new(d.as_str()).with_bucket(bucket));
                }
            }
        }
        Ok(VirtualHost::new(name))
    }
}

/// The one mapping of Locus errors to S3 error codes. `not_found` names what was
/// missing (`NoSuchKey`, `NoSuchBucket`, `NoSuchUpload`).
pub(crate) fn s3_error(e: Error, not_found: S3ErrorCode) -> S3Error {
    let code = match e.kind() {
        ErrorKind::NotFound => not_found,
        ErrorKind::AlreadyExists => S3ErrorCode::InvalidRequest,
        ErrorKind::InvalidArgument => S3ErrorCode::InvalidArgument,
        ErrorKind::NameTooLong => S3ErrorCode::KeyTooLongError,
        ErrorKind::PermissionDenied => S3ErrorCode::AccessDenied,
        ErrorKind::FailedPrecondition
        | ErrorKind::DirectoryNotEmpty
        | ErrorKind::IsADirectory
        | ErrorKind::NotADirectory => S3ErrorCode::InvalidRequest,
        ErrorKind::ResourceExhausted | ErrorKind::Unavailable => S3ErrorCode::ServiceUnavailable,
        // The gateway's own credential was refused: its configuration, not the caller's request.
        ErrorKind::Unauthenticated | ErrorKind::Ufs | ErrorKind::Corrupt | ErrorKind::Io | ErrorKind::Internal => {
            S3ErrorCode::InternalError
        }
    };
    // (Logged with the request's id once answered: `answer::finish`.)
    S3Error::with_message(code, e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_split_virtual_and_path_style() {
        let h = Hosts { domains: vec!["localhost".into(), "s3.example.com".into()] };
        let b = |host: &str| h.parse_host_header(host).unwrap().bucket().map(str::to_string);
        assert_eq!(b("127.0.0.1:39999"), None);
        assert_eq!(b("[::1]:39999"), None);
        assert_eq!(b("localhost:39999"), None);
        assert_eq!(b("localhost"), None);
        assert_eq!(b("sales.localhost:39999"), Some("sales".into()));
        assert_eq!(b("my.data.s3.example.com"), Some("my.data".into()));
        assert_eq!(b("other.host:80"), None);
    }

    #[test]
    fn every_error_kind_maps_to_an_s3_code() {
        for k in ErrorKind::ALL {
            let e = s3_error(Error::new(k, "x"), S3ErrorCode::NoSuchKey);
            let status = e.status_code().map(|s| s.as_u16()).unwrap_or(500);
            assert!((400..600).contains(&status), "{k:?} -> {status}");
        }
        assert_eq!(*s3_error(Error::not_found("x"), S3ErrorCode::NoSuchBucket).code(), S3ErrorCode::NoSuchBucket);
        assert_eq!(
            *s3_error(Error::new(ErrorKind::PermissionDenied, "ro"), S3ErrorCode::NoSuchKey).code(),
            S3ErrorCode::AccessDenied
        );
        // A name the mount's UFS cannot hold: too long, or otherwise refused.
        assert_eq!(
            *s3_error(Error::new(ErrorKind::NameTooLong, "x"), S3ErrorCode::NoSuchKey).code(),
            S3ErrorCode::KeyTooLongError
        );
        assert_eq!(*s3_error(Error::invalid("x "), S3ErrorCode::NoSuchKey).code(), S3ErrorCode::InvalidArgument);
    }
}

//! What keeps one client from holding the gateway: a cap on connections served at once
//! and on those of one client address ([`PerClient`]), a time limit on a request's head
//! that also closes idle connections (hyper's `header_read_timeout`, set where
//! connections are served), a time limit on a request body that stalls ([`IdleBody`]),
//! and S3's one-week limit on presigned URLs ([`Access`]).

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use s3s::S3Result;
use s3s::access::{S3Access, S3AccessContext};

/// The longest validity S3 accepts for a presigned URL (`X-Amz-Expires`): 7 days.
pub(crate) const MAX_PRESIGNED_EXPIRES: u64 = 7 * 24 * 3600;

/// Who may call: signed requests (and unsigned ones when `anonymous`), and no
/// presigned URL valid for more than a week.
pub(crate) struct Access {
    pub(crate) anonymous: bool,
}

#[async_trait::async_trait]
impl S3Access for Access {
    async fn check(&self, cx: &mut S3AccessContext<'_>) -> S3Result<()> {
        let expires =
            cx.uri().query().into_iter().flat_map(|q| form_urlencoded::parse(q.as_bytes())).find_map(|(k, v)| {
                k.eq_ignore_ascii_case("X-Amz-Expires").then(|| v.parse::<u64>().unwrap_or(u64::MAX))
            });
        if let Some(e) = expires
            && e > MAX_PRESIGNED_EXPIRES
        {
            return Err(s3s::s3_error!(
                AuthorizationQueryParametersError,
                "X-Amz-Expires must be less than a week (in seconds) that is {MAX_PRESIGNED_EXPIRES}"
            ));
        }
        if cx.credentials().is_none() && !self.anonymous {
            return Err(s3s::s3_error!(AccessDenied, "Signature is required"));
        }
        Ok(())
    }
}

/// Connections open per client address, each held by a [`ClientSlot`].
#[derive(Clone)]
pub(crate) struct PerClient {
    open: Arc<parking_lot::Mutex<HashMap<IpAddr, usize>>>,
    cap: usize,
}

/// One connection of a client address, counted until it drops.
pub(crate) struct ClientSlot {
    open: Arc<parking_lot::Mutex<HashMap<IpAddr, usize>>>,
    ip: IpAddr,
}

impl PerClient {
    pub(crate) fn new(cap: usize) -> PerClient {
        PerClient { open: Default::default(), cap }
    }

    /// A slot for a new connection from `ip`, unless it already has `cap` open.
    pub(crate) fn admit(&self, ip: IpAddr) -> Option<ClientSlot> {
        let mut m = self.open.lock();
        let n = m.entry(ip).or_default();
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(ClientSlot { open: self.open.clone(), ip })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut m = self.open.lock();
        if let Some(n) = m.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.ip);
            }
        }
    }
}

/// The answer to a connection over its address's cap: 503 SlowDown in S3's XML, then
/// the connection is closed (within a second, whatever the client does).
pub(crate) async fn refuse_busy(mut stream: tokio::net::TcpStream, cap: usize) {
    use tokio::io::AsyncWriteExt;
    let r = crate::early::refusal(
        http::StatusCode::SERVICE_UNAVAILABLE,
        "SlowDown",
        format!(
            "Too many connections from this address (gateway.max_connections_per_client is {cap}): reuse or close some"
        ),
    );
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        stream.write_all(&crate::early::raw_answer(&r)).await?;
        stream.shutdown().await
    })
    .await;
}

/// Why a request body stopped.
#[derive(Debug)]
pub(crate) enum BodyError {
    Read(hyper::Error),
    Idle(Duration),
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BodyError::Read(e) => write!(f, "reading the request body: {e}"),
            BodyError::Idle(d) => write!(f, "the request body sent nothing for {d:?} (gateway.body_idle_timeout)"),
        }
    }
}

impl std::error::Error for BodyError {}

/// A request body that fails when it sends nothing for `idle`, and records when it was
/// read to the end.
pub(crate) struct IdleBody {
    inner: hyper::body::Incoming,
    done: Arc<AtomicBool>,
    idle: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl IdleBody {
    pub(crate) fn new(inner: hyper::body::Incoming, done: Arc<AtomicBool>, idle: Duration) -> IdleBody {
        IdleBody { inner, done, idle, timer: Box::pin(tokio::time::sleep(idle)) }
    }
}

impl http_body::Body for IdleBody {
    type Data = Bytes;
    type Error = BodyError;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, BodyError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(None) => {
                self.done.store(true, Ordering::Release);
                Poll::Ready(None)
            }
            Poll::Ready(Some(r)) => {
                let deadline = tokio::time::Instant::now() + self.idle;
                self.timer.as_mut().reset(deadline);
                Poll::Ready(Some(r.map_err(BodyError::Read)))
            }
            Poll::Pending => match self.timer.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(BodyError::Idle(self.idle)))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }
    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_gets_at_most_its_cap() {
        let p = PerClient::new(2);
        let (a, b): (IpAddr, IpAddr) = ("127.0.0.1".parse().unwrap(), "127.0.0.2".parse().unwrap());
        let s1 = p.admit(a).unwrap();
        let _s2 = p.admit(a).unwrap();
        assert!(p.admit(a).is_none(), "over the cap");
        assert!(p.admit(b).is_some(), "another address is not held up");
        drop(s1);
        assert!(p.admit(a).is_some(), "a closed connection frees its slot");
        drop(p.admit(b));
        assert!(!p.open.lock().contains_key(&b), "an address with nothing open is forgotten");
    }

    #[test]
    fn the_presigned_limit_is_a_week() {
        assert_eq!(MAX_PRESIGNED_EXPIRES, 604_800);
    }
}

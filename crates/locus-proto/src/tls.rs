//! Optional TLS (rustls) on the TCP ports: the master RPC and the workers' data path.
//!
//! A server with `security.tls_cert_file` and `security.tls_key_file` accepts TLS
//! connections only; a process with `security.tls_ca_file` connects to the master and
//! to workers over TLS, checking their certificates against that CA and the host it
//! dialled. Off by default (the defaults bind loopback). The Unix socket of short-circuit
//! reads stays as it is.
//!
//! Both ports tell the two kinds of connection apart by their first byte, without a
//! round trip: a TLS handshake starts with a record of type 22 (`0x16`), a data-path frame
//! with the high byte of its length (`0x00`, frames are below 1 MiB) and a gRPC connection
//! with the HTTP/2 preface (`P`). So a mismatch gets a clear error rather than a hang:
//! - a plain client of a TLS worker gets an `Unauthenticated` error frame saying so, and
//!   of a TLS master an `Unauthenticated` status (`ServerAuth` checks [`ConnInfo`]);
//! - a TLS client of a plain server has its handshake answered with plain text, which
//!   its TLS stack refuses at once; [`Tls::connect`] names the likely causes.

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use locus_common::config::SecurityConfig;
use locus_common::{Error, ErrorKind, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// How long a new connection may take to send its first byte and finish a handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of a TLS handshake record.
const TLS_HANDSHAKE: u8 = 0x16;

/// What a plain server answers a TLS client with: not TLS, so the client's handshake
/// fails at once (and a person reading the bytes learns why).
const NOT_TLS: &[u8] = b"\0\0\0\0locus: this port does not serve TLS (security.tls_cert_file is not set here)\n";

/// The TLS side of a process: what it serves with and what it trusts. Cheap to clone.
#[derive(Clone, Default)]
pub struct Tls {
    server: Option<Arc<rustls::ServerConfig>>,
    client: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("serves", &self.serves()).field("connects", &self.connects()).finish()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn read_pem(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::NotFound { ErrorKind::NotFound } else { ErrorKind::Io };
        Error::new(kind, format!("read {what} {}: {e}", path.display()))
    })
}

fn certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read_pem(path, what)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::invalid(format!("{what} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(Error::invalid(format!("{what} {} holds no PEM certificate", path.display())));
    }
    Ok(certs)
}

impl Tls {
    /// No TLS: plain TCP both ways.
    pub fn none() -> Tls {
        Tls::default()
    }

    /// The TLS of `cfg`'s `tls_*` files. Reads them: call it off the async runtime (at
    /// start, or in `spawn_blocking`).
    pub fn load(cfg: &SecurityConfig) -> Result<Tls> {
        let server = match (&cfg.tls_cert_file, &cfg.tls_key_file) {
            (None, None) => None,
            (Some(c), Some(k)) => Some(Arc::new(Self::server_config(c, k)?)),
            _ => {
                return Err(Error::invalid(
                    "security.tls_cert_file and security.tls_key_file are set together (or neither)",
                ));
            }
        };
        let client = match &cfg.tls_ca_file {
            None => None,
            Some(ca) => Some(Arc::new(Self::client_config(ca)?)),
        };
        Ok(Tls { server, client })
    }

    fn server_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig> {
        let chain = certs(cert, "TLS certificate (security.tls_cert_file)")?;
        let pem = read_pem(key, "TLS key (security.tls_key_file)")?;
        // (The key's text is never put in an error: only its path.)
        let key_der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
            Error::invalid(format!("TLS key (security.tls_key_file) {}: no PEM private key ({e})", key.display()))
        })?;
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key_der))
            .map_err(|e| Error::invalid(format!("TLS certificate {} and key {}: {e}", cert.display(), key.display())))
    }

    fn client_config(ca: &Path) -> Result<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca, "TLS CA file (security.tls_ca_file)")? {
            roots.add(c).map_err(|e| Error::invalid(format!("TLS CA file {}: {e}", ca.display())))?;
        }
        Ok(rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::internal(format!("TLS client: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth())
    }

    /// Whether this process serves its TCP ports over TLS (and only TLS).
    pub fn serves(&self) -> bool {
        self.server.is_some()
    }

    /// Whether this process connects to the cluster's TCP ports over TLS.
    pub fn connects(&self) -> bool {
        self.client.is_some()
    }

    /// Connect to `what` (`"worker"`, `"master"`) at `addr` (`host:port`): TCP without
    /// Nagle, then the TLS handshake if this process connects with TLS, checking the
    /// server's certificate against the CA and `host`.
    pub async fn connect(&self, addr: &str, what: &str) -> Result<DataStream> {
        let tcp = TcpStream::connect(addr).await.map_err(|e| Error::io(format!("connect to {what} {addr}"), e))?;
        let _ = tcp.set_nodelay(true);
        let Some(client) = &self.client else { return Ok(DataStream::Plain(tcp)) };
        let host = addr.rsplit_once(':').map(|(h, _)| h).unwrap_or(addr).trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string())
            .map_err(|e| Error::invalid(format!("{what} address {addr}: not a TLS server name ({e})")))?;
        let hs = TlsConnector::from(client.clone()).connect(name, tcp);
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, hs).await {
            Ok(Ok(s)) => Ok(DataStream::Tls(Box::new(tokio_rustls::TlsStream::Client(s)))),
            Ok(Err(e)) => Err(handshake_error(addr, what, host, e)),
            Err(_) => Err(Error::unavailable(format!("TLS handshake with {what} {addr} timed out"))),
        }
    }

    /// A new connection of a server: TLS or plain by its first byte, with the handshake
    /// done when it is TLS and this server serves TLS. A TLS client of a plain server is
    /// answered with plain text (its handshake fails at once), logged and refused. A
    /// plain connection of a TLS server comes back as it is: the caller refuses it in its
    /// protocol (see [`refuse_plain`] for the data path).
    pub async fn accept(&self, tcp: TcpStream, peer: SocketAddr, port: &str) -> Result<DataStream> {
        let _ = tcp.set_nodelay(true);
        let mut first = [0u8; 1];
        let n = match tokio::time::timeout(HANDSHAKE_TIMEOUT, tcp.peek(&mut first)).await {
            Ok(r) => r.map_err(|e| Error::io("read a new connection", e))?,
            Err(_) => return Err(Error::unavailable("a new connection sent nothing")),
        };
        if n == 0 || first[0] != TLS_HANDSHAKE {
            return Ok(DataStream::Plain(tcp));
        }
        let Some(server) = &self.server else {
            tracing::warn!(%peer, port, "refused a TLS connection: this port serves plain TCP (security.tls_cert_file is not set)");
            answer_and_close(tcp).await;
            return Err(Error::new(ErrorKind::Unauthenticated, "a TLS client of a plain port"));
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, TlsAcceptor::from(server.clone()).accept(tcp)).await {
            Ok(Ok(s)) => Ok(DataStream::Tls(Box::new(tokio_rustls::TlsStream::Server(s)))),
            Ok(Err(e)) => {
                tracing::warn!(%peer, port, error = %e, "refused a connection: TLS handshake failed");
                Err(Error::new(ErrorKind::Unauthenticated, format!("TLS handshake: {e}")))
            }
            Err(_) => Err(Error::unavailable("TLS handshake timed out")),
        }
    }

    /// A tonic channel to the master at `addr` (`host:port`), over TLS if this process
    /// connects with TLS. Connects lazily.
    pub fn master_channel(&self, addr: &str, endpoint: tonic::transport::Endpoint) -> tonic::transport::Channel {
        if !self.connects() {
            return endpoint.tcp_nodelay(true).connect_lazy();
        }
        let (tls, addr) = (self.clone(), addr.to_string());
        endpoint.connect_with_connector_lazy(tower::service_fn(move |_: tonic::transport::Uri| {
            let (tls, addr) = (tls.clone(), addr.clone());
            async move { tls.connect(&addr, "master").await.map(hyper_util::rt::TokioIo::new) }
        }))
    }
}

/// A failed client handshake, named: the server's certificate refused (wrong CA, wrong
/// host), or a server that speaks no TLS (its plain answer is no TLS record). Neither
/// mends by retrying; a connection cut mid-handshake is `Unavailable`.
fn handshake_error(addr: &str, what: &str, host: &str, e: std::io::Error) -> Error {
    use std::io::ErrorKind as K;
    if matches!(e.kind(), K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe) {
        return Error::unavailable(format!(
            "TLS handshake with {what} {addr}: connection closed ({e}; does it serve TLS?)"
        ));
    }
    Error::new(
        ErrorKind::Unauthenticated,
        format!(
            "TLS handshake with {what} {addr} failed: {e} (either it does not serve TLS: set \
             security.tls_cert_file/tls_key_file there, or leave security.tls_ca_file unset here; or its \
             certificate is not signed by the CA in security.tls_ca_file, or not valid for {host})"
        ),
    )
    .set_retryable(false)
}

/// Answer a TLS client of a plain port: read its hello (so closing sends no reset that
/// could overtake the answer), send [`NOT_TLS`], close.
async fn answer_and_close(mut tcp: TcpStream) {
    let mut buf = vec![0u8; 16 << 10];
    let _ = tokio::time::timeout(Duration::from_secs(1), tcp.read(&mut buf)).await;
    let _ = tcp.write_all(NOT_TLS).await;
    drain_and_close(tcp, &mut buf).await;
}

/// Close after an answer: shut down the sending side, then read what the peer still sends
/// (for up to a second) so the close sends no reset that could overtake the answer.
async fn drain_and_close<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, buf: &mut [u8]) {
    let _ = s.shutdown().await;
    let _ =
        tokio::time::timeout(Duration::from_secs(1), async { while matches!(s.read(buf).await, Ok(n) if n > 0) {} })
            .await;
}

/// Refuse a plain connection to a TLS worker's data path: read its first frame (the
/// credential it sent anyway), answer with an `Unauthenticated` error frame saying this
/// port wants TLS, and close.
pub async fn refuse_plain(mut s: DataStream, peer: SocketAddr) {
    tracing::warn!(%peer, "refused a plain-TCP data-path connection: this worker serves TLS only");
    let _ = tokio::time::timeout(Duration::from_secs(1), crate::read_frame::<_, crate::pb::DataRequest>(&mut s)).await;
    let e = Error::new(
        ErrorKind::Unauthenticated,
        "this worker serves TLS only: set security.tls_ca_file (the CA of its certificate) on the caller",
    );
    let _ = crate::write_frame(&mut s, &crate::pb::DataResponse::error(&e)).await;
    let _ = s.flush().await;
    let mut buf = vec![0u8; 16 << 10];
    drain_and_close(s, &mut buf).await;
}

/// One TCP connection of the master RPC or the data path, plain or TLS.
#[derive(Debug)]
pub enum DataStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl DataStream {
    /// The socket under it.
    pub fn tcp(&self) -> &TcpStream {
        match self {
            DataStream::Plain(s) => s,
            DataStream::Tls(s) => s.get_ref().0,
        }
    }

    /// The socket, if the bytes go on it as they are (no TLS): for `sendfile` and
    /// `SO_RCVLOWAT`.
    pub fn plain(&self) -> Option<&TcpStream> {
        match self {
            DataStream::Plain(s) => Some(s),
            DataStream::Tls(_) => None,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, DataStream::Tls(_))
    }
}

impl AsyncRead for DataStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            DataStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            DataStream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for DataStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            DataStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            DataStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            DataStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            DataStream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            DataStream::Plain(s) => s.is_write_vectored(),
            DataStream::Tls(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            DataStream::Plain(s) => Pin::new(s).poll_flush(cx),
            DataStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            DataStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            DataStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// What the master's RPC service knows of a connection: its peer, and whether it is TLS
/// (`ServerAuth` refuses plain calls to a master that serves TLS).
#[derive(Clone, Copy, Debug)]
pub struct ConnInfo {
    pub peer: Option<SocketAddr>,
    pub tls: bool,
}

impl tonic::transport::server::Connected for DataStream {
    type ConnectInfo = ConnInfo;
    fn connect_info(&self) -> ConnInfo {
        ConnInfo { peer: self.tcp().peer_addr().ok(), tls: self.is_tls() }
    }
}

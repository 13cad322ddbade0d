//! The master's web side: a small status page (`/`), Prometheus `/metrics`, and the
//! cluster report as JSON (`/api/report`). Read-only, and authenticated like every other
//! port: each request must carry the client token (or the cluster secret), either as
//! `Authorization: Bearer <token>` (Prometheus: `authorization: credentials_file`) or as
//! HTTP Basic with any user name and the token as password (a browser prompts for it).
//! Without it: 401 with `WWW-Authenticate: Basic realm="locus"`.

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use base64::Engine;
use locus_common::Result;
use locus_common::metrics::ReadSource;
use locus_proto::report::ClusterReport;
use prometheus::Encoder;
use tokio::net::TcpListener;

use crate::Master;

pub(crate) async fn serve(
    master: Master,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let app = Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics))
        .route("/api/report", get(report))
        .layer(axum::middleware::from_fn_with_state(master.clone(), authenticate))
        .with_state(master);
    axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| locus_common::Error::io("web server", e))
}

/// The credential a request presents: a Bearer token, or a Basic password.
fn presented(headers: &HeaderMap) -> Option<String> {
    let v = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, rest) = v.split_once(' ')?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") {
        return Some(rest.to_string());
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let raw = base64::engine::general_purpose::STANDARD.decode(rest).ok()?;
        let text = String::from_utf8(raw).ok()?;
        return text.split_once(':').map(|(_, pw)| pw.to_string());
    }
    None
}

/// Lets a request through only with the client token or the cluster secret.
async fn authenticate(State(m): State<Master>, req: Request, next: Next) -> Response {
    let role = presented(req.headers()).and_then(|t| m.inner.verifier.role(&t));
    if role.is_some_and(|r| locus_proto::roles::WEB.contains(&r)) {
        return next.run(req).await;
    }
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.to_string())
        .unwrap_or_default();
    tracing::debug!(peer, path = %req.uri().path(), "refused a web request: missing or wrong client token");
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Basic realm=\"locus\"")],
        "401: the status page, /metrics and /api/report need the cluster's client token: \
         Authorization: Bearer <token>, or Basic with any user name and the token as password\n",
    )
        .into_response()
}

/// Prometheus text exposition of the master's registry.
pub fn render_metrics(m: &Master) -> String {
    m.update_gauges();
    let mut buf = Vec::new();
    if let Err(e) = prometheus::TextEncoder::new().encode(&m.inner.metrics.registry.gather(), &mut buf) {
        tracing::warn!(error = %e, "encoding the metrics");
    }
    String::from_utf8_lossy(&buf).into_owned()
}

async fn metrics(State(m): State<Master>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], render_metrics(&m))
}

async fn report(State(m): State<Master>) -> impl IntoResponse {
    axum::Json(ClusterReport::new(&m.report(), &m.mount_table(false)))
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

async fn index(State(m): State<Master>) -> Html<String> {
    let r = m.report();
    let t = r.totals.unwrap_or_default();
    let mounts = m.mount_table(false);
    let rep = ClusterReport::new(&r, &mounts);
    let rows: String = r.workers.iter().map(worker_row).collect();
    let jobs: String = rep.jobs.iter().map(job_row).collect();
    let hosts: String = rep.by_host.iter().map(host_row).collect();
    let mounts_rows: String =
        mounts.iter().map(|mi| row([esc(&mi.path), esc(&mi.uri), mi.readonly.to_string()])).collect();
    let failed = failures(&r);
    let masters = masters(&rep);
    Html(format!(
        "<!doctype html><html><head><title>Locus</title><meta http-equiv=refresh content=5>\
<style>body{{font-family:sans-serif;margin:2em}}td,th{{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left}}</style></head>\
<body><h1>Locus</h1>{masters}<h2>Workers</h2><table><tr><th>id</th><th>host</th><th>data</th><th>state</th><th>tiers</th></tr>{rows}</table>\
<h2>Bytes read by source</h2><table><tr><th>short_circuit</th><th>local_worker</th><th>remote_worker</th><th>ufs</th><th>hit ratio</th></tr>\
<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.3}</td></tr></table>\
<h2>Client reads by host</h2><p>Why not short-circuit: <code>locus doctor --reads</code>.</p><table><tr><th>host</th><th>short-circuit</th><th>local worker</th><th>remote worker</th><th>UFS</th><th>short-circuit share</th><th>not short-circuit, by reason</th></tr>{hosts}</table>\
<h2>Mounts</h2><table><tr><th>path</th><th>uri</th><th>read-only</th></tr>{mounts_rows}</table>\
<h2>Background jobs</h2><table><tr><th>on</th><th>job</th><th>state</th><th>runs</th><th>failures</th><th>last run</th><th>backlog</th><th>last error</th></tr>{jobs}</table>{failed}\
<p><a href=/metrics>/metrics</a> · <a href=/api/report>/api/report</a></p></body></html>",
        bytesize(t.short_circuit),
        bytesize(t.local_worker),
        bytesize(t.remote_worker),
        bytesize(t.ufs),
        t.hit_ratio()
    ))
}

/// One table row of cells, each already escaped.
fn row<const N: usize>(cells: [String; N]) -> String {
    let mut s = String::from("<tr>");
    for c in cells {
        s.push_str("<td>");
        s.push_str(&c);
        s.push_str("</td>");
    }
    s.push_str("</tr>");
    s
}

fn worker_row(w: &locus_proto::pb::WorkerReport) -> String {
    let a = w.address.clone().unwrap_or_default();
    let tiers: Vec<String> = w
        .tiers
        .iter()
        .map(|t| format!("{} {} / {}", t.alias().name(), bytesize(t.used), bytesize(t.capacity)))
        .collect();
    let state = if w.live { "live" } else { "LOST" };
    row([a.worker_id.to_string(), esc(&a.host), esc(&a.data_address), state.into(), esc(&tiers.join(", "))])
}

fn job_row(j: &locus_proto::report::JobRow) -> String {
    let last = j.last_run_s_ago.map_or_else(|| "never".into(), |s| format!("{s:.1}s ago"));
    row([
        esc(&j.on),
        esc(&j.name),
        esc(j.state),
        j.runs.to_string(),
        j.failures.to_string(),
        last,
        j.backlog.to_string(),
        esc(&j.last_error),
    ])
}

fn host_row(h: &locus_proto::report::HostReads) -> String {
    let b = |s: ReadSource| bytesize(h.from_source(s));
    let why: Vec<String> = h.not_short_circuit.iter().map(|(k, v)| format!("{k} {}", bytesize(v.bytes))).collect();
    row([
        esc(&h.host),
        b(ReadSource::ShortCircuit),
        b(ReadSource::LocalWorker),
        b(ReadSource::RemoteWorker),
        b(ReadSource::Ufs),
        format!("{:.1}%", h.short_circuit_share * 100.0),
        esc(&why.join(", ")),
    ])
}

/// The persist failures given up on, if any.
/// The master group as this master sees it (only a leader knows the others' place).
fn masters(rep: &ClusterReport) -> String {
    let Some(g) = &rep.masters else { return String::new() };
    let rows: String = g
        .members
        .iter()
        .map(|m| {
            let (raft, rpc) = (esc(&m.raft_address), esc(&m.rpc_address));
            row([m.role.into(), raft, rpc, m.matched_index.to_string(), m.lag.to_string()])
        })
        .collect();
    let since = (rep.now_ms - g.elected_ms).max(0) as f64 / 1000.0;
    format!(
        "<h2>Masters</h2><p>Term {}, log {}, applied {}, leader since {since:.1} s.</p>\
<table><tr><th>role</th><th>raft</th><th>rpc</th><th>matched</th><th>behind</th></tr>{rows}</table>",
        g.term, g.last_log_index, g.applied_index
    )
}

fn failures(r: &locus_proto::pb::Report) -> String {
    if r.persist_failed_ops == 0 {
        return String::new();
    }
    let rows: String = r
        .persist_failed
        .iter()
        .map(|f| row([f.kind().name().into(), esc(&f.path), f.failures.to_string(), esc(&f.last_error)]))
        .collect();
    format!(
        "<h2>Persist failures ({})</h2><p>Given up; <code>locus fs persist --retry PATH</code> or <code>--drop PATH</code>.</p>\
<table><tr><th>kind</th><th>path</th><th>attempts</th><th>last error</th></tr>{rows}</table>",
        r.persist_failed_ops
    )
}

fn bytesize(b: u64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1} {}", U[i])
}

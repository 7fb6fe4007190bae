//! The admin endpoint: `GET /metrics` in Prometheus' text format, the live monitor page
//! (`GET /monitor`, its assets embedded in the binary) and its JSON API
//! (`/api/monitor/active`, `/api/monitor/syncs`, `/api/monitor/series`, and
//! `/api/monitor/profile`, the file `rowsync profile --out` wrote), and the probes
//! `GET /healthz` (the process answers) and `GET /readyz` (it takes syncs: the
//! database answers and no stop was asked; 503 with the reason otherwise). Plain
//! HTTP/1.1 on its own listener, meant for loopback or a monitoring network, never for
//! clients; with a token, every path but the probes needs `Authorization: Bearer`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::monitor::SyncFilter;

/// A scrape's request headers must arrive within this long.
pub const ADMIN_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Admin connections served at once; more wait in the listen queue.
pub const ADMIN_CONNECTIONS_MAX: usize = 16;
/// The largest profile report file the monitor serves (`serve --profile-report`).
pub const PROFILE_REPORT_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// The monitor page and its assets, embedded in the binary (no network at run time).
const MONITOR_HTML: &str = include_str!("../assets/monitor/monitor.html");
const MONITOR_JS: &str = include_str!("../assets/monitor/monitor.js");
/// uPlot 1.6.32 (MIT licence, `assets/monitor/uPlot.LICENSE`), from its npm package.
const UPLOT_JS: &str = include_str!("../assets/monitor/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("../assets/monitor/uPlot.min.css");

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";

/// The probes, answered to anyone (a load balancer or an orchestrator asks them
/// without credentials; they tell nothing but up or not).
fn probe(path: &str, metrics: &Metrics) -> Option<Response<Full<Bytes>>> {
    let (status, body) = match path {
        "/healthz" => (StatusCode::OK, "ok\n".to_string()),
        "/readyz" => match metrics.readiness() {
            Ok(()) => (StatusCode::OK, "ready\n".to_string()),
            Err(why) => (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("not ready: {why}\n"),
            ),
        },
        _ => return None,
    };
    Some(plain(status, Bytes::from(body)))
}

fn plain(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static(TEXT));
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

/// Whether the request carries the admin token (always, when there is none). Compared
/// in time independent of where the first difference is.
fn authorized(request: &Request<Incoming>, token: Option<&str>) -> bool {
    let Some(token) = token else {
        return true;
    };
    let offered = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or("");
    offered.len() == token.len()
        && offered
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |difference, (a, b)| difference | (a ^ b))
            == 0
}

fn unauthorized() -> Response<Full<Bytes>> {
    let mut response = plain(
        StatusCode::UNAUTHORIZED,
        Bytes::from_static(b"the admin endpoint needs Authorization: Bearer <the admin token>\n"),
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}

fn respond(request: &Request<Incoming>, metrics: &Metrics) -> Response<Full<Bytes>> {
    let query = request.uri().query().unwrap_or("");
    let monitor = &metrics.monitor;
    let (status, content_type, body): (_, &'static str, Bytes) =
        match (request.method(), request.uri().path()) {
            (&Method::GET, "/metrics") => (
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                Bytes::from(metrics.encode()),
            ),
            (&Method::GET, "/" | "/monitor") => (
                StatusCode::OK,
                "text/html; charset=utf-8",
                Bytes::from_static(MONITOR_HTML.as_bytes()),
            ),
            (&Method::GET, "/monitor/monitor.js") => (
                StatusCode::OK,
                "text/javascript; charset=utf-8",
                Bytes::from_static(MONITOR_JS.as_bytes()),
            ),
            (&Method::GET, "/monitor/uPlot.iife.min.js") => (
                StatusCode::OK,
                "text/javascript; charset=utf-8",
                Bytes::from_static(UPLOT_JS.as_bytes()),
            ),
            (&Method::GET, "/monitor/uPlot.min.css") => (
                StatusCode::OK,
                "text/css; charset=utf-8",
                Bytes::from_static(UPLOT_CSS.as_bytes()),
            ),
            (&Method::GET, "/api/monitor/active") => (StatusCode::OK, JSON, json(&monitor.active())),
            (&Method::GET, "/api/monitor/syncs") => {
                (StatusCode::OK, JSON, json(&monitor.recent(&sync_filter(query))))
            }
            (&Method::GET, "/api/monitor/series") => {
                let since = query_value(query, "since_unix_ms")
                    .and_then(|since| since.parse().ok())
                    .unwrap_or(0);
                (StatusCode::OK, JSON, json(&monitor.samples(since)))
            }
            (&Method::GET, _) => (
                StatusCode::NOT_FOUND,
                TEXT,
                Bytes::from_static(
                    b"rowsync's admin endpoint serves GET /healthz, /readyz, /metrics, /monitor and /api/monitor/{active,syncs,series,profile}\n",
                ),
            ),
            _ => (
                StatusCode::METHOD_NOT_ALLOWED,
                TEXT,
                Bytes::from_static(b"only GET\n"),
            ),
        };
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(content_type),
    );
    headers.insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

/// `/api/monitor/profile`: the latest `rowsync profile --out` report, as the file holds
/// it (JSON), or 404 with the reason.
async fn profile_report(metrics: &Metrics) -> Response<Full<Bytes>> {
    let answer = |status, content_type, body: Bytes| {
        let mut response = Response::new(Full::new(body));
        *response.status_mut() = status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static(content_type),
        );
        response.headers_mut().insert(
            header::CACHE_CONTROL,
            header::HeaderValue::from_static("no-store"),
        );
        response
    };
    let Some(path) = metrics.monitor.profile_report() else {
        return answer(
            StatusCode::NOT_FOUND,
            TEXT,
            Bytes::from_static(b"no profile report: start the server with --profile-report FILE and run rowsync profile --out FILE\n"),
        );
    };
    let read = async {
        let length = tokio::fs::metadata(path).await?.len();
        if length > PROFILE_REPORT_BYTES_MAX {
            return Err(std::io::Error::other(format!(
                "{length} bytes, more than profile_report_bytes_max ({PROFILE_REPORT_BYTES_MAX})"
            )));
        }
        tokio::fs::read(path).await
    };
    match read.await {
        Ok(bytes) => answer(StatusCode::OK, JSON, Bytes::from(bytes)),
        Err(error) => answer(
            StatusCode::NOT_FOUND,
            TEXT,
            Bytes::from(format!(
                "no profile report in {}: {error}\n",
                path.display()
            )),
        ),
    }
}

fn json(value: &impl serde::Serialize) -> Bytes {
    Bytes::from(serde_json::to_vec(value).unwrap_or_else(|_| b"null".to_vec()))
}

/// `/api/monitor/syncs?user=NAME&outcome=ok|refused|failed&limit=N`.
fn sync_filter(query: &str) -> SyncFilter {
    let non_empty = |name| query_value(query, name).filter(|value| !value.is_empty());
    SyncFilter {
        user: non_empty("user"),
        outcome: non_empty("outcome"),
        limit: query_value(query, "limit").and_then(|limit| limit.parse().ok()),
    }
}

/// The value of `name` in a URL query, percent-decoded (`+` is a space).
fn query_value(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| percent_decode(value))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        let hex = || {
            let pair = std::str::from_utf8(bytes.get(index + 1..index + 3)?).ok()?;
            u8::from_str_radix(pair, 16).ok()
        };
        match (byte, hex()) {
            (b'%', Some(value)) => {
                decoded.push(value);
                index += 3;
            }
            _ => {
                decoded.push(if byte == b'+' { b' ' } else { byte });
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// Serves the admin endpoint on `listener` until `shutdown` completes.
pub async fn serve_admin(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    serve_admin_with_token(listener, metrics, None, shutdown).await
}

/// [`serve_admin`], where every path but `/healthz` and `/readyz` needs
/// `Authorization: Bearer <token>` when `token` is set.
pub async fn serve_admin_with_token(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    token: Option<Arc<str>>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let connections = Arc::new(tokio::sync::Semaphore::new(ADMIN_CONNECTIONS_MAX));
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            accepted = listener.accept() => accepted?,
        };
        let Ok(permit) = Arc::clone(&connections).acquire_owned().await else {
            return Ok(());
        };
        let metrics = Arc::clone(&metrics);
        let token = token.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<Incoming>| {
                let metrics = Arc::clone(&metrics);
                let token = token.clone();
                async move {
                    let path = request.uri().path();
                    let probe = (request.method() == Method::GET)
                        .then(|| probe(path, &metrics))
                        .flatten();
                    let response = if let Some(probe) = probe {
                        probe
                    } else if !authorized(&request, token.as_deref()) {
                        unauthorized()
                    } else if request.method() == Method::GET && path == "/api/monitor/profile" {
                        profile_report(&metrics).await
                    } else {
                        respond(&request, &metrics)
                    };
                    Ok::<_, Infallible>(response)
                }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(ADMIN_HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%peer, %error, "admin connection ended");
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_percent_encoded_filter() {
        let filter = sync_filter("user=ann%20b+c%C3%A9&outcome=ok&limit=5&x");
        assert_eq!(filter.user.as_deref(), Some("ann b cé"));
        assert_eq!(filter.outcome.as_deref(), Some("ok"));
        assert_eq!(filter.limit, Some(5));
        assert!(sync_filter("user=&outcome=").user.is_none());
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
    }
}

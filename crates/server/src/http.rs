//! The HTTP transport (HTTP/1.1 and HTTP/2, plain or inside TLS): one POST carries one
//! sync. Its body is the same byte stream a TCP connection carries from the client
//! (optional preamble, then the frames hello, upload, end_upload, compressed if the
//! preamble says so), and the response body is the server's stream. Nothing about a
//! sync outlives its request, so any server behind a load balancer can take any request.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::TryStreamExt;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, BodyStream, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rowsync_consolidated::Consolidated;
use rowsync_protocol::{encode_frame, Message};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::io::{ReaderStream, StreamReader};

mod framing;

use crate::config::ServerConfig;
use crate::connection_end::ConnectionEnd;
use crate::shared::Shared;
use crate::sync::{handle_connection, ClientClose};

/// The media type of request and response bodies.
pub const CONTENT_TYPE_ROWSYNC: &str = "application/x-rowsync";
/// Bytes of the response in flight between the sync's task and the HTTP connection.
const RESPONSE_PIPE_BYTES: usize = 64 * 1024;

type ResponseBody = BoxBody<Bytes, std::io::Error>;

/// Serves HTTP requests on one connection (HTTP/1.1 keep-alive, or HTTP/2 streams).
/// `over_limit`: the server has too many HTTP connections open; every request on this
/// one is answered busy, and it closes after one answer or at most
/// `OVER_LIMIT_CONNECTION_TIME`. A connection with no request in progress is idle: it
/// is closed after `http_idle_timeout` (the first request: `header_read_timeout`), or
/// sooner to make room when more than `hello_pending_connections_max` are idle
/// (`Shared::idle_http`), so idle connections cannot keep the permits syncs need.
pub(crate) async fn serve_connection<B, I>(
    io: I,
    peer: SocketAddr,
    shared: Arc<Shared<B>>,
    over_limit: bool,
) where
    B: Consolidated,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    // Its syncs waiting for a download's receipt stop waiting when the connection ends.
    let (open, end) = ConnectionEnd::new();
    let (in_flight, mut requests) = InFlight::new();
    let (io, both_framings) = framing::HeadWatch::new(io);
    let serving_shared = Arc::clone(&shared);
    let service = service_fn(move |request| {
        let guard = in_flight.begin();
        let shared = Arc::clone(&serving_shared);
        let end = end.clone();
        let smuggling = both_framings.take();
        async move {
            let response = if smuggling {
                smuggling_response(peer)
            } else if over_limit {
                busy_response(shared.busy_retry_after_ms())
            } else {
                handle_request(request, peer, shared, end)
            };
            // The request is in progress until its response body is dropped.
            Ok::<_, Infallible>(response.map(|body| {
                body.map_frame(move |frame| {
                    let _in_progress = &guard;
                    frame
                })
                .boxed()
            }))
        }
    });
    let builder = connection_builder(&shared.config, over_limit);
    let serving = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(serving);
    let watched = serve_while_busy(serving.as_mut(), &mut requests, &shared, over_limit);
    let result = if over_limit {
        let most = shared.config.header_read_timeout + OVER_LIMIT_CONNECTION_TIME;
        match tokio::time::timeout(most, watched).await {
            Ok(result) => result,
            Err(_) => return,
        }
    } else {
        watched.await
    };
    let result = match result {
        Served::Ended(result) => result,
        Served::Idle(why) => {
            tracing::debug!(%peer, "HTTP connection closed: {why}");
            open.closed_idle();
            serving.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(OVER_LIMIT_CONNECTION_TIME, serving).await;
            return;
        }
    };
    if let Err(error) = result {
        if error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_timeout)
        {
            open.closed_idle();
        }
        tracing::debug!(%peer, %error, "HTTP connection ended with an error");
    }
}

/// `400` for a request with both Content-Length and Transfer-Encoding (`framing`).
fn smuggling_response(peer: SocketAddr) -> Response<ResponseBody> {
    tracing::warn!(%peer, "an HTTP/1.1 request with both Content-Length and Transfer-Encoding; refused");
    plain_response(
        StatusCode::BAD_REQUEST,
        "a request may not carry both Content-Length and Transfer-Encoding\n".into(),
    )
}

/// hyper's connection settings: HTTP/1.1 header timeout (which also ends an idle
/// keep-alive connection) and keep-alive unless over the limit; HTTP/2 pings every
/// `http2_keep_alive_interval`, each to be answered within `read_timeout`.
fn connection_builder(
    config: &ServerConfig,
    over_limit: bool,
) -> hyper_util::server::conn::auto::Builder<TokioExecutor> {
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(config.header_read_timeout)
        .keep_alive(!over_limit);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(config.http2_keep_alive_interval))
        .keep_alive_timeout(config.read_timeout);
    builder
}

type ServeResult = Result<(), Box<dyn std::error::Error + Send + Sync>>;

/// How serving a connection ended.
enum Served {
    /// hyper ended it (the client closed, or an error).
    Ended(ServeResult),
    /// It was idle too long, or had to make room: to be closed.
    Idle(&'static str),
}

/// Serves the connection until it ends or is idle too long: while no request is in
/// progress it holds a place among the idle HTTP connections, and waits at most the
/// idle limit for the next request.
async fn serve_while_busy<B: Consolidated>(
    mut serving: std::pin::Pin<&mut impl std::future::Future<Output = ServeResult>>,
    requests: &mut tokio::sync::watch::Receiver<Requests>,
    shared: &Shared<B>,
    over_limit: bool,
) -> Served {
    let config = &shared.config;
    // hyper's own header timeout starts once it knows the HTTP version, and HTTP/2 has
    // none: the first request must arrive within the header timeout.
    let mut idle_limit = config.header_read_timeout;
    // Requests begun by the end of the last busy spell: one begun since ends the idle
    // spell even if it is already over.
    let mut begun = 0;
    loop {
        let place = (!over_limit).then(|| shared.idle_http.register());
        let evicted = async {
            match &place {
                Some(place) => place.evicted().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            result = serving.as_mut() => return Served::Ended(result),
            _ = requests.wait_for(|now| now.begun > begun || now.in_progress > 0) => {}
            () = tokio::time::sleep(idle_limit) => {
                return Served::Idle("no request within the idle limit");
            }
            () = evicted => return Served::Idle("idle, making room for newer connections"),
        }
        drop(place);
        tokio::select! {
            biased;
            result = serving.as_mut() => return Served::Ended(result),
            done = requests.wait_for(|now| now.in_progress == 0) => {
                begun = done.map_or(u64::MAX, |now| now.begun);
            }
        }
        idle_limit = config.http_idle_timeout;
    }
}

/// The requests of one connection: how many began, and how many are in progress (their
/// responses included).
#[derive(Clone, Copy, Default)]
struct Requests {
    begun: u64,
    in_progress: usize,
}

/// Counts a connection's requests.
struct InFlight(Arc<tokio::sync::watch::Sender<Requests>>);

/// One request in progress, until dropped.
struct InProgress(Arc<tokio::sync::watch::Sender<Requests>>);

impl InFlight {
    fn new() -> (InFlight, tokio::sync::watch::Receiver<Requests>) {
        let (sender, receiver) = tokio::sync::watch::channel(Requests::default());
        (InFlight(Arc::new(sender)), receiver)
    }

    fn begin(&self) -> InProgress {
        self.0.send_modify(|requests| {
            requests.begun += 1;
            requests.in_progress += 1;
        });
        InProgress(Arc::clone(&self.0))
    }
}

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.send_modify(|requests| requests.in_progress -= 1);
    }
}

/// How long a connection above the HTTP connection limit may stay open to hear busy.
const OVER_LIMIT_CONNECTION_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// `503` with `Retry-After` (seconds, rounded up) and a `busy` frame as the body.
fn busy_response(retry_after_ms: u32) -> Response<ResponseBody> {
    let frame = encode_frame(&Message::Busy { retry_after_ms });
    let mut response = Response::new(
        Full::new(Bytes::from(frame))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(CONTENT_TYPE_ROWSYNC),
    );
    headers.insert(
        header::RETRY_AFTER,
        header::HeaderValue::from(retry_after_ms.div_ceil(1000).max(1)),
    );
    response
}

fn plain_response(status: StatusCode, text: String) -> Response<ResponseBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(text))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn handle_request<B: Consolidated>(
    request: Request<Incoming>,
    peer: SocketAddr,
    shared: Arc<Shared<B>>,
    end: ConnectionEnd,
) -> Response<ResponseBody> {
    if request.method() != Method::POST {
        let mut response = plain_response(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("rowsync expects POST with a body of type {CONTENT_TYPE_ROWSYNC}\n"),
        );
        response
            .headers_mut()
            .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
        return response;
    }
    let Ok(permit) = Arc::clone(&shared.slots).try_acquire_owned() else {
        tracing::debug!(%peer, "connection limit reached; answering busy");
        return busy_response(shared.busy_retry_after_ms());
    };
    // Held by the response body until it is sent (or dropped): see `http_responses`.
    let Ok(sending) = Arc::clone(&shared.http_responses).try_acquire_owned() else {
        tracing::debug!(%peer, "draining; answering busy");
        return busy_response(shared.busy_retry_after_ms());
    };
    let body = BodyStream::new(request.into_body())
        .map_ok(|frame| frame.into_data().unwrap_or_default())
        .map_err(std::io::Error::other);
    let reader = StreamReader::new(Box::pin(body));
    let (ours, theirs) = tokio::io::duplex(RESPONSE_PIPE_BYTES);
    tokio::spawn(async move {
        // The request body ends before the download: its end says nothing of the client.
        let stream = tokio::io::join(reader, ours);
        handle_connection(stream, peer, &shared, permit, ClientClose::Unseen(end)).await;
    });
    let body = StreamBody::new(ReaderStream::new(theirs).map_ok(move |bytes| {
        let _sending = &sending;
        Frame::data(bytes)
    }))
    .boxed();
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(CONTENT_TYPE_ROWSYNC),
    );
    response
}

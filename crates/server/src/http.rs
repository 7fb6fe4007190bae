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

use crate::shared::Shared;
use crate::sync::{handle_connection, ClientClose, ConnectionEnd};

/// The media type of request and response bodies.
pub const CONTENT_TYPE_ROWSYNC: &str = "application/x-rowsync";
/// Bytes of the response in flight between the sync's task and the HTTP connection.
const RESPONSE_PIPE_BYTES: usize = 64 * 1024;

type ResponseBody = BoxBody<Bytes, std::io::Error>;

/// Serves HTTP requests on one connection (HTTP/1.1 keep-alive, or HTTP/2 streams).
/// `over_limit`: the server has too many HTTP connections open; every request on this
/// one is answered busy, and it closes after one answer or at most
/// `OVER_LIMIT_CONNECTION_TIME`.
pub(crate) async fn serve_connection<B, I>(
    io: I,
    peer: SocketAddr,
    shared: Arc<Shared<B>>,
    over_limit: bool,
) where
    B: Consolidated,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let header_read_timeout = shared.config.header_read_timeout;
    let request_seen = Arc::new(tokio::sync::Notify::new());
    let seen = Arc::clone(&request_seen);
    // Its syncs waiting for a download's receipt stop waiting when the connection ends.
    let (open, end) = ConnectionEnd::new();
    let service = service_fn(move |request| {
        seen.notify_one();
        let shared = Arc::clone(&shared);
        let end = end.clone();
        async move {
            Ok::<_, Infallible>(if over_limit {
                busy_response(shared.busy_retry_after_ms())
            } else {
                handle_request(request, peer, shared, end)
            })
        }
    });
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .keep_alive(!over_limit);
    builder.http2().timer(TokioTimer::new());
    let serving = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(serving);
    // hyper's own header timeout starts once it knows the HTTP version, and HTTP/2 has
    // none: the first request must arrive within the header timeout, or the connection
    // is closed (dropped).
    let first_request = tokio::time::timeout(header_read_timeout, request_seen.notified());
    let early = tokio::select! {
        result = &mut serving => Some(result),
        waited = first_request => match waited {
            Ok(()) => None,
            Err(_) => {
                tracing::warn!(%peer, "no HTTP request within the header read timeout; closed");
                return;
            }
        },
    };
    let result = match early {
        Some(result) => result,
        None if over_limit => {
            match tokio::time::timeout(OVER_LIMIT_CONNECTION_TIME, serving).await {
                Ok(result) => result,
                Err(_) => return,
            }
        }
        None => serving.await,
    };
    if let Err(error) = result {
        let idle = error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_timeout);
        if idle {
            open.closed_idle();
        }
        tracing::debug!(%peer, %error, "HTTP connection ended with an error");
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
    let body = StreamBody::new(ReaderStream::new(theirs).map_ok(Frame::data)).boxed();
    let mut response = Response::new(body);
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(CONTENT_TYPE_ROWSYNC),
    );
    response
}

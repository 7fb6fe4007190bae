//! The TLS handshake of an accepted connection, bounded by the handshake timeout, with
//! a clear answer for a client that speaks plain text to a TLS port.

use std::net::SocketAddr;
use std::time::Duration;

use rowsync_protocol::{ErrorCode, Message, WireError};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::reply::{reply_and_close, reply_bytes_and_close};

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// The handshake, or `None` (logged) if the peer did not complete it in time, spoke
/// plain text (answered in plain text: a rowsync `error` frame, or for HTTPS an HTTP
/// 400), or failed it (a certificate the peer refused, a protocol version below 1.2).
pub(crate) async fn accept(
    stream: TcpStream,
    peer: SocketAddr,
    acceptor: &TlsAcceptor,
    timeout: Duration,
    http: bool,
) -> Option<TlsStream<TcpStream>> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut first = [0u8; 1];
    match tokio::time::timeout_at(deadline, stream.peek(&mut first)).await {
        Ok(Ok(1)) => {}
        Ok(_) => return None, // closed before sending anything
        Err(_) => {
            tracing::warn!(%peer, timeout_ms = timeout.as_millis() as u64, "no TLS handshake within the handshake timeout");
            return None;
        }
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        tracing::warn!(%peer, "plain text on a TLS port; answered in plain text and closed");
        if http {
            let body = "this port speaks HTTPS: connect with an https:// address\n";
            let reply = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            reply_bytes_and_close(stream, reply.as_bytes()).await;
        } else {
            let refusal = WireError::new(
                ErrorCode::Protocol,
                "this port speaks TLS: connect with a tls:// address",
            );
            reply_and_close(stream, Message::Error(refusal)).await;
        }
        return None;
    }
    match tokio::time::timeout_at(deadline, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Some(stream),
        Ok(Err(error)) => {
            tracing::warn!(%peer, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::warn!(%peer, timeout_ms = timeout.as_millis() as u64, "TLS handshake did not complete within the handshake timeout");
            None
        }
    }
}

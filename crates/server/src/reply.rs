//! The last words on a connection that ends with a final message (busy, an error, plain
//! text on a TLS port): the reply, our side closed, and the client's input drained so
//! that the kernel does not answer it with a reset that destroys the reply.

use std::time::Duration;

use rowsync_protocol::{encode_frame, Message};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::shared::READ_CHUNK_BYTES;

/// Bytes of unread input discarded after a refusal, and for how long, so that closing
/// does not reset the connection before the client has read the refusal.
const REFUSAL_DRAIN_BYTES_MAX: usize = 1024 * 1024;
const REFUSAL_DRAIN_TIME: Duration = Duration::from_secs(2);

/// Sends a final message (error or busy), closes our side, and drains what the client
/// is still sending so the kernel does not answer it with a reset that could destroy
/// the message in flight.
pub(crate) async fn reply_and_close(stream: impl AsyncRead + AsyncWrite + Unpin, message: Message) {
    reply_bytes_and_close(stream, &encode_frame(&message)).await
}

/// Sends `reply` (a frame, or a plain-text answer), closes our side, drains the input.
pub(crate) async fn reply_bytes_and_close(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    reply: &[u8],
) {
    if tokio::time::timeout(REFUSAL_DRAIN_TIME, stream.write_all(reply))
        .await
        .is_err()
    {
        return;
    }
    let _ = stream.shutdown().await;
    let _ = tokio::time::timeout(REFUSAL_DRAIN_TIME, async {
        let mut buffer = vec![0u8; READ_CHUNK_BYTES];
        let mut drained = 0;
        while drained < REFUSAL_DRAIN_BYTES_MAX {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => drained += read,
            }
        }
    })
    .await;
}

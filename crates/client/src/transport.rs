//! Moves one sync's bytes over TCP. All protocol decisions are the session's.

use std::time::Duration;

use rowsync_protocol::{encode_frame, DownloadAck, EndUpload, FrameDecoder, Hello, Message};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::session::{ClientSession, SessionEvent};
use crate::ClientError;

/// Bytes read from the socket at a time.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;

pub struct Exchange<'a> {
    pub address: &'a str,
    pub hello: Hello,
    pub upload_frames: &'a [Vec<u8>],
    pub upload_sequence: u64,
    pub frame_bytes_max: usize,
    pub timeout: Duration,
}

/// Sends hello, upload and end of upload; reads until the session completes. Returns
/// the connection too, for the download acknowledgement.
pub async fn exchange(request: Exchange<'_>) -> Result<(SessionEvent, TcpStream), ClientError> {
    let timeout_ms = request.timeout.as_millis() as u64;
    let mut stream = tokio::time::timeout(request.timeout, TcpStream::connect(request.address))
        .await
        .map_err(|_| ClientError::Timeout {
            during: "connecting",
            timeout_ms,
        })?
        .map_err(|source| ClientError::Connect {
            address: request.address.to_string(),
            source,
        })?;
    stream.set_nodelay(true)?;
    let mut decoder = FrameDecoder::new(request.frame_bytes_max);
    let mut session = ClientSession::new();
    // Each write must progress within the timeout; a large upload may take longer.
    let hello = encode_frame(&Message::Hello(request.hello));
    let end = encode_frame(&Message::EndUpload(EndUpload {
        upload_sequence: request.upload_sequence,
    }));
    let frames = std::iter::once(&hello)
        .chain(request.upload_frames)
        .chain(std::iter::once(&end));
    let mut written = Ok(Ok(()));
    for frame in frames {
        written = tokio::time::timeout(request.timeout, stream.write_all(frame)).await;
        if !matches!(written, Ok(Ok(()))) {
            break;
        }
    }
    match written {
        Err(_) => {
            return Err(ClientError::Timeout {
                during: "sending the upload",
                timeout_ms,
            })
        }
        // The server may have refused the sync early (busy, bad credentials) and closed;
        // its answer, if any, says more than the broken pipe.
        Ok(Err(write_error)) => {
            return match read_until_done(&mut stream, &mut decoder, &mut session, request.timeout)
                .await
            {
                Ok(event) => Ok((event, stream)),
                Err(_) => Err(ClientError::Io(write_error)),
            }
        }
        Ok(Ok(())) => {}
    }
    let event = read_until_done(&mut stream, &mut decoder, &mut session, request.timeout).await?;
    Ok((event, stream))
}

/// Tells the server the download ending at `watermark` was applied, and waits until the
/// server has recorded it (it then closes the connection).
pub async fn acknowledge(
    mut stream: TcpStream,
    watermark: i64,
    timeout: Duration,
) -> Result<(), ClientError> {
    let timeout_ms = timeout.as_millis() as u64;
    let frame = encode_frame(&Message::DownloadAck(DownloadAck { watermark }));
    tokio::time::timeout(timeout, stream.write_all(&frame))
        .await
        .map_err(|_| ClientError::Timeout {
            during: "sending the download acknowledgement",
            timeout_ms,
        })??;
    let mut buffer = [0u8; 256];
    loop {
        let read = tokio::time::timeout(timeout, stream.read(&mut buffer))
            .await
            .map_err(|_| ClientError::Timeout {
                during: "waiting for the server to record the acknowledgement",
                timeout_ms,
            })??;
        if read == 0 {
            return Ok(());
        }
    }
}

async fn read_until_done(
    stream: &mut TcpStream,
    decoder: &mut FrameDecoder,
    session: &mut ClientSession,
    timeout: Duration,
) -> Result<SessionEvent, ClientError> {
    let mut buffer = vec![0u8; READ_CHUNK_BYTES];
    loop {
        while let Some(message) = decoder.next_message()? {
            match session.handle(message)? {
                SessionEvent::Continue => {}
                done => return Ok(done),
            }
        }
        let read = tokio::time::timeout(timeout, stream.read(&mut buffer))
            .await
            .map_err(|_| ClientError::Timeout {
                during: "waiting for the download",
                timeout_ms: timeout.as_millis() as u64,
            })??;
        if read == 0 {
            decoder.finish()?;
            return Err(ClientError::Protocol(
                "the server closed the connection before the end of the download".into(),
            ));
        }
        decoder.feed(&buffer[..read]);
    }
}

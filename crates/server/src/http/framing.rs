//! Watching HTTP/1.1 request heads for both `Content-Length` and `Transfer-Encoding`:
//! hyper takes such a request by its chunked body (dropping `Content-Length`, and
//! closing the connection after it), which a proxy in front that trusts
//! `Content-Length` reads differently: the request-smuggling shape. hyper does not tell
//! the service, so the bytes it reads are watched here, and the service answers 400.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes of a line kept to recognise the header it starts (`transfer-encoding:`).
const LINE_PREFIX_BYTES: usize = 18;

/// A connection's reading side, watched for a head with both framing headers.
pub(crate) struct HeadWatch<I> {
    inner: I,
    line: [u8; LINE_PREFIX_BYTES],
    /// Bytes of the current line so far (only the first `LINE_PREFIX_BYTES` are kept).
    line_bytes: usize,
    content_length: bool,
    transfer_encoding: bool,
    both: Arc<AtomicBool>,
}

/// Set when a head with both headers was read; taken by the service.
#[derive(Clone)]
pub(crate) struct BothFramings(Arc<AtomicBool>);

impl BothFramings {
    /// Whether a head with both headers was read since the last call.
    pub(crate) fn take(&self) -> bool {
        self.0.swap(false, Ordering::AcqRel)
    }
}

impl<I> HeadWatch<I> {
    pub(crate) fn new(inner: I) -> (HeadWatch<I>, BothFramings) {
        let both = Arc::new(AtomicBool::new(false));
        let watch = HeadWatch {
            inner,
            line: [0; LINE_PREFIX_BYTES],
            line_bytes: 0,
            content_length: false,
            transfer_encoding: false,
            both: Arc::clone(&both),
        };
        (watch, BothFramings(both))
    }

    /// Follows the lines of `bytes`: a line starting a framing header marks it; an
    /// empty line ends a head.
    fn watch(&mut self, mut bytes: &[u8]) {
        while let Some(end) = bytes.iter().position(|&byte| byte == b'\n') {
            self.keep(&bytes[..end]);
            self.end_line();
            bytes = &bytes[end + 1..];
        }
        self.keep(bytes);
    }

    fn keep(&mut self, bytes: &[u8]) {
        let kept = self.line_bytes.min(LINE_PREFIX_BYTES);
        let taken = (LINE_PREFIX_BYTES - kept).min(bytes.len());
        self.line[kept..kept + taken].copy_from_slice(&bytes[..taken]);
        self.line_bytes = self.line_bytes.saturating_add(bytes.len());
    }

    fn end_line(&mut self) {
        let line = &self.line[..self.line_bytes.min(LINE_PREFIX_BYTES)];
        let starts =
            |name: &[u8]| line.len() >= name.len() && line[..name.len()].eq_ignore_ascii_case(name);
        if self.line_bytes <= 1 && line.iter().all(|&byte| byte == b'\r') {
            if self.content_length && self.transfer_encoding {
                self.both.store(true, Ordering::Release);
            }
            self.content_length = false;
            self.transfer_encoding = false;
        } else if starts(b"content-length:") {
            self.content_length = true;
        } else if starts(b"transfer-encoding:") {
            self.transfer_encoding = true;
        }
        self.line_bytes = 0;
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for HeadWatch<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buffer.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(context, buffer);
        if let Poll::Ready(Ok(())) = polled {
            let watch = &mut *self;
            watch.watch(&buffer.filled()[before..]);
        }
        polled
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for HeadWatch<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(context, bytes)
    }

    fn poll_flush(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(context)
    }

    fn poll_shutdown(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(context)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(context, buffers)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(reads: &[&[u8]]) -> bool {
        let (mut watch, both) = HeadWatch::new(());
        for read in reads {
            watch.watch(read);
        }
        both.take()
    }

    #[test]
    fn a_head_with_both_framings_is_seen_however_it_is_read() {
        let head: &[u8] =
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(both(&[head]));
        let bytes: Vec<&[u8]> = head.chunks(1).collect();
        assert!(both(&bytes));
        assert!(!both(&[
            b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\nab\r\n"
        ]));
        assert!(!both(&[
            b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
        // Each head on its own: one of each in two heads is not both.
        assert!(!both(&[
            b"GET / HTTP/1.1\r\nContent-Length: 0\r\n\r\nGET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
        assert!(!both(&[
            b"POST / HTTP/1.1\r\nX-Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        ]));
    }
}

//! Moves one sync's bytes over TCP, TLS, HTTP or HTTPS. All protocol decisions are the
//! session's; compression is [`Outbound`]/[`Inbound`]'s.
//!
//! The server is named by a URL: `tcp://host:port` (a bare `host:port` means the same),
//! `tls://host:port`, `http://host:port/path`, `https://host:port/path`. On TCP and TLS
//! the bytes are the frame stream itself (after a preamble when compressed); on HTTP one
//! POST carries the same bytes as its body and the response body is the server's stream.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rowsync_protocol::{
    decode_message, encode_frame, Compression, Conflicts, Download, DownloadAck, DownloadHeld,
    DownloadResume, EndUpload, FrameDecoder, Hello, Inbound, KeyRange, KeyRanges, Message,
    Outbound, UploadHeld, UploadResume, DOWNLOAD_RECEIPT_BYTES_MIN, DOWNLOAD_RESUME_SINCE_VERSION,
    FRAME_HEADER_BYTES, KEY_RANGES_SINCE_VERSION, RESUME_SINCE_VERSION,
    ROW_PIECES_BYTES_MAX_DEFAULT, VALUE_BYTES_MAX_DEFAULT,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::session::{ClientSession, Received, SessionEvent};
use crate::ClientError;

/// A compressed resumable upload is flushed after this many bytes of its stream, so a
/// cut loses at most about this much of it besides the bytes in flight (protocol v3).
pub const RESUMABLE_FLUSH_BYTES: usize = 32 * 1024;
/// Bytes read from the socket at a time.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Default port of `tcp://` and `tls://` addresses.
pub const DEFAULT_PORT: u16 = 2439;
/// Default path of `http://` and `https://` addresses.
pub const DEFAULT_HTTP_PATH: &str = "/sync";
/// The media type of HTTP request and response bodies.
pub const CONTENT_TYPE_ROWSYNC: &str = "application/x-rowsync";
/// Retry hint for a `503` that names none.
const BUSY_RETRY_AFTER_MS_DEFAULT: u32 = 1000;
/// Bytes of an unexpected HTTP answer's body kept for the error message.
const HTTP_ERROR_BODY_BYTES_MAX: usize = 1024;
/// A download may inflate to at most this many bytes by default (the reference
/// server's default download limit).
pub const DECOMPRESSED_BYTES_MAX_DEFAULT: u64 = 16 * 1024 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Tcp,
    Tls,
    Http,
    Https,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Tcp => "tcp",
            Scheme::Tls => "tls",
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }

    fn uses_tls(self) -> bool {
        matches!(self, Scheme::Tls | Scheme::Https)
    }
}

/// A parsed server address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerAddress {
    pub scheme: Scheme,
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// The HTTP request path (`/sync` unless the URL names one).
    pub path: String,
}

impl ServerAddress {
    pub fn parse(text: &str) -> Result<ServerAddress, ClientError> {
        let invalid = |why: &str| ClientError::Address {
            address: text.to_string(),
            message: why.to_string(),
        };
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme, rest)) => {
                let scheme = match scheme.to_ascii_lowercase().as_str() {
                    "tcp" => Scheme::Tcp,
                    "tls" => Scheme::Tls,
                    "http" => Scheme::Http,
                    "https" => Scheme::Https,
                    _ => return Err(invalid("the scheme must be tcp, tls, http or https")),
                };
                (scheme, rest)
            }
            None => (Scheme::Tcp, text),
        };
        let (authority, path) = match rest.find('/') {
            Some(slash) => (&rest[..slash], &rest[slash..]),
            None => (rest, ""),
        };
        if !path.is_empty() && matches!(scheme, Scheme::Tcp | Scheme::Tls) {
            return Err(invalid("a tcp:// or tls:// address has no path"));
        }
        let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
            let (host, after) = bracketed
                .split_once(']')
                .ok_or_else(|| invalid("unclosed [ in the host"))?;
            (host, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (authority, None),
            }
        };
        if host.is_empty() {
            return Err(invalid("the host is missing"));
        }
        let port = match port {
            Some(port) => port
                .parse::<u16>()
                .map_err(|_| invalid("the port must be a number from 1 to 65535"))?,
            None => match scheme {
                Scheme::Tcp | Scheme::Tls => DEFAULT_PORT,
                Scheme::Http => 80,
                Scheme::Https => 443,
            },
        };
        let path = if path.is_empty() || path == "/" {
            DEFAULT_HTTP_PATH.to_string()
        } else {
            path.to_string()
        };
        Ok(ServerAddress {
            scheme,
            host: host.to_string(),
            port,
            path,
        })
    }

    /// `host:port`, IPv6 hosts in brackets.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// How to verify the server (TLS and HTTPS) and whom to present.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM file of the CA certificates to trust instead of the public web roots.
    pub ca_file: Option<PathBuf>,
    /// PEM certificate chain and key to present when the server asks for one.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// The name the server's certificate must carry, when not the URL's host.
    pub server_name: Option<String>,
}

/// HTTP version for `http://` and `https://`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HttpVersion {
    /// HTTPS: HTTP/2 if the server offers it (ALPN), else HTTP/1.1. HTTP: HTTP/1.1.
    #[default]
    Auto,
    Http1,
    /// HTTPS: HTTP/2 required. HTTP: HTTP/2 with prior knowledge (h2c).
    Http2,
}

/// Everything about the transport beyond the address.
#[derive(Debug, Clone)]
pub struct TransportOptions {
    /// Compression of both directions (the server answers in kind).
    pub compression: Compression,
    pub tls: TlsOptions,
    pub http_version: HttpVersion,
    /// Bytes the server's (compressed) download may inflate to.
    pub decompressed_bytes_max: u64,
    /// The largest value the download may carry in pieces (text or blob bytes).
    pub value_bytes_max: u64,
    /// The most bytes of values in pieces held for one downloaded row before its
    /// message arrives.
    pub row_pieces_bytes_max: u64,
}

impl Default for TransportOptions {
    fn default() -> TransportOptions {
        TransportOptions {
            compression: Compression::None,
            tls: TlsOptions::default(),
            http_version: HttpVersion::Auto,
            decompressed_bytes_max: DECOMPRESSED_BYTES_MAX_DEFAULT,
            value_bytes_max: VALUE_BYTES_MAX_DEFAULT,
            row_pieces_bytes_max: ROW_PIECES_BYTES_MAX_DEFAULT,
        }
    }
}

pub struct Exchange<'a> {
    pub address: &'a str,
    pub transport: &'a TransportOptions,
    pub hello: Hello,
    pub upload_frames: &'a [Vec<u8>],
    pub upload_sequence: u64,
    pub frame_bytes_max: usize,
    pub timeout: Duration,
    /// Instead of an upload, confirm that the download ending at this watermark was
    /// applied (the hello then has `download_ack` set). A separate exchange, so it works
    /// alike on every transport and through any server behind a proxy.
    pub acknowledge: Option<i64>,
    /// Protocol v3: which transfer the upload is and where it goes on, or a question
    /// about a held transfer instead of an upload. `None` with a v3 hello: a new
    /// transfer of a random id, from its start.
    pub transfer: Option<Transfer>,
    /// Protocol v4: instead of an upload, continue the cut download of this transfer
    /// after the bytes of its stream the client holds.
    pub download_resume: Option<HeldDownload<'a>>,
    /// Protocol v7: the key ranges the client holds, sent before the end of upload.
    pub key_ranges: &'a [KeyRange],
}

/// What a client holds of a cut download (protocol v4): the transfer and the start of
/// its stream.
#[derive(Debug, Clone, Copy)]
pub struct HeldDownload<'a> {
    pub transfer_id: &'a str,
    pub prefix: &'a [u8],
}

/// Protocol v3: an upload's place in a resumable transfer (see docs/protocol.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transfer {
    /// The upload's stream (its frames and the end of upload) is sent from byte
    /// `offset` on; the server takes the bytes before it from what it holds.
    Resume { transfer_id: String, offset: u64 },
    /// Instead of an upload, ask what the server holds of the transfer; answered with
    /// [`SessionEvent::Held`].
    Query { transfer_id: String },
}

/// A new transfer id: 16 random bytes in hex.
pub fn new_transfer_id() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    hex::encode(bytes)
}

/// An upload's stream as a transfer counts it: its frames, then the end of upload.
pub fn transfer_stream<'a>(
    upload_frames: &'a [Vec<u8>],
    end: &'a [u8],
) -> impl Iterator<Item = &'a [u8]> + 'a {
    upload_frames
        .iter()
        .map(Vec::as_slice)
        .chain(std::iter::once(end))
}

/// The frames that end an upload: the key ranges the client holds (protocol v7, when
/// it holds any), then the end of upload of its sequence.
pub fn end_upload_frame(hello: &Hello, upload_sequence: u64, key_ranges: &[KeyRange]) -> Vec<u8> {
    let mut frames = Vec::new();
    if hello.protocol_version >= KEY_RANGES_SINCE_VERSION && !key_ranges.is_empty() {
        frames = encode_frame(&Message::KeyRanges(KeyRanges {
            ranges: key_ranges.to_vec(),
        }));
    }
    frames.extend(encode_frame(&Message::EndUpload(EndUpload {
        upload_sequence,
    })));
    frames
}

/// Bytes that crossed the TCP connection, in each direction, everything included (TLS
/// records, HTTP headers, the preamble).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireBytes {
    pub sent: u64,
    pub received: u64,
}

/// What a streaming exchange does with each download message as it arrives, and how it
/// tells progress. Runs on the exchange's task, between reads.
pub trait DownloadHandler: Send {
    /// A checked download message; `wire` counts the bytes so far. An error ends the
    /// exchange with it.
    fn download(&mut self, download: Download, wire: WireBytes) -> Result<(), ClientError>;
    /// One table's keys the server did not apply as uploaded; all come before the first
    /// download message.
    fn conflicts(&mut self, conflicts: Conflicts) -> Result<(), ClientError> {
        let _ = conflicts;
        Ok(())
    }
    /// Part of the upload was written; `wire` counts the bytes so far.
    fn sent(&mut self, wire: WireBytes) {
        let _ = wire;
    }
    /// The whole upload was written (or, on HTTP, the answer began): from here a cut
    /// may leave a download the server holds (protocol v4).
    fn upload_sent(&mut self) {}
    /// Bytes of the download's stream (decompressed), as they arrive; after a resumed
    /// download's `DownloadHeld`, only the bytes that follow the client's prefix.
    fn stream(&mut self, bytes: &[u8]) {
        let _ = bytes;
    }
    /// A resumed download's answer: the whole stream's length and digest, before the
    /// prefix and the rest go through [`DownloadHandler::download`].
    fn held(&mut self, held: &DownloadHeld) {
        let _ = held;
    }
}

/// Keeps every download and conflicting key, for [`exchange`].
#[derive(Default)]
struct Collect {
    downloads: Vec<Download>,
    conflicts: Vec<Conflicts>,
}

impl DownloadHandler for Collect {
    fn download(&mut self, download: Download, _wire: WireBytes) -> Result<(), ClientError> {
        self.downloads.push(download);
        Ok(())
    }

    fn conflicts(&mut self, conflicts: Conflicts) -> Result<(), ClientError> {
        self.conflicts.push(conflicts);
        Ok(())
    }
}

/// Sends hello, upload and end of upload; reads until the session completes.
pub async fn exchange(request: Exchange<'_>) -> Result<SessionEvent, ClientError> {
    Ok(exchange_measured(request).await?.0)
}

/// [`exchange`], also counting the bytes on the wire. The whole download is kept in
/// memory and comes with [`SessionEvent::Complete`].
pub async fn exchange_measured(
    request: Exchange<'_>,
) -> Result<(SessionEvent, WireBytes), ClientError> {
    let mut collect = Collect::default();
    let (event, wire) = exchange_streaming(request, &mut collect).await?;
    let event = match event {
        SessionEvent::Complete(mut completed) => {
            completed.downloads = collect.downloads;
            completed.conflicts = collect.conflicts;
            SessionEvent::Complete(completed)
        }
        other => other,
    };
    Ok((event, wire))
}

/// [`exchange_measured`], handing each download message to `handler` as it arrives
/// instead of keeping it: [`SessionEvent::Complete`] then carries no downloads.
pub async fn exchange_streaming(
    request: Exchange<'_>,
    handler: &mut dyn DownloadHandler,
) -> Result<(SessionEvent, WireBytes), ClientError> {
    let address = ServerAddress::parse(request.address)?;
    let counters = Arc::new(Counters::default());
    let receiver = Receiver::new(&request, handler, Arc::clone(&counters));
    let tcp = connect_tcp(&address, request.timeout).await?;
    let stream = Counted {
        inner: tcp,
        counters: Arc::clone(&counters),
    };
    let event = match address.scheme {
        Scheme::Tcp => exchange_stream(stream, &request, receiver).await,
        Scheme::Tls => {
            let (tls, _) = tls_handshake(stream, &address, &request, &[b"rowsync"]).await?;
            exchange_stream(tls, &request, receiver).await
        }
        Scheme::Http | Scheme::Https => {
            let (event, undelivered) = match http_connection(stream, &address, &request).await? {
                HttpConnection::Plain(stream, http2) => {
                    exchange_http(stream, &address, http2, &request, receiver).await
                }
                HttpConnection::Tls(tls, http2) => {
                    exchange_http(*tls, &address, http2, &request, receiver).await
                }
            }?;
            if let Some(frame) = undelivered {
                receipt_anew(&address, &request, frame, &counters).await;
            }
            Ok(event)
        }
    }?;
    Ok((event, counters.get()))
}

/// An HTTP(S) connection, TLS done, and whether it speaks HTTP/2.
enum HttpConnection {
    Plain(Counted<TcpStream>, bool),
    Tls(
        Box<tokio_rustls::client::TlsStream<Counted<TcpStream>>>,
        bool,
    ),
}

/// The HTTP(S) connection over `stream`: TLS for `https://` (HTTP/2 if ALPN agrees to
/// it, or as the request asks).
async fn http_connection(
    stream: Counted<TcpStream>,
    address: &ServerAddress,
    request: &Exchange<'_>,
) -> Result<HttpConnection, ClientError> {
    if address.scheme == Scheme::Http {
        let http2 = request.transport.http_version == HttpVersion::Http2;
        return Ok(HttpConnection::Plain(stream, http2));
    }
    let alpn: &[&[u8]] = match request.transport.http_version {
        HttpVersion::Auto => &[b"h2", b"http/1.1"],
        HttpVersion::Http1 => &[b"http/1.1"],
        HttpVersion::Http2 => &[b"h2"],
    };
    let (tls, alpn) = tls_handshake(stream, address, request, alpn).await?;
    let http2 = alpn.as_deref() == Some(b"h2".as_slice());
    if request.transport.http_version == HttpVersion::Http2 && !http2 {
        return Err(ClientError::Http {
            status: None,
            message: format!("{} did not agree to HTTP/2", address.authority()),
        });
    }
    Ok(HttpConnection::Tls(Box::new(tls), http2))
}

/// Sends a download's receipt on a connection of its own, when the sync's connection
/// could not take it (an HTTP/1.1 server closes a keep-alive connection that stays idle
/// past its header timeout, which a slow link's buffered download may outlast). Any
/// failure costs only a held download.
async fn receipt_anew(
    address: &ServerAddress,
    request: &Exchange<'_>,
    frame: Vec<u8>,
    counters: &Arc<Counters>,
) {
    let sending = async {
        let tcp = connect_tcp(address, request.timeout).await.ok()?;
        let stream = Counted {
            inner: tcp,
            counters: Arc::clone(counters),
        };
        let (mut sender, http2) = match http_connection(stream, address, request).await.ok()? {
            HttpConnection::Plain(stream, http2) => {
                (HttpSender::handshake(stream, http2).await.ok()?, http2)
            }
            HttpConnection::Tls(tls, http2) => {
                (HttpSender::handshake(*tls, http2).await.ok()?, http2)
            }
        };
        let answer = sender.send(http_post(address, http2, frame).ok()?).await;
        drain(&mut answer.ok()?.into_body()).await
    };
    let _ = tokio::time::timeout(request.timeout, sending).await;
}

async fn connect_tcp(address: &ServerAddress, timeout: Duration) -> Result<TcpStream, ClientError> {
    let authority = address.authority();
    let stream = tokio::time::timeout(timeout, TcpStream::connect(&authority))
        .await
        .map_err(|_| ClientError::Timeout {
            during: "connecting",
            timeout_ms: timeout.as_millis() as u64,
        })?
        .map_err(|source| ClientError::Connect {
            address: authority,
            source,
        })?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

fn tls_error(address: &ServerAddress, message: impl std::fmt::Display) -> ClientError {
    ClientError::Tls {
        address: address.authority(),
        message: message.to_string(),
    }
}

fn client_config(
    options: &TlsOptions,
    address: &ServerAddress,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    match &options.ca_file {
        Some(path) => {
            let certificates = CertificateDer::pem_file_iter(path)
                .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
                .map_err(|error| {
                    tls_error(
                        address,
                        format!("reading CA file {}: {error}", path.display()),
                    )
                })?;
            if certificates.is_empty() {
                return Err(tls_error(
                    address,
                    format!("CA file {} holds no PEM certificate", path.display()),
                ));
            }
            for certificate in certificates {
                roots.add(certificate).map_err(|error| {
                    tls_error(address, format!("CA file {}: {error}", path.display()))
                })?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|error| tls_error(address, error))?
        .with_root_certificates(roots);
    let mut config = match (&options.client_cert, &options.client_key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
                .map_err(|error| {
                    tls_error(
                        address,
                        format!("reading client certificate {}: {error}", cert.display()),
                    )
                })?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|error| {
                tls_error(
                    address,
                    format!("reading client key {}: {error}", key.display()),
                )
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|error| tls_error(address, format!("client certificate: {error}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(tls_error(
                address,
                "a client certificate needs both its certificate and its key file",
            ))
        }
    };
    config.alpn_protocols = alpn.iter().map(|name| name.to_vec()).collect();
    Ok(config)
}

/// The TLS handshake; verifies the server's certificate chain and name. Returns the
/// stream and the negotiated ALPN protocol.
async fn tls_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    address: &ServerAddress,
    request: &Exchange<'_>,
    alpn: &[&[u8]],
) -> Result<(tokio_rustls::client::TlsStream<S>, Option<Vec<u8>>), ClientError> {
    let options = &request.transport.tls;
    let config = client_config(options, address, alpn)?;
    let name = options.server_name.as_deref().unwrap_or(&address.host);
    let server_name = ServerName::try_from(name.to_string())
        .map_err(|error| tls_error(address, format!("server name {name:?}: {error}")))?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tls = tokio::time::timeout(request.timeout, connector.connect(server_name, stream))
        .await
        .map_err(|_| ClientError::Timeout {
            during: "the TLS handshake",
            timeout_ms: request.timeout.as_millis() as u64,
        })?
        .map_err(|error| {
            let plain_text = error
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                .is_some_and(|inner| matches!(inner, rustls::Error::InvalidMessage(_)));
            let hint = if plain_text {
                " (the server did not answer in TLS: is this a plain tcp:// or http:// port?)"
            } else {
                ""
            };
            tls_error(address, format!("handshake failed: {error}{hint}"))
        })?;
    let alpn = tls.get_ref().1.alpn_protocol().map(|name| name.to_vec());
    Ok((tls, alpn))
}

/// What an exchange's stream starts with after the hello.
struct StreamHead<'a> {
    /// The frame that says what the exchange is: a download's receipt or resumption, an
    /// acknowledgement, a question about a held upload, the upload's transfer (v3).
    head: Option<Vec<u8>>,
    /// The upload's frames, when it is an upload.
    upload_frames: &'a [Vec<u8>],
    /// Where a resumed upload's stream starts.
    offset: u64,
    /// The transfer whose download a receipt confirms (protocol v4).
    receipt: Option<String>,
}

/// The frame after the hello, and what the rest of the stream is.
fn stream_head<'a>(request: &Exchange<'a>, resumable: bool) -> StreamHead<'a> {
    let download_resumable = request.hello.protocol_version >= DOWNLOAD_RESUME_SINCE_VERSION;
    let mut receipt = None;
    let (head, upload_frames, offset): (Option<Vec<u8>>, &[Vec<u8>], u64) =
        match (request.acknowledge, &request.transfer) {
            (None, _) if request.download_resume.is_some() => {
                let held = request.download_resume.expect("matched");
                receipt = Some(held.transfer_id.to_string());
                (
                    Some(encode_frame(&Message::DownloadResume(DownloadResume {
                        transfer_id: held.transfer_id.to_string(),
                        offset: held.prefix.len() as u64,
                    }))),
                    &[],
                    0,
                )
            }
            (Some(watermark), _) => (
                Some(encode_frame(&Message::DownloadAck(DownloadAck {
                    watermark,
                }))),
                &[],
                0,
            ),
            (None, Some(Transfer::Query { transfer_id })) => (
                Some(encode_frame(&Message::UploadHeld(UploadHeld {
                    transfer_id: transfer_id.clone(),
                    length: 0,
                    sha256: Vec::new(),
                }))),
                &[],
                0,
            ),
            (None, transfer) => {
                let (transfer_id, offset) = match transfer {
                    Some(Transfer::Resume {
                        transfer_id,
                        offset,
                    }) => (transfer_id.clone(), *offset),
                    _ => (new_transfer_id(), 0),
                };
                if download_resumable {
                    receipt = Some(transfer_id.clone());
                }
                let resume = resumable.then(|| {
                    encode_frame(&Message::UploadResume(UploadResume {
                        transfer_id,
                        offset,
                    }))
                });
                (resume, request.upload_frames, offset)
            }
        };
    StreamHead {
        head,
        upload_frames,
        offset,
        receipt,
    }
}

/// The client's side of the byte stream: preamble (when compressed), then the frames;
/// and the transfer whose download a receipt confirms (protocol v4).
fn upload_stream(request: &Exchange<'_>) -> Result<(Vec<Vec<u8>>, Option<String>), ClientError> {
    let mut outbound = Outbound::new(request.transport.compression, false)
        .map_err(|error| ClientError::Protocol(format!("compression: {error}")))?;
    let compress_error = |error| ClientError::Protocol(format!("compression: {error}"));
    let mut pieces = Vec::with_capacity(request.upload_frames.len() + 3);
    if let Some(preamble) = outbound.take_preamble() {
        pieces.push(preamble.to_vec());
    }
    let mut hello = request.hello.clone();
    hello.download_ack = request.acknowledge.is_some();
    let resumable = hello.protocol_version >= RESUME_SINCE_VERSION;
    let hello = encode_frame(&Message::Hello(hello));
    // The hello goes out whole at once (a sync flush when compressing): the server
    // reads it under its header read timeout, which a slow link would otherwise spend
    // on the upload held back in the compressor's first block.
    let mut hello_piece = outbound
        .compressor()
        .compress(&hello)
        .map_err(compress_error)?;
    hello_piece.extend(outbound.compressor().flush().map_err(compress_error)?);
    pieces.push(hello_piece);
    let end = end_upload_frame(&request.hello, request.upload_sequence, request.key_ranges);
    let StreamHead {
        head,
        upload_frames,
        offset,
        receipt,
    } = stream_head(request, resumable);
    let upload = request.acknowledge.is_none()
        && request.download_resume.is_none()
        && !matches!(request.transfer, Some(Transfer::Query { .. }));
    // A v2 hello has no transfer: its upload goes whole.
    let mut skip = if resumable { offset } else { 0 };
    let stream = transfer_stream(upload_frames, &end)
        .filter(|_| upload)
        .filter_map(|frame| {
            // A resumed transfer's first `offset` bytes are the server's already.
            let skipped = skip.min(frame.len() as u64) as usize;
            skip -= skipped as u64;
            (skipped < frame.len()).then(|| &frame[skipped..])
        });
    // A resumable upload is flushed every `RESUMABLE_FLUSH_BYTES` of its stream, so
    // what crosses the link before a cut inflates on the server (a compressed block
    // only inflates whole) and is held: a cut costs at most that much more.
    let flush_every = match (resumable, request.transport.compression) {
        (true, Compression::Zlib | Compression::Zstd) => RESUMABLE_FLUSH_BYTES,
        _ => usize::MAX,
    };
    let mut since_flush = 0usize;
    for frame in head.iter().map(Vec::as_slice).chain(stream) {
        let mut rest = frame;
        while !rest.is_empty() {
            let (part, after) = rest.split_at(rest.len().min(flush_every - since_flush));
            rest = after;
            let mut piece = outbound
                .compressor()
                .compress(part)
                .map_err(compress_error)?;
            since_flush += part.len();
            if since_flush == flush_every {
                piece.extend(outbound.compressor().flush().map_err(compress_error)?);
                since_flush = 0;
            }
            if !piece.is_empty() {
                pieces.push(piece);
            }
        }
    }
    let tail = outbound.finish().map_err(compress_error)?;
    if !tail.is_empty() {
        pieces.push(tail);
    }
    Ok((pieces, receipt))
}

/// The receipt that follows a download's end on TCP and TLS (protocol v4): a plain
/// `download_resume` frame at the stream's length, never compressed (the client's
/// compressed stream has ended).
fn receipt_frame(transfer_id: &str, stream_bytes: u64) -> Vec<u8> {
    encode_frame(&Message::DownloadResume(DownloadResume {
        transfer_id: transfer_id.to_string(),
        offset: stream_bytes,
    }))
}

/// The server's side of the byte stream, turned into session events; downloads go to
/// the handler as they arrive.
struct Receiver<'h> {
    inbound: Inbound,
    decoder: FrameDecoder,
    session: ClientSession,
    handler: &'h mut dyn DownloadHandler,
    counters: Arc<Counters>,
    frame_bytes_max: usize,
    /// A resumed download (protocol v4) until its `DownloadHeld` frame is in: the
    /// client's prefix of the stream and the bytes of that frame so far.
    resume: Option<(Vec<u8>, Vec<u8>)>,
    /// Bytes of the download's stream so far (a resumed one's prefix included).
    stream_bytes: u64,
    upload_sent: bool,
}

impl<'h> Receiver<'h> {
    fn new(
        request: &Exchange<'_>,
        handler: &'h mut dyn DownloadHandler,
        counters: Arc<Counters>,
    ) -> Receiver<'h> {
        Receiver {
            inbound: Inbound::new(request.transport.decompressed_bytes_max),
            decoder: FrameDecoder::new(request.frame_bytes_max).with_value_limits(
                request.transport.value_bytes_max,
                request.transport.row_pieces_bytes_max,
            ),
            session: ClientSession::new(),
            handler,
            counters,
            frame_bytes_max: request.frame_bytes_max,
            resume: request
                .download_resume
                .map(|held| (held.prefix.to_vec(), Vec::new())),
            stream_bytes: 0,
            upload_sent: false,
        }
    }

    fn sent(&mut self) {
        self.handler.sent(self.counters.get());
    }

    /// The upload is out (or the answer began): told to the handler once.
    fn upload_sent(&mut self) {
        if !self.upload_sent {
            self.upload_sent = true;
            self.handler.upload_sent();
        }
    }

    /// Takes received bytes; a final event once the session is complete.
    fn take(&mut self, bytes: &[u8]) -> Result<Option<SessionEvent>, ClientError> {
        self.inbound.feed(bytes)?;
        while let Some(chunk) = self.inbound.next_chunk()? {
            if let Some((_, first)) = self.resume.as_mut() {
                first.extend_from_slice(chunk);
                if let Some(event) = self.resume_start()? {
                    return Ok(Some(event));
                }
                continue;
            }
            self.stream_bytes += chunk.len() as u64;
            self.handler.stream(chunk);
            let mut parts = Parts {
                decoder: &mut self.decoder,
                session: &mut self.session,
                handler: &mut *self.handler,
                counters: &self.counters,
            };
            if let Some(event) = parts.deliver(chunk)? {
                return Ok(Some(event));
            }
        }
        Ok(None)
    }

    /// A resumed download's first frame, once whole: `DownloadHeld` (then the client's
    /// prefix and the bytes after the frame go on as the stream), or the server's
    /// refusal.
    fn resume_start(&mut self) -> Result<Option<SessionEvent>, ClientError> {
        let Some((_, first)) = self.resume.as_ref() else {
            return Ok(None);
        };
        if first.len() < FRAME_HEADER_BYTES {
            return Ok(None);
        }
        let length = u32::from_be_bytes(first[..4].try_into().expect("4 bytes")) as usize;
        if length == 0 || length > self.frame_bytes_max {
            return Err(ClientError::Protocol(format!(
                "the answer to a download resumption is a frame of {length} bytes"
            )));
        }
        if first.len() < FRAME_HEADER_BYTES + length {
            return Ok(None);
        }
        let (prefix, first) = self.resume.take().expect("checked above");
        let message = decode_message(&first[FRAME_HEADER_BYTES..FRAME_HEADER_BYTES + length])?;
        let Message::DownloadHeld(held) = message else {
            return match self.session.receive(message)? {
                Received::Event(event) => Ok(Some(event)),
                _ => Err(ClientError::Protocol(
                    "a download resumption was answered with download rows".into(),
                )),
            };
        };
        self.handler.held(&held);
        let rest = &first[FRAME_HEADER_BYTES + length..];
        self.stream_bytes += (prefix.len() + rest.len()) as u64;
        self.handler.stream(rest);
        let mut parts = Parts {
            decoder: &mut self.decoder,
            session: &mut self.session,
            handler: &mut *self.handler,
            counters: &self.counters,
        };
        if let Some(event) = parts.deliver(&prefix)? {
            return Ok(Some(event));
        }
        parts.deliver(rest)
    }

    /// The stream ended before the session did (a cut, mid-frame or not).
    fn ended(&self) -> ClientError {
        match self.decoder.finish() {
            Err(error) => ClientError::Protocol(format!(
                "the server closed the connection before the end of the download, mid-frame \
                 ({error})"
            )),
            Ok(()) => ClientError::Protocol(
                "the server closed the connection before the end of the download".into(),
            ),
        }
    }
}

/// The parts of a [`Receiver`] that decode the stream, borrowed apart from its inbound.
struct Parts<'r, 'h> {
    decoder: &'r mut FrameDecoder,
    session: &'r mut ClientSession,
    handler: &'r mut (dyn DownloadHandler + 'h),
    counters: &'r Counters,
}

impl Parts<'_, '_> {
    /// Decodes stream bytes into messages for the session and the handler.
    fn deliver(&mut self, bytes: &[u8]) -> Result<Option<SessionEvent>, ClientError> {
        self.decoder.feed(bytes);
        while let Some(message) = self.decoder.next_message()? {
            match self.session.receive(message)? {
                Received::Download(download) => {
                    self.handler.download(download, self.counters.get())?
                }
                Received::Conflicts(conflicts) => self.handler.conflicts(conflicts)?,
                Received::Event(SessionEvent::Continue) => {}
                Received::Event(done) => return Ok(Some(done)),
            }
        }
        Ok(None)
    }
}

/// A TLS alert (a refused client certificate, say) arrives as an I/O error; name it.
fn stream_error(error: std::io::Error, authority: &str) -> ClientError {
    match error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(tls) => ClientError::Tls {
            address: authority.to_string(),
            message: format!("the session failed after the handshake: {tls}"),
        },
        None => ClientError::Io(error),
    }
}

async fn exchange_stream<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &Exchange<'_>,
    mut receiver: Receiver<'_>,
) -> Result<SessionEvent, ClientError> {
    let timeout_ms = request.timeout.as_millis() as u64;
    // Each write must progress within the timeout; a large upload may take longer.
    let mut written = Ok(Ok(()));
    let (pieces, receipt) = upload_stream(request)?;
    for piece in pieces {
        written = tokio::time::timeout(request.timeout, stream.write_all(&piece)).await;
        if !matches!(written, Ok(Ok(()))) {
            break;
        }
        receiver.sent();
    }
    if matches!(written, Ok(Ok(()))) {
        written = tokio::time::timeout(request.timeout, stream.flush()).await;
    }
    match written {
        Err(_) => {
            return Err(ClientError::Timeout {
                during: "sending the upload",
                timeout_ms,
            })
        }
        // The server may have refused the sync early (busy, bad credentials, a value above
        // its limit) and closed while we were still writing; its answer, if it arrived,
        // says more than the broken pipe (protocol §1).
        Ok(Err(write_error)) => {
            return match read_until_done(
                &mut stream,
                &mut receiver,
                request.timeout,
                request.address,
            )
            .await
            {
                Ok(event) => Ok(event),
                Err(said @ (ClientError::Server(_) | ClientError::Tls { .. })) => Err(said),
                Err(_) => Err(stream_error(write_error, request.address)),
            }
        }
        Ok(Ok(())) => receiver.upload_sent(),
    }
    let event =
        read_until_done(&mut stream, &mut receiver, request.timeout, request.address).await?;
    if let (Some(transfer_id), SessionEvent::Complete(_)) = (receipt, &event) {
        // The server holds the download unless this arrives; failing to send it costs
        // only that (the download is here).
        let frame = receipt_frame(&transfer_id, receiver.stream_bytes);
        let sending = async {
            stream.write_all(&frame).await?;
            stream.flush().await
        };
        let _ = tokio::time::timeout(request.timeout, sending).await;
    }
    Ok(event)
}

async fn read_until_done<S: AsyncRead + Unpin>(
    stream: &mut S,
    receiver: &mut Receiver<'_>,
    timeout: Duration,
    authority: &str,
) -> Result<SessionEvent, ClientError> {
    let mut buffer = vec![0u8; READ_CHUNK_BYTES];
    loop {
        let read = tokio::time::timeout(timeout, stream.read(&mut buffer))
            .await
            .map_err(|_| ClientError::Timeout {
                during: "waiting for the download",
                timeout_ms: timeout.as_millis() as u64,
            })?
            .map_err(|error| stream_error(error, authority))?;
        if read == 0 {
            return Err(receiver.ended());
        }
        if let Some(event) = receiver.take(&buffer[..read])? {
            return Ok(event);
        }
    }
}

/// One sync over an HTTP connection; with the final event, a download's receipt that
/// is due but could not go on this connection.
async fn exchange_http<S>(
    stream: S,
    address: &ServerAddress,
    http2: bool,
    request: &Exchange<'_>,
    mut receiver: Receiver<'_>,
) -> Result<(SessionEvent, Option<Vec<u8>>), ClientError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let timeout = request.timeout;
    let (pieces, receipt) = upload_stream(request)?;
    let http_request = http_post(address, http2, pieces.concat())?;
    let sending = async {
        let mut sender = HttpSender::handshake(stream, http2)
            .await
            .map_err(|error| http_failure(address, error, None))?;
        let response = sender.send(http_request).await;
        match response {
            Ok(response) => Ok((sender, response)),
            Err(error) => {
                let connection = sender.connection_error().await;
                Err(http_failure(address, error, connection))
            }
        }
    };
    let (mut sender, response) = tokio::time::timeout(timeout, sending)
        .await
        .map_err(|_| timed_out("waiting for the HTTP response", timeout))??;
    receiver.sent();
    let (event, mut body) = read_http_answer(address, response, &mut receiver, timeout).await?;
    // Protocol v4: a download of at least `DOWNLOAD_RECEIPT_BYTES_MIN`, and any resumed
    // one, is confirmed by a receipt of its own on the same connection.
    let due =
        request.download_resume.is_some() || receiver.stream_bytes >= DOWNLOAD_RECEIPT_BYTES_MIN;
    let (Some(transfer_id), SessionEvent::Complete(_), true) = (receipt, &event, due) else {
        return Ok((event, None));
    };
    let frame = receipt_frame(&transfer_id, receiver.stream_bytes);
    // The server holds the download unless this arrives; failing to send it costs only
    // that (the download is here).
    let confirming = async {
        drain(&mut body).await?;
        let answer = sender
            .send(http_post(address, http2, frame.clone()).ok()?)
            .await;
        drain(&mut answer.ok()?.into_body()).await
    };
    match tokio::time::timeout(timeout, confirming).await {
        Ok(Some(())) => Ok((event, None)),
        _ => Ok((event, Some(frame))),
    }
}

/// The POST that carries `body` to the server's path.
fn http_post(
    address: &ServerAddress,
    http2: bool,
    body: Vec<u8>,
) -> Result<http::Request<Full<Bytes>>, ClientError> {
    let scheme = if address.scheme.uses_tls() {
        "https"
    } else {
        "http"
    };
    let builder = http::Request::post(if http2 {
        format!("{scheme}://{}{}", address.authority(), address.path)
    } else {
        address.path.clone()
    })
    .header(http::header::CONTENT_TYPE, CONTENT_TYPE_ROWSYNC);
    let builder = if http2 {
        builder
    } else {
        builder.header(http::header::HOST, address.authority())
    };
    builder
        .body(Full::new(Bytes::from(body)))
        .map_err(|error| ClientError::Http {
            status: None,
            message: format!("building the request: {error}"),
        })
}

fn timed_out(during: &'static str, timeout: Duration) -> ClientError {
    ClientError::Timeout {
        during,
        timeout_ms: timeout.as_millis() as u64,
    }
}

/// Reads a response body to its end, dropping what it holds; `None` if it fails.
async fn drain(body: &mut hyper::body::Incoming) -> Option<()> {
    loop {
        match body.frame().await {
            None => return Some(()),
            Some(Ok(_)) => {}
            Some(Err(_)) => return None,
        }
    }
}

/// One HTTP/1.1 or HTTP/2 client connection, its requests sent one after another.
enum HttpSender {
    One(
        hyper::client::conn::http1::SendRequest<Full<Bytes>>,
        tokio::task::JoinHandle<Result<(), hyper::Error>>,
    ),
    Two(
        hyper::client::conn::http2::SendRequest<Full<Bytes>>,
        tokio::task::JoinHandle<Result<(), hyper::Error>>,
    ),
}

impl HttpSender {
    async fn handshake<S>(stream: S, http2: bool) -> Result<HttpSender, hyper::Error>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(stream);
        Ok(if http2 {
            let (sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
            HttpSender::Two(sender, tokio::spawn(connection))
        } else {
            let (sender, connection) = hyper::client::conn::http1::handshake(io).await?;
            HttpSender::One(sender, tokio::spawn(connection))
        })
    }

    /// Sends a request once the connection can take it (HTTP/1.1: after the last
    /// response was read to its end).
    async fn send(
        &mut self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<hyper::body::Incoming>, hyper::Error> {
        match self {
            HttpSender::One(sender, _) => {
                sender.ready().await?;
                sender.send_request(request).await
            }
            HttpSender::Two(sender, _) => {
                sender.ready().await?;
                sender.send_request(request).await
            }
        }
    }

    /// The connection's own error, once a request failed (it ends then).
    async fn connection_error(self) -> Option<hyper::Error> {
        let (HttpSender::One(_, connection) | HttpSender::Two(_, connection)) = self;
        connection.await.ok().and_then(Result::err)
    }
}

/// A failed HTTP request as the client reports it: the connection's own error (a TLS
/// alert, say) says more than the request's.
fn http_failure(
    address: &ServerAddress,
    error: hyper::Error,
    connection: Option<hyper::Error>,
) -> ClientError {
    let error = connection.unwrap_or(error);
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    let mut chain = String::new();
    let mut closed = false;
    while let Some(cause) = source {
        if let Some(tls) = cause.downcast_ref::<rustls::Error>() {
            return tls_error(address, tls);
        }
        closed |= cause.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            )
        });
        chain.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    // In TLS 1.3 a server refuses a client's certificate (or its lack of one) after
    // the client's side of the handshake ended: the request then often meets the
    // closed connection before the server's alert is read.
    let hint = if closed && address.scheme.uses_tls() {
        " (the server closed the connection after the TLS handshake, as a server \
         that requires client certificates does when the client's certificate is \
         missing or not trusted)"
    } else {
        ""
    };
    ClientError::Http {
        status: None,
        message: format!(
            "HTTP request to {} failed{chain}{hint}",
            address.authority()
        ),
    }
}

/// The server's answer to a sync's request: its body read through the session until
/// the session's final event. Returns the event and the body (its end not yet read).
async fn read_http_answer(
    address: &ServerAddress,
    response: http::Response<hyper::body::Incoming>,
    receiver: &mut Receiver<'_>,
    timeout: Duration,
) -> Result<(SessionEvent, hyper::body::Incoming), ClientError> {
    let status = response.status();
    // A 503 without a busy frame (from a proxy, say): its Retry-After is the hint.
    let retry_after_ms = response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u32>().ok())
        .map_or(BUSY_RETRY_AFTER_MS_DEFAULT, |seconds| {
            seconds.saturating_mul(1000)
        });
    let mut body = response.into_body();
    if status != http::StatusCode::OK && status != http::StatusCode::SERVICE_UNAVAILABLE {
        return Err(not_rowsync(address, status, &mut body, timeout).await);
    }
    loop {
        let frame = tokio::time::timeout(timeout, body.frame())
            .await
            .map_err(|_| timed_out("waiting for the download", timeout))?;
        match frame {
            None if status == http::StatusCode::SERVICE_UNAVAILABLE => {
                return Ok((SessionEvent::Busy { retry_after_ms }, body))
            }
            None => return Err(receiver.ended()),
            Some(Err(error)) => {
                return Err(ClientError::Http {
                    status: None,
                    message: format!("reading the HTTP response: {error}"),
                })
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    receiver.upload_sent();
                    if let Some(event) = receiver.take(&data)? {
                        return Ok((event, body));
                    }
                }
            }
        }
    }
}

/// An answer that is not rowsync's (a proxy's, or a refusal of the request itself),
/// named with its status and the start of its body.
async fn not_rowsync(
    address: &ServerAddress,
    status: http::StatusCode,
    body: &mut hyper::body::Incoming,
    timeout: Duration,
) -> ClientError {
    let mut text = Vec::new();
    while text.len() < HTTP_ERROR_BODY_BYTES_MAX {
        match tokio::time::timeout(timeout, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    text.extend_from_slice(&data);
                }
            }
            _ => break,
        }
    }
    text.truncate(HTTP_ERROR_BODY_BYTES_MAX);
    ClientError::Http {
        status: Some(status.as_u16()),
        message: format!(
            "{} answered {status}: {}",
            address.authority(),
            String::from_utf8_lossy(&text).trim()
        ),
    }
}

#[derive(Default)]
struct Counters {
    sent: AtomicU64,
    received: AtomicU64,
}

impl Counters {
    fn get(&self) -> WireBytes {
        WireBytes {
            sent: self.sent.load(Ordering::Relaxed),
            received: self.received.load(Ordering::Relaxed),
        }
    }
}

/// A stream that counts the bytes through it.
struct Counted<S> {
    inner: S,
    counters: Arc<Counters>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = buf.filled().len() - before;
        self.counters
            .received
            .fetch_add(read as u64, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = &polled {
            self.counters
                .sent
                .fetch_add(*written as u64, Ordering::Relaxed);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Over a slow link the server must have the hello within its header read timeout
    /// (10 s): compressed, the hello is flushed on its own, not held back until the
    /// compressor's first block fills with upload (zstd: 128 KiB of input; at 8 kbit/s,
    /// tens of seconds of wire).
    #[test]
    fn a_compressed_hello_is_sent_whole_before_the_upload() {
        let frames: Vec<Vec<u8>> = (0..200u32)
            .map(|n| {
                let text = format!("{n:08x}").repeat(100);
                encode_frame(&Message::ValuePiece(rowsync_protocol::ValuePiece {
                    bytes: text.into_bytes(),
                }))
            })
            .collect();
        let hello = Hello {
            protocol_version: rowsync_protocol::PROTOCOL_VERSION,
            client_id: "c".into(),
            user: "u".into(),
            password: "p".into(),
            script_version: "v1".into(),
            last_download_watermark: 0,
            token: String::new(),
            auth_parameters: Vec::new(),
            download_ack: false,
            tables: Default::default(),
        };
        for compression in [Compression::Zlib, Compression::Zstd] {
            let transport = TransportOptions {
                compression,
                ..TransportOptions::default()
            };
            let request = Exchange {
                address: "tcp://127.0.0.1:1",
                transport: &transport,
                hello: hello.clone(),
                upload_frames: &frames,
                upload_sequence: 1,
                frame_bytes_max: 1 << 22,
                timeout: Duration::from_secs(1),
                acknowledge: None,
                transfer: None,
                download_resume: None,
                key_ranges: &[],
            };
            let (pieces, _) = upload_stream(&request).unwrap();
            // The preamble, then a piece that inflates to the hello frame exactly.
            let mut inbound = Inbound::new(1 << 30);
            inbound.feed(&pieces[0]).unwrap();
            inbound.feed(&pieces[1]).unwrap();
            let mut inflated = Vec::new();
            while let Some(chunk) = inbound.next_chunk().unwrap() {
                inflated.extend_from_slice(chunk);
            }
            let mut hello_frame = hello.clone();
            hello_frame.download_ack = false;
            assert_eq!(
                inflated,
                encode_frame(&Message::Hello(hello_frame)),
                "{compression}: {} pieces",
                pieces.len()
            );
        }
    }

    #[test]
    fn addresses_parse_with_defaults_and_bad_ones_are_named() {
        let bare = ServerAddress::parse("127.0.0.1:2500").unwrap();
        assert_eq!((bare.scheme, bare.port), (Scheme::Tcp, 2500));
        let https = ServerAddress::parse("https://sync.example.com").unwrap();
        assert_eq!(
            (
                https.scheme,
                https.host.as_str(),
                https.port,
                https.path.as_str()
            ),
            (Scheme::Https, "sync.example.com", 443, "/sync")
        );
        let v6 = ServerAddress::parse("tls://[::1]:7000").unwrap();
        assert_eq!(
            (v6.host.as_str(), v6.authority()),
            ("::1", "[::1]:7000".into())
        );
        let path = ServerAddress::parse("http://proxy:8080/rowsync/a").unwrap();
        assert_eq!(path.path, "/rowsync/a");
        for (bad, fragment) in [
            ("ftp://x:1", "scheme"),
            ("tcp://x:99999", "port"),
            ("tcp://x:1/path", "no path"),
            ("http://:80", "host"),
        ] {
            let error = ServerAddress::parse(bad).unwrap_err().to_string();
            assert!(error.contains(fragment), "{bad}: {error}");
        }
    }
}

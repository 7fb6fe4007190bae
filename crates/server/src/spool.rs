//! The spool: a sync's bytes on their way through the server (the checked upload until
//! a worker decodes it, the encoded download until the client has read it), in memory
//! while the shared cache has room, else in an unnamed temporary file, so no worker waits
//! on a client and no sync holds its bytes whole in memory.

use rowsync_protocol::{Compression, CompressionError, Decompressor, Outbound};
use std::collections::VecDeque;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncSeekExt, AsyncWrite, AsyncWriteExt};

use crate::cache::Cache;

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("the download exceeds the limit of {limit_bytes} bytes")]
    TooLarge { limit_bytes: u64 },
    #[error("spilling the download to a temporary file failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("compressing the download failed: {0}")]
    Compression(#[from] CompressionError),
    #[error("{0}")]
    Decode(String),
    #[error(
        "the download holds a value of {length_bytes} bytes in column {column:?} of table \
         {table:?}, above the server's value_bytes_max of {limit_bytes} bytes; nothing was applied"
    )]
    ValueTooLarge {
        table: String,
        column: String,
        length_bytes: u64,
        limit_bytes: u64,
    },
    #[error(
        "a row of table {table:?} takes a frame of {frame_bytes} bytes, above the \
         {limit_bytes} bytes a client takes; its largest value ({value_bytes} bytes) is in \
         column {column:?}, and a protocol version {protocol_version} client {hint}; nothing \
         was applied",
        hint = pieces_hint(.protocol_version)
    )]
    RowTooLarge {
        table: String,
        column: String,
        frame_bytes: usize,
        value_bytes: usize,
        limit_bytes: usize,
        protocol_version: u16,
    },
}

/// What a client of a protocol version receives in pieces, for [`SpoolError::RowTooLarge`].
fn pieces_hint(protocol_version: &u16) -> &'static str {
    if *protocol_version < rowsync_protocol::PIECES_SINCE_VERSION {
        "receives no value in pieces (a client of version 2 would)"
    } else {
        "receives only text and blob values in pieces"
    }
}

/// Encoded download frames, compressed as the client asked: in memory up to
/// `memory_bytes_max`, then in a temporary file (unnamed: it disappears with the spool,
/// whatever happens). The limit `bytes_max` counts frames before compression.
pub struct Spool {
    /// Pieces in memory, in order; each was reserved in the cache.
    memory: VecDeque<Vec<u8>>,
    memory_bytes: usize,
    file: Option<tokio::fs::File>,
    bytes: u64,
    wire_bytes: u64,
    memory_bytes_max: usize,
    bytes_max: u64,
    outbound: Option<Outbound>,
    /// How the stored bytes are compressed.
    compression: Compression,
    /// A resumable download's compressor is flushed after this many bytes of frames, so
    /// what crosses the link before a cut inflates at the client (`usize::MAX`: never).
    flush_every_bytes: usize,
    since_flush_bytes: usize,
    cache: Arc<Cache>,
}

impl Spool {
    /// Keeps up to `memory_bytes_max` in memory while the shared `cache` has room, the
    /// rest in a temporary file; refuses more than `bytes_max` in all.
    pub fn new(
        memory_bytes_max: usize,
        bytes_max: u64,
        mut outbound: Outbound,
        cache: Arc<Cache>,
    ) -> Spool {
        Spool {
            compression: outbound.compressor().compression(),
            flush_every_bytes: usize::MAX,
            since_flush_bytes: 0,
            memory: VecDeque::new(),
            memory_bytes: 0,
            file: None,
            bytes: 0,
            wire_bytes: 0,
            memory_bytes_max,
            bytes_max,
            outbound: Some(outbound),
            cache,
        }
    }

    /// Flushes the compressor after every `bytes` of frames (a resumable download).
    pub fn flush_every(&mut self, bytes: usize) {
        self.flush_every_bytes = bytes.max(1);
    }

    /// Frame bytes appended (before compression).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes held to be sent (after compression).
    pub fn wire_bytes(&self) -> u64 {
        self.wire_bytes
    }

    pub fn spilled(&self) -> bool {
        self.file.is_some()
    }

    pub async fn append(&mut self, frame: &[u8]) -> Result<(), SpoolError> {
        self.bytes += frame.len() as u64;
        if self.bytes > self.bytes_max {
            return Err(SpoolError::TooLarge {
                limit_bytes: self.bytes_max,
            });
        }
        let compressed = match self.outbound.as_mut() {
            Some(outbound) => {
                // Flushed every `flush_every_bytes` of frames, within a frame too (a
                // batch of rows is one frame of up to megabytes): a cut loses at most
                // that much of what the client could not inflate.
                let mut compressed = Vec::new();
                let mut rest = frame;
                while !rest.is_empty() {
                    let room = self.flush_every_bytes - self.since_flush_bytes;
                    let (slice, after) = rest.split_at(room.min(rest.len()));
                    compressed.extend(outbound.compressor().compress(slice)?);
                    self.since_flush_bytes += slice.len();
                    if self.since_flush_bytes >= self.flush_every_bytes {
                        self.since_flush_bytes = 0;
                        compressed.extend(outbound.compressor().flush()?);
                    }
                    rest = after;
                }
                compressed
            }
            None => {
                return Err(SpoolError::Io(std::io::Error::other(
                    "append after the download was finished",
                )))
            }
        };
        self.store(&compressed).await
    }

    /// Ends the compressed stream and makes sure it is all stored.
    pub async fn finish(&mut self) -> Result<(), SpoolError> {
        if let Some(outbound) = self.outbound.take() {
            let trailer = outbound.finish()?;
            self.store(&trailer).await?;
        }
        self.flush().await
    }

    async fn store(&mut self, frame: &[u8]) -> Result<(), SpoolError> {
        if frame.is_empty() {
            return Ok(());
        }
        self.wire_bytes += frame.len() as u64;
        if self.file.is_none()
            && self.memory_bytes + frame.len() <= self.memory_bytes_max
            && self.cache.try_reserve(frame.len())
        {
            self.memory_bytes += frame.len();
            self.memory.push_back(frame.to_vec());
            return Ok(());
        }
        self.cache.spilled(frame.len());
        if self.file.is_none() {
            let file = tokio::task::spawn_blocking(tempfile::tempfile)
                .await
                .map_err(|error| std::io::Error::other(error.to_string()))??;
            self.file = Some(tokio::fs::File::from_std(file));
        }
        let file = self.file.as_mut().expect("created above");
        file.write_all(frame).await?;
        Ok(())
    }

    /// Makes sure everything appended reached the temporary file (a full disk shows here,
    /// before the sync commits, not while sending).
    pub async fn flush(&mut self) -> Result<(), SpoolError> {
        if let Some(file) = self.file.as_mut() {
            file.flush().await?;
        }
        Ok(())
    }

    /// Writes everything spooled, in order, to `out`; each write must progress within
    /// `write_timeout` (a slow client is dropped, a large download is not). `sending`
    /// says whether memory is given back as it goes.
    pub(crate) async fn send(
        &mut self,
        out: &mut (impl AsyncWrite + Unpin),
        write_timeout: std::time::Duration,
        sending: Sending,
    ) -> std::io::Result<()> {
        let mut index = 0;
        while index < self.memory.len() {
            #[cfg(feature = "failpoints")]
            if index + 1 == self.memory.len() && self.file.is_none() {
                // All but the last piece (a download's end frame) is out.
                out.flush().await?;
                rowsync_consolidated::failpoint!("mid_download");
            }
            write_within(out, &self.memory[index], write_timeout).await?;
            match sending {
                Sending::Keep => index += 1,
                Sending::Release => {
                    let piece = self.memory.pop_front().expect("a piece at the index");
                    self.forget(piece.len());
                }
            }
        }
        if let Some(file) = self.file.as_mut() {
            file.flush().await?;
            file.seek(std::io::SeekFrom::Start(0)).await?;
            let mut buffer = vec![0u8; SPOOL_READ_BYTES];
            loop {
                let read = file.read(&mut buffer).await?;
                if read == 0 {
                    break;
                }
                write_within(out, &buffer[..read], write_timeout).await?;
            }
        }
        Ok(())
    }

    /// Everything stored, decompressed (the frames as appended), or `None` when that is
    /// more than `bytes_max`.
    pub async fn decompressed(self, bytes_max: u64) -> Result<Option<Vec<u8>>, SpoolError> {
        if self.bytes > bytes_max {
            return Ok(None);
        }
        let mut decompressor = Decompressor::new(self.compression, bytes_max)?;
        let mut frames = Vec::with_capacity(self.bytes as usize);
        self.drain(|piece| {
            decompressor.feed(piece);
            while let Some(chunk) = decompressor.next_chunk()? {
                frames.extend_from_slice(chunk);
            }
            Ok(())
        })
        .await?;
        Ok(Some(frames))
    }

    /// Hands every stored piece, in order, to `take`, freeing each piece from memory (and
    /// the cache) as soon as it was taken: the upload is decoded from its spool this way.
    pub async fn drain(
        mut self,
        mut take: impl FnMut(&[u8]) -> Result<(), SpoolError>,
    ) -> Result<(), SpoolError> {
        while let Some(piece) = self.memory.pop_front() {
            take(&piece)?;
            self.forget(piece.len());
        }
        if let Some(mut file) = self.file.take() {
            file.flush().await?;
            file.seek(std::io::SeekFrom::Start(0)).await?;
            let mut buffer = vec![0u8; SPOOL_READ_BYTES];
            loop {
                let read = file.read(&mut buffer).await?;
                if read == 0 {
                    break;
                }
                take(&buffer[..read])?;
            }
        }
        Ok(())
    }

    fn forget(&mut self, bytes: usize) {
        self.memory_bytes -= bytes;
        self.cache.release(bytes);
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        self.cache.release(self.memory_bytes);
    }
}

/// Whether sending a spool gives its memory back as it goes or keeps every byte.
#[derive(Clone, Copy)]
pub(crate) enum Sending {
    Release,
    /// What was sent can still be read back ([`Spool::decompressed`]) when the client
    /// may not have received it (a resumable download, protocol v4).
    Keep,
}

/// Writes `bytes` to `out`, which must take them within `write_timeout`.
async fn write_within(
    out: &mut (impl AsyncWrite + Unpin),
    bytes: &[u8],
    write_timeout: std::time::Duration,
) -> std::io::Result<()> {
    let stalled = || {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the client stopped reading the download",
        )
    };
    tokio::time::timeout(write_timeout, out.write_all(bytes))
        .await
        .map_err(|_| stalled())?
}

/// Bytes read back from a spilled spool at a time.
const SPOOL_READ_BYTES: usize = 256 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::download_frames::chunk_frames;
    use crate::download_frames::tests::chunk;
    use rowsync_protocol::Compression;

    fn plain() -> Outbound {
        Outbound::new(Compression::None, false).unwrap()
    }

    fn cache() -> Arc<Cache> {
        Cache::new(1 << 30, Arc::new(crate::metrics::Metrics::new()))
    }

    #[tokio::test]
    async fn a_spool_past_its_memory_limit_spills_and_replays_in_order() {
        let mut spool = Spool::new(50_000, 10_000_000, plain(), cache());
        let mut expected = Vec::new();
        for n in 0..20 {
            for frame in chunk_frames(
                chunk(n * 100, 100),
                4096,
                rowsync_protocol::PROTOCOL_VERSION,
            )
            .unwrap()
            {
                expected.extend_from_slice(&frame);
                spool.append(&frame).await.unwrap();
            }
        }
        spool.finish().await.unwrap();
        assert!(spool.spilled());
        assert_eq!(spool.bytes(), expected.len() as u64);
        assert_eq!(spool.wire_bytes(), expected.len() as u64);
        let mut out = Vec::new();
        spool
            .send(
                &mut out,
                std::time::Duration::from_secs(5),
                Sending::Release,
            )
            .await
            .unwrap();
        assert_eq!(out, expected);
    }

    #[tokio::test]
    async fn a_compressed_spool_holds_fewer_bytes_and_replays_the_same_frames() {
        for compression in [Compression::Zlib, Compression::Zstd] {
            let outbound = Outbound::new(compression, true).unwrap();
            let mut spool = Spool::new(20_000, 10_000_000, outbound, cache());
            let mut expected = Vec::new();
            for n in 0..20 {
                for frame in chunk_frames(
                    chunk(n * 100, 100),
                    4096,
                    rowsync_protocol::PROTOCOL_VERSION,
                )
                .unwrap()
                {
                    expected.extend_from_slice(&frame);
                    spool.append(&frame).await.unwrap();
                }
            }
            spool.finish().await.unwrap();
            assert_eq!(spool.bytes(), expected.len() as u64);
            assert!(spool.wire_bytes() * 4 < spool.bytes(), "{compression}");
            let mut out = Vec::new();
            spool
                .send(
                    &mut out,
                    std::time::Duration::from_secs(5),
                    Sending::Release,
                )
                .await
                .unwrap();
            let mut decompressor =
                rowsync_protocol::Decompressor::new(compression, u64::MAX).unwrap();
            decompressor.feed(&out);
            let mut replayed = Vec::new();
            while let Some(piece) = decompressor.next_chunk().unwrap() {
                replayed.extend_from_slice(piece);
            }
            assert!(decompressor.is_finished());
            assert!(replayed == expected, "{compression}");
        }
    }

    /// A resumable download's compressor is flushed every `flush_every` bytes within a
    /// frame too: a frame holds a whole batch of rows (up to megabytes), and a cut loses
    /// what the client cannot inflate. Fed the compressed bytes a little at a time, the
    /// client inflates at least every `flush_every` bytes of the stream (not once per
    /// frame, nor per zstd block of up to 128 KiB).
    #[tokio::test]
    async fn a_resumable_spool_is_flushed_within_a_large_frame() {
        const EVERY: usize = 32 * 1024;
        let outbound = Outbound::new(Compression::Zstd, true).unwrap();
        let mut spool = Spool::new(1 << 24, 1 << 24, outbound, cache());
        spool.flush_every(EVERY);
        // One frame of 1 MiB that compresses (a counter in text), as a batch would be.
        let frame: Vec<u8> = (0..200_000u32)
            .flat_map(|n| format!("{n:06};").into_bytes())
            .take(1 << 20)
            .collect();
        spool.append(&frame).await.unwrap();
        spool.finish().await.unwrap();
        let mut out = Vec::new();
        let sent = spool.send(
            &mut out,
            std::time::Duration::from_secs(5),
            Sending::Release,
        );
        sent.await.unwrap();
        let mut decompressor =
            rowsync_protocol::Decompressor::new(Compression::Zstd, u64::MAX).unwrap();
        let (mut inflated, mut largest_step) = (Vec::new(), 0);
        for piece in out.chunks(64) {
            decompressor.feed(piece);
            let before = inflated.len();
            while let Some(chunk) = decompressor.next_chunk().unwrap() {
                inflated.extend_from_slice(chunk);
            }
            largest_step = largest_step.max(inflated.len() - before);
        }
        assert!(inflated == frame, "the frame inflates whole");
        assert!(
            largest_step <= EVERY,
            "{largest_step} bytes became readable at once (flush every {EVERY})"
        );
    }

    #[tokio::test]
    async fn a_spool_refuses_to_grow_past_its_limit() {
        let mut spool = Spool::new(1000, 5000, plain(), cache());
        let frame = vec![0u8; 3000];
        spool.append(&frame).await.unwrap();
        assert!(matches!(
            spool.append(&frame).await,
            Err(SpoolError::TooLarge { limit_bytes: 5000 })
        ));
    }
}

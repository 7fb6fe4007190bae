//! The memory of the connections' zstd decoders, bounded together. A zstd stream's
//! decoder holds the window its first frame asks for (2 MiB for the client library's
//! level 3, up to 8 MiB) from the stream's first bytes until the upload is read, through
//! authentication: a burst of 2,000 zstd clients with passwords held 4.8 GB of decoders
//! while they queued for argon2id. So a connection reads its stream's window from the
//! frame header before any decoder is made ([`rowsync_protocol::zstd_stream_window`]),
//! reserves what a decoder of that window holds here, and waits for room while the
//! decoders of others inflate; the decoder it then gets refuses any frame asking for more
//! than was reserved. Bytes held at once stay under `zstd_decoders_bytes_max`.

use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The budget is counted in units of this many bytes (a semaphore's permits).
const UNIT_BYTES: u64 = 1024;

pub(crate) struct ZstdDecoders {
    permits: Arc<Semaphore>,
    units_max: u32,
    bytes: Gauge,
}

/// Room for one decoder, given back when dropped.
pub(crate) struct ZstdDecoderRoom {
    _permit: OwnedSemaphorePermit,
    bytes: u64,
    gauge: Gauge,
}

impl Drop for ZstdDecoderRoom {
    fn drop(&mut self) {
        self.gauge.dec_by(self.bytes as i64);
    }
}

impl ZstdDecoders {
    /// A budget of `bytes_max` (at least one decoder of the largest window:
    /// a smaller budget would refuse streams the protocol allows).
    pub(crate) fn new(bytes_max: usize, bytes: Gauge) -> ZstdDecoders {
        let bytes_max = (bytes_max as u64).max(zstd_decoder_bytes_max());
        let units_max = u32::try_from(bytes_max.div_ceil(UNIT_BYTES)).unwrap_or(u32::MAX);
        ZstdDecoders {
            permits: Arc::new(Semaphore::new(units_max as usize)),
            units_max,
            bytes,
        }
    }

    /// Waits until `bytes` (one decoder's) fit beside the decoders of other connections.
    pub(crate) async fn reserve(&self, bytes: u64) -> ZstdDecoderRoom {
        let units = u32::try_from(bytes.div_ceil(UNIT_BYTES))
            .unwrap_or(u32::MAX)
            .clamp(1, self.units_max);
        let permit = Arc::clone(&self.permits)
            .acquire_many_owned(units)
            .await
            .expect("the decoders' semaphore is never closed");
        let bytes = u64::from(units) * UNIT_BYTES;
        self.bytes.inc_by(bytes as i64);
        ZstdDecoderRoom {
            _permit: permit,
            bytes,
            gauge: self.bytes.clone(),
        }
    }
}

/// Share of physical memory the zstd decoders may use by default.
pub const ZSTD_DECODERS_SHARE_OF_MEMORY_DIVISOR: u64 = 8;
/// The default budget when physical memory cannot be read.
pub const ZSTD_DECODERS_BYTES_MAX_FALLBACK: usize = 256 * 1024 * 1024;

/// An eighth of physical memory (from /proc/meminfo; 3 GiB on a 24 GiB machine, room for
/// about 1,150 decoders of the client library's 2 MiB window), or 256 MiB when unknown.
pub fn default_zstd_decoders_bytes_max() -> usize {
    crate::cache::physical_memory_bytes()
        .map(|bytes| (bytes / ZSTD_DECODERS_SHARE_OF_MEMORY_DIVISOR) as usize)
        .unwrap_or(ZSTD_DECODERS_BYTES_MAX_FALLBACK)
}

/// What a decoder of the largest window the protocol allows holds.
pub fn zstd_decoder_bytes_max() -> u64 {
    rowsync_protocol::zstd_decoder_bytes(rowsync_protocol::ZSTD_WINDOW_BYTES_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn decoders_wait_for_room_and_give_it_back() {
        let gauge = Gauge::default();
        let budget = zstd_decoder_bytes_max() as usize;
        let decoders = ZstdDecoders::new(budget, gauge.clone());
        let window = rowsync_protocol::zstd_decoder_bytes(2 * 1024 * 1024);
        let first = decoders.reserve(window).await;
        let second = decoders.reserve(window).await;
        assert_eq!(gauge.get(), 2 * window.div_ceil(UNIT_BYTES) as i64 * 1024);
        // A decoder of the largest window waits until both are gone.
        let waiting = decoders.reserve(zstd_decoder_bytes_max());
        tokio::pin!(waiting);
        assert!(futures_util::poll!(waiting.as_mut()).is_pending());
        drop(first);
        assert!(futures_util::poll!(waiting.as_mut()).is_pending());
        drop(second);
        let largest = waiting.await;
        assert_eq!(
            gauge.get() as u64,
            zstd_decoder_bytes_max().div_ceil(1024) * 1024
        );
        drop(largest);
        assert_eq!(gauge.get(), 0);
        // A budget below one largest decoder is raised to it.
        let small = ZstdDecoders::new(1024, Gauge::default());
        drop(small.reserve(zstd_decoder_bytes_max()).await);
    }
}

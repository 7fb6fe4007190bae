//! The cache: one limit on the upload and download bytes all syncs in flight keep in
//! memory. A spool that cannot reserve room writes to a temporary file instead, so the
//! server's memory stays under the limit plus a fixed overhead however many syncs wait.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::metrics::Metrics;

/// Share of physical memory the cache may use by default.
pub const CACHE_SHARE_OF_MEMORY_DIVISOR: u64 = 4;
/// The default limit when physical memory cannot be read.
pub const CACHE_BYTES_MAX_FALLBACK: usize = 1024 * 1024 * 1024;

/// A quarter of physical memory (from /proc/meminfo), or 1 GiB when unknown.
pub fn default_cache_bytes_max() -> usize {
    physical_memory_bytes()
        .map(|bytes| (bytes / CACHE_SHARE_OF_MEMORY_DIVISOR) as usize)
        .unwrap_or(CACHE_BYTES_MAX_FALLBACK)
}

/// Physical memory, from /proc/meminfo.
pub(crate) fn physical_memory_bytes() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("MemTotal:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<u64>().ok())
        })
        .map(|kib| kib * 1024)
}

pub struct Cache {
    used_bytes: AtomicUsize,
    /// The most `used_bytes` ever was (what proves the bound, counted, not timed).
    peak_bytes: AtomicUsize,
    bytes_max: usize,
    metrics: Arc<Metrics>,
}

impl Cache {
    pub fn new(bytes_max: usize, metrics: Arc<Metrics>) -> Arc<Cache> {
        metrics.cache_bytes_max.set(bytes_max as i64);
        Arc::new(Cache {
            used_bytes: AtomicUsize::new(0),
            peak_bytes: AtomicUsize::new(0),
            bytes_max,
            metrics,
        })
    }

    /// Takes `bytes` of the cache if they fit under the limit.
    pub fn try_reserve(&self, bytes: usize) -> bool {
        let reserved = self
            .used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes)
                    .filter(|&total| total <= self.bytes_max)
            });
        let Ok(before) = reserved else {
            return false;
        };
        self.metrics.cache_bytes.inc_by(bytes as i64);
        let peak = self.peak_bytes.fetch_max(before + bytes, Ordering::AcqRel);
        self.metrics
            .cache_bytes_peak
            .set(peak.max(before + bytes) as i64);
        true
    }

    pub fn release(&self, bytes: usize) {
        self.used_bytes.fetch_sub(bytes, Ordering::AcqRel);
        self.metrics.cache_bytes.dec_by(bytes as i64);
    }

    pub fn spilled(&self, bytes: usize) {
        self.metrics.spilled_bytes.inc_by(bytes as u64);
    }

    pub fn used_bytes(&self) -> usize {
        self.used_bytes.load(Ordering::Acquire)
    }

    pub fn bytes_max(&self) -> usize {
        self.bytes_max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserves_up_to_the_limit_and_releases() {
        let cache = Cache::new(100, Arc::new(Metrics::new()));
        assert!(cache.try_reserve(60));
        assert!(!cache.try_reserve(41));
        assert!(cache.try_reserve(40));
        assert_eq!(cache.used_bytes(), 100);
        cache.release(60);
        assert!(cache.try_reserve(50));
        assert_eq!(cache.used_bytes(), 90);
        assert!(default_cache_bytes_max() > 0);
    }
}

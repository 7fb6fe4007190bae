//! Shared rows read once: when many clients of one script version download the same
//! rows (a `shared` table's catalogue at their first sync), one sync's cursor rows are
//! kept, and the syncs after with the same cursor and parameter values get them from
//! here instead of the database, within `shared_download_cache_bytes_max`, for at most
//! `shared_download_cache_seconds`.
//!
//! Only a cursor whose script names no parameter but the watermark ones
//! (`:last_download`, `:last_sync_xid`, `:echo_xid`, `:script_version`) is kept: its
//! rows depend on nothing but the database's state. Rows read at watermark `W` hold
//! every change below `W`; a sync served them reports a watermark no higher than `W`
//! (`SharedUse::watermark_cap`), so its client's next sync asks again for every change
//! from there: nothing is missed, a little may come twice. A sync whose upload wrote
//! anything reads from the database (its own writes must come down in it).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rowsync_protocol::{Row, Value};

use crate::parameters::{positional_parameters, Parameters};

/// The parameters a cursor kept here may name.
const SHAREABLE_PARAMETERS: [&str; 4] = [
    "last_download",
    "last_sync_xid",
    "echo_xid",
    "script_version",
];

/// What [`SharedDownloads::get`] found.
pub enum Lookup {
    Kept(Arc<CachedCursor>),
    /// Read from the database and record for the syncs after.
    Record,
    /// Read from the database (another sync records the rows).
    Read,
}

/// A cursor's rows, in the batches it was read in, and the watermark of the sync that
/// read them.
pub struct CachedCursor {
    pub columns: Vec<String>,
    pub batches: Vec<Vec<Row>>,
    pub watermark: i64,
    bytes: u64,
    read_at: Instant,
}

/// What identifies a cursor's rows: the script and the values of the parameters it
/// names.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct CursorKey {
    table: String,
    script: String,
    values: String,
}

impl CursorKey {
    /// The key of a cursor script run with `parameters`, or `None` when its rows may
    /// depend on who asks.
    pub fn of(table: &str, script: &str, parameters: &Parameters<'_>) -> Option<CursorKey> {
        let (_, names) = positional_parameters(script);
        if names
            .iter()
            .any(|name| !SHAREABLE_PARAMETERS.contains(&name.as_str()))
        {
            return None;
        }
        let values: Vec<Value> = names
            .iter()
            .map(|name| parameters.value(name, table, ""))
            .collect::<Result<_, _>>()
            .ok()?;
        Some(CursorKey {
            table: table.to_string(),
            script: script.to_string(),
            values: format!("{values:?}"),
        })
    }
}

#[derive(Default)]
struct Kept {
    cursors: HashMap<CursorKey, Arc<CachedCursor>>,
    order: VecDeque<CursorKey>,
    bytes: u64,
    /// Cursors a sync is reading to keep: no other sync records them meanwhile, so
    /// the rows held while recording stay within one bound per cursor.
    recording: std::collections::HashSet<CursorKey>,
}

/// The cursors kept, the oldest dropped first when a new one needs room.
pub struct SharedDownloads {
    bytes_max: u64,
    age_max: Duration,
    kept: Mutex<Kept>,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

impl SharedDownloads {
    pub fn new(bytes_max: u64, age_max: Duration) -> Arc<SharedDownloads> {
        Arc::new(SharedDownloads {
            bytes_max,
            age_max,
            kept: Mutex::new(Kept::default()),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        })
    }

    pub fn bytes_max(&self) -> u64 {
        self.bytes_max
    }

    /// The rows kept for `key`, or else whether this sync is to record them (no other
    /// sync is).
    pub fn get(&self, key: &CursorKey) -> Lookup {
        let Ok(mut kept) = self.kept.lock() else {
            return Lookup::Read;
        };
        if let Some(found) = kept.cursors.get(key) {
            if found.read_at.elapsed() <= self.age_max {
                self.hits.fetch_add(1, Ordering::Relaxed);
                return Lookup::Kept(Arc::clone(found));
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        if kept.recording.insert(key.clone()) {
            Lookup::Record
        } else {
            Lookup::Read
        }
    }

    /// Gives up recording `key` (the sync failed).
    pub fn abandon(&self, key: &CursorKey) {
        if let Ok(mut kept) = self.kept.lock() {
            kept.recording.remove(key);
        }
    }

    /// Keeps a cursor's rows, dropping the oldest kept until they fit.
    pub fn put(&self, key: CursorKey, recording: Recording) {
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        kept.recording.remove(&key);
        let Some(cursor) = recording.finish() else {
            return;
        };
        if cursor.bytes > self.bytes_max {
            return;
        }
        if let Some(stale) = kept.cursors.remove(&key) {
            kept.bytes -= stale.bytes;
            kept.order.retain(|kept_key| kept_key != &key);
        }
        while kept.bytes + cursor.bytes > self.bytes_max {
            let Some(oldest) = kept.order.pop_front() else {
                break;
            };
            if let Some(dropped) = kept.cursors.remove(&oldest) {
                kept.bytes -= dropped.bytes;
            }
        }
        kept.bytes += cursor.bytes;
        kept.order.push_back(key.clone());
        kept.cursors.insert(key, Arc::new(cursor));
    }
}

/// A cursor's rows as they are read, given up once they pass the bound.
pub struct Recording {
    watermark: i64,
    columns: Vec<String>,
    batches: Vec<Vec<Row>>,
    bytes: u64,
    bytes_max: u64,
    over: bool,
}

impl Recording {
    /// Rows read by a sync of `watermark`.
    pub fn new(bytes_max: u64, watermark: i64) -> Recording {
        Recording {
            watermark,
            columns: Vec::new(),
            batches: Vec::new(),
            bytes: 0,
            bytes_max,
            over: false,
        }
    }

    pub fn take(&mut self, columns: &[String], rows: &[Row]) {
        if self.over {
            return;
        }
        self.bytes += rows.iter().map(row_bytes).sum::<u64>();
        if self.bytes > self.bytes_max {
            self.over = true;
            self.batches = Vec::new();
            return;
        }
        if self.columns.is_empty() {
            self.columns = columns.to_vec();
        }
        self.batches.push(rows.to_vec());
    }

    fn finish(self) -> Option<CachedCursor> {
        (!self.over).then_some(CachedCursor {
            columns: self.columns,
            batches: self.batches,
            watermark: self.watermark,
            bytes: self.bytes,
            read_at: Instant::now(),
        })
    }
}

/// About what a row holds in memory.
fn row_bytes(row: &Row) -> u64 {
    row.iter()
        .map(|value| match value {
            Value::Text(text) => 32 + text.len() as u64,
            Value::Blob(bytes) => 32 + bytes.len() as u64,
            _ => 32,
        })
        .sum::<u64>()
        + 24
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: i64) -> CursorKey {
        CursorKey {
            table: "film".into(),
            script: format!("SELECT {n}"),
            values: String::new(),
        }
    }

    fn recording(rows: usize) -> Recording {
        let mut recording = Recording::new(10_000, 7);
        recording.take(&["id".into()], &vec![vec![Value::Int(1)]; rows]);
        recording
    }

    #[test]
    fn the_oldest_cursor_goes_when_a_new_one_needs_room() {
        let shared = SharedDownloads::new(200, Duration::from_secs(60));
        shared.put(key(1), recording(2));
        shared.put(key(2), recording(2));
        assert!(
            matches!(shared.get(&key(1)), Lookup::Record),
            "dropped for key 2"
        );
        assert!(
            matches!(shared.get(&key(1)), Lookup::Read),
            "another sync records it"
        );
        match shared.get(&key(2)) {
            Lookup::Kept(kept) => assert_eq!((kept.batches[0].len(), kept.watermark), (2, 7)),
            _ => panic!("key 2 is kept"),
        }
        shared.put(key(3), recording(20));
        assert!(
            matches!(shared.get(&key(3)), Lookup::Record),
            "larger than the bound: not kept"
        );
    }

    #[test]
    fn a_cursor_naming_the_user_is_not_shared() {
        let parameters = Parameters::for_connection("v1");
        assert!(CursorKey::of("t", "SELECT * FROM t WHERE o = :user", &parameters).is_none());
        assert!(CursorKey::of(
            "t",
            "SELECT * FROM t WHERE x >= :last_download",
            &parameters
        )
        .is_some());
    }
}

#[cfg(test)]
mod age {
    use super::*;

    #[test]
    fn rows_older_than_the_age_limit_are_read_again() {
        let shared = SharedDownloads::new(10_000, Duration::ZERO);
        let key = CursorKey {
            table: "film".into(),
            script: "SELECT 1".into(),
            values: String::new(),
        };
        assert!(matches!(shared.get(&key), Lookup::Record));
        shared.put(key.clone(), Recording::new(10_000, 1));
        std::thread::sleep(Duration::from_millis(2));
        assert!(matches!(shared.get(&key), Lookup::Record));
    }
}

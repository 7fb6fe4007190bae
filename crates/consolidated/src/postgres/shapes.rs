//! Table shapes kept per connection across syncs, valid while the database's schema
//! generation stays the same.
//!
//! Reading a table's shape (a catalog query, the costliest fixed statement of a sync)
//! and its partition column costs a round trip and about 40 us of PostgreSQL's time per
//! table per sync. Instead, `rs_schema_generation` counts schema changes: event
//! triggers on `ddl_command_end` and `sql_drop` bump it for any DDL but that on
//! temporary objects (scratch tables), and a trigger on `rs_table` for any change of a
//! partition column. The statement that takes the client's lock reads the generation
//! with no round trip of its own (`GENERATION`), and a connection uses the shapes it
//! read under the same generation; any other generation empties the cache first.
//!
//! Event triggers need a superuser. Without them (or with either disabled) the
//! generation reads as NULL and shapes are kept only for the transaction that read
//! them, as before the cache. The generation is read by the sync's first statement; a
//! change committed between it and the sync's first statement on a table is met as a
//! change committed between reading a shape and using it always was: by the statements
//! (a stale prepared statement fails, the attempt is retried, and the retry reads the
//! new generation).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use crate::foreign_keys::ForeignKey;
use crate::shape::TableShape;

/// The schema generation, NULL unless both event triggers exist and fire always (a
/// session with `session_replication_role = replica` skips triggers enabled only for
/// origin): an expression the lock statement selects.
macro_rules! schema_generation {
    () => {
        "(SELECT g.generation FROM rs_schema_generation AS g \
          WHERE (SELECT count(*) FROM pg_event_trigger \
                 WHERE evtname IN ('rs_schema_changed', 'rs_schema_dropped') AND evtenabled = 'A') = 2)"
    };
}
pub(super) use schema_generation;

/// The table, trigger functions and event triggers behind the generation; part of the
/// system tables. Installing event triggers needs a superuser: without one the cache
/// stays off, with a notice.
pub const SCHEMA_GENERATION_DDL: &str = r"
CREATE TABLE IF NOT EXISTS rs_schema_generation (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    generation BIGINT NOT NULL
);
INSERT INTO rs_schema_generation (id, generation) VALUES (1, 0) ON CONFLICT (id) DO NOTHING;
CREATE OR REPLACE FUNCTION rs_schema_changed() RETURNS event_trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_EVENT = 'ddl_command_end' AND NOT EXISTS (
        SELECT FROM pg_event_trigger_ddl_commands()
        WHERE schema_name IS NULL
           OR (schema_name NOT LIKE 'pg\_temp%' AND schema_name NOT LIKE 'pg\_toast\_temp%')) THEN
        RETURN;
    END IF;
    IF TG_EVENT = 'sql_drop' AND NOT EXISTS (
        SELECT FROM pg_event_trigger_dropped_objects() WHERE NOT is_temporary) THEN
        RETURN;
    END IF;
    UPDATE rs_schema_generation SET generation = generation + 1;
END $$;
CREATE OR REPLACE FUNCTION rs_table_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE rs_schema_generation SET generation = generation + 1;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER rs_table_changed AFTER INSERT OR UPDATE OR DELETE OR TRUNCATE
    ON rs_table FOR EACH STATEMENT EXECUTE FUNCTION rs_table_changed();
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_event_trigger WHERE evtname = 'rs_schema_changed') THEN
        CREATE EVENT TRIGGER rs_schema_changed ON ddl_command_end
            EXECUTE FUNCTION rs_schema_changed();
    END IF;
    IF NOT EXISTS (SELECT FROM pg_event_trigger WHERE evtname = 'rs_schema_dropped') THEN
        CREATE EVENT TRIGGER rs_schema_dropped ON sql_drop EXECUTE FUNCTION rs_schema_changed();
    END IF;
    ALTER EVENT TRIGGER rs_schema_changed ENABLE ALWAYS;
    ALTER EVENT TRIGGER rs_schema_dropped ENABLE ALWAYS;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE NOTICE 'rowsync: event triggers need a superuser; table shapes are read at every sync';
END $$;
";

/// What a sync needs to know of a table: its shape, its columns' SQL types (array
/// scratch binds each column by its type), its partition column and its foreign keys.
#[derive(Clone)]
pub struct CachedTable {
    pub shape: TableShape,
    pub types: Vec<String>,
    pub partition: Option<String>,
    /// Its foreign keys (`Dialect::foreign_keys`).
    pub foreign_keys: Vec<ForeignKey>,
    /// Its tombstones are kept in batches (`rs_deleted_<T>`); false for tracking set up
    /// by a rowsync from before batches and not initialized again since.
    pub tombstone_batches: bool,
    /// Something besides rowsync may change a row as it is written: a trigger other
    /// than rowsync's, a generated or identity column (or the table is not in
    /// `rs_table`). Every uploaded row is then read back (`stored`).
    pub server_writes: bool,
}

/// One connection's table shapes and the generation they were read under.
#[derive(Default)]
pub struct ShapeCache {
    /// `None`: the entries hold only for the transaction that read them.
    generation: Option<i64>,
    entries: HashMap<String, CachedTable>,
    /// The open transaction has checked `generation` (or holds no entries older than
    /// itself).
    confirmed: bool,
}

impl ShapeCache {
    /// A transaction begins: nothing is trusted until it reads the generation (or, on
    /// an apply stream, is told the one its sync read).
    pub fn begin(&mut self) {
        self.confirmed = false;
    }

    /// The generation the transaction read: entries of any other are dropped.
    pub fn confirm(&mut self, generation: Option<i64>) {
        if generation.is_none() || generation != self.generation {
            self.entries.clear();
        }
        self.generation = generation;
        self.confirmed = true;
    }

    pub fn get(&mut self, table: &str) -> Option<&CachedTable> {
        if !self.confirmed {
            self.confirm(None);
        }
        self.entries.get(table)
    }

    pub fn insert(&mut self, table: &str, cached: CachedTable) {
        if !self.confirmed {
            self.confirm(None);
        }
        self.entries.insert(table.to_string(), cached);
    }

    /// Forgets every shape (after a failure that may come from a changed table).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.generation = None;
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// The generation a connection's open sync read, shared with the apply streams it takes:
/// their transactions run inside the sync, after its lock statement, so they may use
/// their own shapes of that generation without reading it again.
#[derive(Clone)]
pub struct SyncGeneration(Arc<AtomicI64>);

/// No generation (none read yet, or no event triggers).
const NO_GENERATION: i64 = i64::MIN;

impl Default for SyncGeneration {
    fn default() -> SyncGeneration {
        SyncGeneration(Arc::new(AtomicI64::new(NO_GENERATION)))
    }
}

impl SyncGeneration {
    pub fn set(&self, generation: Option<i64>) {
        self.0
            .store(generation.unwrap_or(NO_GENERATION), Ordering::Release);
    }

    pub fn get(&self) -> Option<i64> {
        Some(self.0.load(Ordering::Acquire)).filter(|&generation| generation != NO_GENERATION)
    }
}

//! Held transfers (see `crate::held`) in SQLite: the storage primitives. SQLite's calls
//! block, so a `crate::held` step runs on the connection's blocking thread through
//! `Handle::block_on`, as the sync driver does; none of these futures waits.

use rusqlite::types::ValueRef;
use rusqlite::{Connection, ToSql};

use crate::held::{held_storage, HeldParam, HeldSql, HeldValue};
use crate::DbError;

/// Held transfers' SQL in SQLite.
pub const SQL: HeldSql = HeldSql {
    name: "TEXT",
    integer: "INTEGER",
    digest: "BLOB",
    part: "INTEGER",
    bytes: "BLOB",
    table_options: "",
    integer_sum: ("", ""),
    lock_read: "",
};

/// Runs a `crate::held` step on the connection's blocking thread.
pub fn on_thread<T>(step: impl std::future::Future<Output = T>) -> T {
    tokio::runtime::Handle::current().block_on(step)
}

/// A connection holding transfers, on its blocking thread.
pub struct SqliteHeld<'c> {
    pub connection: &'c Connection,
}

impl AsRef<Connection> for SqliteHeld<'_> {
    fn as_ref(&self) -> &Connection {
        self.connection
    }
}

/// A `BEGIN IMMEDIATE` transaction, rolled back when dropped uncommitted.
pub struct SqliteHeldTransaction<'c> {
    connection: &'c Connection,
}

impl AsRef<Connection> for SqliteHeldTransaction<'_> {
    fn as_ref(&self) -> &Connection {
        self.connection
    }
}

impl Drop for SqliteHeldTransaction<'_> {
    fn drop(&mut self) {
        if !self.connection.is_autocommit() {
            let _ = self.connection.execute_batch("ROLLBACK");
        }
    }
}

fn bind<'p>(param: &'p HeldParam<'_>) -> &'p dyn ToSql {
    match param {
        HeldParam::Text(text) => text,
        HeldParam::Integer(value) => value,
        HeldParam::Part(part) => part,
        HeldParam::Bytes(bytes) => bytes,
    }
}

async fn execute(
    connection: &mut impl AsRef<Connection>,
    sql: &str,
    params: &[HeldParam<'_>],
) -> Result<u64, DbError> {
    let binds: Vec<&dyn ToSql> = params.iter().map(bind).collect();
    let mut statement = connection.as_ref().prepare_cached(sql)?;
    Ok(statement.execute(binds.as_slice())? as u64)
}

async fn query(
    connection: &mut impl AsRef<Connection>,
    sql: &str,
    params: &[HeldParam<'_>],
) -> Result<Vec<Vec<HeldValue>>, DbError> {
    let binds: Vec<&dyn ToSql> = params.iter().map(bind).collect();
    let mut statement = connection.as_ref().prepare_cached(sql)?;
    let columns = statement.column_count();
    let mut rows = statement.query(binds.as_slice())?;
    let mut found = Vec::new();
    while let Some(row) = rows.next()? {
        let mut values = Vec::with_capacity(columns);
        for index in 0..columns {
            values.push(match row.get_ref(index)? {
                ValueRef::Null => HeldValue::Null,
                ValueRef::Integer(value) => HeldValue::Integer(value),
                ValueRef::Text(text) => HeldValue::Text(
                    std::str::from_utf8(text)
                        .map_err(|error| DbError::Invalid(format!("held transfers: {error}")))?
                        .to_string(),
                ),
                ValueRef::Blob(bytes) => HeldValue::Bytes(bytes.to_vec()),
                ValueRef::Real(value) => {
                    return Err(DbError::Invalid(format!(
                        "held transfers: a real number ({value}) where none is stored"
                    )))
                }
            });
        }
        found.push(values);
    }
    Ok(found)
}

// IMMEDIATE: a deferred transaction that reads first cannot then write once another
// connection has committed (SQLite's stale snapshot, "database is locked" at once, no
// busy timeout waits for it).
held_storage! {
    storage: SqliteHeld<'_>,
    transaction: SqliteHeldTransaction<'t>,
    sql: SQL,
    statements: execute, query,
    begin: |held| {
        held.connection.execute_batch("BEGIN IMMEDIATE")?;
        Ok(SqliteHeldTransaction { connection: held.connection })
    },
    commit: |transaction| Ok(transaction.connection.execute_batch("COMMIT")?),
    rollback: |transaction| Ok(transaction.connection.execute_batch("ROLLBACK")?),
}

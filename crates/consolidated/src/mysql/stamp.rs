//! The download watermark on MySQL and MariaDB: stamps given after commit, in order.
//!
//! PostgreSQL's snapshot names the oldest transaction still running (its `xmin`), so rows
//! there carry the id of the transaction that wrote them. InnoDB has transaction ids too,
//! but SQL cannot reach them dependably: `information_schema.INNODB_TRX` is a cache that
//! is refilled only when nobody read it for 100 ms (so under steady load it goes stale),
//! no function returns the current transaction's id, and a read view's limits are not
//! exposed. MariaDB's `transaction_registry` needs system-versioned tables, and MySQL
//! has none. A counter bumped by writers is no watermark either: a writer that took 5
//! and commits after one that took 6 would be missed by a sync that saw 6.
//!
//! So rows are stamped *after* they commit. Writers leave their rows unstamped (triggers
//! set `rs_stamp` to NULL on every insert and update; tombstones are born unstamped).
//! Before each sync's transaction a short *stamper* transaction (READ COMMITTED, so no
//! gap locks) locks the clock row, takes the clock's next value `V`, and gives `V` to
//! the unstamped rows it can lock at once: `SELECT ... FOR UPDATE SKIP LOCKED` skips the
//! rows some transaction still holds (an uncommitted write, or a committed row another
//! writer is changing). It records `V` and commits. The sync's watermark is `V + 1`, and
//! the default cursors read `rs_stamp >= :last_download OR rs_stamp IS NULL`.
//!
//! Why no row is missed: take a row version committed at time `c`, and the first sync of
//! a client whose REPEATABLE READ view includes it (the view is created at the sync's
//! first read, after its stamper committed). If the view sees the version unstamped, the
//! cursor sends it (it is committed, so sending it is at worst a duplicate). If it sees
//! it stamped `V'`, the stamper that gave `V'` locked the committed version, so it ran
//! after `c`; the client's previous sync had a view from before `c`, so its stamper
//! committed before `c`, and stampers are serialized by the clock row: its `V` is below
//! `V'`, so `V' >= V + 1`, the watermark the client comes back with, and the cursor sends
//! it. Tombstones likewise. Duplicates are possible, misses are not; the late-commit
//! property test (`tests/mysql_watermark.rs`) checks it against interleaved writers.
//!
//! A sync's own writes carry its `V` in `rs_origin` (the triggers read `@rs_sync`), and
//! the default cursors skip rows of the client's previous sync when it comes back with
//! exactly that watermark (`:last_sync_xid`), as PostgreSQL's skip its transaction id.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, IsolationLevel, TxOpts};

use super::error::db;
use super::names::{tombstone_table, STAMP_COLUMN};
use crate::names::column_list;
use crate::{quote_identifier as q, DbError};

/// The clock's next value, with the clock row locked until the transaction ends.
pub async fn next_stamp(connection: &mut impl Queryable) -> Result<i64, DbError> {
    let clock: Option<i64> = connection
        .query_first("SELECT value FROM rs_counter WHERE name = 'clock' FOR UPDATE")
        .await
        .map_err(db)?;
    let clock = clock.ok_or_else(|| DbError::Invalid("rs_counter has no clock row".into()))?;
    Ok(clock + 1)
}

pub async fn set_clock(connection: &mut impl Queryable, stamp: i64) -> Result<(), DbError> {
    connection
        .exec_drop(
            "UPDATE rs_counter SET value = ? WHERE name = 'clock'",
            (stamp,),
        )
        .await
        .map_err(db)
}

/// Keys per stamping update (each a bound value or a few).
const STAMP_KEYS_PER_STATEMENT: usize = 1000;

/// One synchronized table as the stamper sees it.
#[derive(Debug, Clone)]
pub struct StampedTable {
    pub table: String,
    pub key_columns: Vec<String>,
    /// `, "c" = "c"` for its `ON UPDATE CURRENT_TIMESTAMP` columns, which stamping
    /// must leave as they are (`schema::keep_auto_updated`).
    pub keep_auto_updated: String,
}

impl StampedTable {
    /// Stamps the table's committed, unstamped rows, then its tombstones. The keys are
    /// read with `SKIP LOCKED` and updated by primary key (forced: a scan would wait for
    /// the row lock of an insert not yet committed).
    async fn stamp(&self, transaction: &mut impl Queryable, stamp: i64) -> Result<(), DbError> {
        let stamp_column = q(STAMP_COLUMN);
        let table = q(&self.table);
        let keys = column_list(&self.key_columns, "");
        let pending: Vec<mysql_async::Row> = transaction
            .query(format!(
                "SELECT {keys} FROM {table} WHERE {stamp_column} IS NULL FOR UPDATE SKIP LOCKED"
            ))
            .await
            .map_err(db)?;
        let width = self.key_columns.len();
        let one_key = if width == 1 {
            "?".to_string()
        } else {
            format!("({})", vec!["?"; width].join(", "))
        };
        for batch in pending.chunks(STAMP_KEYS_PER_STATEMENT) {
            let sql = format!(
                "UPDATE {table} FORCE INDEX (PRIMARY) SET {stamp_column} = ?{} WHERE ({keys}) IN ({})",
                self.keep_auto_updated,
                vec![one_key.as_str(); batch.len()].join(", ")
            );
            let mut values = vec![mysql_async::Value::Int(stamp)];
            values.extend(batch.iter().flat_map(|row| row.clone().unwrap()));
            transaction.exec_drop(sql, values).await.map_err(db)?;
        }
        let tombstones = q(&tombstone_table(&self.table));
        let pending: Vec<i64> = transaction
            .query(format!(
                "SELECT rs_id FROM {tombstones} WHERE stamp IS NULL FOR UPDATE SKIP LOCKED"
            ))
            .await
            .map_err(db)?;
        for batch in pending.chunks(STAMP_KEYS_PER_STATEMENT) {
            let sql = format!(
                "UPDATE {tombstones} FORCE INDEX (PRIMARY) SET stamp = ? WHERE rs_id IN ({})",
                vec!["?"; batch.len()].join(", ")
            );
            let mut values = vec![stamp];
            values.extend(batch);
            transaction.exec_drop(sql, values).await.map_err(db)?;
        }
        Ok(())
    }
}

/// Runs a stamper transaction (see the module's documentation) and announces the
/// watermark this connection's sync will hand out; returns the stamp `V`.
pub async fn stamp_committed_rows(
    connection: &mut Conn,
    tables: &[StampedTable],
) -> Result<i64, DbError> {
    let mut options = TxOpts::default();
    options.with_isolation_level(IsolationLevel::ReadCommitted);
    let mut transaction = connection.start_transaction(options).await.map_err(db)?;
    let stamp = next_stamp(&mut transaction).await?;
    transaction
        .query_drop("SET @rs_stamping = 1")
        .await
        .map_err(db)?;
    let mut stamped = Ok(());
    for table in tables {
        stamped = table.stamp(&mut transaction, stamp).await;
        if stamped.is_err() {
            break;
        }
    }
    transaction
        .query_drop("SET @rs_stamping = NULL")
        .await
        .map_err(db)?;
    stamped?;
    set_clock(&mut transaction, stamp).await?;
    transaction
        .exec_drop(
            "REPLACE INTO rs_sync_in_flight (connection_id, watermark) VALUES (CONNECTION_ID(), ?)",
            (stamp + 1,),
        )
        .await
        .map_err(db)?;
    transaction.commit().await.map_err(db)?;
    Ok(stamp)
}

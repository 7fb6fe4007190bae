//! Transfers held for resumption, kept in the consolidated database so the client's next
//! attempt, on whichever server it reaches, goes on from where a cut left it. Uploads:
//! what a server received of an upload whose connection was cut (the decompressed
//! stream after the `upload_resume` frame; `rs_held_upload`, its bytes in parts in
//! `rs_held_upload_part`). Downloads: the whole decompressed stream of a download whose
//! sending was cut (`rs_held_download`, `rs_held_download_part`). Each direction holds one
//! transfer per client: holding another replaces it. Both directions are one
//! implementation over two pairs of tables of the same shape.
//!
//! The storage is one algorithm for every backend (`hold`, `held`, `held_client`,
//! `held_bytes`, `release`, `expire`, and the tables' DDL from `tables_sql`), over the few
//! primitives a backend gives in [`HeldStorage`] and [`HeldStatements`]: a transaction
//! that will write, a statement, a query, and [`HeldSql`], the SQL that differs (column
//! types, a 64-bit integer sum, a row lock), as the sync driver runs over `dialect`. Statements are written with `?`
//! placeholders, each parameter once and in order; a backend numbers them if it must.

use crate::DbError;

/// Which way a held transfer went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Client to server: what the server received of a cut upload.
    Upload,
    /// Server to client: the whole stream of a download whose sending was cut.
    Download,
}

impl Direction {
    pub const ALL: [Direction; 2] = [Direction::Upload, Direction::Download];

    /// The direction's table and its parts' table.
    pub fn tables(self) -> (&'static str, &'static str) {
        match self {
            Direction::Upload => ("rs_held_upload", "rs_held_upload_part"),
            Direction::Download => ("rs_held_download", "rs_held_download_part"),
        }
    }

    /// "upload" or "download", for messages.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Upload => "upload",
            Direction::Download => "download",
        }
    }
}

/// A held transfer, without its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldTransfer {
    pub client_id: String,
    /// The authenticated user whose connection left it: only that user resumes it.
    pub user: String,
    pub transfer_id: String,
    /// Bytes held.
    pub length: u64,
    /// SHA-256 of the bytes held (32 bytes).
    pub sha256: Vec<u8>,
    pub created_unix_ms: i64,
}

/// Bytes of one part row of a held transfer (under every backend's packet limit).
pub const HELD_TRANSFER_PART_BYTES: usize = 1024 * 1024;

/// The bounds a held transfer must stay within, in bytes as the tables store them (the
/// decompressed stream, not what came over the wire): all held transfers of its
/// direction together, and those of its user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HoldBounds {
    pub all_bytes_max: u64,
    pub user_bytes_max: u64,
}

/// A bound on all held transfers only.
impl From<u64> for HoldBounds {
    fn from(all_bytes_max: u64) -> HoldBounds {
        HoldBounds {
            all_bytes_max,
            user_bytes_max: u64::MAX,
        }
    }
}

/// Whether holding `length` more bytes keeps the held transfers of a direction within
/// `bounds`, given the bytes other clients hold: `held_by_others` in all, `held_by_user`
/// of them the user's.
pub(crate) fn fits(
    held_by_others: i64,
    held_by_user: i64,
    length: u64,
    bounds: HoldBounds,
) -> bool {
    let within = |held: i64, max: u64| (held.max(0) as u64).saturating_add(length) <= max;
    within(held_by_others, bounds.all_bytes_max) && within(held_by_user, bounds.user_bytes_max)
}

/// Whether a client's held transfer may be replaced by `user`'s: only by its own user
/// (`owner`, if the client holds one).
pub(crate) fn replaceable_by(owner: Option<&str>, user: &str) -> bool {
    owner.is_none_or(|owner| owner == user)
}

/// The length as the tables store it.
pub(crate) fn stored_length(length: u64) -> Result<i64, crate::DbError> {
    i64::try_from(length)
        .map_err(|_| crate::DbError::Invalid(format!("a held transfer of {length} bytes")))
}

/// A parameter of a held-transfer statement.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HeldParam<'a> {
    Text(&'a str),
    /// A 64-bit integer column (`length`, `created_unix_ms`).
    Integer(i64),
    /// A part number (a 32-bit `part` column).
    Part(i32),
    Bytes(&'a [u8]),
}

/// A value a held-transfer query returns (a backend that cannot tell text from bytes
/// returns text as bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeldValue {
    Null,
    Text(String),
    Integer(i64),
    Bytes(Vec<u8>),
}

impl HeldValue {
    fn unexpected(&self, wanted: &str) -> DbError {
        DbError::Invalid(format!("held transfers: {wanted} expected, read {self:?}"))
    }

    pub(crate) fn into_text(self) -> Result<String, DbError> {
        match self {
            HeldValue::Text(text) => Ok(text),
            HeldValue::Bytes(bytes) => String::from_utf8(bytes)
                .map_err(|error| DbError::Invalid(format!("held transfers: {error}"))),
            other => Err(other.unexpected("text")),
        }
    }

    pub(crate) fn into_integer(self) -> Result<i64, DbError> {
        match self {
            HeldValue::Integer(value) => Ok(value),
            other => Err(other.unexpected("an integer")),
        }
    }

    pub(crate) fn into_bytes(self) -> Result<Vec<u8>, DbError> {
        match self {
            HeldValue::Bytes(bytes) => Ok(bytes),
            HeldValue::Text(text) => Ok(text.into_bytes()),
            other => Err(other.unexpected("bytes")),
        }
    }
}

/// Statements on a connection or in a transaction: what every held-transfer step is
/// made of. `sql` has `?` placeholders, one per parameter, in order. `async fn`, as in
/// `dialect`: a backend whose futures are `Send` gives `Send` held-transfer futures.
pub(crate) trait HeldStatements {
    /// Runs a statement; returns the rows it changed.
    async fn execute(&mut self, sql: &str, params: &[HeldParam<'_>]) -> Result<u64, DbError>;

    /// Runs a query; returns its rows, each its columns in order.
    async fn query(
        &mut self,
        sql: &str,
        params: &[HeldParam<'_>],
    ) -> Result<Vec<Vec<HeldValue>>, DbError>;
}

/// A backend's [`HeldStorage`], [`HeldCommit`] and [`HeldStatements`] (for its
/// connection and its transaction) from what differs: its statement functions, generic
/// over connection and transaction (`async fn execute(&mut T, &str, &[HeldParam]) ->
/// Result<u64, DbError>`, `async fn query(&mut T, &str, &[HeldParam]) ->
/// Result<Vec<Vec<HeldValue>>, DbError>`), its [`HeldSql`], and how a transaction
/// begins, commits and rolls back.
macro_rules! held_storage {
    (
        storage: $storage:ty,
        transaction: $transaction:ident<$lifetime:lifetime>,
        sql: $sql:expr,
        statements: $execute:path, $query:path,
        begin: |$this:ident| $begin:expr,
        commit: |$committed:ident| $commit:expr,
        rollback: |$rolled:ident| $rollback:expr $(,)?
    ) => {
        $crate::held::held_storage!(@statements $storage, $execute, $query);
        $crate::held::held_storage!(@statements $transaction<'_>, $execute, $query);

        impl $crate::held::HeldStorage for $storage {
            type Transaction<$lifetime>
                = $transaction<$lifetime>
            where
                Self: $lifetime;

            const SQL: $crate::held::HeldSql = $sql;

            async fn begin(&mut self) -> Result<Self::Transaction<'_>, $crate::DbError> {
                let $this = self;
                $begin
            }
        }

        impl $crate::held::HeldCommit for $transaction<'_> {
            async fn commit(self) -> Result<(), $crate::DbError> {
                let $committed = self;
                $commit
            }

            async fn rollback(self) -> Result<(), $crate::DbError> {
                let $rolled = self;
                $rollback
            }
        }
    };
    (@statements $type:ty, $execute:path, $query:path) => {
        impl $crate::held::HeldStatements for $type {
            async fn execute(
                &mut self,
                sql: &str,
                params: &[$crate::held::HeldParam<'_>],
            ) -> Result<u64, $crate::DbError> {
                $execute(self, sql, params).await
            }

            async fn query(
                &mut self,
                sql: &str,
                params: &[$crate::held::HeldParam<'_>],
            ) -> Result<Vec<Vec<$crate::held::HeldValue>>, $crate::DbError> {
                $query(self, sql, params).await
            }
        }
    };
}
pub(crate) use held_storage;

/// What a backend gives held-transfer storage: its statements, a transaction that will
/// write (dropped uncommitted, it rolls back), and its SQL where databases differ.
pub(crate) trait HeldStorage: HeldStatements {
    type Transaction<'t>: HeldCommit
    where
        Self: 't;

    const SQL: HeldSql;

    /// Opens a transaction that reads held rows and then replaces them (SQLite: one
    /// that takes the write lock at once, as a deferred one could not write after a
    /// read once another connection committed).
    async fn begin(&mut self) -> Result<Self::Transaction<'_>, DbError>;
}

/// An open transaction of [`HeldStorage`].
pub(crate) trait HeldCommit: HeldStatements {
    async fn commit(self) -> Result<(), DbError>;
    async fn rollback(self) -> Result<(), DbError>;
}

/// A backend's SQL for held transfers where databases differ: the types of the held
/// tables' columns, how a sum is read as a 64-bit integer, how a read row is locked.
pub(crate) struct HeldSql {
    /// `client_id`, `transfer_id`, `user_name` (compared byte for byte).
    pub(crate) name: &'static str,
    /// `length`, `created_unix_ms`.
    pub(crate) integer: &'static str,
    /// `sha256` (32 bytes).
    pub(crate) digest: &'static str,
    /// `part`.
    pub(crate) part: &'static str,
    /// `bytes` (up to [`HELD_TRANSFER_PART_BYTES`]).
    pub(crate) bytes: &'static str,
    /// After each `CREATE TABLE (...)`: a storage engine, or nothing.
    pub(crate) table_options: &'static str,
    /// What goes before and after a sum of 64-bit integers to read it as one
    /// (PostgreSQL: `::bigint` after, MySQL: `CAST(` ... ` AS SIGNED)`).
    pub(crate) integer_sum: (&'static str, &'static str),
    /// What a query that reads a client's held row appends to hold that row until the
    /// transaction ends (MySQL: ` FOR UPDATE`), or nothing.
    pub(crate) lock_read: &'static str,
}

impl HeldSql {
    fn integer(&self, sum: &str) -> String {
        let (before, after) = self.integer_sum;
        format!("{before}{sum}{after}")
    }
}

/// The `CREATE TABLE IF NOT EXISTS` statements of both directions' tables.
pub(crate) fn tables_sql(sql: &HeldSql) -> Vec<String> {
    let HeldSql {
        name,
        integer,
        digest,
        part,
        bytes,
        table_options,
        ..
    } = sql;
    let mut statements = Vec::new();
    for direction in Direction::ALL {
        let (table, part_table) = direction.tables();
        statements.push(format!(
            "CREATE TABLE IF NOT EXISTS {table} (client_id {name} PRIMARY KEY, \
             transfer_id {name} NOT NULL, user_name {name} NOT NULL, length {integer} NOT NULL, \
             sha256 {digest} NOT NULL, created_unix_ms {integer} NOT NULL){table_options}"
        ));
        statements.push(format!(
            "CREATE TABLE IF NOT EXISTS {part_table} (client_id {name} NOT NULL, \
             part {part} NOT NULL, bytes {bytes} NOT NULL, PRIMARY KEY (client_id, part))\
             {table_options}"
        ));
    }
    statements
}

/// Removes a client's held transfer of a direction; returns the rows of its table
/// removed (0 or 1).
async fn remove(
    statements: &mut impl HeldStatements,
    direction: Direction,
    client_id: &str,
) -> Result<u64, DbError> {
    let (table, part_table) = direction.tables();
    let client = [HeldParam::Text(client_id)];
    statements
        .execute(
            &format!("DELETE FROM {part_table} WHERE client_id = ?"),
            &client,
        )
        .await?;
    statements
        .execute(&format!("DELETE FROM {table} WHERE client_id = ?"), &client)
        .await
}

/// See `ConsolidatedConnection::hold_transfer`.
pub(crate) async fn hold<S: HeldStorage>(
    storage: &mut S,
    direction: Direction,
    held: &HeldTransfer,
    bytes: &[u8],
    bounds: HoldBounds,
) -> Result<bool, DbError> {
    let (table, _) = direction.tables();
    let length = stored_length(bytes.len() as u64)?;
    let mut transaction = storage.begin().await?;
    let owner = transaction
        .query(
            &format!(
                "SELECT user_name FROM {table} WHERE client_id = ?{}",
                S::SQL.lock_read
            ),
            &[HeldParam::Text(&held.client_id)],
        )
        .await?
        .into_iter()
        .next()
        .map(|row| first(row).into_text())
        .transpose()?;
    if !replaceable_by(owner.as_deref(), &held.user) {
        transaction.rollback().await?;
        return Ok(false);
    }
    remove(&mut transaction, direction, &held.client_id).await?;
    let (others, users) = held_sums::<S>(&mut transaction, table, &held.user).await?;
    if !fits(others, users, bytes.len() as u64, bounds) {
        transaction.commit().await?;
        return Ok(false);
    }
    insert(&mut transaction, direction, held, length, bytes).await?;
    transaction.commit().await?;
    Ok(true)
}

/// The bytes held in a direction's table by all clients, and by `user`'s.
async fn held_sums<S: HeldStorage>(
    transaction: &mut S::Transaction<'_>,
    table: &str,
    user: &str,
) -> Result<(i64, i64), DbError> {
    let all = S::SQL.integer("coalesce(sum(length), 0)");
    let users = S::SQL.integer("coalesce(sum(CASE WHEN user_name = ? THEN length ELSE 0 END), 0)");
    let row = transaction
        .query(
            &format!("SELECT {all}, {users} FROM {table}"),
            &[HeldParam::Text(user)],
        )
        .await?
        .into_iter()
        .next();
    let Some(row) = row else {
        return Ok((0, 0));
    };
    let mut values = row.into_iter();
    let mut next = || values.next().unwrap_or(HeldValue::Null).into_integer();
    Ok((next()?, next()?))
}

/// Writes a held transfer's row and its parts.
async fn insert(
    transaction: &mut impl HeldStatements,
    direction: Direction,
    held: &HeldTransfer,
    length: i64,
    bytes: &[u8],
) -> Result<(), DbError> {
    let (table, part_table) = direction.tables();
    transaction
        .execute(
            &format!(
                "INSERT INTO {table} (client_id, transfer_id, user_name, length, sha256, \
                 created_unix_ms) VALUES (?, ?, ?, ?, ?, ?)"
            ),
            &[
                HeldParam::Text(&held.client_id),
                HeldParam::Text(&held.transfer_id),
                HeldParam::Text(&held.user),
                HeldParam::Integer(length),
                HeldParam::Bytes(&held.sha256),
                HeldParam::Integer(held.created_unix_ms),
            ],
        )
        .await?;
    let insert = format!("INSERT INTO {part_table} (client_id, part, bytes) VALUES (?, ?, ?)");
    for (part, chunk) in bytes.chunks(HELD_TRANSFER_PART_BYTES).enumerate() {
        let part = i32::try_from(part)
            .map_err(|_| DbError::Invalid(format!("a held transfer of {part} parts")))?;
        transaction
            .execute(
                &insert,
                &[
                    HeldParam::Text(&held.client_id),
                    HeldParam::Part(part),
                    HeldParam::Bytes(chunk),
                ],
            )
            .await?;
    }
    Ok(())
}

fn first(row: Vec<HeldValue>) -> HeldValue {
    row.into_iter().next().unwrap_or(HeldValue::Null)
}

/// See `ConsolidatedConnection::held_transfer_client`: by the transfer id alone (a
/// table of few rows: no index).
pub(crate) async fn held_client(
    statements: &mut impl HeldStatements,
    direction: Direction,
    transfer_id: &str,
) -> Result<Option<String>, DbError> {
    let (table, _) = direction.tables();
    statements
        .query(
            &format!("SELECT client_id FROM {table} WHERE transfer_id = ? LIMIT 1"),
            &[HeldParam::Text(transfer_id)],
        )
        .await?
        .into_iter()
        .next()
        .map(|row| first(row).into_text())
        .transpose()
}

/// See `ConsolidatedConnection::held_transfer`.
pub(crate) async fn held(
    statements: &mut impl HeldStatements,
    direction: Direction,
    client_id: &str,
    transfer_id: &str,
) -> Result<Option<HeldTransfer>, DbError> {
    let (table, _) = direction.tables();
    let row = statements
        .query(
            &format!(
                "SELECT user_name, length, sha256, created_unix_ms FROM {table} \
                 WHERE client_id = ? AND transfer_id = ?"
            ),
            &[HeldParam::Text(client_id), HeldParam::Text(transfer_id)],
        )
        .await?
        .into_iter()
        .next();
    let Some(row) = row else {
        return Ok(None);
    };
    let mut values = row.into_iter();
    let mut next = || values.next().unwrap_or(HeldValue::Null);
    Ok(Some(HeldTransfer {
        client_id: client_id.to_string(),
        user: next().into_text()?,
        transfer_id: transfer_id.to_string(),
        length: next().into_integer()?.max(0) as u64,
        sha256: next().into_bytes()?,
        created_unix_ms: next().into_integer()?,
    }))
}

/// See `ConsolidatedConnection::held_transfer_bytes`: the parts that hold the first
/// `length` bytes, in order.
pub(crate) async fn held_bytes(
    statements: &mut impl HeldStatements,
    direction: Direction,
    client_id: &str,
    transfer_id: &str,
    length: u64,
) -> Result<Vec<u8>, DbError> {
    let (_, part_table) = direction.tables();
    let mut bytes = Vec::new();
    if held(statements, direction, client_id, transfer_id)
        .await?
        .is_none()
    {
        return Ok(bytes);
    }
    let parts = length.div_ceil(HELD_TRANSFER_PART_BYTES as u64);
    let parts = i32::try_from(parts).unwrap_or(i32::MAX);
    let rows = statements
        .query(
            &format!(
                "SELECT bytes FROM {part_table} WHERE client_id = ? AND part < ? ORDER BY part"
            ),
            &[HeldParam::Text(client_id), HeldParam::Part(parts)],
        )
        .await?;
    for row in rows {
        bytes.extend_from_slice(&first(row).into_bytes()?);
    }
    bytes.truncate(length.min(bytes.len() as u64) as usize);
    Ok(bytes)
}

/// See `ConsolidatedConnection::release_held_transfer`.
pub(crate) async fn release<S: HeldStorage>(
    storage: &mut S,
    direction: Direction,
    client_id: &str,
    transfer_id: &str,
) -> Result<bool, DbError> {
    let mut transaction = storage.begin().await?;
    let found = held(&mut transaction, direction, client_id, transfer_id)
        .await?
        .is_some();
    if found {
        remove(&mut transaction, direction, client_id).await?;
    }
    transaction.commit().await?;
    Ok(found)
}

/// See `ConsolidatedConnection::expire_held_transfers`.
pub(crate) async fn expire<S: HeldStorage>(
    storage: &mut S,
    direction: Direction,
    created_before_unix_ms: i64,
) -> Result<u64, DbError> {
    let (table, part_table) = direction.tables();
    let before = [HeldParam::Integer(created_before_unix_ms)];
    let mut transaction = storage.begin().await?;
    transaction
        .execute(
            &format!(
                "DELETE FROM {part_table} WHERE client_id IN \
                 (SELECT client_id FROM {table} WHERE created_unix_ms < ?)"
            ),
            &before,
        )
        .await?;
    let removed = transaction
        .execute(
            &format!("DELETE FROM {table} WHERE created_unix_ms < ?"),
            &before,
        )
        .await?;
    transaction.commit().await?;
    Ok(removed)
}

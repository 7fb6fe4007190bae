//! Held transfers (see `crate::held`) in MySQL and MariaDB: the storage primitives.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Transaction, TxOpts, Value};

use super::error::db;
use crate::held::{held_storage, HeldParam, HeldSql, HeldValue};
use crate::DbError;

/// Held transfers' SQL in MySQL: text columns compare byte for byte, as the other system
/// tables' do.
const SQL: HeldSql = HeldSql {
    name: "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
    integer: "BIGINT",
    digest: "VARBINARY(32)",
    part: "INT",
    bytes: "LONGBLOB",
    table_options: " ENGINE = InnoDB",
    integer_sum: ("CAST(", " AS SIGNED)"),
    lock_read: " FOR UPDATE",
};

pub async fn install(connection: &mut Conn) -> Result<(), DbError> {
    for statement in crate::held::tables_sql(&SQL) {
        connection.query_drop(statement).await.map_err(db)?;
    }
    Ok(())
}

fn params(params: &[HeldParam<'_>]) -> Params {
    Params::Positional(
        params
            .iter()
            .map(|param| match *param {
                HeldParam::Text(text) => Value::from(text),
                HeldParam::Integer(value) => Value::Int(value),
                HeldParam::Part(part) => Value::Int(part.into()),
                HeldParam::Bytes(bytes) => Value::Bytes(bytes.to_vec()),
            })
            .collect(),
    )
}

fn held_value(value: Value) -> Result<HeldValue, DbError> {
    Ok(match value {
        Value::NULL => HeldValue::Null,
        Value::Bytes(bytes) => HeldValue::Bytes(bytes),
        Value::Int(value) => HeldValue::Integer(value),
        Value::UInt(value) => HeldValue::Integer(
            i64::try_from(value)
                .map_err(|_| DbError::Invalid(format!("held transfers: {value} read")))?,
        ),
        other => return Err(DbError::Invalid(format!("held transfers: {other:?} read"))),
    })
}

async fn execute(
    connection: &mut impl Queryable,
    sql: &str,
    values: &[HeldParam<'_>],
) -> Result<u64, DbError> {
    let result = connection
        .exec_iter(sql, params(values))
        .await
        .map_err(db)?;
    let changed = result.affected_rows();
    result.drop_result().await.map_err(db)?;
    Ok(changed)
}

async fn query(
    connection: &mut impl Queryable,
    sql: &str,
    values: &[HeldParam<'_>],
) -> Result<Vec<Vec<HeldValue>>, DbError> {
    let rows: Vec<mysql_async::Row> = connection.exec(sql, params(values)).await.map_err(db)?;
    rows.into_iter()
        .map(|row| row.unwrap().into_iter().map(held_value).collect())
        .collect()
}

held_storage! {
    storage: Conn,
    transaction: Transaction<'t>,
    sql: SQL,
    statements: execute, query,
    begin: |connection| connection.start_transaction(TxOpts::default()).await.map_err(db),
    commit: |transaction| Transaction::commit(transaction).await.map_err(db),
    rollback: |transaction| Transaction::rollback(transaction).await.map_err(db),
}

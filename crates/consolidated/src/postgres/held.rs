//! Held transfers (see `crate::held`) in PostgreSQL: the storage primitives.

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, GenericClient, Row, Transaction};

use crate::held::{held_storage, HeldParam, HeldSql, HeldValue};
use crate::DbError;

/// Held transfers' SQL in PostgreSQL.
const SQL: HeldSql = HeldSql {
    name: "TEXT",
    integer: "BIGINT",
    digest: "BYTEA",
    part: "INTEGER",
    bytes: "BYTEA",
    table_options: "",
    integer_sum: ("", "::bigint"),
    lock_read: "",
};

pub async fn install(client: &Client) -> Result<(), DbError> {
    // One implicit transaction: the lock serializes concurrent installers.
    let mut sql = String::from("SELECT pg_advisory_xact_lock(7262);");
    for statement in crate::held::tables_sql(&SQL) {
        sql.push_str(&statement);
        sql.push(';');
    }
    client.batch_execute(&sql).await?;
    Ok(())
}

/// `?` placeholders as PostgreSQL's `$1`, `$2`, ...
fn numbered(sql: &str) -> String {
    let mut numbered = String::with_capacity(sql.len() + 8);
    let mut next = 0;
    for character in sql.chars() {
        if character == '?' {
            next += 1;
            numbered.push_str(&format!("${next}"));
        } else {
            numbered.push(character);
        }
    }
    numbered
}

fn bind<'p>(param: &'p HeldParam<'_>) -> &'p (dyn ToSql + Sync) {
    match param {
        HeldParam::Text(text) => text,
        HeldParam::Integer(value) => value,
        HeldParam::Part(part) => part,
        HeldParam::Bytes(bytes) => bytes,
    }
}

fn values(row: &Row) -> Result<Vec<HeldValue>, DbError> {
    let mut values = Vec::with_capacity(row.len());
    for (index, column) in row.columns().iter().enumerate() {
        let kind = column.type_();
        let value = if *kind == Type::INT8 {
            row.try_get::<_, Option<i64>>(index)?
                .map(HeldValue::Integer)
        } else if *kind == Type::INT4 {
            row.try_get::<_, Option<i32>>(index)?
                .map(|value| HeldValue::Integer(value.into()))
        } else if *kind == Type::BYTEA {
            row.try_get::<_, Option<Vec<u8>>>(index)?
                .map(HeldValue::Bytes)
        } else {
            row.try_get::<_, Option<String>>(index)?
                .map(HeldValue::Text)
        };
        values.push(value.unwrap_or(HeldValue::Null));
    }
    Ok(values)
}

async fn execute(
    client: &mut impl GenericClient,
    sql: &str,
    params: &[HeldParam<'_>],
) -> Result<u64, DbError> {
    let binds: Vec<&(dyn ToSql + Sync)> = params.iter().map(bind).collect();
    Ok(client.execute(numbered(sql).as_str(), &binds).await?)
}

async fn query(
    client: &mut impl GenericClient,
    sql: &str,
    params: &[HeldParam<'_>],
) -> Result<Vec<Vec<HeldValue>>, DbError> {
    let binds: Vec<&(dyn ToSql + Sync)> = params.iter().map(bind).collect();
    let rows = client.query(numbered(sql).as_str(), &binds).await?;
    rows.iter().map(values).collect()
}

held_storage! {
    storage: Client,
    transaction: Transaction<'t>,
    sql: SQL,
    statements: execute, query,
    begin: |client| Ok(client.transaction().await?),
    commit: |transaction| Ok(Transaction::commit(transaction).await?),
    rollback: |transaction| Ok(Transaction::rollback(transaction).await?),
}

//! An upload's scratch rows in the statement itself: one array parameter per column, read
//! through `unnest` in a common table expression named [`UPLOAD_CTE`]. Against a
//! temporary table this saves, per table and kind of each sync, the catalog writes of
//! `CREATE TEMP TABLE` and its drop at commit, a `COPY`, an `ANALYZE` and three round
//! trips; and the script's statement sees the rows as values, as `COPY` would have.
//!
//! Used for set scripts that are one `INSERT`, `UPDATE` or `DELETE` (with or without a
//! leading `WITH`): a statement of another kind (a `SELECT` of a function, `CALL`,
//! `MERGE`, which cannot follow `WITH` before PostgreSQL 17) may hand the name on to code
//! that cannot see a CTE, so it keeps the temporary table.

use std::error::Error;

use bytes::BytesMut;
use postgres_types::{IsNull, Kind, ToSql, Type};
use rowsync_protocol::Value;

use super::value::Bind;
use crate::names::{column_list, key_match};

type BoxError = Box<dyn Error + Sync + Send>;

/// The name `{upload}` takes in a script whose scratch rows are arrays.
pub const UPLOAD_CTE: &str = "rs_upload";

/// Whether a set script can read its upload from the CTE: one data-modifying statement.
pub fn takes_cte(script: &str) -> bool {
    let first = script
        .trim_start()
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("");
    ["insert", "update", "delete", "with"]
        .iter()
        .any(|keyword| first.eq_ignore_ascii_case(keyword))
}

/// A value its column's type cannot take, named by column (found while the array
/// parameter is encoded, before the statement reaches the database).
#[derive(Debug, thiserror::Error)]
#[error("column {column:?}: {message}")]
pub struct ColumnRefusal {
    pub column: String,
    pub message: String,
}

/// The values of one scratch column, bound as one array.
#[derive(Debug)]
pub struct ScratchColumn<'v> {
    column: String,
    values: Vec<Bind<'v>>,
}

impl ToSql for ScratchColumn<'_> {
    fn to_sql(&self, ty: &Type, out: &mut BytesMut) -> Result<IsNull, BoxError> {
        self.values.to_sql(ty, out).map_err(|error| {
            Box::new(ColumnRefusal {
                column: self.column.clone(),
                message: error.to_string(),
            }) as BoxError
        })
    }

    fn accepts(ty: &Type) -> bool {
        matches!(ty.kind(), Kind::Array(_))
    }

    postgres_types::to_sql_checked!();
}

/// The scratch upload of one kind of operation of one table.
pub struct ArrayScratch<'v> {
    /// Scratch column names (new values, then `rs_old_` ones for updates).
    pub columns: Vec<String>,
    types: Vec<String>,
    key_columns: Vec<String>,
    arrays: Vec<ScratchColumn<'v>>,
}

impl<'v> ArrayScratch<'v> {
    /// `rows` hold values in the order of `columns`, whose SQL types are `types`.
    pub fn new(
        columns: Vec<String>,
        types: Vec<String>,
        key_columns: Vec<String>,
        rows: Vec<Vec<&'v Value>>,
    ) -> ArrayScratch<'v> {
        let count = rows.len();
        let mut arrays: Vec<ScratchColumn<'v>> = columns
            .iter()
            .map(|column| ScratchColumn {
                column: column.clone(),
                values: Vec::with_capacity(count),
            })
            .collect();
        for row in rows {
            for (array, value) in arrays.iter_mut().zip(row) {
                array.values.push(Bind(value));
            }
        }
        ArrayScratch {
            columns,
            types,
            key_columns,
            arrays,
        }
    }

    /// `rs_upload AS (SELECT * FROM unnest($first::t1[], …) AS u(c1, …))`.
    fn cte(&self, first_parameter: usize) -> String {
        let arrays = self
            .types
            .iter()
            .enumerate()
            .map(|(index, ty)| format!("${}::{ty}[]", first_parameter + index))
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "{UPLOAD_CTE} AS (SELECT * FROM unnest({arrays}) AS u({}))",
            column_list(&self.columns, "")
        )
    }

    /// `sql`, whose own parameters are `$1` to `$parameters`, with the scratch defined in
    /// front of it (merged into its `WITH` if it has one).
    pub fn statement(&self, sql: &str, parameters: usize) -> String {
        with_cte(sql, &self.cte(parameters + 1))
    }

    /// The arrays, to bind after the statement's own parameters.
    pub fn parameters(&self) -> impl Iterator<Item = &(dyn ToSql + Sync)> {
        self.arrays.iter().map(|array| array as &(dyn ToSql + Sync))
    }

    pub fn key_list(&self, alias: &str) -> String {
        column_list(&self.key_columns, &format!("{alias}."))
    }

    pub fn key_match(&self, left: &str, right: &str) -> String {
        key_match(&self.key_columns, left, right)
    }
}

/// `WITH cte <sql>`, or `sql`'s own `WITH [RECURSIVE]` list with `cte` first.
pub fn with_cte(sql: &str, cte: &str) -> String {
    let trimmed = sql.trim_start();
    let mut words = trimmed.splitn(3, |c: char| c.is_whitespace());
    let first = words.next().unwrap_or("");
    if !first.eq_ignore_ascii_case("with") {
        return format!("WITH {cte} {trimmed}");
    }
    let rest = trimmed[first.len()..].trim_start();
    let second = rest
        .split(|c: char| !c.is_ascii_alphabetic())
        .next()
        .unwrap_or("");
    if second.eq_ignore_ascii_case("recursive") {
        format!(
            "WITH RECURSIVE {cte}, {}",
            rest[second.len()..].trim_start()
        )
    } else {
        format!("WITH {cte}, {rest}")
    }
}

/// The column whose value its type refused, if that is what `error` is.
pub fn refusal(error: &tokio_postgres::Error) -> Option<&ColumnRefusal> {
    let mut source = error.source();
    while let Some(cause) = source {
        if let Some(refusal) = cause.downcast_ref::<ColumnRefusal>() {
            return Some(refusal);
        }
        source = cause.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scratch_goes_first_in_any_with_list() {
        let cte = "rs_upload AS (SELECT 1)";
        assert_eq!(
            with_cte("INSERT INTO t SELECT * FROM rs_upload", cte),
            "WITH rs_upload AS (SELECT 1) INSERT INTO t SELECT * FROM rs_upload"
        );
        assert_eq!(
            with_cte("  with x AS (SELECT 2) DELETE FROM t", cte),
            "WITH rs_upload AS (SELECT 1), x AS (SELECT 2) DELETE FROM t"
        );
        assert_eq!(
            with_cte("WITH RECURSIVE r(n) AS (SELECT 1) UPDATE t SET a = 1", cte),
            "WITH RECURSIVE rs_upload AS (SELECT 1), r(n) AS (SELECT 1) UPDATE t SET a = 1"
        );
        // A name that merely starts with "with" is not a WITH clause.
        assert_eq!(
            with_cte("withdrawals", cte),
            "WITH rs_upload AS (SELECT 1) withdrawals"
        );
    }

    #[test]
    fn only_data_modifying_statements_read_the_scratch_as_a_cte() {
        for script in [
            "INSERT INTO t SELECT * FROM {upload}",
            "\n update t SET a = u.a FROM {upload} AS u",
            "DELETE FROM t USING {upload} u",
            "WITH x AS (SELECT 1) INSERT INTO t SELECT * FROM {upload}",
        ] {
            assert!(takes_cte(script), "{script}");
        }
        for script in [
            "SELECT apply_orders('{upload}')",
            "CALL apply_orders('{upload}')",
            "MERGE INTO t USING {upload} AS u ON t.id = u.id WHEN MATCHED THEN DELETE",
        ] {
            assert!(!takes_cte(script), "{script}");
        }
    }

    #[test]
    fn columns_become_arrays_of_their_own_types() {
        let values = [
            Value::Int(1),
            Value::Text("a".into()),
            Value::Int(2),
            Value::Null,
        ];
        let scratch = ArrayScratch::new(
            vec!["id".into(), "name".into()],
            vec!["integer".into(), "character varying(64)".into()],
            vec!["id".into()],
            vec![vec![&values[0], &values[1]], vec![&values[2], &values[3]]],
        );
        assert_eq!(
            scratch.statement("DELETE FROM t USING rs_upload AS u WHERE t.id = u.id AND t.x = $1", 1),
            "WITH rs_upload AS (SELECT * FROM unnest($2::integer[], $3::character varying(64)[]) AS u(\"id\", \"name\")) \
             DELETE FROM t USING rs_upload AS u WHERE t.id = u.id AND t.x = $1"
        );
        assert_eq!(scratch.parameters().count(), 2);
        assert_eq!(scratch.arrays[0].values.len(), 2);
    }
}

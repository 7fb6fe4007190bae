//! `rowsync schema`: the client's `CREATE TABLE`s for a script version, from the
//! server's tables and the columns the version synchronizes (a rule may leave some
//! out), each column with the affinity docs/types.md requires. Printed, or created in
//! a client database (`--client-db`, tables that exist are left as they are).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use rowsync_cli::database::{DatabaseArg, OnBackend};
use rowsync_consolidated::{
    quote_identifier as q, ClientTable, Consolidated, ConsolidatedConnection,
};
use rowsync_protocol::Value;

#[derive(clap::Args)]
pub struct SchemaArgs {
    #[command(flatten)]
    database: DatabaseArg,
    /// The script version whose tables the client synchronizes.
    #[arg(long, default_value = "v1")]
    script_version: String,
    /// Create the tables in this client database (SQLite file) instead of printing
    /// them; tables it has already are left as they are.
    #[arg(long, value_name = "FILE")]
    client_db: Option<PathBuf>,
}

pub async fn run(args: SchemaArgs) -> Result<()> {
    let database = args.database.database()?;
    let statements = database.run(Versioned(args.script_version.clone())).await?;
    if statements.is_empty() {
        bail!(
            "script version {:?} synchronizes no table; run `rowsync rules apply` or `rowsync init` first",
            args.script_version
        );
    }
    let sql = statements.join("\n");
    match &args.client_db {
        None => println!("{sql}"),
        Some(path) => {
            let connection = rusqlite::Connection::open(path)
                .with_context(|| format!("opening the client database {}", path.display()))?;
            connection
                .execute_batch(&sql)
                .with_context(|| format!("creating tables in {}", path.display()))?;
            println!("{} table(s) ready in {}", statements.len(), path.display());
        }
    }
    Ok(())
}

struct Versioned(String);

impl OnBackend for Versioned {
    type Output = Vec<String>;
    async fn run<B: Consolidated>(self, backend: B) -> Result<Vec<String>> {
        let mut connection = backend.connect().await?;
        connection.install_system_tables().await?;
        let rows = connection
            .query_sql(&format!(
                "SELECT table_name, column_name FROM rs_script_column WHERE script_version = '{}' \
                 AND dropped = false ORDER BY table_name, position",
                self.0.replace('\'', "''")
            ))
            .await?;
        let mut tables: Vec<(String, Vec<String>)> = Vec::new();
        for row in rows {
            let [Value::Text(table), Value::Text(column)] = row.as_slice() else {
                continue;
            };
            match tables.last_mut() {
                Some((name, columns)) if name == table => columns.push(column.clone()),
                _ => tables.push((table.clone(), vec![column.clone()])),
            }
        }
        let mut statements = Vec::new();
        for (table, columns) in tables {
            let Some(shape) = connection.client_columns(&table).await? else {
                bail!(
                    "table {table:?} of script version {:?} is gone from the database",
                    self.0
                );
            };
            statements.push(create_table(&table, &columns, &shape));
        }
        Ok(statements)
    }
}

/// `CREATE TABLE IF NOT EXISTS` with the version's columns, in the table's order.
fn create_table(table: &str, columns: &[String], shape: &ClientTable) -> String {
    let single_integer_key = shape.key_columns.len() == 1;
    let definitions: Vec<String> = shape
        .columns
        .iter()
        .filter(|(name, _)| columns.contains(name))
        .map(|(name, affinity)| {
            if single_integer_key && shape.key_columns[0] == *name {
                format!("    {} {affinity} PRIMARY KEY", q(name))
            } else {
                format!("    {} {affinity}", q(name))
            }
        })
        .collect();
    let key = if single_integer_key {
        String::new()
    } else {
        let keys: Vec<String> = shape.key_columns.iter().map(|k| q(k)).collect();
        format!(",\n    PRIMARY KEY ({})", keys.join(", "))
    };
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\n{}{key}\n);",
        q(table),
        definitions.join(",\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_with_a_column_left_out() {
        let shape = ClientTable {
            columns: vec![
                ("film_id".into(), "INTEGER"),
                ("title".into(), "TEXT"),
                ("fulltext".into(), "TEXT"),
            ],
            key_columns: vec!["film_id".into()],
        };
        assert_eq!(
            create_table("film", &["film_id".into(), "title".into()], &shape),
            "CREATE TABLE IF NOT EXISTS \"film\" (\n    \"film_id\" INTEGER PRIMARY KEY,\n    \"title\" TEXT\n);"
        );
    }
}

//! `rowsync init`: makes an existing table synchronizable, or brings its scripts up to
//! date after its columns changed (docs/schema-changes.md).

use anyhow::Result;
use rowsync_cli::database::{Database, DatabaseArg, OnBackend};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, InitOutcome, TableInit};

#[derive(clap::Args)]
pub struct InitArgs {
    #[command(flatten)]
    database: DatabaseArg,
    /// The table to synchronize: it must exist, with a primary key.
    #[arg(long)]
    table: String,
    /// Rows whose value in this column equals a user's name belong to that user.
    #[arg(long)]
    partition_column: String,
    /// The script version to write the table's default scripts into. Default: `v1` on a
    /// fresh database; else the newest version, unless clients use it and the table
    /// changed in it (or is new to it): then a new version named after it (`v1` → `v2`)
    /// that starts as its copy.
    #[arg(long)]
    script_version: Option<String>,
    /// When the script version does not exist yet, it starts as a copy of this one
    /// (every table's scripts and the connection events).
    #[arg(long)]
    based_on: Option<String>,
    /// Make the SQLite file --db names when it does not exist (without it, a missing file
    /// is refused as a typo). A file made here is removed again if init fails.
    #[arg(long)]
    create: bool,
}

pub async fn run(args: InitArgs) -> Result<()> {
    if !args.create {
        return args.database.database()?.run(args).await;
    }
    let database = args.database.database_or_new()?;
    let made = match &database {
        Database::Sqlite(path) if !path.exists() => Some(path.clone()),
        _ => None,
    };
    let ran = database.run(args).await;
    if let (Err(_), Some(path)) = (&ran, made) {
        // Nothing half-made is left behind (with SQLite's journal files, if any).
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut file = path.clone().into_os_string();
            file.push(suffix);
            let _ = std::fs::remove_file(file);
        }
    }
    ran
}

impl OnBackend for InitArgs {
    type Output = ();
    async fn run<B: Consolidated>(self, backend: B) -> Result<()> {
        let mut connection = backend.connect().await?;
        connection.install_system_tables().await?;
        let outcome = connection
            .init_table(&TableInit {
                table: self.table.clone(),
                partition_column: self.partition_column,
                script_version: self.script_version,
                based_on: self.based_on,
            })
            .await?;
        print!("{}", describe(&self.table, &outcome));
        Ok(())
    }
}

/// What `init` did, one line per fact.
fn describe(table: &str, outcome: &InitOutcome) -> String {
    let version = &outcome.script_version;
    let mut text = match (&outcome.created, &outcome.based_on) {
        (true, Some(base)) => format!("script version {version} created as a copy of {base}\n"),
        (true, None) => format!("script version {version} created\n"),
        (false, _) => String::new(),
    };
    text.push_str(&format!(
        "table {table} is synchronized by script version {version}\n"
    ));
    for (old, dropped) in &outcome.rewritten {
        text.push_str(&format!(
            "script version {old}: default scripts of {table} rewritten without dropped columns {}\n",
            dropped.join(", ")
        ));
    }
    for (old, event) in &outcome.left_alone {
        text.push_str(&format!(
            "warning: script version {old}: the {event} script of {table} is not the default and may name a dropped column; change it with `rowsync script set`\n"
        ));
    }
    text
}

//! `rowsync script`: lists, shows, stores and removes the scripts of script versions.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use rowsync_cli::database::{DatabaseArg, OnBackend};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, ScriptEntry};

#[derive(clap::Args)]
pub struct ScriptKey {
    #[command(flatten)]
    database: DatabaseArg,
    /// The script version the script belongs to (`rowsync version list`).
    #[arg(long)]
    version: String,
    /// The table of a table event; none for connection events.
    #[arg(long, default_value = "")]
    table: String,
    /// The event the script runs at: upload_insert, download_cursor, authenticate_user,
    /// ... (docs/scripts.md).
    #[arg(long)]
    event: String,
}

#[derive(clap::Subcommand)]
pub enum ScriptCommand {
    /// List the scripts of one version (or of all).
    List {
        #[command(flatten)]
        database: DatabaseArg,
        /// Only this script version's scripts.
        #[arg(long)]
        version: Option<String>,
    },
    /// Print one script.
    Show {
        #[command(flatten)]
        key: ScriptKey,
    },
    /// Store a script, read from --file or from standard input.
    Set {
        #[command(flatten)]
        key: ScriptKey,
        /// The file holding the script's SQL (default: standard input).
        #[arg(long)]
        file: Option<PathBuf>,
    },
    /// Remove a script.
    Remove {
        #[command(flatten)]
        key: ScriptKey,
    },
}

pub async fn run(command: ScriptCommand) -> Result<()> {
    let database = match &command {
        ScriptCommand::List { database, .. } => database,
        ScriptCommand::Show { key }
        | ScriptCommand::Set { key, .. }
        | ScriptCommand::Remove { key } => &key.database,
    };
    database.database()?.run(command).await
}

impl OnBackend for ScriptCommand {
    type Output = ();
    async fn run<B: Consolidated>(self, backend: B) -> Result<()> {
        let mut connection = backend.connect().await?;
        connection.install_system_tables().await?;
        match self {
            ScriptCommand::List { version, .. } => list(&mut connection, version).await,
            ScriptCommand::Show { key } => show(&mut connection, &key).await,
            ScriptCommand::Set { key, file } => set(&mut connection, &key, file).await,
            ScriptCommand::Remove { key } => remove(&mut connection, &key).await,
        }
    }
}

async fn list<C: ConsolidatedConnection>(
    connection: &mut C,
    version: Option<String>,
) -> Result<()> {
    for entry in connection.scripts(version.as_deref()).await? {
        let table = if entry.table.is_empty() {
            "(connection)"
        } else {
            entry.table.as_str()
        };
        let first_line = entry.script.lines().next().unwrap_or("");
        println!(
            "{}\t{table}\t{}\t{first_line}",
            entry.script_version, entry.event
        );
    }
    Ok(())
}

async fn show<C: ConsolidatedConnection>(connection: &mut C, key: &ScriptKey) -> Result<()> {
    let found = connection
        .scripts(Some(&key.version))
        .await?
        .into_iter()
        .find(|entry| entry.table == key.table && entry.event == key.event);
    match found {
        Some(entry) => println!("{}", entry.script),
        None => bail!(
            "script version {:?} has no {} script{}",
            key.version,
            key.event,
            table_suffix(&key.table)
        ),
    }
    Ok(())
}

async fn set<C: ConsolidatedConnection>(
    connection: &mut C,
    key: &ScriptKey,
    file: Option<PathBuf>,
) -> Result<()> {
    rowsync_consolidated::scripts::check_event(&key.table, &key.event)
        .map_err(anyhow::Error::msg)?;
    let script = match file {
        Some(path) => {
            std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?
        }
        None => {
            let mut input = String::new();
            std::io::stdin()
                .read_to_string(&mut input)
                .context("reading the script from stdin")?;
            input
        }
    };
    let script = script.trim().to_string();
    if script.is_empty() {
        bail!("the script is empty");
    }
    connection
        .set_script(&ScriptEntry {
            script_version: key.version.clone(),
            table: key.table.clone(),
            event: key.event.clone(),
            script,
        })
        .await?;
    println!(
        "{} script{} of version {} saved",
        key.event,
        table_suffix(&key.table),
        key.version
    );
    Ok(())
}

async fn remove<C: ConsolidatedConnection>(connection: &mut C, key: &ScriptKey) -> Result<()> {
    if !connection
        .remove_script(&key.version, &key.table, &key.event)
        .await?
    {
        bail!(
            "script version {:?} has no {} script{}",
            key.version,
            key.event,
            table_suffix(&key.table)
        );
    }
    println!("{} script{} removed", key.event, table_suffix(&key.table));
    Ok(())
}

fn table_suffix(table: &str) -> String {
    if table.is_empty() {
        String::new()
    } else {
        format!(" for table {table}")
    }
}

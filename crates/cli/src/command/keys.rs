//! `rowsync keys`: key ranges for a table's rows made offline (docs/types.md, "Keys for
//! rows made offline"): the table's key space split between the clients and the
//! server, and the `key_range` script that hands clients their ranges.

use anyhow::{bail, Result};
use rowsync_cli::database::{DatabaseArg, OnBackend};
use rowsync_consolidated::scripts::UPLOAD_INSERT;
use rowsync_consolidated::{
    key_range_script, Consolidated, ConsolidatedConnection, KeyRangeInit, KeySpace,
    RANGE_KEYS_DEFAULT,
};

#[derive(clap::Args)]
pub struct KeysArgs {
    #[command(flatten)]
    database: DatabaseArg,
    /// The table whose rows clients insert offline (already set up with `rowsync init`).
    #[arg(long)]
    table: String,
    /// The integer key column the ranges are of. Default: the primary key, when it is
    /// one column.
    #[arg(long)]
    column: Option<String>,
    /// Keys in each range handed to a client. A client gets a new range at a sync when
    /// less than half of one is left.
    #[arg(long, default_value_t = RANGE_KEYS_DEFAULT)]
    range_keys: i64,
    /// The script version to write the `key_range` script into. Default: every version
    /// that synchronizes the table's inserts.
    #[arg(long)]
    script_version: Option<String>,
}

pub async fn run(args: KeysArgs) -> Result<()> {
    args.database.database()?.run(args).await
}

impl OnBackend for KeysArgs {
    type Output = ();
    async fn run<B: Consolidated>(self, backend: B) -> Result<()> {
        let mut connection = backend.connect().await?;
        connection.install_system_tables().await?;
        let versions = match self.script_version.clone() {
            Some(version) => vec![version],
            None => versions_inserting(&mut connection, &self.table).await?,
        };
        if versions.is_empty() {
            bail!(
                "no script version synchronizes inserts of table {:?}; run `rowsync init --table {}` first",
                self.table,
                self.table
            );
        }
        let mut init = KeyRangeInit {
            table: self.table.clone(),
            column: self.column.clone(),
            script_version: String::new(),
            range_keys: self.range_keys,
        };
        let space = connection.init_key_ranges(&init).await?;
        for version in versions {
            init.script_version = version;
            connection.set_script(&key_range_script(&init)).await?;
            println!(
                "script version {}: key_range script of {} written ({} keys a range)",
                init.script_version, self.table, self.range_keys
            );
        }
        print!("{}", describe(&self.table, &space));
        Ok(())
    }
}

async fn versions_inserting<C: ConsolidatedConnection>(
    connection: &mut C,
    table: &str,
) -> Result<Vec<String>> {
    let mut versions: Vec<String> = connection
        .scripts(None)
        .await?
        .into_iter()
        .filter(|entry| entry.table == table && entry.event == UPLOAD_INSERT)
        .map(|entry| entry.script_version)
        .collect();
    versions.sort();
    versions.dedup();
    Ok(versions)
}

fn describe(table: &str, space: &KeySpace) -> String {
    let KeySpace {
        key_column,
        space_start,
        space_end,
        ..
    } = space;
    let mut text = format!(
        "table {table}: clients are handed keys of {key_column} from {space_start} to {} in ranges\n",
        space_end - 1
    );
    text.push_str(&match (&space.generator, space.existed) {
        (_, true) => format!("the split was made before; the server's keys start at {space_end}\n"),
        (Some(generator), false) => {
            format!("the server's {generator} now starts at {space_end}\n")
        }
        (None, false) => format!(
            "warning: nothing on the server generates keys of {key_column}: rows inserted on \
             the server must take keys from {space_end} up\n"
        ),
    });
    text
}

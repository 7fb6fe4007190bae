//! `rowsync rules`: a whole app's sync rules from one file (docs/rules.md): `check`
//! reads the file and compares it with the database, `apply` makes every table's
//! scripts from it.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use rowsync_cli::database::{DatabaseArg, OnBackend};
use rowsync_consolidated::rules::{GroupSource, Rule, RuleSet};
use rowsync_consolidated::{Consolidated, ConsolidatedConnection, TableInit};
use rowsync_protocol::Value;

#[derive(clap::Subcommand)]
pub enum RulesCommand {
    /// Read a rule file and compare it with the database: tables without a rule,
    /// rules naming missing tables.
    Check(RulesArgs),
    /// Make every table of a rule file synchronizable by its rule: change tracking and
    /// the scripts of the given script version.
    Apply(RulesArgs),
}

#[derive(clap::Args)]
pub struct RulesArgs {
    #[command(flatten)]
    database: DatabaseArg,
    /// The rule file (TOML, docs/rules.md).
    #[arg(long, value_name = "FILE")]
    file: PathBuf,
    /// The script version the scripts are written into (created when missing).
    #[arg(long, default_value = "v1")]
    script_version: String,
}

struct Run {
    args: RulesArgs,
    apply: bool,
    rules: RuleSet,
}

pub async fn run(command: RulesCommand) -> Result<()> {
    let (args, apply) = match command {
        RulesCommand::Check(args) => (args, false),
        RulesCommand::Apply(args) => (args, true),
    };
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading the rule file {}", args.file.display()))?;
    let rules = RuleSet::parse(&text)
        .with_context(|| format!("in the rule file {}", args.file.display()))?;
    let database = args.database.database()?;
    database.run(Run { args, apply, rules }).await
}

impl OnBackend for Run {
    type Output = ();
    async fn run<B: Consolidated>(self, backend: B) -> Result<()> {
        let mut connection = backend.connect().await?;
        connection.install_system_tables().await?;
        let synchronized = synchronized_tables(&mut connection).await?;
        let mut report = check(&self.rules, &synchronized);
        report.push_str(&advise_indexes(&mut connection, &self.rules).await?);
        print!("{report}");
        if !self.apply {
            return Ok(());
        }
        if self.rules.tables.is_empty() {
            bail!("the rule file declares no table; add a [tables.NAME] section");
        }
        for table in self.rules.tables.keys() {
            let init = TableInit::new(table, "", &self.args.script_version);
            connection
                .init_rule_table(&init, &self.rules)
                .await
                .with_context(|| format!("applying the rule of table {table:?}"))?;
            let rule = &self.rules.tables[table].rule;
            println!(
                "table {table} is synchronized by script version {} (rule {})",
                self.args.script_version,
                rule.kind()
            );
        }
        Ok(())
    }
}

/// Every table some script version synchronizes.
async fn synchronized_tables(connection: &mut impl ConsolidatedConnection) -> Result<Vec<String>> {
    let rows = connection
        .query_sql("SELECT table_name FROM rs_table ORDER BY table_name")
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|row| match row.into_iter().next() {
            Some(Value::Text(name)) => Some(name),
            _ => None,
        })
        .collect())
}

/// What the rule file says of each table, and what it leaves unsaid.
fn check(rules: &RuleSet, synchronized: &[String]) -> String {
    let mut report = String::new();
    for (table, rule) in &rules.tables {
        let how = match &rule.rule {
            Rule::Owner { column } => format!("rows whose {column} is the user's name"),
            Rule::Shared { writers } if writers.is_empty() => "every row; nobody uploads".into(),
            Rule::Shared { writers } => format!("every row; uploads by {}", writers.join(", ")),
            Rule::Group { column, group } => format!("rows whose {column} is a group of {group}"),
            Rule::Parent { parent, .. } => format!("the rows of its {parent} rows"),
        };
        report.push_str(&format!("{table}: {how}\n"));
    }
    for (name, source) in &rules.groups {
        if let GroupSource::Table { table, .. } = source {
            report.push_str(&format!(
                "group {name}: read from {table} at every sync (it needs no tracking)\n"
            ));
        }
    }
    for table in synchronized {
        if !rules.tables.contains_key(table) {
            report.push_str(&format!(
                "warning: table {table} is synchronized but has no rule; its scripts stay as they are\n"
            ));
        }
    }
    report
}

/// The indexes a rule's joins want and the database lacks: the columns of a `parent`
/// table holding its parent's key, and the user column of a group table.
async fn advise_indexes(
    connection: &mut impl ConsolidatedConnection,
    rules: &RuleSet,
) -> Result<String> {
    let mut wanted: Vec<(String, Vec<String>, String)> = Vec::new();
    for (table, rule) in &rules.tables {
        if let Rule::Parent { parent, via } = &rule.rule {
            let via = match via.is_empty() {
                false => via.clone(),
                true => match connection.client_columns(parent).await? {
                    Some(shape) => shape.key_columns,
                    None => continue,
                },
            };
            wanted.push((
                table.clone(),
                via,
                format!("its {parent} rows are found by them"),
            ));
        }
    }
    for (name, source) in &rules.groups {
        if let GroupSource::Table {
            table, user_column, ..
        } = source
        {
            let why = format!("group {name} reads a user's rows by it at every sync");
            wanted.push((table.clone(), vec![user_column.clone()], why));
        }
    }
    let mut advice = String::new();
    for (table, columns, why) in wanted {
        let indexes = connection.index_columns(&table).await?;
        if indexes.iter().any(|index| index.starts_with(&columns)) {
            continue;
        }
        let (list, index) = (columns.join(", "), columns.join("_"));
        advice.push_str(&format!(
            "warning: no index of {table} starts with ({list}), and {why}: CREATE INDEX {table}_{index} ON {table} ({list})\n",
        ));
    }
    Ok(advice)
}

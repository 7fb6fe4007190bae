//! Sync rules: which rows of each table a user's clients download and may write,
//! declared per table in a rule file (`docs/rules.md`) and turned into each backend's
//! scripts (`rowsync rules apply`). One model, one set of scope predicates
//! ([`scope`]); each backend only says how its SQL casts and how it tells a row
//! changed since the client's last download ([`scope::RuleSql`]).
//!
//! Rule kinds:
//! - `owner`: a column holds the user's name (what `rowsync init` does);
//! - `shared`: every user downloads every row; only `writers` may upload;
//! - `group`: a column holds a group value, and a `[groups.NAME]` source says which
//!   groups a user belongs to: a table (a membership table, many-to-many, or a user
//!   mapping, one row per user) or an SQL query returning the values;
//! - `parent`: a row follows the rule of the row its foreign key points to,
//!   transitively.

pub mod scope;

use std::collections::BTreeMap;

use serde::Deserialize;

/// A rule file that cannot be used, with what to change.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    #[error("the rule file is not valid TOML: {0}")]
    Syntax(String),
    #[error("table {table:?}: {problem}")]
    Table { table: String, problem: String },
    #[error("group {group:?}: {problem}")]
    Group { group: String, problem: String },
}

fn table_error(table: &str, problem: impl Into<String>) -> RuleError {
    RuleError::Table {
        table: table.to_string(),
        problem: problem.into(),
    }
}

/// Which groups a user belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupSource {
    /// `SELECT group_column FROM table WHERE user_column = :user`: a membership table
    /// (several rows per user) or a user mapping (one).
    Table {
        table: String,
        user_column: String,
        group_column: String,
    },
    /// A query returning the group values of `:user` in its first column.
    Sql(String),
}

/// How a table's rows reach users.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// The column holds the user's name.
    Owner { column: String },
    /// Everyone downloads every row; only these users may upload.
    Shared { writers: Vec<String> },
    /// The column holds a group value; users of the named group source see the row.
    Group { column: String, group: String },
    /// The row follows the row of `parent` whose primary key equals `via` (the child's
    /// columns, in the order of the parent's key).
    Parent { parent: String, via: Vec<String> },
}

impl Rule {
    /// The rule's name in a rule file.
    pub fn kind(&self) -> &'static str {
        match self {
            Rule::Owner { .. } => "owner",
            Rule::Shared { .. } => "shared",
            Rule::Group { .. } => "group",
            Rule::Parent { .. } => "parent",
        }
    }
}

/// One table's rule and the columns it synchronizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRule {
    pub rule: Rule,
    /// Only these columns (in the table's order); `None`: all but `exclude_columns`.
    pub columns: Option<Vec<String>>,
    pub exclude_columns: Vec<String>,
}

impl TableRule {
    /// Whether a column of the table is synchronized.
    pub fn includes(&self, column: &str) -> bool {
        let listed = self
            .columns
            .as_ref()
            .is_none_or(|columns| columns.iter().any(|c| c == column));
        listed && !self.exclude_columns.iter().any(|c| c == column)
    }
}

/// The positions of the columns a rule synchronizes among `columns` (a table's, in
/// order); refuses a rule that leaves out a key column or names a column the table
/// lacks.
pub fn kept_columns(
    table: &str,
    columns: &[String],
    keys: &[String],
    rule: &TableRule,
) -> Result<Vec<usize>, RuleError> {
    for listed in rule.columns.iter().flatten().chain(&rule.exclude_columns) {
        if !columns.contains(listed) {
            return Err(table_error(
                table,
                format!(
                    "has no column {listed:?} (its columns: {})",
                    columns.join(", ")
                ),
            ));
        }
    }
    if let Some(key) = keys.iter().find(|key| !rule.includes(key)) {
        return Err(table_error(
            table,
            format!("the rule leaves out key column {key:?}; rowsync identifies rows by their primary key"),
        ));
    }
    Ok((0..columns.len())
        .filter(|&index| rule.includes(&columns[index]))
        .collect())
}

/// A whole app's rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleSet {
    pub groups: BTreeMap<String, GroupSource>,
    pub tables: BTreeMap<String, TableRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    groups: BTreeMap<String, RawGroup>,
    #[serde(default)]
    tables: BTreeMap<String, RawTable>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGroup {
    table: Option<String>,
    user_column: Option<String>,
    group_column: Option<String>,
    sql: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    rule: String,
    column: Option<String>,
    group: Option<String>,
    parent: Option<String>,
    via: Option<Vec<String>>,
    #[serde(default)]
    writers: Vec<String>,
    columns: Option<Vec<String>>,
    #[serde(default)]
    exclude_columns: Vec<String>,
}

impl RuleSet {
    /// Reads a rule file (TOML, `docs/rules.md`); checks what needs no database.
    pub fn parse(text: &str) -> Result<RuleSet, RuleError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| RuleError::Syntax(e.to_string()))?;
        let mut rules = RuleSet::default();
        for (name, group) in raw.groups {
            rules
                .groups
                .insert(name.clone(), group_source(&name, group)?);
        }
        for (name, table) in raw.tables {
            let rule = table_rule(&name, table)?;
            rules.tables.insert(name, rule);
        }
        rules.check_references()?;
        Ok(rules)
    }

    /// Every `group` names a group source, every `parent` a table with a rule, and no
    /// parent chain comes back to where it started.
    fn check_references(&self) -> Result<(), RuleError> {
        for (name, table) in &self.tables {
            match &table.rule {
                Rule::Group { group, .. } if !self.groups.contains_key(group) => {
                    return Err(table_error(
                        name,
                        format!(
                            "group {group:?} is not declared; add a [groups.{group}] section ({})",
                            known(self.groups.keys())
                        ),
                    ));
                }
                Rule::Parent { parent, .. } if !self.tables.contains_key(parent) => {
                    return Err(table_error(
                        name,
                        format!("parent {parent:?} has no rule; add a [tables.{parent}] section"),
                    ));
                }
                _ => {}
            }
            self.root_of(name)?;
        }
        Ok(())
    }

    /// The table at the end of `table`'s parent chain (itself when it has no parent).
    pub fn root_of<'a>(&'a self, table: &'a str) -> Result<&'a str, RuleError> {
        let mut current = table;
        for _ in 0..=self.tables.len() {
            match self.tables.get(current).map(|rule| &rule.rule) {
                Some(Rule::Parent { parent, .. }) => current = parent,
                _ => return Ok(current),
            }
        }
        Err(table_error(table, "its parent chain is a cycle"))
    }

    /// The rule of a table; an error naming the tables that have one.
    pub fn rule_of(&self, table: &str) -> Result<&TableRule, RuleError> {
        self.tables.get(table).ok_or_else(|| {
            table_error(
                table,
                format!("has no rule ({})", known(self.tables.keys())),
            )
        })
    }
}

impl RuleSet {
    /// `table` and the tables up its parent chain, child first.
    pub fn chain<'a>(&'a self, table: &'a str) -> Vec<&'a str> {
        let mut chain = vec![table];
        while let Some(Rule::Parent { parent, .. }) =
            self.tables.get(chain[chain.len() - 1]).map(|r| &r.rule)
        {
            if chain.contains(&parent.as_str()) {
                break;
            }
            chain.push(parent);
        }
        chain
    }
}

/// One table's rule with what its scripts are made from: the rule set, the keys of the
/// tables its rule reaches, and the backend's SQL (`scope::RuleSql`).
pub struct Ruled<S> {
    pub rules: RuleSet,
    pub table: String,
    pub keys: std::collections::BTreeMap<String, Vec<String>>,
    pub sql: S,
    /// The column tombstones are partitioned by (`rs_table.partition_column`).
    pub tracking_column: String,
}

impl<S: scope::RuleSql> Ruled<S> {
    pub fn new(
        rules: &RuleSet,
        table: &str,
        keys: std::collections::BTreeMap<String, Vec<String>>,
        sql: S,
    ) -> Result<Ruled<S>, RuleError> {
        rules.rule_of(table)?;
        let mut ruled = Ruled {
            rules: rules.clone(),
            table: table.to_string(),
            keys,
            sql,
            tracking_column: String::new(),
        };
        ruled.tracking_column = ruled.scope().tracking_column(table)?;
        Ok(ruled)
    }

    pub fn scope(&self) -> scope::Scope<'_> {
        scope::Scope {
            rules: &self.rules,
            keys: &self.keys,
            sql: &self.sql,
        }
    }

    pub fn rule(&self) -> &TableRule {
        &self.rules.tables[&self.table]
    }

    /// An `owner` rule: the default scripts of `init --partition-column`.
    pub fn is_owner(&self) -> bool {
        matches!(self.rule().rule, Rule::Owner { .. })
    }

    /// A `shared` or `parent` table: tracked by its first key column, its cursors find
    /// changed rows by their change stamp alone.
    pub fn by_change_stamp(&self) -> bool {
        matches!(self.rule().rule, Rule::Shared { .. } | Rule::Parent { .. })
    }
}

fn known<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let names: Vec<&str> = names.map(String::as_str).collect();
    if names.is_empty() {
        "none is declared".into()
    } else {
        format!("declared: {}", names.join(", "))
    }
}

fn group_source(name: &str, raw: RawGroup) -> Result<GroupSource, RuleError> {
    let problem = |problem: &str| RuleError::Group {
        group: name.to_string(),
        problem: problem.to_string(),
    };
    match raw {
        RawGroup {
            sql: Some(sql),
            table: None,
            user_column: None,
            group_column: None,
        } => Ok(GroupSource::Sql(sql)),
        RawGroup {
            sql: None,
            table: Some(table),
            user_column: Some(user_column),
            group_column: Some(group_column),
        } => Ok(GroupSource::Table {
            table,
            user_column,
            group_column,
        }),
        RawGroup { sql: Some(_), .. } => Err(problem(
            "give either `sql` or `table`, `user_column` and `group_column`, not both",
        )),
        _ => Err(problem(
            "give `table`, `user_column` and `group_column` (the table saying which users belong to which groups), or `sql` (a query returning the groups of :user)",
        )),
    }
}

fn table_rule(name: &str, raw: RawTable) -> Result<TableRule, RuleError> {
    let needs = |field: Option<String>, what: &str| {
        field.ok_or_else(|| table_error(name, format!("rule {:?} needs `{what}`", raw.rule)))
    };
    let rule = match raw.rule.as_str() {
        "owner" => Rule::Owner {
            column: needs(raw.column.clone(), "column")?,
        },
        "shared" => Rule::Shared {
            writers: raw.writers.clone(),
        },
        "group" => Rule::Group {
            column: needs(raw.column.clone(), "column")?,
            group: needs(raw.group.clone(), "group")?,
        },
        "parent" => Rule::Parent {
            parent: needs(raw.parent.clone(), "parent")?,
            via: raw.via.clone().unwrap_or_default(),
        },
        other => {
            return Err(table_error(
                name,
                format!("unknown rule {other:?}; rules are owner, shared, group, parent"),
            ))
        }
    };
    if !raw.writers.is_empty() && !matches!(rule, Rule::Shared { .. }) {
        return Err(table_error(
            name,
            "`writers` belongs to rule \"shared\"; other rules let a user write the rows it sees",
        ));
    }
    if raw.columns.is_some() && !raw.exclude_columns.is_empty() {
        return Err(table_error(
            name,
            "give `columns` or `exclude_columns`, not both",
        ));
    }
    Ok(TableRule {
        rule,
        columns: raw.columns,
        exclude_columns: raw.exclude_columns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STORE_CHAIN: &str = r#"
[groups.store]
table = "staff"
user_column = "username"
group_column = "store_id"

[tables.customer]
rule = "group"
column = "store_id"
group = "store"

[tables.rental]
rule = "parent"
parent = "customer"

[tables.film]
rule = "shared"
writers = ["office"]
exclude_columns = ["fulltext"]
"#;

    #[test]
    fn a_store_chain_parses() {
        let rules = RuleSet::parse(STORE_CHAIN).unwrap();
        assert_eq!(rules.root_of("rental").unwrap(), "customer");
        assert_eq!(rules.chain("rental"), ["rental", "customer"]);
        assert!(!rules.tables["film"].includes("fulltext"));
        assert!(rules.tables["film"].includes("title"));
        assert_eq!(
            rules.groups["store"],
            GroupSource::Table {
                table: "staff".into(),
                user_column: "username".into(),
                group_column: "store_id".into()
            }
        );
    }

    #[test]
    fn mistakes_are_named() {
        let error = |text: &str| RuleSet::parse(text).unwrap_err().to_string();
        assert_eq!(
            error("[tables.a]\nrule = \"group\"\ncolumn = \"g\"\ngroup = \"team\"\n"),
            "table \"a\": group \"team\" is not declared; add a [groups.team] section (none is declared)"
        );
        assert_eq!(
            error("[tables.a]\nrule = \"parent\"\nparent = \"b\"\n"),
            "table \"a\": parent \"b\" has no rule; add a [tables.b] section"
        );
        assert_eq!(
            error("[tables.a]\nrule = \"parent\"\nparent = \"b\"\n[tables.b]\nrule = \"parent\"\nparent = \"a\"\n"),
            "table \"a\": its parent chain is a cycle"
        );
        assert_eq!(
            error("[tables.a]\nrule = \"ownr\"\n"),
            "table \"a\": unknown rule \"ownr\"; rules are owner, shared, group, parent"
        );
        assert_eq!(
            error("[tables.a]\nrule = \"owner\"\n"),
            "table \"a\": rule \"owner\" needs `column`"
        );
        assert!(error("[tables.a]\nrule = \"owner\"\ncolum = \"x\"\n")
            .contains("unknown field `colum`"));
        assert_eq!(
            error("[groups.g]\ntable = \"t\"\n"),
            "group \"g\": give `table`, `user_column` and `group_column` (the table saying which users belong to which groups), or `sql` (a query returning the groups of :user)"
        );
    }
}

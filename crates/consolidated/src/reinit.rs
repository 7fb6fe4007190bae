//! `init` run again after a table's columns changed: which script version it writes
//! (and starts from), what it refuses, and which older versions' default scripts it
//! rewrites because they name a dropped column. Pure decisions: each backend reads the
//! facts, asks here, and writes the answer in its `init_table` transaction.
//!
//! The rule that keeps clients syncing: a version some client uses is never changed
//! in a way its clients cannot follow (other columns for a table, a table they lack).
//! New columns and new tables go into a new version; clients move to it when upgraded.
//! A dropped column cannot stay in any version, so the default scripts of the versions
//! that carried it are rewritten without it, and their clients' values for it are
//! ignored (see `driver::upload`).

use std::collections::HashMap;

use crate::shape::{Column, TableShape};
use crate::{DbError, TableInit};

/// A table's default scripts, by event.
pub type DefaultScripts = Vec<(&'static str, String)>;

/// The version `init` writes when none is given and none exists.
pub const FIRST_VERSION: &str = "v1";

/// What `init` reads of one script version before it writes.
#[derive(Debug, Clone)]
pub struct VersionFacts {
    pub name: String,
    /// Some client's last sync used it.
    pub in_use: bool,
    /// The version has scripts for the table.
    pub synchronizes_table: bool,
    /// The table's columns (in order) the version's default scripts were written for,
    /// dropped ones left out; `None` when `init` recorded none (scripts set by hand,
    /// or written before rowsync recorded columns).
    pub columns: Option<Vec<String>>,
}

impl VersionFacts {
    /// Whether the version's scripts for the table carry other columns than `current`
    /// (or no scripts at all for it); `None` when unknown.
    fn differs_from(&self, current: &[String]) -> Option<bool> {
        if !self.synchronizes_table {
            return Some(true);
        }
        self.columns.as_ref().map(|columns| columns != current)
    }
}

/// The version an `init` writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    /// It does not exist yet.
    pub create: bool,
    /// Copy this version's scripts into it first.
    pub based_on: Option<String>,
}

/// Chooses the version `init` writes; `versions` oldest first. A named version that
/// clients use is refused when the table differs in it; an unnamed one is derived: the
/// newest version if no client uses it or the table is the same in it, else a new
/// version named after it and starting as its copy.
pub fn choose_version(
    init: &TableInit,
    versions: &[VersionFacts],
    current: &[String],
) -> Result<Target, DbError> {
    let find = |name: &str| versions.iter().find(|version| version.name == name);
    let Some(name) = &init.script_version else {
        let Some(newest) = versions.last() else {
            return Ok(Target {
                name: FIRST_VERSION.into(),
                create: true,
                based_on: None,
            });
        };
        if !newest.in_use || newest.differs_from(current) == Some(false) {
            return Ok(Target {
                name: newest.name.clone(),
                create: false,
                based_on: None,
            });
        }
        return Ok(Target {
            name: next_version_name(&newest.name, |name| find(name).is_some()),
            create: true,
            based_on: Some(newest.name.clone()),
        });
    };
    if let Some(existing) = find(name) {
        if existing.in_use && existing.differs_from(current) == Some(true) {
            let next = next_version_name(name, |name| find(name).is_some());
            return Err(DbError::Invalid(format!(
                "script version {name:?} is in use by clients and {}; rewriting it would break \
                 them. Write the table into a new version: --script-version {next} --based-on {name}",
                describe_change(existing, &init.table, current)
            )));
        }
        return Ok(Target {
            name: name.clone(),
            create: false,
            based_on: None,
        });
    }
    if let Some(base) = &init.based_on {
        if find(base).is_none() {
            return Err(DbError::Invalid(format!(
                "script version {base:?}, to base {name:?} on, does not exist"
            )));
        }
    }
    Ok(Target {
        name: name.clone(),
        create: true,
        based_on: init.based_on.clone(),
    })
}

fn describe_change(version: &VersionFacts, table: &str, current: &[String]) -> String {
    let recorded = version.columns.as_deref().unwrap_or_default();
    if !version.synchronizes_table {
        return format!("does not synchronize table {table:?}, which its clients lack");
    }
    let added: Vec<&String> = current.iter().filter(|c| !recorded.contains(c)).collect();
    let dropped: Vec<&String> = recorded.iter().filter(|c| !current.contains(c)).collect();
    format!("table {table:?} changed since its scripts were written (columns added: {added:?}, dropped: {dropped:?})")
}

/// `v1` → `v2`, `release-09` → `release-10`, `beta` → `beta2`; the first name not taken.
pub fn next_version_name(name: &str, taken: impl Fn(&str) -> bool) -> String {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let mut number: u64 = name[stem.len()..].parse().unwrap_or(1);
    loop {
        number = number.saturating_add(1);
        let candidate = format!("{stem}{number}");
        if !taken(&candidate) || number == u64::MAX {
            return candidate;
        }
    }
}

/// An older version whose default scripts for the table name columns it no longer has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewrite {
    pub version: String,
    /// The columns its scripts were written for.
    pub recorded: Vec<String>,
    /// Those the table still has.
    pub remaining: Vec<String>,
    pub dropped: Vec<String>,
}

/// The versions other than `target` whose recorded columns for the table include
/// some it no longer has, as long as every key column remains.
pub fn dropped_column_rewrites(
    versions: &[VersionFacts],
    target: &str,
    shape: &TableShape,
) -> Vec<Rewrite> {
    versions
        .iter()
        .filter(|version| version.name != target)
        .filter_map(|version| {
            let recorded = version.columns.clone()?;
            let (remaining, dropped): (Vec<String>, Vec<String>) = recorded
                .iter()
                .cloned()
                .partition(|column| shape.has_column(column));
            let keys_remain = shape.key_columns.iter().all(|key| remaining.contains(key));
            (!dropped.is_empty() && keys_remain).then(|| Rewrite {
                version: version.name.clone(),
                recorded,
                remaining,
                dropped,
            })
        })
        .collect()
}

/// The table as a version's scripts see it: its key and the given columns.
pub fn shape_with_columns(shape: &TableShape, columns: &[String]) -> TableShape {
    TableShape {
        name: shape.name.clone(),
        columns: columns
            .iter()
            .map(|name| Column { name: name.clone() })
            .collect(),
        key_columns: shape.key_columns.clone(),
    }
}

/// A version's default scripts for the columns it recorded and for those the table
/// still has: what a rewrite compares the stored scripts with, and what it writes.
pub struct RewriteDefaults {
    pub recorded: DefaultScripts,
    pub remaining: DefaultScripts,
}

impl RewriteDefaults {
    /// The defaults `scripts_for` writes for each of the rewrite's two column lists.
    pub fn of(
        rewrite: &Rewrite,
        shape: &TableShape,
        scripts_for: impl Fn(&TableShape) -> DefaultScripts,
    ) -> RewriteDefaults {
        RewriteDefaults {
            recorded: scripts_for(&shape_with_columns(shape, &rewrite.recorded)),
            remaining: scripts_for(&shape_with_columns(shape, &rewrite.remaining)),
        }
    }
}

/// The scripts to write for a rewrite: each stored script that is exactly the default
/// for the recorded columns becomes the default for the remaining ones; the others
/// (changed by hand) are returned as left alone.
pub fn rewritten_scripts(
    stored: &HashMap<String, String>,
    recorded_defaults: Vec<(&'static str, String)>,
    remaining_defaults: Vec<(&'static str, String)>,
) -> (Vec<(&'static str, String)>, Vec<String>) {
    let remaining: HashMap<&str, String> = remaining_defaults.into_iter().collect();
    let mut write = Vec::new();
    let mut left_alone = Vec::new();
    for (event, recorded) in recorded_defaults {
        match (stored.get(event), remaining.get(event)) {
            (Some(script), Some(new)) if *script == recorded => write.push((event, new.clone())),
            (Some(script), _) if *script != recorded => left_alone.push(event.to_string()),
            _ => {}
        }
    }
    (write, left_alone)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(name: &str, in_use: bool, columns: Option<&[&str]>) -> VersionFacts {
        VersionFacts {
            name: name.into(),
            in_use,
            synchronizes_table: columns.is_some(),
            columns: columns.map(|c| c.iter().map(|c| c.to_string()).collect()),
        }
    }

    fn init(version: Option<&str>, based_on: Option<&str>) -> TableInit {
        TableInit {
            table: "notes".into(),
            partition_column: "owner".into(),
            script_version: version.map(Into::into),
            based_on: based_on.map(Into::into),
        }
    }

    fn columns(names: &[&str]) -> Vec<String> {
        names.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn a_derived_version_is_new_only_when_clients_use_a_changed_one() {
        let now = columns(&["id", "owner", "body", "due"]);
        let target = |versions: &[VersionFacts]| choose_version(&init(None, None), versions, &now);
        assert_eq!(target(&[]).unwrap().name, "v1");
        let unused = [facts("v1", false, Some(&["id", "owner", "body"]))];
        assert_eq!(target(&unused).unwrap().name, "v1");
        let same = [facts("v1", true, Some(&["id", "owner", "body", "due"]))];
        assert!(!target(&same).unwrap().create);
        let changed = [facts("v1", true, Some(&["id", "owner", "body"]))];
        assert_eq!(
            target(&changed).unwrap(),
            Target {
                name: "v2".into(),
                create: true,
                based_on: Some("v1".into())
            }
        );
        let new_table = [facts("v7", true, None)];
        assert_eq!(target(&new_table).unwrap().name, "v8");
    }

    #[test]
    fn a_named_version_in_use_is_refused_when_the_table_differs_in_it() {
        let now = columns(&["id", "owner", "body", "due"]);
        let versions = [facts("v1", true, Some(&["id", "owner", "body"]))];
        let refused = choose_version(&init(Some("v1"), None), &versions, &now)
            .unwrap_err()
            .to_string();
        assert!(refused.contains("added: [\"due\"]"), "{refused}");
        assert!(
            refused.contains("--script-version v2 --based-on v1"),
            "{refused}"
        );
        let missing_base = choose_version(&init(Some("v2"), Some("v0")), &versions, &now);
        assert!(missing_base.unwrap_err().to_string().contains("\"v0\""));
        let created = choose_version(&init(Some("v2"), Some("v1")), &versions, &now).unwrap();
        assert!(created.create);
    }

    #[test]
    fn version_names_count_up_past_taken_ones() {
        assert_eq!(next_version_name("v1", |_| false), "v2");
        assert_eq!(next_version_name("release-09", |_| false), "release-10");
        assert_eq!(next_version_name("beta", |_| false), "beta2");
        assert_eq!(next_version_name("v1", |name| name == "v2"), "v3");
    }

    #[test]
    fn only_default_scripts_are_rewritten() {
        let stored: HashMap<String, String> = [
            ("upload_insert".to_string(), "old insert".to_string()),
            ("download_cursor".to_string(), "custom cursor".to_string()),
        ]
        .into();
        let (write, left) = rewritten_scripts(
            &stored,
            vec![
                ("upload_insert", "old insert".into()),
                ("download_cursor", "old cursor".into()),
            ],
            vec![
                ("upload_insert", "new insert".into()),
                ("download_cursor", "new cursor".into()),
            ],
        );
        assert_eq!(write, vec![("upload_insert", "new insert".to_string())]);
        assert_eq!(left, vec!["download_cursor".to_string()]);
    }
}

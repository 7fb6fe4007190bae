//! The scripts of a script version, and each connection's cache of them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rowsync_protocol::{Row, Value};

use crate::scripts::*;
use crate::SyncError;

/// What a query script returned: its column names and its rows.
pub type ScriptRows = (Vec<String>, Vec<Row>);

/// One connection's scripts by version, valid while the version's revision (bumped by a
/// trigger on every change of `rs_script`) stays the same. Also remembers the versions
/// whose `begin_connection` ran on this connection.
#[derive(Default)]
pub struct ScriptCache {
    versions: HashMap<String, (i64, Arc<Scripts>)>,
    connected: HashSet<String>,
}

impl ScriptCache {
    pub fn get(&self, version: &str, revision: i64) -> Option<Arc<Scripts>> {
        self.versions
            .get(version)
            .filter(|(cached, _)| *cached == revision)
            .map(|(_, scripts)| Arc::clone(scripts))
    }

    /// The scripts cached for `version` whatever their revision, with that revision: a
    /// backend that checks the revision inside the sync's transaction starts with them.
    pub fn latest(&self, version: &str) -> Option<(Arc<Scripts>, i64)> {
        self.versions
            .get(version)
            .map(|(revision, scripts)| (Arc::clone(scripts), *revision))
    }

    pub fn insert(&mut self, version: &str, revision: i64, scripts: Scripts) -> Arc<Scripts> {
        let scripts = Arc::new(scripts);
        self.versions
            .insert(version.to_string(), (revision, Arc::clone(&scripts)));
        scripts
    }

    /// Whether `begin_connection` of `version` ran on this connection.
    pub fn is_connected(&self, version: &str) -> bool {
        self.connected.contains(version)
    }

    pub fn mark_connected(&mut self, version: &str) {
        self.connected.insert(version.to_string());
    }
}

/// The scripts of one script version, by (table, event).
pub struct Scripts {
    pub version: String,
    by_table_event: HashMap<(String, String), String>,
}

impl Scripts {
    pub fn new(
        version: &str,
        scripts: impl IntoIterator<Item = ((String, String), String)>,
    ) -> Scripts {
        Scripts {
            version: version.to_string(),
            by_table_event: scripts.into_iter().collect(),
        }
    }

    /// A connection event's script.
    pub fn connection_event(&self, event: &str) -> Option<&str> {
        self.get("", event)
    }

    pub fn get(&self, table: &str, event: &str) -> Option<&str> {
        self.by_table_event
            .get(&(table.to_string(), event.to_string()))
            .map(String::as_str)
    }

    pub fn require(&self, table: &str, event: &str) -> Result<&str, SyncError> {
        self.get(table, event).ok_or_else(|| {
            SyncError::Schema(format!(
                "script version {:?} has no {event} script for table {table:?}",
                self.version
            ))
        })
    }

    /// The script with its placeholders replaced by scratch table names.
    pub fn expand(
        &self,
        table: &str,
        event: &str,
        substitutions: &[(&str, &str)],
    ) -> Result<String, SyncError> {
        let mut sql = self.require(table, event)?.to_string();
        for (placeholder, replacement) in substitutions {
            sql = sql.replace(placeholder, replacement);
        }
        Ok(sql)
    }

    pub fn check_synchronizes(&self, table: &str) -> Result<(), SyncError> {
        if !table.is_empty() && self.by_table_event.keys().any(|(name, _)| name == table) {
            Ok(())
        } else {
            Err(SyncError::Schema(format!(
                "table {table:?} is not synchronized by script version {:?}",
                self.version
            )))
        }
    }

    pub fn download_tables(&self) -> Vec<&str> {
        self.tables_with(&[DOWNLOAD_CURSOR, DOWNLOAD_DELETE_CURSOR])
    }

    /// The tables with a script for one of `events`, sorted, each once.
    pub fn tables_with(&self, events: &[&str]) -> Vec<&str> {
        let mut tables: Vec<&str> = self
            .by_table_event
            .keys()
            .filter(|(table, event)| !table.is_empty() && events.contains(&event.as_str()))
            .map(|(table, _)| table.as_str())
            .collect();
        tables.sort_unstable();
        tables.dedup();
        tables
    }
}

/// The first value of a query script's first row as an integer (a status, an action,
/// a watermark); `None` when it returned no row.
pub fn single_integer(rows: Option<ScriptRows>, event: &str) -> Result<Option<i64>, SyncError> {
    let Some((_, rows)) = rows else {
        return Ok(None);
    };
    match rows.first().and_then(|row| row.first()) {
        None => Ok(None),
        Some(Value::Int(value)) => Ok(Some(*value)),
        Some(Value::Decimal(decimal)) if decimal.scale == 0 => {
            i64::try_from(decimal.mantissa).map(Some).map_err(|_| {
                SyncError::script(event, "", "the script returned an integer out of range")
            })
        }
        Some(other) => Err(SyncError::script(
            event,
            "",
            format!("the script must return an integer in its first column; it returned {other:?}"),
        )),
    }
}

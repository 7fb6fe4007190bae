//! Syncs of some tables (protocol v9): which tables a round covers (a subset the app
//! names, levels of priority first), and what its hello says of them.

use rowsync_protocol::{SyncTables, TableWatermark, TABLES_SINCE_VERSION};
use rusqlite::Connection;

use crate::{store, ClientError};

/// The tables of each round of one sync, in order: a round per priority level (each
/// level's tables within `subset`, empty levels left out), then one of `subset` (`None`:
/// every table); each round with the tables its tables reference (`with_parents`). Levels are skipped when the last download was of another script
/// version than `script_version`: a new version's first sync covers every table.
pub(crate) fn rounds(
    connection: &Connection,
    script_version: &str,
    subset: &[String],
    priorities: &[Vec<String>],
) -> Result<Vec<Option<Vec<String>>>, ClientError> {
    let changed_version = version_changed(connection, script_version)?;
    if changed_version && !subset.is_empty() {
        return Err(ClientError::Option(format!(
            "the last download was of another script version than {script_version:?}: \
             sync every table once with it before syncing some of them (leave the tables \
             option empty)"
        )));
    }
    let mut rounds = Vec::new();
    if !changed_version {
        for level in priorities {
            let tables: Vec<String> = level
                .iter()
                .filter(|table| subset.is_empty() || subset.contains(table))
                .cloned()
                .collect();
            if !tables.is_empty() {
                rounds.push(Some(store::with_parents(connection, &tables)?));
            }
        }
    }
    rounds.push(match subset.is_empty() {
        true => None,
        false => Some(store::with_parents(connection, subset)?),
    });
    Ok(rounds)
}

/// The last download applied was of another script version (none yet counts as the
/// same: nothing is downloaded to be replaced).
fn version_changed(connection: &Connection, script_version: &str) -> Result<bool, ClientError> {
    let state = store::state(connection)?;
    Ok(state
        .script_version
        .is_some_and(|last| last != script_version))
}

/// What a hello of `protocol_version` says of the tables a round covers (`tables`,
/// `None`: all), the client's watermark being `floor`: each table synced on its own
/// since the last round of every table has a watermark of its own. A new script
/// version's tables all start from `floor` (0).
pub(crate) fn hello_tables(
    connection: &Connection,
    protocol_version: u16,
    script_version: &str,
    tables: Option<&[String]>,
    floor: i64,
) -> Result<SyncTables, ClientError> {
    if protocol_version < TABLES_SINCE_VERSION {
        // An older server syncs every table from the floor: what a table synced on its
        // own since then has comes again, nothing is missed.
        return Ok(SyncTables::default());
    }
    let own = match version_changed(connection, script_version)? {
        true => Vec::new(),
        false => store::table_watermarks(connection)?,
    };
    let Some(tables) = tables else {
        return Ok(SyncTables {
            only_these: false,
            watermarks: own,
        });
    };
    let watermarks = tables
        .iter()
        .map(|table| TableWatermark {
            table: table.clone(),
            last_download: own
                .iter()
                .find(|named| named.table == *table)
                .map_or(floor, |named| named.last_download),
        })
        .collect();
    Ok(SyncTables {
        only_these: true,
        watermarks,
    })
}

//! The backend-neutral part of a sync: which scripts a version has, which named
//! parameters exist, checking an upload against a table, and turning conflicts and
//! cursor results into the download. Backends do the queries; this decides.

use std::collections::{HashMap, HashSet};

use rowsync_protocol::{encode_values, Download, Row, TableUpload, Value};

use crate::scripts::*;
use crate::{SyncError, SyncRequest};

/// What a query script returned: its column names and its rows.
pub type ScriptRows = (Vec<String>, Vec<Row>);

/// A column of a consolidated table.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
}

/// What rowsync needs to know of a consolidated table.
#[derive(Debug, Clone)]
pub struct TableShape {
    pub name: String,
    pub columns: Vec<Column>,
    /// Primary-key column names in key order.
    pub key_columns: Vec<String>,
}

impl TableShape {
    pub fn has_column(&self, name: &str) -> bool {
        self.columns.iter().any(|column| column.name == name)
    }
}

/// The values of the named parameters scripts may use.
pub struct Parameters<'a> {
    pub user: &'a str,
    pub client_id: &'a str,
    pub script_version: &'a str,
    pub last_download: i64,
    pub upload_sequence: i64,
    /// PostgreSQL: the transaction id of this client's previous sync when the client
    /// applied that sync's download (it then holds every row that sync wrote), else 0.
    pub last_sync_xid: i64,
}

impl<'a> Parameters<'a> {
    /// The parameters of a sync, checking that its upload sequence fits the database.
    pub fn for_request(request: &'a SyncRequest) -> Result<Parameters<'a>, SyncError> {
        let upload_sequence = i64::try_from(request.upload_sequence).map_err(|_| {
            SyncError::Schema(format!(
                "upload sequence {} is out of range",
                request.upload_sequence
            ))
        })?;
        Ok(Parameters {
            user: &request.user,
            client_id: &request.client_id,
            script_version: &request.script_version,
            last_download: request.last_download_watermark,
            upload_sequence,
            last_sync_xid: 0,
        })
    }

    /// The value of a named parameter (`user`, `:user`, `@user` and `$user` alike).
    pub fn value(&self, name: &str, table: &str, event: &str) -> Result<Value, SyncError> {
        Ok(match name.trim_start_matches([':', '@', '$']) {
            "user" => Value::Text(self.user.to_string()),
            "client_id" => Value::Text(self.client_id.to_string()),
            "script_version" => Value::Text(self.script_version.to_string()),
            "last_download" => Value::Int(self.last_download),
            "upload_sequence" => Value::Int(self.upload_sequence),
            "last_sync_xid" => Value::Int(self.last_sync_xid),
            _ => {
                let known = PARAMETERS
                    .iter()
                    .map(|(name, _)| format!(":{name}"))
                    .collect::<Vec<_>>();
                return Err(SyncError::Script {
                    event: event.to_string(),
                    table: table.to_string(),
                    message: format!(
                        "unknown parameter {name}; known parameters are {}",
                        known.join(", ")
                    ),
                });
            }
        })
    }
}

/// The upload sequence this client already had applied, from its subscription (owner,
/// sequence): a client id belongs to the first user that synced with it. Also refuses
/// an upload naming one table twice.
pub fn applied_sequence(
    request: &SyncRequest,
    subscription: Option<(String, i64)>,
) -> Result<i64, SyncError> {
    let mut tables = HashSet::new();
    for upload in &request.tables {
        if !tables.insert(upload.table.as_str()) {
            return Err(SyncError::Schema(format!(
                "table {:?} appears twice in one upload",
                upload.table
            )));
        }
    }
    match subscription {
        Some((owner, _)) if owner != request.user => Err(SyncError::ClientIdTaken {
            client_id: request.client_id.clone(),
        }),
        Some((_, sequence)) => Ok(sequence),
        None => Ok(0),
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

    /// The script with its placeholders replaced by staging table names.
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
        if self.by_table_event.keys().any(|(name, _)| name == table) {
            Ok(())
        } else {
            Err(SyncError::Schema(format!(
                "table {table:?} is not synchronized by script version {:?}",
                self.version
            )))
        }
    }

    pub fn download_tables(&self) -> Vec<&str> {
        let mut tables: Vec<&str> = self
            .by_table_event
            .keys()
            .filter(|(_, event)| event == DOWNLOAD_CURSOR || event == DOWNLOAD_DELETE_CURSOR)
            .map(|(table, _)| table.as_str())
            .collect();
        tables.sort_unstable();
        tables.dedup();
        tables
    }
}

/// What applying one table's upload means for its download.
#[derive(Default)]
pub struct Resolution {
    pub conflict_count: u64,
    /// Keys the client uploaded: rows it already holds as the server now does, unless
    /// they conflicted (conflicts are resolved below and always sent).
    pub uploaded_upsert_keys: HashSet<Vec<u8>>,
    pub uploaded_delete_keys: HashSet<Vec<u8>>,
    /// Current server rows for conflicting keys (server wins), and conflicting keys the
    /// client must drop because no row in its partition has them.
    pub conflict_columns: Vec<String>,
    pub conflict_upserts: Vec<Row>,
    pub conflict_deletes: Vec<Row>,
}

impl Resolution {
    /// Remembers every key the upload touched, to keep them out of the echo.
    pub fn record_upload(&mut self, upload: &TableUpload, key_positions: &[usize]) {
        for row in upload
            .inserts
            .iter()
            .chain(upload.updates.iter().map(|update| &update.new))
        {
            self.uploaded_upsert_keys
                .insert(key_bytes(row, key_positions));
        }
        let all: Vec<usize> = (0..upload.key_columns.len()).collect();
        for key in &upload.deletes {
            self.uploaded_delete_keys.insert(key_bytes(key, &all));
        }
    }

    /// Server wins: `rows` (with `columns`) are the current rows `upload_fetch` found for
    /// the conflicting keys; keys it did not find are sent as deletes.
    pub fn resolve(
        &mut self,
        shape: &TableShape,
        conflict_keys: Vec<Row>,
        columns: Vec<String>,
        rows: Vec<Row>,
    ) -> Result<(), SyncError> {
        self.conflict_count = conflict_keys.len() as u64;
        let key_positions =
            key_positions_in(&columns, &shape.key_columns, &shape.name, UPLOAD_FETCH)?;
        let found: HashSet<Vec<u8>> = rows
            .iter()
            .map(|row| key_bytes(row, &key_positions))
            .collect();
        let all: Vec<usize> = (0..shape.key_columns.len()).collect();
        let mut seen = HashSet::new();
        for key in conflict_keys {
            let bytes = key_bytes(&key, &all);
            if !found.contains(&bytes) && seen.insert(bytes) {
                self.conflict_deletes.push(key);
            }
        }
        self.conflict_columns = columns;
        self.conflict_upserts = rows;
        Ok(())
    }
}

/// An exact, hashable identity of a row's key.
pub fn key_bytes(row: &[Value], key_positions: &[usize]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(16 * key_positions.len());
    for &position in key_positions {
        encode_values(std::slice::from_ref(&row[position]), &mut bytes);
    }
    bytes
}

pub fn key_positions_in(
    columns: &[String],
    keys: &[String],
    table: &str,
    event: &str,
) -> Result<Vec<usize>, SyncError> {
    keys.iter()
        .map(|key| {
            columns
                .iter()
                .position(|column| column == key)
                .ok_or_else(|| SyncError::Script {
                    event: event.to_string(),
                    table: table.to_string(),
                    message: format!(
                        "the script must select the key column {key:?}; it selects {columns:?}"
                    ),
                })
        })
        .collect()
}

/// Checks the upload's columns against the table and returns the positions of the key
/// columns within the upload's columns.
pub fn validate_upload_shape(
    upload: &TableUpload,
    shape: &TableShape,
) -> Result<Vec<usize>, SyncError> {
    let table = &shape.name;
    if upload.key_columns != shape.key_columns {
        return Err(SyncError::Schema(format!(
            "table {table:?} has primary key {:?} in the consolidated database, the upload names {:?}",
            shape.key_columns, upload.key_columns
        )));
    }
    let mut seen = HashSet::new();
    for column in &upload.columns {
        if !shape.has_column(column) {
            return Err(SyncError::Schema(format!(
                "table {table:?} has no column {column:?}"
            )));
        }
        if !seen.insert(column) {
            return Err(SyncError::Schema(format!(
                "column {column:?} of table {table:?} appears twice in the upload"
            )));
        }
    }
    let carries_rows = !(upload.inserts.is_empty() && upload.updates.is_empty());
    if carries_rows && upload.columns.is_empty() {
        return Err(SyncError::Schema(format!(
            "upload of table {table:?} carries rows but no columns"
        )));
    }
    if upload.columns.is_empty() {
        return Ok(Vec::new());
    }
    upload
        .key_columns
        .iter()
        .map(|key| {
            upload
                .columns
                .iter()
                .position(|column| column == key)
                .ok_or_else(|| {
                    SyncError::Schema(format!(
                        "upload of table {table:?} lacks key column {key:?}"
                    ))
                })
        })
        .collect()
}

/// Streams one table's download as chunks: first deletes (the delete cursor's keys
/// minus the client's own deletes, then conflict deletes), then upserts (the cursor's
/// rows minus the client's own applied uploads, then the current rows of conflicting
/// keys). Only the upload's keys are held in memory, never the cursor's rows.
pub struct DownloadFilter<'a> {
    shape: &'a TableShape,
    resolution: &'a Resolution,
    conflict_upsert_keys: HashSet<Vec<u8>>,
    conflict_delete_keys: HashSet<Vec<u8>>,
    /// The cursor's columns and key positions, once its first batch was seen.
    cursor: Option<(Vec<String>, Vec<usize>)>,
    pub rows_sent: u64,
}

static NO_RESOLUTION: std::sync::OnceLock<Resolution> = std::sync::OnceLock::new();

impl<'a> DownloadFilter<'a> {
    pub fn new(shape: &'a TableShape, resolution: Option<&'a Resolution>) -> DownloadFilter<'a> {
        let resolution =
            resolution.unwrap_or_else(|| NO_RESOLUTION.get_or_init(Resolution::default));
        let all: Vec<usize> = (0..shape.key_columns.len()).collect();
        DownloadFilter {
            shape,
            conflict_delete_keys: resolution
                .conflict_deletes
                .iter()
                .map(|key| key_bytes(key, &all))
                .collect(),
            conflict_upsert_keys: HashSet::new(),
            resolution,
            cursor: None,
            rows_sent: 0,
        }
    }

    fn chunk(&self, columns: Vec<String>, upserts: Vec<Row>, deletes: Vec<Row>) -> Download {
        Download {
            table: self.shape.name.clone(),
            columns,
            key_columns: self.shape.key_columns.clone(),
            upserts,
            deletes,
        }
    }

    /// A batch of the delete cursor, as a chunk to send.
    pub fn deletes(&mut self, columns: &[String], keys: Vec<Row>) -> Result<Download, SyncError> {
        if columns.len() != self.shape.key_columns.len() {
            return Err(SyncError::Script {
                event: DOWNLOAD_DELETE_CURSOR.to_string(),
                table: self.shape.name.clone(),
                message: format!(
                    "the script must select exactly the key columns {:?}; it selects {columns:?}",
                    self.shape.key_columns
                ),
            });
        }
        let all: Vec<usize> = (0..self.shape.key_columns.len()).collect();
        let keys: Vec<Row> = keys
            .into_iter()
            .filter(|key| {
                let bytes = key_bytes(key, &all);
                !self.resolution.uploaded_delete_keys.contains(&bytes)
                    && !self.conflict_delete_keys.contains(&bytes)
            })
            .collect();
        self.rows_sent += keys.len() as u64;
        Ok(self.chunk(Vec::new(), Vec::new(), keys))
    }

    /// Conflicting keys the client must drop; send after the delete cursor's chunks.
    pub fn conflict_deletes(&mut self) -> Download {
        self.rows_sent += self.resolution.conflict_deletes.len() as u64;
        self.chunk(
            Vec::new(),
            Vec::new(),
            self.resolution.conflict_deletes.clone(),
        )
    }

    /// A batch of the download cursor, as a chunk to send.
    pub fn upserts(&mut self, columns: &[String], rows: Vec<Row>) -> Result<Download, SyncError> {
        if self.cursor.is_none() {
            let table = self.shape.name.as_str();
            let key_positions =
                key_positions_in(columns, &self.shape.key_columns, table, DOWNLOAD_CURSOR)?;
            if !self.resolution.conflict_upserts.is_empty()
                && self.resolution.conflict_columns != columns
            {
                return Err(SyncError::Script {
                    event: UPLOAD_FETCH.to_string(),
                    table: table.to_string(),
                    message: format!(
                        "upload_fetch selects {:?} but download_cursor selects {columns:?}; they must select the same columns",
                        self.resolution.conflict_columns
                    ),
                });
            }
            self.conflict_upsert_keys = self
                .resolution
                .conflict_upserts
                .iter()
                .map(|row| key_bytes(row, &key_positions))
                .collect();
            self.cursor = Some((columns.to_vec(), key_positions));
        }
        let (columns, key_positions) = self.cursor.as_ref().expect("set above");
        if self.resolution.uploaded_upsert_keys.is_empty() && self.conflict_upsert_keys.is_empty() {
            self.rows_sent += rows.len() as u64;
            return Ok(self.chunk(columns.clone(), rows, Vec::new()));
        }
        let rows: Vec<Row> = rows
            .into_iter()
            .filter(|row| {
                let key = key_bytes(row, key_positions);
                !self.resolution.uploaded_upsert_keys.contains(&key)
                    && !self.conflict_upsert_keys.contains(&key)
            })
            .collect();
        self.rows_sent += rows.len() as u64;
        Ok(self.chunk(columns.clone(), rows, Vec::new()))
    }

    /// The current rows of conflicting keys (server wins); send last.
    pub fn conflict_upserts(&mut self) -> Download {
        self.rows_sent += self.resolution.conflict_upserts.len() as u64;
        self.chunk(
            self.resolution.conflict_columns.clone(),
            self.resolution.conflict_upserts.clone(),
            Vec::new(),
        )
    }
}

/// Rewrites named parameters (`:user`) as positional ones (`$1`) for databases that
/// only take those, returning the names in position order (each name gets one
/// position, however often it appears). String literals, quoted identifiers, comments
/// and `::` casts are left alone.
pub fn positional_parameters(sql: &str) -> (String, Vec<String>) {
    let bytes = sql.as_bytes();
    let mut out = String::with_capacity(sql.len());
    let mut names: Vec<String> = Vec::new();
    let mut i = 0;
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    while i < bytes.len() {
        let b = bytes[i];
        let skip_to = |terminator: &[u8], from: usize| -> usize {
            sql[from..]
                .find(std::str::from_utf8(terminator).unwrap())
                .map_or(bytes.len(), |p| from + p + terminator.len())
        };
        let end = match b {
            b'\'' => skip_to(b"'", i + 1),
            b'"' => skip_to(b"\"", i + 1),
            b'-' if bytes.get(i + 1) == Some(&b'-') => skip_to(b"\n", i + 2),
            b'/' if bytes.get(i + 1) == Some(&b'*') => skip_to(b"*/", i + 2),
            b':' if bytes.get(i + 1) == Some(&b':') => i + 2,
            b':' if bytes
                .get(i + 1)
                .is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_') =>
            {
                let mut j = i + 1;
                while j < bytes.len() && is_ident(bytes[j]) {
                    j += 1;
                }
                let name = &sql[i + 1..j];
                let position = match names.iter().position(|known| known == name) {
                    Some(position) => position,
                    None => {
                        names.push(name.to_string());
                        names.len() - 1
                    }
                };
                out.push_str(&format!("${}", position + 1));
                i = j;
                continue;
            }
            _ => {
                let width = sql[i..].chars().next().map_or(1, char::len_utf8);
                i + width
            }
        };
        out.push_str(&sql[i..end]);
        i = end;
    }
    (out, names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_parameters_become_positional_outside_literals_comments_and_casts() {
        let (sql, names) = positional_parameters(
            "SELECT ':x', \":y\", a::text FROM t -- :z\nWHERE u = :user AND v > :last_download AND w = :user::text /* :q */",
        );
        assert_eq!(
            sql,
            "SELECT ':x', \":y\", a::text FROM t -- :z\nWHERE u = $1 AND v > $2 AND w = $1::text /* :q */"
        );
        assert_eq!(names, vec!["user", "last_download"]);
    }
}

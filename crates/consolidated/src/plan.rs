//! The backend-neutral part of a sync: which scripts a version has, which named
//! parameters exist, checking an upload against a table, and turning conflicts and
//! cursor results into the download. Backends do the queries; this decides.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

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
#[derive(Clone)]
pub struct Parameters<'a> {
    pub user: &'a str,
    pub client_id: &'a str,
    pub script_version: &'a str,
    pub last_download: i64,
    pub upload_sequence: i64,
    /// PostgreSQL: the transaction id of this client's previous sync when the client
    /// applied that sync's download (it then holds every row that sync wrote), else 0.
    pub last_sync_xid: i64,
    /// Custom authentication parameters, `:auth_1` onwards.
    pub auth_parameters: &'a [String],
    /// Values of one event only (`:password`, `:error_message`, ...), looked up first.
    pub extra: Vec<(&'static str, Value)>,
}

/// The images of one row a row script runs for, by column.
pub struct RowImages<'a> {
    pub columns: &'a [String],
    pub new: Option<&'a [Value]>,
    pub old: Option<&'a [Value]>,
    pub current: Option<&'a [Value]>,
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
            auth_parameters: &request.auth_parameters,
            extra: Vec::new(),
        })
    }

    /// Parameters outside any sync (`begin_connection`): only the version is known.
    pub fn for_connection(script_version: &'a str) -> Parameters<'a> {
        Parameters {
            user: "",
            client_id: "",
            script_version,
            last_download: 0,
            upload_sequence: 0,
            last_sync_xid: 0,
            auth_parameters: &[],
            extra: Vec::new(),
        }
    }

    /// These parameters plus values of one event.
    pub fn with(&self, extra: Vec<(&'static str, Value)>) -> Parameters<'a> {
        let mut parameters = self.clone();
        parameters.extra.extend(extra);
        parameters
    }

    /// The value of a named parameter (`user`, `:user`, `@user` and `$user` alike).
    pub fn value(&self, name: &str, table: &str, event: &str) -> Result<Value, SyncError> {
        self.value_for_row(name, None, table, event)
    }

    /// The value of a named parameter, where `new.c`, `old.c` and `current.c` name the
    /// images of `row`.
    pub fn value_for_row(
        &self,
        name: &str,
        row: Option<&RowImages>,
        table: &str,
        event: &str,
    ) -> Result<Value, SyncError> {
        let name = name.trim_start_matches([':', '@', '$']);
        if let Some((_, value)) = self.extra.iter().find(|(known, _)| *known == name) {
            return Ok(value.clone());
        }
        if let Some((image, column)) = name.split_once('.') {
            let Some(row) = row else {
                return Err(SyncError::script(
                    event,
                    table,
                    format!(":{name} names a row image, which only row scripts of upload events and resolve_conflict have"),
                ));
            };
            let values = match image {
                "new" => row.new,
                "old" => row.old,
                "current" => row.current,
                _ => {
                    return Err(SyncError::script(
                        event,
                        table,
                        format!("unknown row image in :{name}; use :new.<column>, :old.<column> or :current.<column>"),
                    ))
                }
            };
            let position = row
                .columns
                .iter()
                .position(|known| known == column)
                .ok_or_else(|| {
                    SyncError::script(
                        event,
                        table,
                        format!(
                            ":{name}: the uploaded rows have no column {column:?}; they have {:?}",
                            row.columns
                        ),
                    )
                })?;
            // An image the event does not have (old values of an insert) is NULL.
            return Ok(values
                .and_then(|values| values.get(position))
                .cloned()
                .unwrap_or(Value::Null));
        }
        if let Some(index) = name.strip_prefix("auth_") {
            if let Ok(index) = index.parse::<usize>() {
                if index >= 1 {
                    return Ok(self
                        .auth_parameters
                        .get(index - 1)
                        .map_or(Value::Null, |text| Value::Text(text.clone())));
                }
            }
        }
        Ok(match name {
            "user" => Value::Text(self.user.to_string()),
            "client_id" => Value::Text(self.client_id.to_string()),
            "script_version" => Value::Text(self.script_version.to_string()),
            "last_download" => Value::Int(self.last_download),
            "upload_sequence" => Value::Int(self.upload_sequence),
            "last_sync_xid" => Value::Int(self.last_sync_xid),
            _ => {
                let known = PARAMETERS
                    .iter()
                    .chain(&EVENT_PARAMETERS)
                    .map(|(name, _)| format!(":{name}"))
                    .collect::<Vec<_>>();
                return Err(SyncError::script(
                    event,
                    table,
                    format!(
                        "unknown parameter :{name} (or not one of this event); known parameters are {}",
                        known.join(", ")
                    ),
                ));
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

    /// The scripts last used for `version`, whatever their revision.
    pub fn last(&self, version: &str) -> Option<Arc<Scripts>> {
        self.versions
            .get(version)
            .map(|(_, scripts)| Arc::clone(scripts))
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
        self.uploaded_upsert_keys
            .reserve(upload.inserts.len() + upload.updates.len());
        self.uploaded_delete_keys.reserve(upload.deletes.len());
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

/// The named parameters `handle_error` and `report_error` receive.
pub fn error_parameters(error: &SyncError) -> Vec<(&'static str, Value)> {
    let (event, table, row_key, code) = match error {
        SyncError::Script {
            event,
            table,
            row_key,
            code,
            ..
        } => (
            event.clone(),
            table.clone(),
            row_key.clone().map_or(Value::Null, Value::Text),
            code.clone(),
        ),
        _ => (String::new(), String::new(), Value::Null, String::new()),
    };
    let message = match error {
        SyncError::Script { message, .. } => message.clone(),
        other => other.to_string(),
    };
    vec![
        ("error_message", Value::Text(message)),
        ("error_code", Value::Text(code)),
        ("error_event", Value::Text(event)),
        ("error_table", Value::Text(table)),
        ("error_row_key", row_key),
    ]
}

/// A row's key as people write it: `(5, 'north')`.
pub fn describe_key(key: &[Value]) -> String {
    let parts: Vec<String> = key
        .iter()
        .map(|value| match value {
            Value::Null => "NULL".to_string(),
            Value::Int(n) => n.to_string(),
            Value::Double(d) => d.to_string(),
            Value::Decimal(d) => d.to_string(),
            Value::Text(t) => format!("'{}'", t.replace('\'', "''")),
            Value::Blob(b) => format!(
                "x'{}'",
                b.iter()
                    .map(|byte| format!("{byte:02x}"))
                    .collect::<String>()
            ),
            Value::Timestamp(micros) => format!("timestamp {micros}us"),
        })
        .collect();
    format!("({})", parts.join(", "))
}

/// One uploaded operation as row scripts see it: its images over the upload's columns.
#[derive(Debug, Clone)]
pub struct UploadedRow {
    pub operation: &'static str,
    pub new: Option<Row>,
    pub old: Option<Row>,
}

impl UploadedRow {
    pub fn images<'a>(&'a self, columns: &'a [String]) -> RowImages<'a> {
        RowImages {
            columns,
            new: self.new.as_deref(),
            old: self.old.as_deref(),
            current: None,
        }
    }

    /// The key, from the new image (inserts, updates) or the old (deletes).
    pub fn key(&self, key_positions: &[usize]) -> Row {
        let image = self
            .new
            .as_ref()
            .or(self.old.as_ref())
            .expect("one image is always set");
        key_positions
            .iter()
            .map(|&position| image[position].clone())
            .collect()
    }
}

/// The columns row images are laid out by, and the key's positions among them: the
/// upload's columns, or only its key columns when it carries deletes alone.
pub fn image_layout(upload: &TableUpload, key_positions: &[usize]) -> (Vec<String>, Vec<usize>) {
    if upload.columns.is_empty() {
        (
            upload.key_columns.clone(),
            (0..upload.key_columns.len()).collect(),
        )
    } else {
        (upload.columns.clone(), key_positions.to_vec())
    }
}

/// The operations of one kind of a table's upload, each with both images over
/// the columns of [`image_layout`] (a delete's old image holds its key, NULL elsewhere);
/// `key_positions` are the layout's.
pub fn uploaded_rows(
    upload: &TableUpload,
    event: &str,
    key_positions: &[usize],
) -> Vec<UploadedRow> {
    match event {
        UPLOAD_INSERT => upload
            .inserts
            .iter()
            .map(|row| UploadedRow {
                operation: "insert",
                new: Some(row.clone()),
                old: None,
            })
            .collect(),
        UPLOAD_UPDATE => upload
            .updates
            .iter()
            .map(|update| UploadedRow {
                operation: "update",
                new: Some(update.new.clone()),
                old: Some(update.old.clone()),
            })
            .collect(),
        _ => upload
            .deletes
            .iter()
            .map(|key| {
                let width = upload.columns.len().max(key.len());
                let mut old = vec![Value::Null; width];
                for (value, &position) in key.iter().zip(key_positions) {
                    old[position] = value.clone();
                }
                UploadedRow {
                    operation: "delete",
                    new: None,
                    old: Some(old),
                }
            })
            .collect(),
    }
}

/// The uploaded operations behind conflicting keys (the last operation of each key).
pub fn conflicting_rows(
    upload: &TableUpload,
    key_positions: &[usize],
    conflict_keys: &[Row],
) -> Vec<UploadedRow> {
    let all: Vec<usize> = (0..conflict_keys.first().map_or(0, Vec::len)).collect();
    let wanted: HashSet<Vec<u8>> = conflict_keys
        .iter()
        .map(|key| key_bytes(key, &all))
        .collect();
    let mut found: HashMap<Vec<u8>, UploadedRow> = HashMap::new();
    for event in [UPLOAD_INSERT, UPLOAD_UPDATE, UPLOAD_DELETE] {
        for row in uploaded_rows(upload, event, key_positions) {
            let key = key_bytes(&row.key(key_positions), &all);
            if wanted.contains(&key) {
                found.insert(key, row);
            }
        }
    }
    found.into_values().collect()
}

/// An exact, hashable identity of a row's key.
pub fn key_bytes(row: &[Value], key_positions: &[usize]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(16 * key_positions.len());
    write_key_bytes(row, key_positions, &mut bytes);
    bytes
}

/// [`key_bytes`] into a buffer the caller reuses (cleared first): no allocation per row
/// where a key is only looked up.
fn write_key_bytes(row: &[Value], key_positions: &[usize], bytes: &mut Vec<u8>) {
    bytes.clear();
    for &position in key_positions {
        encode_values(std::slice::from_ref(&row[position]), bytes);
    }
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
                .ok_or_else(|| {
                    SyncError::script(
                        event,
                        table,
                        format!(
                            "the script must select the key column {key:?}; it selects {columns:?}"
                        ),
                    )
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
            return Err(SyncError::script(
                DOWNLOAD_DELETE_CURSOR,
                &self.shape.name,
                format!(
                    "the script must select exactly the key columns {:?}; it selects {columns:?}",
                    self.shape.key_columns
                ),
            ));
        }
        let all: Vec<usize> = (0..self.shape.key_columns.len()).collect();
        let mut bytes = Vec::new();
        let keys: Vec<Row> = keys
            .into_iter()
            .filter(|key| {
                write_key_bytes(key, &all, &mut bytes);
                !self
                    .resolution
                    .uploaded_delete_keys
                    .contains(bytes.as_slice())
                    && !self.conflict_delete_keys.contains(bytes.as_slice())
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
                return Err(SyncError::script(UPLOAD_FETCH, table, format!(
                        "upload_fetch selects {:?} but download_cursor selects {columns:?}; they must select the same columns",
                        self.resolution.conflict_columns
                    )));
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
        let mut key = Vec::new();
        let rows: Vec<Row> = rows
            .into_iter()
            .filter(|row| {
                write_key_bytes(row, key_positions, &mut key);
                !self
                    .resolution
                    .uploaded_upsert_keys
                    .contains(key.as_slice())
                    && !self.conflict_upsert_keys.contains(key.as_slice())
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
    positional_parameters_with(sql, '$')
}

/// As [`positional_parameters`], writing positions as `<marker>N` (`$1` for
/// PostgreSQL, `?1` for SQLite). Names may be dotted (`:new.qty`).
pub fn positional_parameters_with(sql: &str, marker: char) -> (String, Vec<String>) {
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
                // One dotted part: `:new.qty`.
                if bytes.get(j) == Some(&b'.')
                    && bytes
                        .get(j + 1)
                        .is_some_and(|&c| c.is_ascii_alphabetic() || c == b'_')
                {
                    j += 1;
                    while j < bytes.len() && is_ident(bytes[j]) {
                        j += 1;
                    }
                }
                let name = &sql[i + 1..j];
                let position = match names.iter().position(|known| known == name) {
                    Some(position) => position,
                    None => {
                        names.push(name.to_string());
                        names.len() - 1
                    }
                };
                out.push_str(&format!("{marker}{}", position + 1));
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

    #[test]
    fn dotted_names_are_one_parameter() {
        let (sql, names) = positional_parameters_with(
            "UPDATE t SET q = :new.q WHERE id = :old.id AND o = :user AND x = :new.q",
            '?',
        );
        assert_eq!(
            sql,
            "UPDATE t SET q = ?1 WHERE id = ?2 AND o = ?3 AND x = ?1"
        );
        assert_eq!(names, vec!["new.q", "old.id", "user"]);
    }
}

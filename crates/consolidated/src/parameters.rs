//! The named parameters scripts may use (`:user`, `:new.qty`, ...), their values, and
//! rewriting them as the positional parameters databases take.

use rowsync_protocol::{TableWatermark, Value};

use crate::scripts::*;
use crate::{SyncError, SyncRequest};

/// The values of the named parameters scripts may use.
#[derive(Clone)]
pub struct Parameters<'a> {
    pub user: &'a str,
    pub client_id: &'a str,
    pub script_version: &'a str,
    pub last_download: i64,
    /// Protocol v9: tables whose last download was not `last_download` (a client that
    /// synced some of its tables since); a script of one reads its own.
    pub table_watermarks: &'a [TableWatermark],
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
            table_watermarks: &request.sync_tables.watermarks,
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
            table_watermarks: &[],
            upload_sequence: 0,
            last_sync_xid: 0,
            auth_parameters: &[],
            extra: Vec::new(),
        }
    }

    /// `:last_download` in a script of `table`: the watermark the client named for the
    /// table (protocol v9), else the sync's.
    pub fn last_download_of(&self, table: &str) -> i64 {
        self.table_watermarks
            .iter()
            .find(|named| !table.is_empty() && named.table == table)
            .map_or(self.last_download, |named| named.last_download)
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
            return image_value(name, image, column, row, table, event);
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
            "last_download" => Value::Int(self.last_download_of(table)),
            "upload_sequence" => Value::Int(self.upload_sequence),
            "last_sync_xid" => Value::Int(self.last_sync_xid),
            // Set by the driver for each download cursor; nothing to leave out elsewhere.
            ECHO_XID => Value::Int(0),
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

/// The value of `:<image>.<column>` (`name`) in a row script's images.
fn image_value(
    name: &str,
    image: &str,
    column: &str,
    row: Option<&RowImages>,
    table: &str,
    event: &str,
) -> Result<Value, SyncError> {
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
    Ok(values
        .and_then(|values| values.get(position))
        .cloned()
        .unwrap_or(Value::Null))
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

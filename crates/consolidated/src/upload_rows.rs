//! An upload's operations as rows with images, their keys, and the keys' identity.

use std::collections::{HashMap, HashSet};

use rowsync_protocol::{encode_key_identity, Row, TableUpload, Value};

use crate::parameters::RowImages;
use crate::scripts::*;

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
            other => format!("{other:?}"),
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

    /// The row as its kind's scratch holds it: new values (inserts), new then old
    /// (updates), the key (deletes).
    pub fn scratch_image(&self, event: &str, key_positions: &[usize]) -> Vec<&Value> {
        match event {
            UPLOAD_INSERT => self.new.iter().flatten().collect(),
            UPLOAD_UPDATE => self
                .new
                .iter()
                .flatten()
                .chain(self.old.iter().flatten())
                .collect(),
            _ => {
                let old = self.old.as_ref().expect("deletes have an old image");
                key_positions
                    .iter()
                    .map(|&position| &old[position])
                    .collect()
            }
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
pub struct ImageLayout {
    pub columns: Vec<String>,
    pub key_positions: Vec<usize>,
}

impl ImageLayout {
    /// The layout of `upload`, whose key columns are at `key_positions` of its columns.
    pub fn of(upload: &TableUpload, key_positions: &[usize]) -> ImageLayout {
        if upload.columns.is_empty() {
            ImageLayout {
                columns: upload.key_columns.clone(),
                key_positions: (0..upload.key_columns.len()).collect(),
            }
        } else {
            ImageLayout {
                columns: upload.columns.clone(),
                key_positions: key_positions.to_vec(),
            }
        }
    }
}

/// The operations of one kind of a table's upload, each with both images over
/// the columns of an [`ImageLayout`] (a delete's old image holds its key, NULL elsewhere);
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

/// An exact, hashable identity of a row's key (typed values in their identity form, so
/// a uuid uploaded as text and read as a uuid are one key).
pub fn key_bytes(row: &[Value], key_positions: &[usize]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(16 * key_positions.len());
    write_key_bytes(row, key_positions, &mut bytes);
    bytes
}

/// [`key_bytes`] into a buffer the caller reuses (cleared first): no allocation per row
/// where a key is only looked up.
pub(crate) fn write_key_bytes(row: &[Value], key_positions: &[usize], bytes: &mut Vec<u8>) {
    bytes.clear();
    for &position in key_positions {
        encode_key_identity(std::slice::from_ref(&row[position]), bytes);
    }
}

//! The paper's workload: table `purchase`, values that no packing shrinks, `cost`
//! starting at 123456789.12 and growing by one per update, `notes` of exactly 64
//! characters. Client *i* owns the rows with `emp_id = EMP_ID_BASE + i`.

use rowsync_protocol::{encode_frame, Decimal, Message, Row, RowUpdate, TableUpload, Value};

pub const TABLE: &str = "purchase";
pub const RAW_TABLE: &str = "purchase_raw";
pub const COLUMNS: [&str; 6] = [
    "emp_id",
    "purch_id",
    "cust_id",
    "cost",
    "order_date",
    "notes",
];
pub const KEY_COLUMNS: [&str; 2] = ["emp_id", "purch_id"];
/// The paper's table, on PostgreSQL.
pub const TABLE_COLUMNS_DDL: &str =
    "(emp_id INT NOT NULL, purch_id INT NOT NULL, cust_id INT NOT NULL, \
     cost NUMERIC(30,6) NOT NULL, order_date TIMESTAMP NOT NULL, notes VARCHAR(64), \
     PRIMARY KEY (emp_id, purch_id))";
/// The same table in a client's SQLite database. `cost` and `order_date` are TEXT: a
/// rowsync client stores decimals and timestamps as exact text, and NUMERIC affinity
/// would turn the decimal into a REAL (which the server refuses for a numeric column
/// rather than round).
pub const CLIENT_TABLE_DDL: &str = "CREATE TABLE purchase (emp_id INTEGER NOT NULL, \
     purch_id INTEGER NOT NULL, cust_id INTEGER NOT NULL, cost TEXT NOT NULL, \
     order_date TEXT NOT NULL, notes TEXT, PRIMARY KEY (emp_id, purch_id))";

/// Large values, so that no integer encoding makes them shorter than a real key.
pub const EMP_ID_BASE: i64 = 1_000_000_000;
pub const PURCH_ID_BASE: i64 = 1_100_000_000;
pub const CUST_ID_BASE: i64 = 2_000_000_000;
/// 123456789.12 at scale 6.
const COST_BASE_MICROS: i128 = 123_456_789_120_000;
/// 2012-01-01 00:00:00 UTC, in microseconds since 1970.
const ORDER_DATE_BASE_MICROS: i64 = 1_325_376_000_000_000;
pub const NOTES_CHARS: usize = 64;
/// Upload messages are cut at about this size, as the client library does.
pub const UPLOAD_MESSAGE_BYTES: usize = 1024 * 1024;

/// The user name, and partition value, of client `client`.
pub fn emp_id(client: usize) -> i64 {
    EMP_ID_BASE + client as i64
}

pub fn user_name(client: usize) -> String {
    emp_id(client).to_string()
}

pub fn purch_id(index: usize) -> i64 {
    PURCH_ID_BASE + index as i64
}

pub fn cost(updates: i64) -> Decimal {
    Decimal::new(COST_BASE_MICROS + i128::from(updates) * 1_000_000, 6).expect("scale 6")
}

pub fn notes(client: usize, index: usize) -> String {
    let mut text = format!(
        "purchase {} of employee {} ",
        purch_id(index),
        emp_id(client)
    );
    while text.len() < NOTES_CHARS {
        text.push((b'a' + (text.len() % 26) as u8) as char);
    }
    text.truncate(NOTES_CHARS);
    text
}

/// Row `index` of client `client` after `updates` updates.
pub fn row(client: usize, index: usize, updates: i64) -> Row {
    vec![
        Value::Int(emp_id(client)),
        Value::Int(purch_id(index)),
        Value::Int(CUST_ID_BASE - index as i64),
        Value::Decimal(cost(updates)),
        Value::Timestamp(ORDER_DATE_BASE_MICROS + index as i64 * 1_000_000),
        Value::Text(notes(client, index)),
    ]
}

pub fn key(client: usize, index: usize) -> Row {
    vec![Value::Int(emp_id(client)), Value::Int(purch_id(index))]
}

/// The rows of set `set` (indexes `set * rows .. (set + 1) * rows`).
pub fn set_indexes(set: usize, rows: usize) -> std::ops::Range<usize> {
    set * rows..(set + 1) * rows
}

/// What a timed upload carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadKind {
    Update,
    Delete,
    Insert,
}

fn empty_upload() -> TableUpload {
    TableUpload {
        table: TABLE.into(),
        columns: COLUMNS.iter().map(|c| c.to_string()).collect(),
        key_columns: KEY_COLUMNS.iter().map(|c| c.to_string()).collect(),
        ..TableUpload::default()
    }
}

fn row_bytes(row: &Row) -> usize {
    row.iter().map(Value::encoded_len).sum()
}

/// The encoded upload frames of one client's set: updates carry the old and the new
/// image (cost + 1), deletes the key, inserts the row as it was first downloaded.
pub fn upload_frames(
    kind: UploadKind,
    client: usize,
    indexes: std::ops::Range<usize>,
) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let mut current = empty_upload();
    let mut bytes = 0;
    for index in indexes {
        match kind {
            UploadKind::Update => {
                let update = RowUpdate {
                    old: row(client, index, 0),
                    new: row(client, index, 1),
                };
                bytes += row_bytes(&update.old) + row_bytes(&update.new);
                current.updates.push(update);
            }
            UploadKind::Delete => {
                let key = key(client, index);
                bytes += row_bytes(&key);
                current.deletes.push(key);
            }
            UploadKind::Insert => {
                let row = row(client, index, 0);
                bytes += row_bytes(&row);
                current.inserts.push(row);
            }
        }
        if bytes >= UPLOAD_MESSAGE_BYTES {
            frames.push(encode_frame(&Message::Upload(std::mem::replace(
                &mut current,
                empty_upload(),
            ))));
            bytes = 0;
        }
    }
    let empty =
        current.inserts.is_empty() && current.updates.is_empty() && current.deletes.is_empty();
    if !empty || frames.is_empty() {
        frames.push(encode_frame(&Message::Upload(current)));
    }
    frames
}

/// A checksum of rows that does not depend on their order: each row's values are
/// hashed (FNV-1a over their canonical text) and the hashes summed.
pub fn checksum<'r>(rows: impl IntoIterator<Item = &'r Row>) -> u64 {
    rows.into_iter().fold(0u64, |sum, row| {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for value in row {
            let text = match value {
                Value::Decimal(d) => d.to_string(),
                Value::Timestamp(t) => t.to_string(),
                Value::Int(n) => n.to_string(),
                Value::Text(t) => t.clone(),
                other => format!("{other:?}"),
            };
            for byte in text.bytes().chain(std::iter::once(0xff)) {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x0100_0000_01b3);
            }
        }
        sum.wrapping_add(hash)
    })
}

/// The checksum a client must compute over its download of set `set`.
pub fn expected_download_checksum(client: usize, set: usize, rows: usize) -> u64 {
    let expected: Vec<Row> = set_indexes(set, rows).map(|i| row(client, i, 0)).collect();
    checksum(&expected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_are_exactly_64_characters_and_costs_step_by_one() {
        assert_eq!(notes(0, 0).len(), NOTES_CHARS);
        assert_eq!(notes(9_999, 9_999_999).len(), NOTES_CHARS);
        assert_eq!(cost(0).to_string(), "123456789.120000");
        assert_eq!(cost(1).to_string(), "123456790.120000");
    }

    #[test]
    fn checksum_ignores_order_but_not_values() {
        let a = row(1, 1, 0);
        let b = row(1, 2, 0);
        assert_eq!(checksum([&a, &b]), checksum([&b, &a]));
        assert_ne!(checksum([&a, &b]), checksum([&a, &row(1, 2, 1)]));
    }

    #[test]
    fn large_uploads_are_cut_into_messages_and_keep_every_row() {
        let frames = upload_frames(UploadKind::Update, 3, 0..20_000);
        assert!(frames.len() > 1, "{} frames", frames.len());
        let mut decoder =
            rowsync_protocol::FrameDecoder::new(rowsync_protocol::FRAME_BYTES_MAX_DEFAULT);
        let mut updates = 0;
        for frame in &frames {
            decoder.feed(frame);
            while let Some(Message::Upload(upload)) = decoder.next_message().unwrap() {
                updates += upload.updates.len();
            }
        }
        assert_eq!(updates, 20_000);
    }
}

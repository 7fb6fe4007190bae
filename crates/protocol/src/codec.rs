//! Message bodies: the bytes of a frame after its length prefix. Big-endian throughout.

use crate::message::*;
pub(crate) use crate::whole::Rows;
use crate::whole::{Whole, WholeValues};
use crate::{
    Decimal, DecodeError, ErrorCode, Interval, Numeric, Row, Value, ARRAY_DEPTH_MAX,
    DECIMAL_SCALE_MAX, TABLES_SINCE_VERSION,
};

mod tag {
    pub const NULL: u8 = 0x00;
    pub const INT: u8 = 0x01;
    pub const DOUBLE: u8 = 0x02;
    pub const DECIMAL: u8 = 0x03;
    pub const TEXT: u8 = 0x04;
    pub const BLOB: u8 = 0x05;
    pub const TIMESTAMP: u8 = 0x06;
    // Protocol v2.
    pub const BOOL: u8 = 0x07;
    pub const UUID: u8 = 0x08;
    pub const DATE: u8 = 0x09;
    pub const TIME: u8 = 0x0A;
    pub const INTERVAL: u8 = 0x0B;
    pub const NUMERIC: u8 = 0x0C;
    pub const ARRAY: u8 = 0x0D;
    /// Protocol v2: the value was sent before the message, in pieces.
    pub const IN_PIECES: u8 = 0x20;
}

/// Microseconds in a day: the largest `time` (`24:00:00`).
const TIME_MICROS_MAX: i64 = 86_400_000_000;

/// Encodes one message body: its type byte followed by its fields.
pub fn encode_message(message: &Message) -> Vec<u8> {
    encode_body(message, &mut Marks::none())
}

/// Encodes one message body, writing the tag `in_pieces` instead of each value whose
/// ordinal (its place in the order [`values_mut`] walks) `marks` names.
pub(crate) fn encode_body(message: &Message, marks: &mut Marks<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(message.message_type() as u8);
    match message {
        Message::Hello(hello) => put_hello(&mut out, hello),
        Message::Upload(upload) => put_upload(&mut out, upload, marks),
        Message::EndUpload(end) => out.extend_from_slice(&end.upload_sequence.to_be_bytes()),
        Message::Download(download) => put_download(&mut out, download, marks),
        Message::EndDownload(end) => put_end_download(&mut out, end),
        Message::Error(error) => put_error(&mut out, error),
        Message::Busy { retry_after_ms } => out.extend_from_slice(&retry_after_ms.to_be_bytes()),
        Message::DownloadAck(ack) => out.extend_from_slice(&ack.watermark.to_be_bytes()),
        Message::ValueStart(start) => put_value_start(&mut out, start),
        Message::ValuePiece(piece) => put_bytes(&mut out, &piece.bytes),
        Message::UploadResume(resume) => {
            put_transfer_offset(&mut out, &resume.transfer_id, resume.offset);
        }
        Message::UploadHeld(held) => {
            put_transfer_held(&mut out, &held.transfer_id, held.length, &held.sha256);
        }
        Message::DownloadResume(resume) => {
            put_transfer_offset(&mut out, &resume.transfer_id, resume.offset);
        }
        Message::DownloadHeld(held) => {
            put_transfer_held(&mut out, &held.transfer_id, held.length, &held.sha256);
        }
        Message::KeyRanges(key_ranges) => put_key_ranges(&mut out, key_ranges),
        Message::SessionToken(session) => {
            put_str(&mut out, &session.token);
            out.extend_from_slice(&session.expires_in_seconds.to_be_bytes());
        }
        Message::Conflicts(conflicts) => {
            put_str(&mut out, &conflicts.table);
            put_names(&mut out, &conflicts.key_columns);
            put_rows(&mut out, &conflicts.keys, &mut Marks::none());
        }
    }
    out
}

fn put_hello(out: &mut Vec<u8>, hello: &Hello) {
    out.extend_from_slice(&hello.protocol_version.to_be_bytes());
    put_str(out, &hello.client_id);
    put_str(out, &hello.user);
    put_str(out, &hello.password);
    put_str(out, &hello.script_version);
    out.extend_from_slice(&hello.last_download_watermark.to_be_bytes());
    put_str(out, &hello.token);
    put_names(out, &hello.auth_parameters);
    out.push(u8::from(hello.download_ack));
    if hello.protocol_version >= TABLES_SINCE_VERSION {
        out.push(u8::from(hello.tables.only_these));
        put_count(out, hello.tables.watermarks.len());
        for table in &hello.tables.watermarks {
            put_str(out, &table.table);
            out.extend_from_slice(&table.last_download.to_be_bytes());
        }
    }
}

fn put_upload(out: &mut Vec<u8>, upload: &TableUpload, marks: &mut Marks<'_>) {
    put_str(out, &upload.table);
    put_names(out, &upload.columns);
    put_names(out, &upload.key_columns);
    put_rows(out, &upload.inserts, marks);
    put_count(out, upload.updates.len());
    for update in &upload.updates {
        put_row(out, &update.old, marks);
        put_row(out, &update.new, marks);
    }
    put_rows(out, &upload.deletes, marks);
}

fn put_download(out: &mut Vec<u8>, download: &Download, marks: &mut Marks<'_>) {
    put_str(out, &download.table);
    put_names(out, &download.columns);
    put_names(out, &download.key_columns);
    put_rows(out, &download.upserts, marks);
    put_rows(out, &download.deletes, marks);
}

fn put_end_download(out: &mut Vec<u8>, end: &EndDownload) {
    out.extend_from_slice(&end.watermark.to_be_bytes());
    out.extend_from_slice(&end.summary.rows_uploaded.to_be_bytes());
    out.extend_from_slice(&end.summary.conflicts.to_be_bytes());
    out.push(u8::from(end.summary.upload_already_applied));
}

fn put_error(out: &mut Vec<u8>, error: &WireError) {
    out.extend_from_slice(&error.code.to_be_bytes());
    put_str(out, &error.message);
    if error.code == ErrorCode::RowsRefused as u16 {
        put_count(out, error.refused.len());
        for refused in &error.refused {
            put_str(out, &refused.table);
            put_names(out, &refused.key_columns);
            put_row(out, &refused.key, &mut Marks::none());
            out.extend_from_slice(&refused.code.to_be_bytes());
            put_str(out, &refused.reason);
        }
    }
}

fn put_value_start(out: &mut Vec<u8>, start: &ValueStart) {
    out.push(start.kind as u8);
    out.extend_from_slice(&start.length.to_be_bytes());
    put_str(out, &start.table);
    put_str(out, &start.column);
}

/// The body of `upload_resume` and `download_resume`.
fn put_transfer_offset(out: &mut Vec<u8>, transfer_id: &str, offset: u64) {
    put_str(out, transfer_id);
    out.extend_from_slice(&offset.to_be_bytes());
}

/// The body of `upload_held` and `download_held`.
fn put_transfer_held(out: &mut Vec<u8>, transfer_id: &str, length: u64, sha256: &[u8]) {
    put_str(out, transfer_id);
    out.extend_from_slice(&length.to_be_bytes());
    put_bytes(out, sha256);
}

fn put_key_ranges(out: &mut Vec<u8>, key_ranges: &KeyRanges) {
    put_count(out, key_ranges.ranges.len());
    for range in &key_ranges.ranges {
        put_str(out, &range.table);
        out.extend_from_slice(&range.start.to_be_bytes());
        out.extend_from_slice(&range.end.to_be_bytes());
        out.extend_from_slice(&range.next.to_be_bytes());
    }
}

/// Which values of a message [`encode_body`] writes as `in_pieces`: their ordinals, in
/// ascending order.
pub(crate) struct Marks<'a> {
    ordinals: &'a [usize],
    seen: usize,
}

impl<'a> Marks<'a> {
    pub(crate) fn new(ordinals: &'a [usize]) -> Marks<'a> {
        Marks { ordinals, seen: 0 }
    }

    fn none() -> Marks<'static> {
        Marks {
            ordinals: &[],
            seen: 0,
        }
    }

    /// Whether the next value written is one sent in pieces.
    fn next_in_pieces(&mut self) -> bool {
        let ordinal = self.seen;
        self.seen += 1;
        match self.ordinals.split_first() {
            Some((&first, rest)) if first == ordinal => {
                self.ordinals = rest;
                true
            }
            _ => false,
        }
    }
}

/// Every value of an upload or a download, in the order they are encoded (inserts,
/// updates (old, then new image), deletes; upserts, deletes), each with its column.
pub(crate) fn values_mut(message: &mut Message) -> Vec<(&str, &mut Value)> {
    let rows: Vec<(&[String], &mut Row)> =
        match message {
            Message::Upload(upload) => {
                let (columns, keys) = (&upload.columns[..], &upload.key_columns[..]);
                (upload.inserts.iter_mut().map(|row| (columns, row)))
                    .chain(upload.updates.iter_mut().flat_map(|update| {
                        [(columns, &mut update.old), (columns, &mut update.new)]
                    }))
                    .chain(upload.deletes.iter_mut().map(|row| (keys, row)))
                    .collect()
            }
            Message::Download(download) => {
                let (columns, keys) = (&download.columns[..], &download.key_columns[..]);
                (download.upserts.iter_mut().map(|row| (columns, row)))
                    .chain(download.deletes.iter_mut().map(|row| (keys, row)))
                    .collect()
            }
            _ => Vec::new(),
        };
    rows.into_iter()
        .flat_map(|(names, row)| names.iter().map(String::as_str).zip(row.iter_mut()))
        .collect()
}

/// Encodes values as they appear inside a row, without the count: a compact, exact
/// identity for keys (usable in hash sets, unlike `Value`, which holds doubles).
pub fn encode_values(values: &[Value], out: &mut Vec<u8>) {
    for value in values {
        put_value(out, value);
    }
}

/// Encodes values in their identity form ([`Value::identity_form`]): a key a SQLite
/// client uploads as text (a uuid, a date) and the same key a server reads typed encode
/// alike. For hash sets of keys.
pub fn encode_key_identity(values: &[Value], out: &mut Vec<u8>) {
    for value in values {
        put_value(out, &value.identity_form());
    }
}

/// Decodes one message body (a whole frame payload). Trailing bytes are an error, and
/// so is a value `in_pieces`: only a [`crate::FrameDecoder`] has the pieces it stands for.
///
/// The body is checked whole before anything is kept, so that every count it holds is
/// known to be true when vectors are sized by it: otherwise nested counts that each
/// claim the rest of the body (arrays in arrays) would reserve it several times over
/// before the first lie is found (found by fuzzing: 579 bytes reserving 42 KB). A
/// decoded message then takes at most the memory of its values.
pub fn decode_message(body: &[u8]) -> Result<Message, DecodeError> {
    decode(body, Rows::CheckOnly, None)?;
    decode(body, Rows::Keep, None)
}

/// Checks one message body exactly as [`decode_message`] does (every row and value,
/// UTF-8 and decimal scales included) but keeps no rows: an upload's or a download's
/// row lists come back empty, and nothing is allocated per row or value. For a receiver
/// that needs only a message's shape now and decodes it in full later.
pub fn check_message(body: &[u8]) -> Result<Message, DecodeError> {
    decode(body, Rows::CheckOnly, None)
}

/// Decodes a body; a value `in_pieces` takes the next of `whole` (the values the
/// frames before it brought), and a message holding one must carry a single row.
pub(crate) fn decode(
    body: &[u8],
    rows: Rows,
    whole: Option<&mut WholeValues>,
) -> Result<Message, DecodeError> {
    let mut reader = Reader {
        body,
        offset: 0,
        rows,
        whole,
        in_pieces: 0,
        rows_seen: 0,
    };
    let type_byte = *body.first().ok_or(DecodeError::EmptyFrame)?;
    reader.offset = 1;
    let message = reader.message(type_byte)?;
    if reader.in_pieces > 0 && reader.rows_seen != 1 {
        return Err(DecodeError::InPiecesRows {
            rows: reader.rows_seen,
        });
    }
    let trailing = body.len() - reader.offset;
    if trailing != 0 {
        return Err(DecodeError::TrailingBytes {
            message: message.message_type().name(),
            trailing,
        });
    }
    Ok(message)
}

/// The smallest encoding of a row (its value count) and of a value (its tag); used to
/// refuse counts that could not possibly fit before allocating for them.
const ROW_BYTES_MIN: usize = 2;
/// The fewest bytes a refused row takes: its table and reason counts (4 each), no key
/// column names (2), an empty key (2) and its code (2).
const REFUSED_ROW_BYTES_MIN: usize = 14;
const VALUE_BYTES_MIN: usize = 1;
/// The fewest bytes a key range takes: its table's count (4) and three numbers (24).
const KEY_RANGE_BYTES_MIN: usize = 28;
const NAME_BYTES_MIN: usize = 4;

fn put_count(out: &mut Vec<u8>, count: usize) {
    let count = u32::try_from(count).expect("a message never holds 2^32 items: frame limit");
    out.extend_from_slice(&count.to_be_bytes());
}

fn put_str(out: &mut Vec<u8>, text: &str) {
    put_bytes(out, text.as_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_count(out, bytes.len());
    out.extend_from_slice(bytes);
}

fn put_names(out: &mut Vec<u8>, names: &[String]) {
    let count = u16::try_from(names.len()).expect("at most 65535 columns");
    out.extend_from_slice(&count.to_be_bytes());
    for name in names {
        put_str(out, name);
    }
}

fn put_rows(out: &mut Vec<u8>, rows: &[Row], marks: &mut Marks<'_>) {
    put_count(out, rows.len());
    for row in rows {
        put_row(out, row, marks);
    }
}

fn put_row(out: &mut Vec<u8>, row: &Row, marks: &mut Marks<'_>) {
    let count = u16::try_from(row.len()).expect("at most 65535 values in a row");
    out.extend_from_slice(&count.to_be_bytes());
    for value in row {
        if marks.next_in_pieces() {
            out.push(tag::IN_PIECES);
        } else {
            put_value(out, value);
        }
    }
}

fn put_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.push(tag::NULL),
        Value::Int(number) => {
            out.push(tag::INT);
            out.extend_from_slice(&number.to_be_bytes());
        }
        Value::Double(number) => {
            out.push(tag::DOUBLE);
            out.extend_from_slice(&number.to_bits().to_be_bytes());
        }
        Value::Decimal(decimal) => {
            out.push(tag::DECIMAL);
            out.extend_from_slice(&decimal.mantissa.to_be_bytes());
            out.push(decimal.scale);
        }
        Value::Text(text) => {
            out.push(tag::TEXT);
            put_str(out, text);
        }
        Value::Blob(bytes) => {
            out.push(tag::BLOB);
            put_bytes(out, bytes);
        }
        Value::Timestamp(micros) => {
            out.push(tag::TIMESTAMP);
            out.extend_from_slice(&micros.to_be_bytes());
        }
        Value::Bool(flag) => out.extend_from_slice(&[tag::BOOL, u8::from(*flag)]),
        Value::Uuid(bytes) => {
            out.push(tag::UUID);
            out.extend_from_slice(bytes);
        }
        Value::Date(days) => {
            out.push(tag::DATE);
            out.extend_from_slice(&days.to_be_bytes());
        }
        Value::Time(micros) => {
            out.push(tag::TIME);
            out.extend_from_slice(&micros.to_be_bytes());
        }
        Value::Interval(interval) => {
            out.push(tag::INTERVAL);
            out.extend_from_slice(&interval.months.to_be_bytes());
            out.extend_from_slice(&interval.days.to_be_bytes());
            out.extend_from_slice(&interval.micros.to_be_bytes());
        }
        Value::Numeric(numeric) => {
            out.push(tag::NUMERIC);
            put_str(out, numeric.as_str());
        }
        Value::Array(elements) => {
            out.push(tag::ARRAY);
            put_count(out, elements.len());
            for element in elements {
                put_value(out, element);
            }
        }
    }
}

struct Reader<'a, 'w> {
    body: &'a [u8],
    offset: usize,
    rows: Rows,
    /// The values in pieces received before this message, if any could be.
    whole: Option<&'w mut WholeValues>,
    /// Values `in_pieces` read so far.
    in_pieces: usize,
    /// Rows read so far (an update counts once).
    rows_seen: usize,
}

/// A value as it lies in the body, borrowed: checked without being copied.
enum ValueRef<'a> {
    Null,
    Int(i64),
    Double(f64),
    Decimal(Decimal),
    Text(&'a str),
    Blob(&'a [u8]),
    Timestamp(i64),
    /// A value sent in pieces before the message (no value when only checking).
    Whole(Whole),
    /// Any value without borrowed bytes, and an array (empty when only checking).
    Owned(Value),
}

impl ValueRef<'_> {
    fn into_value(self) -> Value {
        match self {
            ValueRef::Null => Value::Null,
            ValueRef::Int(number) => Value::Int(number),
            ValueRef::Double(number) => Value::Double(number),
            ValueRef::Decimal(decimal) => Value::Decimal(decimal),
            ValueRef::Text(text) => Value::Text(text.to_owned()),
            ValueRef::Blob(bytes) => Value::Blob(bytes.to_vec()),
            ValueRef::Timestamp(micros) => Value::Timestamp(micros),
            ValueRef::Whole(whole) => whole.value.unwrap_or(Value::Null),
            ValueRef::Owned(value) => value,
        }
    }
}

impl<'a> Reader<'a, '_> {
    fn remaining(&self) -> usize {
        self.body.len() - self.offset
    }

    fn take(&mut self, length: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < length {
            return Err(DecodeError::Truncated {
                what,
                offset: self.offset,
                needed: length - self.remaining(),
            });
        }
        let bytes = &self.body[self.offset..self.offset + length];
        self.offset += length;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let bytes = self.take(N, what)?;
        Ok(bytes.try_into().expect("take returned N bytes"))
    }

    /// A boolean byte: exactly 0 or 1, so every message has one encoding.
    fn flag(&mut self, what: &'static str) -> Result<bool, DecodeError> {
        let offset = self.offset;
        match self.take(1, what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(DecodeError::InvalidFlag {
                what,
                value,
                offset,
            }),
        }
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        self.array(what).map(u16::from_be_bytes)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        self.array(what).map(u32::from_be_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        self.array(what).map(u64::from_be_bytes)
    }

    fn i64(&mut self, what: &'static str) -> Result<i64, DecodeError> {
        self.array(what).map(i64::from_be_bytes)
    }

    /// A u32 count whose items take at least `item_bytes_min` each.
    fn count(&mut self, what: &'static str, item_bytes_min: usize) -> Result<usize, DecodeError> {
        let offset = self.offset;
        let count = self.u32(what)? as usize;
        self.check_fits(what, count, item_bytes_min, offset)
    }

    fn check_fits(
        &self,
        what: &'static str,
        count: usize,
        item_bytes_min: usize,
        offset: usize,
    ) -> Result<usize, DecodeError> {
        if count.saturating_mul(item_bytes_min) > self.remaining() {
            return Err(DecodeError::CountTooLarge {
                what,
                count,
                offset,
                remaining: self.remaining(),
            });
        }
        Ok(count)
    }

    fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let length = self.u32(what)? as usize;
        self.take(length, what)
    }

    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        self.str(what).map(str::to_owned)
    }

    fn str(&mut self, what: &'static str) -> Result<&'a str, DecodeError> {
        let offset = self.offset;
        let bytes = self.bytes(what)?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8 { what, offset })
    }

    fn names(&mut self, what: &'static str) -> Result<Vec<String>, DecodeError> {
        let offset = self.offset;
        let count = usize::from(self.u16(what)?);
        self.check_fits(what, count, NAME_BYTES_MIN, offset)?;
        (0..count).map(|_| self.string(what)).collect()
    }

    /// Rows of `table` whose values are those of `names`.
    fn rows(
        &mut self,
        what: &'static str,
        table: &str,
        names: &[String],
    ) -> Result<Vec<Row>, DecodeError> {
        let count = self.count(what, ROW_BYTES_MIN)?;
        self.rows_seen += count;
        let mut rows = Vec::with_capacity(if self.rows == Rows::Keep { count } else { 0 });
        for _ in 0..count {
            let row = self.row(table, names)?;
            if self.rows == Rows::Keep {
                rows.push(row);
            }
        }
        Ok(rows)
    }

    /// The message after its type byte.
    fn message(&mut self, type_byte: u8) -> Result<Message, DecodeError> {
        Ok(match type_byte {
            0x01 => Message::Hello(self.hello()?),
            0x02 => Message::Upload(self.upload()?),
            0x03 => Message::EndUpload(EndUpload {
                upload_sequence: self.u64("upload sequence")?,
            }),
            0x04 => Message::Download(self.download()?),
            0x05 => Message::EndDownload(self.end_download()?),
            0x06 => Message::Error(self.error()?),
            0x07 => Message::Busy {
                retry_after_ms: self.u32("retry after")?,
            },
            0x08 => Message::DownloadAck(DownloadAck {
                watermark: self.i64("watermark")?,
            }),
            0x09 => Message::Conflicts(self.conflicts()?),
            0x0A => Message::ValueStart(self.value_start()?),
            0x0B => Message::ValuePiece(ValuePiece {
                bytes: self.bytes("value piece")?.to_vec(),
            }),
            0x0C => Message::UploadResume(UploadResume {
                transfer_id: self.string("transfer id")?,
                offset: self.u64("transfer offset")?,
            }),
            0x0D => Message::UploadHeld(UploadHeld {
                transfer_id: self.string("transfer id")?,
                length: self.u64("held length")?,
                sha256: self.bytes("held digest")?.to_vec(),
            }),
            0x0E => Message::DownloadResume(DownloadResume {
                transfer_id: self.string("transfer id")?,
                offset: self.u64("transfer offset")?,
            }),
            0x0F => Message::DownloadHeld(DownloadHeld {
                transfer_id: self.string("transfer id")?,
                length: self.u64("held length")?,
                sha256: self.bytes("held digest")?.to_vec(),
            }),
            0x10 => Message::KeyRanges(self.key_ranges()?),
            0x11 => Message::SessionToken(SessionToken {
                token: self.string("session token")?,
                expires_in_seconds: self.u32("session token expiry")?,
            }),
            other => return Err(DecodeError::UnknownMessageType(other)),
        })
    }

    fn hello(&mut self) -> Result<Hello, DecodeError> {
        let protocol_version = self.u16("protocol version")?;
        Ok(Hello {
            protocol_version,
            client_id: self.string("client id")?,
            user: self.string("user")?,
            password: self.string("password")?,
            script_version: self.string("script version")?,
            last_download_watermark: self.i64("last download watermark")?,
            token: self.string("token")?,
            auth_parameters: self.names("authentication parameter")?,
            download_ack: self.flag("download acknowledgement")?,
            tables: match protocol_version >= TABLES_SINCE_VERSION {
                true => self.sync_tables()?,
                false => SyncTables::default(),
            },
        })
    }

    /// A hello's tables (v9): the subset flag, then each table and its watermark.
    fn sync_tables(&mut self) -> Result<SyncTables, DecodeError> {
        let only_these = self.flag("tables subset")?;
        // Bounded by the hello's bytes (`check_fits`), themselves bounded by the server.
        let count = self.count("table watermark", NAME_BYTES_MIN + 8)?;
        let watermarks = (0..count)
            .map(|_| {
                Ok(TableWatermark {
                    table: self.string("table name")?,
                    last_download: self.i64("table watermark")?,
                })
            })
            .collect::<Result<_, DecodeError>>()?;
        Ok(SyncTables {
            only_these,
            watermarks,
        })
    }

    fn upload(&mut self) -> Result<TableUpload, DecodeError> {
        let table = self.string("table name")?;
        let columns = self.names("column")?;
        let key_columns = self.names("key column")?;
        let inserts = self.rows("insert", &table, &columns)?;
        let update_count = self.count("update", 2 * ROW_BYTES_MIN)?;
        let keep = self.rows == Rows::Keep;
        let mut updates = Vec::with_capacity(if keep { update_count } else { 0 });
        self.rows_seen += update_count;
        for _ in 0..update_count {
            let old = self.row(&table, &columns)?;
            let new = self.row(&table, &columns)?;
            if keep {
                updates.push(RowUpdate { old, new });
            }
        }
        let deletes = self.rows("delete", &table, &key_columns)?;
        Ok(TableUpload {
            table,
            columns,
            key_columns,
            inserts,
            updates,
            deletes,
        })
    }

    fn download(&mut self) -> Result<Download, DecodeError> {
        let table = self.string("table name")?;
        let columns = self.names("column")?;
        let key_columns = self.names("key column")?;
        let upserts = self.rows("upsert", &table, &columns)?;
        let deletes = self.rows("delete", &table, &key_columns)?;
        Ok(Download {
            table,
            columns,
            key_columns,
            upserts,
            deletes,
        })
    }

    fn end_download(&mut self) -> Result<EndDownload, DecodeError> {
        Ok(EndDownload {
            watermark: self.i64("watermark")?,
            summary: SyncSummary {
                rows_uploaded: self.u64("rows uploaded")?,
                conflicts: self.u64("conflicts")?,
                upload_already_applied: self.flag("upload already applied")?,
            },
        })
    }

    fn conflicts(&mut self) -> Result<Conflicts, DecodeError> {
        let table = self.string("table name")?;
        let key_columns = self.names("key column")?;
        let keys = self.rows("conflicting key", &table, &key_columns)?;
        Ok(Conflicts {
            table,
            key_columns,
            keys,
        })
    }

    fn value_start(&mut self) -> Result<ValueStart, DecodeError> {
        let offset = self.offset;
        let tag = self.take(1, "value kind")?[0];
        let kind = PieceKind::from_u8(tag).ok_or(DecodeError::PieceKind { tag, offset })?;
        Ok(ValueStart {
            kind,
            length: self.u64("value length")?,
            table: self.string("value table")?,
            column: self.string("value column")?,
        })
    }

    /// An error message; with code 17 (`RowsRefused`, protocol v6) the rows refused.
    fn error(&mut self) -> Result<WireError, DecodeError> {
        let code = self.u16("error code")?;
        let message = self.string("error message")?;
        let mut refused = Vec::new();
        if code == ErrorCode::RowsRefused as u16 {
            let count = self.count("refused row", REFUSED_ROW_BYTES_MIN)?;
            for _ in 0..count {
                let table = self.string("refused table")?;
                let key_columns = self.names("refused key column")?;
                let key = self.row(&table, &key_columns)?;
                refused.push(RefusedRow {
                    table,
                    key_columns,
                    key,
                    code: self.u16("refused row code")?,
                    reason: self.string("refused row reason")?,
                });
            }
        }
        Ok(WireError {
            code,
            message,
            refused,
        })
    }

    /// One row: its values, or (checking only) an empty row once every value is checked.
    /// A value sent in pieces must have been announced for its table and column.
    fn key_ranges(&mut self) -> Result<KeyRanges, DecodeError> {
        let count = self.count("key range", KEY_RANGE_BYTES_MIN)?;
        let mut ranges = Vec::with_capacity(count);
        for _ in 0..count {
            ranges.push(KeyRange {
                table: self.string("key range table")?,
                start: self.i64("key range start")?,
                end: self.i64("key range end")?,
                next: self.i64("key range next")?,
            });
        }
        Ok(KeyRanges { ranges })
    }

    fn row(&mut self, table: &str, names: &[String]) -> Result<Row, DecodeError> {
        let width = names.len();
        let offset = self.offset;
        let found = usize::from(self.u16("row value count")?);
        if found != width {
            return Err(DecodeError::RowWidth {
                offset,
                expected: width,
                found,
            });
        }
        self.check_fits("value", found, VALUE_BYTES_MIN, offset)?;
        if self.rows == Rows::CheckOnly {
            for column in names {
                self.placed(table, column)?;
            }
            return Ok(Row::new());
        }
        names
            .iter()
            .map(|column| Ok(self.placed(table, column)?.into_value()))
            .collect()
    }

    /// The next value, in `column` of `table`: where a value in pieces must have been
    /// announced.
    fn placed(&mut self, table: &str, column: &str) -> Result<ValueRef<'a>, DecodeError> {
        let offset = self.offset;
        let value = self.value()?;
        if let ValueRef::Whole(whole) = &value {
            if whole.table != table || whole.column != column {
                return Err(DecodeError::InPiecesMisplaced {
                    offset,
                    announced_table: whole.table.clone(),
                    announced_column: whole.column.clone(),
                    table: table.to_owned(),
                    column: column.to_owned(),
                });
            }
        }
        Ok(value)
    }

    fn value(&mut self) -> Result<ValueRef<'a>, DecodeError> {
        self.value_at_depth(0)
    }

    fn value_at_depth(&mut self, depth: usize) -> Result<ValueRef<'a>, DecodeError> {
        let offset = self.offset;
        let tag = self.take(1, "value tag")?[0];
        Ok(match tag {
            tag::NULL => ValueRef::Null,
            tag::INT => ValueRef::Int(self.i64("integer value")?),
            tag::DOUBLE => ValueRef::Double(f64::from_bits(self.u64("double value")?)),
            tag::DECIMAL => {
                let mantissa = i128::from_be_bytes(self.array("decimal mantissa")?);
                let scale_offset = self.offset;
                let scale = self.take(1, "decimal scale")?[0];
                let decimal = Decimal::new(mantissa, scale).ok_or(DecodeError::DecimalScale {
                    scale,
                    offset: scale_offset,
                    max: DECIMAL_SCALE_MAX,
                })?;
                ValueRef::Decimal(decimal)
            }
            tag::TEXT => ValueRef::Text(self.str("text value")?),
            tag::BLOB => ValueRef::Blob(self.bytes("blob value")?),
            tag::TIMESTAMP => ValueRef::Timestamp(self.i64("timestamp value")?),
            tag::BOOL => ValueRef::Owned(Value::Bool(self.flag("boolean value")?)),
            tag::UUID => ValueRef::Owned(Value::Uuid(self.array("uuid value")?)),
            tag::DATE => ValueRef::Owned(Value::Date(
                self.array("date value").map(i32::from_be_bytes)?,
            )),
            tag::TIME => {
                let micros = self.i64("time value")?;
                if !(0..=TIME_MICROS_MAX).contains(&micros) {
                    return Err(self.invalid(
                        "time value",
                        offset,
                        format!("{micros} microseconds is outside 0 to {TIME_MICROS_MAX}"),
                    ));
                }
                ValueRef::Owned(Value::Time(micros))
            }
            tag::INTERVAL => ValueRef::Owned(Value::Interval(Interval {
                months: self.array("interval months").map(i32::from_be_bytes)?,
                days: self.array("interval days").map(i32::from_be_bytes)?,
                micros: self.i64("interval microseconds")?,
            })),
            tag::NUMERIC => {
                let text = self.str("numeric value")?;
                let numeric = Numeric::from_canonical(text).map_err(|error| {
                    self.invalid("numeric value", offset, error.reason.to_string())
                })?;
                ValueRef::Owned(Value::Numeric(numeric))
            }
            tag::ARRAY => ValueRef::Owned(self.array_value(depth, offset)?),
            tag::IN_PIECES if depth > 0 => {
                return Err(self.invalid(
                    "array element",
                    offset,
                    "a value in pieces cannot be an array element".to_owned(),
                ))
            }
            tag::IN_PIECES => {
                let rows = self.rows;
                let whole = self
                    .whole
                    .as_mut()
                    .and_then(|whole| whole.take(rows))
                    .ok_or(DecodeError::InPiecesMissing { offset })?;
                self.in_pieces += 1;
                ValueRef::Whole(whole)
            }
            tag => return Err(DecodeError::UnknownValueTag { tag, offset }),
        })
    }

    /// An array's elements (none kept when only checking), at most `ARRAY_DEPTH_MAX` deep.
    fn array_value(&mut self, depth: usize, offset: usize) -> Result<Value, DecodeError> {
        if depth >= ARRAY_DEPTH_MAX {
            return Err(self.invalid(
                "array value",
                offset,
                format!("more than {ARRAY_DEPTH_MAX} levels of arrays"),
            ));
        }
        let count = self.count("array element", VALUE_BYTES_MIN)?;
        let keep = self.rows == Rows::Keep;
        let mut elements = Vec::with_capacity(if keep { count } else { 0 });
        for _ in 0..count {
            let element = self.value_at_depth(depth + 1)?;
            if keep {
                elements.push(element.into_value());
            }
        }
        Ok(Value::Array(elements))
    }

    fn invalid(&self, what: &'static str, offset: usize, reason: String) -> DecodeError {
        DecodeError::InvalidValue {
            what,
            offset,
            reason,
        }
    }
}

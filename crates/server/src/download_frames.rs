//! The download's framing: chunks from the backend cut into messages no larger than
//! `download_message_bytes_max` (deletes first; a larger row alone in its message), each
//! message's frames (from protocol v2 its large values first, in pieces, by
//! `message_frames`), and the frame that ends the download.

use std::borrow::Cow;

use rowsync_consolidated::SyncOutcome;
use rowsync_protocol::{
    encode_frame, message_frames, Conflicts, Download, EndDownload, KeyRanges, Message, Row,
    SessionToken, Value, FRAME_BYTES_MAX_DEFAULT, FRAME_HEADER_BYTES, PIECES_SINCE_VERSION,
};

use crate::session_token::IssuedToken;
use crate::spool::SpoolError;

/// The largest frame the server sends: the frame limit every client has by default. A
/// frame above it (a row whose values cannot travel in pieces) is refused here, naming
/// the row's table and largest column, rather than by the client.
pub(crate) const DOWNLOAD_FRAME_BYTES_MAX: usize = FRAME_BYTES_MAX_DEFAULT;

fn row_bytes(row: &Row) -> usize {
    2 + row.iter().map(Value::encoded_len).sum::<usize>()
}

/// Refuses a chunk holding a text or blob value above `value_bytes_max`, naming it.
pub(crate) fn check_values(chunk: &Download, value_bytes_max: u64) -> Result<(), SpoolError> {
    let too_large = |row: &Row, columns: &[String]| {
        row.iter().zip(columns).find_map(|(value, column)| {
            let length = match value {
                Value::Text(text) => text.len(),
                Value::Blob(bytes) => bytes.len(),
                _ => return None,
            } as u64;
            (length > value_bytes_max).then(|| SpoolError::ValueTooLarge {
                table: chunk.table.clone(),
                column: column.clone(),
                length_bytes: length,
                limit_bytes: value_bytes_max,
            })
        })
    };
    let upserts = chunk.upserts.iter().map(|row| (row, &chunk.columns));
    let deletes = chunk.deletes.iter().map(|row| (row, &chunk.key_columns));
    match upserts
        .chain(deletes)
        .find_map(|(row, columns)| too_large(row, columns))
    {
        Some(error) => Err(error),
        None => Ok(()),
    }
}

#[cfg(test)]
/// Frames of one chunk (each message's frames in order), see [`chunk_messages`] and
/// [`message_frames_for`].
pub(crate) fn chunk_frames(
    chunk: Download,
    message_bytes_max: usize,
    protocol_version: u16,
) -> Result<Vec<Vec<u8>>, SpoolError> {
    chunk_messages(chunk, message_bytes_max, protocol_version)
        .into_iter()
        .flat_map(|message| message_frames_for(message, message_bytes_max, protocol_version))
        .collect()
}

/// Messages of one chunk, split where a message would pass `message_bytes_max` (a row
/// larger than that alone in its message), its values in the form of the session's
/// `protocol_version` (v1: each v2 value in its v1 form, so an old client keeps syncing).
pub(crate) fn chunk_messages(
    chunk: Download,
    message_bytes_max: usize,
    protocol_version: u16,
) -> Vec<Download> {
    let Download {
        table,
        columns,
        key_columns,
        mut upserts,
        mut deletes,
    } = chunk;
    if protocol_version < 2 {
        for row in upserts.iter_mut().chain(deletes.iter_mut()) {
            to_v1(row);
        }
    }
    // Deletes first: a receiver applying messages in order must drop before it writes.
    let rows = deletes
        .into_iter()
        .map(|row| (false, row))
        .chain(upserts.into_iter().map(|row| (true, row)));
    runs_within(rows, |(_, row)| row_bytes(row), message_bytes_max)
        .into_iter()
        .map(|run| {
            let (upserts, deletes) = run.into_iter().partition(|(is_upsert, _)| *is_upsert);
            let rows = |tagged: Vec<(bool, Row)>| tagged.into_iter().map(|(_, row)| row).collect();
            Download {
                table: table.clone(),
                columns: columns.clone(),
                key_columns: key_columns.clone(),
                upserts: rows(upserts),
                deletes: rows(deletes),
            }
        })
        .collect()
}

/// The frames of one download message, produced one at a time: to a client of protocol
/// v2 a row larger than `message_bytes_max` sends its large text and blob values first,
/// in pieces (each freed once sent); a version 1 client gets no pieces. A frame above
/// [`DOWNLOAD_FRAME_BYTES_MAX`] is refused, naming the table and the column of the
/// row's largest value that could not travel in pieces.
pub(crate) fn message_frames_for(
    message: Download,
    message_bytes_max: usize,
    protocol_version: u16,
) -> impl Iterator<Item = Result<Vec<u8>, SpoolError>> {
    let pieces = protocol_version >= PIECES_SINCE_VERSION;
    let (column, value_bytes) = largest_inline_value(&message, pieces);
    let table = message.table.clone();
    // Without pieces, no row is ever larger than the message size it is cut by.
    let cut_bytes = if pieces {
        message_bytes_max
    } else {
        usize::MAX
    };
    message_frames(Message::Download(message), cut_bytes).map(move |frame| {
        let frame_bytes = frame.len() - FRAME_HEADER_BYTES;
        if frame_bytes <= DOWNLOAD_FRAME_BYTES_MAX {
            return Ok(frame);
        }
        Err(SpoolError::RowTooLarge {
            table: table.clone(),
            column: column.clone(),
            frame_bytes,
            value_bytes,
            limit_bytes: DOWNLOAD_FRAME_BYTES_MAX,
            protocol_version,
        })
    })
}

/// The column and encoded size of the largest value of a message's rows, leaving out
/// text and blob values when they can travel in pieces.
fn largest_inline_value(message: &Download, pieces: bool) -> (String, usize) {
    let upserts = message.upserts.iter().map(|row| (row, &message.columns));
    let deletes = message
        .deletes
        .iter()
        .map(|row| (row, &message.key_columns));
    upserts
        .chain(deletes)
        .flat_map(|(row, columns)| row.iter().zip(columns))
        .filter(|(value, _)| !(pieces && matches!(value, Value::Text(_) | Value::Blob(_))))
        .map(|(value, column)| (column.clone(), value.encoded_len()))
        .max_by_key(|(_, bytes)| *bytes)
        .unwrap_or_default()
}

/// `items` in order, cut into runs whose sizes add up to at most `bytes_max`: a run is
/// cut before the item that would pass it (an item larger than that goes alone).
fn runs_within<T>(
    items: impl IntoIterator<Item = T>,
    size: impl Fn(&T) -> usize,
    bytes_max: usize,
) -> Vec<Vec<T>> {
    let mut runs = Vec::new();
    let mut current = Vec::new();
    let mut current_bytes = 0;
    for item in items {
        let item_bytes = size(&item);
        if current_bytes + item_bytes > bytes_max && current_bytes > 0 {
            runs.push(std::mem::take(&mut current));
            current_bytes = 0;
        }
        current_bytes += item_bytes;
        current.push(item);
    }
    if !current.is_empty() {
        runs.push(current);
    }
    runs
}

/// Replaces each v2 value of `row` by its v1 form.
fn to_v1(row: &mut Row) {
    for value in row.iter_mut() {
        if let Cow::Owned(v1) = value.to_v1() {
            *value = v1;
        }
    }
}

/// Frames naming one table's conflicting keys, split where a message would pass
/// `message_bytes_max`.
pub(crate) fn conflict_frames(conflicts: Conflicts, message_bytes_max: usize) -> Vec<Vec<u8>> {
    let Conflicts {
        table,
        key_columns,
        keys,
    } = conflicts;
    runs_within(keys, row_bytes, message_bytes_max)
        .into_iter()
        .map(|keys| {
            encode_frame(&Message::Conflicts(Conflicts {
                table: table.clone(),
                key_columns: key_columns.clone(),
                keys,
            }))
        })
        .collect()
}

/// The frames that end a download: the key ranges handed out (protocol v7, only when
/// there are any), a session token (protocol v8, when one was issued), then its
/// watermark and the sync's summary.
pub(crate) fn end_frame(outcome: &SyncOutcome, session_token: Option<&IssuedToken>) -> Vec<u8> {
    let mut frames = Vec::new();
    if !outcome.key_ranges.is_empty() {
        frames = encode_frame(&Message::KeyRanges(KeyRanges {
            ranges: outcome.key_ranges.clone(),
        }));
    }
    if let Some(issued) = session_token {
        frames.extend(encode_frame(&Message::SessionToken(SessionToken {
            token: issued.token.clone(),
            expires_in_seconds: issued.expires_in_seconds,
        })));
    }
    frames.extend(encode_frame(&Message::EndDownload(EndDownload {
        watermark: outcome.watermark,
        summary: outcome.summary,
    })));
    frames
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rowsync_protocol::{FrameDecoder, FRAME_BYTES_MAX_DEFAULT, PROTOCOL_VERSION};

    pub(crate) fn chunk(start: i64, rows: i64) -> Download {
        Download {
            table: "t".into(),
            columns: vec!["id".into(), "text".into()],
            key_columns: vec!["id".into()],
            upserts: (start..start + rows)
                .map(|i| vec![Value::Int(i), Value::Text("x".repeat(100))])
                .collect(),
            deletes: vec![vec![Value::Int(-start)]],
        }
    }

    #[test]
    fn chunks_split_by_size_keep_every_row_with_deletes_first() {
        let frames = chunk_frames(chunk(0, 1000), 10_000, PROTOCOL_VERSION).unwrap();
        assert!(
            frames.len() > 10,
            "expected many frames, got {}",
            frames.len()
        );
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
        let mut upserts = 0;
        let mut first = true;
        for frame in &frames {
            assert!(frame.len() < 11_000, "frame of {} bytes", frame.len());
            decoder.feed(frame);
            let Some(Message::Download(download)) = decoder.next_message().unwrap() else {
                panic!("a download")
            };
            if first {
                assert_eq!(download.deletes, vec![vec![Value::Int(0)]]);
                first = false;
            }
            upserts += download.upserts.len();
        }
        assert_eq!(upserts, 1000);
    }

    #[test]
    fn a_v1_session_gets_v2_values_in_their_v1_form() {
        let download = Download {
            table: "t".into(),
            columns: vec!["id".into(), "flag".into(), "tags".into()],
            key_columns: vec!["id".into()],
            upserts: vec![vec![
                Value::Uuid([1; 16]),
                Value::Bool(true),
                Value::Array(vec![Value::Int(1)]),
            ]],
            deletes: vec![vec![Value::Uuid([2; 16])]],
        };
        let decoded = |version| {
            let frames = chunk_frames(download.clone(), 10_000, version).unwrap();
            let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
            decoder.feed(&frames[0]);
            match decoder.next_message().unwrap() {
                Some(Message::Download(download)) => download,
                other => panic!("a download, not {other:?}"),
            }
        };
        assert_eq!(decoded(PROTOCOL_VERSION), download);
        let v1 = decoded(1);
        assert_eq!(
            v1.upserts[0],
            vec![
                Value::Text("01010101-0101-0101-0101-010101010101".into()),
                Value::Int(1),
                Value::Text("[1]".into()),
            ]
        );
        assert_eq!(
            v1.deletes[0],
            vec![Value::Text("02020202-0202-0202-0202-020202020202".into())]
        );
    }

    #[test]
    fn a_row_above_a_frame_goes_in_pieces_to_v2_and_is_refused_to_v1_naming_its_column() {
        let large = Download {
            table: "files".into(),
            columns: vec!["id".into(), "data".into()],
            key_columns: vec!["id".into()],
            upserts: vec![vec![Value::Int(1), Value::Blob(vec![7; 5_000_000])]],
            deletes: Vec::new(),
        };
        let frames = chunk_frames(large.clone(), 1024 * 1024, PROTOCOL_VERSION).unwrap();
        assert!(frames.len() > 2, "a value_start, pieces, the row");
        assert!(frames
            .iter()
            .all(|frame| frame.len() <= DOWNLOAD_FRAME_BYTES_MAX));
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
        decoder.feed(&frames.concat());
        assert_eq!(
            decoder.next_message().unwrap(),
            Some(Message::Download(large.clone()))
        );
        let refused = chunk_frames(large, 1024 * 1024, 1).unwrap_err();
        let SpoolError::RowTooLarge {
            ref table,
            ref column,
            protocol_version: 1,
            ..
        } = refused
        else {
            panic!("{refused:?}")
        };
        assert_eq!((table.as_str(), column.as_str()), ("files", "data"));
        assert!(
            refused.to_string().contains("a client of version 2 would"),
            "{refused}"
        );
    }

    #[test]
    fn conflicting_keys_split_by_size_keep_every_key_in_order() {
        let keys: Vec<Row> = (0..1000).map(|i| vec![Value::Int(i)]).collect();
        let conflicts = Conflicts {
            table: "t".into(),
            key_columns: vec!["id".into()],
            keys: keys.clone(),
        };
        let frames = conflict_frames(conflicts, 1_000);
        assert!(
            frames.len() >= 11,
            "expected many frames, got {}",
            frames.len()
        );
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
        let mut received = Vec::new();
        for frame in &frames {
            assert!(frame.len() < 1_100, "frame of {} bytes", frame.len());
            decoder.feed(frame);
            let Some(Message::Conflicts(part)) = decoder.next_message().unwrap() else {
                panic!("a conflicts message")
            };
            assert_eq!(part.key_columns, vec!["id".to_string()]);
            received.extend(part.keys);
        }
        assert_eq!(received, keys);
    }
}

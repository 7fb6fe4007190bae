//! The download's framing: chunks from the backend cut into messages no larger than
//! `download_message_bytes_max` (deletes first; a larger row alone in its message, its
//! large values sent in pieces by `message_frames`), and the frame that ends the download.

use rowsync_consolidated::SyncOutcome;
use rowsync_protocol::{encode_frame, Download, EndDownload, Message, Row, Value};

use crate::spool::SpoolError;

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
    let found = (chunk
        .upserts
        .iter()
        .map(|row| too_large(row, &chunk.columns)))
    .chain(
        chunk
            .deletes
            .iter()
            .map(|row| too_large(row, &chunk.key_columns)),
    )
    .flatten()
    .next();
    found.map_or(Ok(()), Err)
}

/// Frames of one chunk, split where a message would pass `message_bytes_max` (tests).
#[cfg(test)]
pub(crate) fn chunk_frames(chunk: Download, message_bytes_max: usize) -> Vec<Vec<u8>> {
    chunk_messages(chunk, message_bytes_max)
        .into_iter()
        .map(|message| encode_frame(&Message::Download(message)))
        .collect()
}

/// Messages of one chunk, split where a message would pass `message_bytes_max`: a row
/// larger than that is alone in its message.
pub(crate) fn chunk_messages(chunk: Download, message_bytes_max: usize) -> Vec<Download> {
    let Download {
        table,
        columns,
        key_columns,
        upserts,
        deletes,
    } = chunk;
    let empty = || Download {
        table: table.clone(),
        columns: columns.clone(),
        key_columns: key_columns.clone(),
        ..Download::default()
    };
    let mut messages = Vec::new();
    let mut current = empty();
    let mut current_bytes = 0;
    // Deletes first: a receiver applying messages in order must drop before it writes.
    for (is_upsert, row) in deletes
        .into_iter()
        .map(|row| (false, row))
        .chain(upserts.into_iter().map(|row| (true, row)))
    {
        // Cut before the row that would pass the size, so no message grows past it.
        let size = row_bytes(&row);
        if current_bytes + size > message_bytes_max && current_bytes > 0 {
            messages.push(std::mem::replace(&mut current, empty()));
            current_bytes = 0;
        }
        current_bytes += size;
        if is_upsert {
            current.upserts.push(row);
        } else {
            current.deletes.push(row);
        }
    }
    if !current.upserts.is_empty() || !current.deletes.is_empty() {
        messages.push(current);
    }
    messages
}

/// The frame that ends a download: its watermark and the sync's summary.
pub(crate) fn end_frame(outcome: &SyncOutcome) -> Vec<u8> {
    encode_frame(&Message::EndDownload(EndDownload {
        watermark: outcome.watermark,
        summary: outcome.summary,
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rowsync_protocol::{FrameDecoder, FRAME_BYTES_MAX_DEFAULT};

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
        let frames = chunk_frames(chunk(0, 1000), 10_000);
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
}

//! The download's framing: chunks from the backend encoded into frames no larger than
//! `download_message_bytes_max` (deletes first), and the frame that ends the download.

use rowsync_consolidated::SyncOutcome;
use rowsync_protocol::{encode_frame, Conflicts, Download, EndDownload, Message, Row, Value};

fn row_bytes(row: &Row) -> usize {
    2 + row.iter().map(Value::encoded_len).sum::<usize>()
}

/// Frames of one chunk, split where a message would pass `message_bytes_max`.
pub(crate) fn chunk_frames(chunk: Download, message_bytes_max: usize) -> Vec<Vec<u8>> {
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
    let mut frames = Vec::new();
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
            frames.push(encode_frame(&Message::Download(std::mem::replace(
                &mut current,
                empty(),
            ))));
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
        frames.push(encode_frame(&Message::Download(current)));
    }
    frames
}

/// Frames naming one table's conflicting keys, split where a message would pass
/// `message_bytes_max`.
pub(crate) fn conflict_frames(conflicts: Conflicts, message_bytes_max: usize) -> Vec<Vec<u8>> {
    let Conflicts {
        table,
        key_columns,
        keys,
    } = conflicts;
    let mut frames = Vec::new();
    let mut current: Vec<Row> = Vec::new();
    let mut current_bytes = 0;
    let mut flush = |current: &mut Vec<Row>| {
        frames.push(encode_frame(&Message::Conflicts(Conflicts {
            table: table.clone(),
            key_columns: key_columns.clone(),
            keys: std::mem::take(current),
        })));
    };
    for key in keys {
        let size = row_bytes(&key);
        if current_bytes + size > message_bytes_max && current_bytes > 0 {
            flush(&mut current);
            current_bytes = 0;
        }
        current_bytes += size;
        current.push(key);
    }
    if !current.is_empty() {
        flush(&mut current);
    }
    frames
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

//! Cuts a sync's download into frames of bounded size.

use rowsync_consolidated::SyncOutcome;
use rowsync_protocol::{encode_frame, Download, EndDownload, Message, Row, Value};

fn row_bytes(row: &Row) -> usize {
    2 + row.iter().map(Value::encoded_len).sum::<usize>()
}

/// The frames of the download, each table split where a message would pass
/// `message_bytes_max`, then the end of download.
pub fn download_frames(outcome: SyncOutcome, message_bytes_max: usize) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    for download in outcome.downloads {
        let Download {
            table,
            columns,
            key_columns,
            upserts,
            deletes,
        } = download;
        let empty = || Download {
            table: table.clone(),
            columns: columns.clone(),
            key_columns: key_columns.clone(),
            ..Download::default()
        };
        let mut chunk = empty();
        let mut chunk_bytes = 0;
        for (is_upsert, row) in upserts
            .into_iter()
            .map(|row| (true, row))
            .chain(deletes.into_iter().map(|row| (false, row)))
        {
            chunk_bytes += row_bytes(&row);
            if is_upsert {
                chunk.upserts.push(row);
            } else {
                chunk.deletes.push(row);
            }
            if chunk_bytes >= message_bytes_max {
                frames.push(encode_frame(&Message::Download(std::mem::replace(
                    &mut chunk,
                    empty(),
                ))));
                chunk_bytes = 0;
            }
        }
        if !chunk.upserts.is_empty() || !chunk.deletes.is_empty() {
            frames.push(encode_frame(&Message::Download(chunk)));
        }
    }
    frames.push(encode_frame(&Message::EndDownload(EndDownload {
        watermark: outcome.watermark,
        summary: outcome.summary,
    })));
    frames
}

#[cfg(test)]
mod tests {
    use super::*;
    use rowsync_protocol::{decode_message, FRAME_HEADER_BYTES};

    #[test]
    fn splits_large_tables_and_keeps_every_row() {
        let outcome = SyncOutcome {
            downloads: vec![Download {
                table: "t".into(),
                columns: vec!["id".into(), "text".into()],
                key_columns: vec!["id".into()],
                upserts: (0..1000)
                    .map(|i| vec![Value::Int(i), Value::Text("x".repeat(100))])
                    .collect(),
                deletes: (0..10).map(|i| vec![Value::Int(i + 5000)]).collect(),
            }],
            watermark: 7,
            summary: Default::default(),
        };
        let frames = download_frames(outcome, 10_000);
        assert!(
            frames.len() > 10,
            "expected many frames, got {}",
            frames.len()
        );
        let (mut upserts, mut deletes) = (0, 0);
        for frame in &frames {
            assert!(
                frame.len() < 10_000 + 1_000,
                "frame of {} bytes",
                frame.len()
            );
            match decode_message(&frame[FRAME_HEADER_BYTES..]).unwrap() {
                Message::Download(download) => {
                    upserts += download.upserts.len();
                    deletes += download.deletes.len();
                }
                Message::EndDownload(end) => assert_eq!(end.watermark, 7),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!((upserts, deletes), (1000, 10));
    }
}

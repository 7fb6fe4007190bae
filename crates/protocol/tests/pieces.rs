//! Values in pieces (protocol v2): sent by `message_frames`, put back (or only checked)
//! by the frame decoder, refused when they break a rule, and never held beyond the limits.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

use proptest::prelude::*;
use rowsync_protocol::*;

fn download_of(row: Row) -> Message {
    Message::Download(Download {
        table: "files".into(),
        columns: (0..row.len()).map(|i| format!("c{i}")).collect(),
        key_columns: vec!["c0".into()],
        upserts: vec![row],
        deletes: Vec::new(),
    })
}

fn frames(message: &Message, message_bytes_max: usize) -> Vec<Vec<u8>> {
    message_frames(message.clone(), message_bytes_max).collect()
}

/// Feeds `bytes` in reads of `read_bytes`, collecting every message (decoding or only
/// checking) and the most bytes the decoder buffered at once.
fn decode_all(
    decoder: &mut FrameDecoder,
    bytes: &[u8],
    read_bytes: usize,
    check_only: bool,
) -> Result<(Vec<Message>, usize), DecodeError> {
    let mut messages = Vec::new();
    let mut buffered_max = 0;
    for read in bytes.chunks(read_bytes.max(1)) {
        decoder.feed(read);
        buffered_max = buffered_max.max(decoder.buffered_bytes());
        loop {
            let next = if check_only {
                decoder.next_message_checked()?
            } else {
                decoder.next_message()?
            };
            match next {
                Some(message) => messages.push(message),
                None => break,
            }
        }
    }
    Ok((messages, buffered_max))
}

proptest! {
    #[test]
    fn values_in_pieces_round_trip_split_anywhere(
        blob in proptest::collection::vec(any::<u8>(), 0..3000),
        text in ".{0,400}",
        message_bytes_max in 16usize..600,
        read_bytes in 1usize..700,
    ) {
        let message = download_of(vec![Value::Int(1), Value::Text(text), Value::Blob(blob)]);
        let sent = frames(&message, message_bytes_max);
        for frame in &sent {
            // Every frame stays within the sender's message size (plus its own header).
            prop_assert!(frame.len() <= message_bytes_max.max(200) + 64, "frame of {}", frame.len());
        }
        let stream: Vec<u8> = sent.concat();
        let mut decoder = FrameDecoder::new(1 << 20);
        let (messages, buffered_max) = decode_all(&mut decoder, &stream, read_bytes, false).unwrap();
        prop_assert_eq!(&messages, &vec![message.clone()]);
        // The decoder buffers one frame plus one read, never the value.
        let frame_max = sent.iter().map(Vec::len).max().unwrap();
        prop_assert!(buffered_max <= frame_max + read_bytes);
        // Checking alone accepts the same stream and keeps no rows.
        let mut checker = FrameDecoder::new(1 << 20);
        let (checked, _) = decode_all(&mut checker, &stream, read_bytes, true).unwrap();
        prop_assert_eq!(checked.len(), 1);
    }
}

#[test]
fn a_large_value_travels_in_pieces_and_small_rows_do_not() {
    let big = download_of(vec![Value::Int(1), Value::Blob(vec![7; 5_000_000])]);
    let sent = frames(&big, 1 << 20);
    // value_start, five pieces of at most 1 MiB, the message.
    assert_eq!(sent.len(), 7);
    assert!(sent.iter().all(|frame| frame.len() <= (1 << 20) + 9));
    let small = download_of(vec![Value::Int(1), Value::Blob(vec![7; 1000])]);
    assert_eq!(frames(&small, 1 << 20), vec![encode_frame(&small)]);
}

#[test]
fn a_value_above_the_limit_is_refused_at_its_value_start() {
    let message = download_of(vec![Value::Int(1), Value::Blob(vec![1; 1001])]);
    let sent = frames(&message, 100);
    let mut decoder = FrameDecoder::new(1 << 20).with_value_limits(1000, 1 << 20);
    decoder.feed(&sent[0]);
    assert_eq!(
        decoder.next_message_checked().unwrap_err(),
        DecodeError::ValueTooLarge {
            table: "files".into(),
            column: "c1".into(),
            length: 1001,
            limit: 1000
        }
    );
    // Exactly at the limit is accepted.
    let message = download_of(vec![Value::Int(1), Value::Blob(vec![1; 1000])]);
    let mut decoder = FrameDecoder::new(1 << 20).with_value_limits(1000, 1 << 20);
    let (messages, _) =
        decode_all(&mut decoder, &frames(&message, 100).concat(), 64, false).unwrap();
    assert_eq!(messages, vec![message]);
}

#[test]
fn the_values_of_one_row_are_bounded_together() {
    let message = download_of(vec![
        Value::Int(1),
        Value::Blob(vec![1; 600]),
        Value::Blob(vec![2; 600]),
    ]);
    let mut decoder = FrameDecoder::new(1 << 20).with_value_limits(1000, 1000);
    let error = decode_all(&mut decoder, &frames(&message, 100).concat(), 64, false).unwrap_err();
    // Each value costs its names ("files", "c1" or "c2") and a fixed amount besides.
    let each = 600 + 7 + VALUE_IN_PIECES_COST_BYTES;
    assert_eq!(
        error,
        DecodeError::RowPiecesTooLarge {
            bytes: 2 * each,
            limit: 1000
        }
    );
}

/// A `value_start` for column `c1` of `files`, where [`download_of`]'s second value sits.
fn value_start(kind: PieceKind, length: u64) -> Vec<u8> {
    encode_frame(&Message::ValueStart(ValueStart {
        kind,
        length,
        table: "files".into(),
        column: "c1".into(),
    }))
}

fn value_piece(bytes: &[u8]) -> Vec<u8> {
    encode_frame(&Message::ValuePiece(ValuePiece {
        bytes: bytes.to_vec(),
    }))
}

fn first_error(frames: &[Vec<u8>], check_only: bool) -> DecodeError {
    let mut decoder = FrameDecoder::new(1 << 20);
    decode_all(&mut decoder, &frames.concat(), 1 << 20, check_only).unwrap_err()
}

#[test]
fn broken_sequences_are_refused_in_both_modes() {
    let row_message = |values: usize| {
        let mut body = encode_frame(&download_of(vec![Value::Int(1), Value::Null]));
        // Replace the NULL (the last value, tag 0x00) by the tag in_pieces.
        let last = body.len() - 5; // deletes count (4 bytes) after the value
        assert_eq!(body[last], 0x00);
        if values > 0 {
            body[last] = 0x20;
        }
        body
    };
    let end_upload = encode_frame(&Message::EndUpload(EndUpload { upload_sequence: 1 }));
    for check_only in [false, true] {
        assert_eq!(
            first_error(&[value_piece(b"ab")], check_only),
            DecodeError::PieceWithoutStart
        );
        assert_eq!(
            first_error(
                &[value_start(PieceKind::Blob, 2), value_piece(b"abc")],
                check_only
            ),
            DecodeError::PieceOverrun {
                received: 3,
                length: 2
            }
        );
        assert_eq!(
            first_error(
                &[
                    value_start(PieceKind::Blob, 4),
                    value_piece(b"ab"),
                    row_message(1)
                ],
                check_only
            ),
            DecodeError::ValueIncomplete {
                message: "download",
                received: 2,
                length: 4
            }
        );
        assert_eq!(
            first_error(
                &[
                    value_start(PieceKind::Blob, 2),
                    value_piece(b"ab"),
                    end_upload.clone()
                ],
                check_only
            ),
            DecodeError::InPiecesUnused {
                count: 1,
                message: "end_upload"
            }
        );
        assert!(matches!(
            first_error(&[row_message(1)], check_only),
            DecodeError::InPiecesMissing { .. }
        ));
        assert!(matches!(
            first_error(
                &[value_start(PieceKind::Text, 2), value_piece(&[0xc3, 0x28])],
                check_only
            ),
            DecodeError::InvalidUtf8 { .. }
        ));
    }
    // A kind that cannot travel in pieces.
    let mut start = value_start(PieceKind::Blob, 2);
    start[5] = 0x01;
    assert!(matches!(
        first_error(&[start], false),
        DecodeError::PieceKind { tag: 0x01, .. }
    ));
    // A message holding values in pieces carries exactly one row.
    let mut two_rows = download_of(vec![Value::Int(1), Value::Null]);
    if let Message::Download(download) = &mut two_rows {
        download.upserts.push(vec![Value::Int(2), Value::Null]);
    }
    let mut body = encode_frame(&two_rows);
    let last = body.len() - 5;
    body[last] = 0x20;
    assert_eq!(
        first_error(
            &[value_start(PieceKind::Blob, 1), value_piece(b"a"), body],
            false
        ),
        DecodeError::InPiecesRows { rows: 2 }
    );
    // Outside a frame stream nothing stands behind the tag.
    assert!(matches!(
        decode_message(&row_message(1)[FRAME_HEADER_BYTES..]),
        Err(DecodeError::InPiecesMissing { .. })
    ));
}

#[test]
fn a_value_in_pieces_sits_where_it_was_announced() {
    // Announced for c1 of files, but the download names another table.
    let mut elsewhere = download_of(vec![Value::Int(1), Value::Blob(vec![5; 300])]);
    if let Message::Download(download) = &mut elsewhere {
        download.table = "other".into();
    }
    let mut sent = frames(&elsewhere, 100);
    sent[0] = value_start(PieceKind::Blob, 300);
    for check_only in [false, true] {
        assert_eq!(
            first_error(&sent, check_only),
            DecodeError::InPiecesMisplaced {
                offset: 47,
                announced_table: "files".into(),
                announced_column: "c1".into(),
                table: "other".into(),
                column: "c1".into(),
            }
        );
    }
}

#[test]
fn a_decoder_that_refuses_pieces_refuses_value_start_and_value_piece() {
    for frame in [value_start(PieceKind::Blob, 2), value_piece(b"ab")] {
        let mut decoder = FrameDecoder::new(1 << 20);
        decoder.refuse_pieces();
        decoder.feed(&frame);
        assert_eq!(
            decoder.next_message_checked().unwrap_err(),
            DecodeError::PiecesRefused
        );
    }
}

/// Issue 32, item 1: a `value_start` of length 0 cost a few bytes on the wire and was
/// held until the next row, without limit.
#[test]
fn an_empty_value_never_travels_in_pieces() {
    for check_only in [false, true] {
        assert_eq!(
            first_error(&[value_start(PieceKind::Blob, 0)], check_only),
            DecodeError::EmptyValueInPieces {
                table: "files".into(),
                column: "c1".into(),
            }
        );
    }
}

/// Issue 32, item 1: each whole value held for the row costs a fixed amount and its
/// names besides its bytes, so many small values reach the row's limit.
#[test]
fn small_values_in_pieces_cost_their_names_and_a_fixed_amount() {
    let one = [value_start(PieceKind::Blob, 1), value_piece(b"a")].concat();
    let cost = 1 + VALUE_IN_PIECES_COST_BYTES + "files".len() as u64 + "c1".len() as u64;
    let limit = 100 * cost;
    for check_only in [false, true] {
        let mut decoder = FrameDecoder::new(1 << 20).with_value_limits(1000, limit);
        let error = decode_all(&mut decoder, &one.repeat(1000), 1 << 16, check_only).unwrap_err();
        assert_eq!(
            error,
            DecodeError::RowPiecesTooLarge {
                bytes: 101 * cost,
                limit
            }
        );
    }
}

/// Issue 32, item 1: no more values wait for a row than a row can hold (an update's two
/// images of the most columns a message names).
#[test]
fn no_more_values_in_pieces_than_a_row_holds() {
    let one = [value_start(PieceKind::Blob, 1), value_piece(b"a")].concat();
    let most = VALUES_IN_PIECES_PER_ROW_MAX;
    let mut decoder = FrameDecoder::new(1 << 20).with_value_limits(1000, u64::MAX);
    let error = decode_all(&mut decoder, &one.repeat(most + 1), 1 << 20, true).unwrap_err();
    assert_eq!(error, DecodeError::ValuesInPiecesTooMany { limit: most });
}

/// Found by the `frame_stream` fuzz target: decoding checked a text value's UTF-8 only
/// once the value was whole, so a bad piece followed by a frame too large was refused
/// for the frame when decoding and for the text when checking.
#[test]
fn bad_utf8_is_refused_at_its_piece_in_both_modes() {
    let mut too_large = vec![0xff, 0xff, 0xff, 0xff];
    too_large.push(0);
    for check_only in [false, true] {
        assert!(matches!(
            first_error(
                &[
                    value_start(PieceKind::Text, 4),
                    value_piece(&[0xa6]),
                    too_large.clone()
                ],
                check_only
            ),
            DecodeError::InvalidUtf8 { .. }
        ));
    }
}

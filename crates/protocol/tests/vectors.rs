//! Golden test vectors: message <-> bytes, shared with implementations in other languages.
//!
//! `tests/vectors.json` is the contract. Regenerate it only for a deliberate protocol
//! change: `ROWSYNC_WRITE_VECTORS=1 cargo test -p rowsync-protocol --test vectors`.

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

use rowsync_protocol::*;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct Vector {
    name: String,
    message: Message,
    /// The whole frame, length prefix included, as lowercase hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    frame_hex: Option<String>,
    /// For a message sent with values in pieces: the sender's message size...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message_bytes_max: Option<usize>,
    /// ...and every frame it sends, in order (value_start, value_piece..., the message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    frames_hex: Option<Vec<String>>,
}

fn decimal(text: &str) -> Value {
    Value::Decimal(text.parse().unwrap())
}

fn vectors() -> Vec<(&'static str, Message)> {
    vec![
        (
            "hello",
            Message::Hello(Hello {
                protocol_version: 2,
                client_id: "device-7".into(),
                user: "alice".into(),
                password: "s3cret".into(),
                script_version: "v1".into(),
                last_download_watermark: 42,
                token: String::new(),
                auth_parameters: vec!["site-9".into()],
                download_ack: false,
                tables: Default::default(),
            }),
        ),
        (
            "hello_with_tables",
            Message::Hello(Hello {
                protocol_version: 9,
                client_id: "device-9".into(),
                user: "alice".into(),
                password: "s3cret".into(),
                script_version: "v1".into(),
                last_download_watermark: 42,
                token: String::new(),
                auth_parameters: Vec::new(),
                download_ack: false,
                tables: SyncTables {
                    only_these: true,
                    watermarks: vec![
                        TableWatermark {
                            table: "film".into(),
                            last_download: 77,
                        },
                        TableWatermark {
                            table: "store".into(),
                            last_download: 42,
                        },
                    ],
                },
            }),
        ),
        (
            "hello_with_token",
            Message::Hello(Hello {
                protocol_version: 2,
                client_id: "device-8".into(),
                user: String::new(),
                password: String::new(),
                script_version: "v2".into(),
                last_download_watermark: 0,
                token: "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2ln".into(),
                auth_parameters: Vec::new(),
                download_ack: true,
                tables: Default::default(),
            }),
        ),
        (
            "upload_all_value_types",
            Message::Upload(TableUpload {
                table: "orders".into(),
                columns: vec!["id".into(), "rep".into(), "amount".into(), "note".into()],
                key_columns: vec!["id".into()],
                inserts: vec![
                    vec![
                        Value::Int(1),
                        "alice".into(),
                        decimal("999999999999999999999999.999999"),
                        Value::Null,
                    ],
                    vec![
                        Value::Int(-2),
                        "alice".into(),
                        Value::Double(2.5),
                        Value::Blob(vec![0, 255, 16]),
                    ],
                    vec![
                        Value::Int(i64::MAX),
                        "alice".into(),
                        decimal("-0.000001"),
                        Value::Timestamp(1_700_000_000_123_456),
                    ],
                ],
                updates: vec![RowUpdate {
                    old: vec![
                        Value::Int(3),
                        "alice".into(),
                        decimal("1.000000"),
                        "before".into(),
                    ],
                    new: vec![
                        Value::Int(3),
                        "alice".into(),
                        decimal("2.000000"),
                        "after ✓".into(),
                    ],
                }],
                deletes: vec![vec![Value::Int(4)]],
            }),
        ),
        (
            "upload_v2_value_types",
            Message::Upload(TableUpload {
                table: "things".into(),
                columns: vec![
                    "id".into(),
                    "flag".into(),
                    "day".into(),
                    "at".into(),
                    "span".into(),
                    "amount".into(),
                    "tags".into(),
                ],
                key_columns: vec!["id".into()],
                inserts: vec![
                    vec![
                        Value::Uuid([
                            0x0e, 0x3f, 0x5f, 0x6a, 0x2b, 0x8c, 0x4e, 0x1d, 0x9f, 0x3a, 0x5c, 0x6d,
                            0x7e, 0x8f, 0x9a, 0x0b,
                        ]),
                        Value::Bool(true),
                        Value::Date(19_782),
                        Value::Time(47_109_000_250),
                        Value::Interval(Interval {
                            months: 14,
                            days: -3,
                            micros: 14_706_500_000,
                        }),
                        Value::Numeric(
                            Numeric::from_canonical("-123456789012345678901234567890123456789.5")
                                .unwrap(),
                        ),
                        Value::Array(vec![
                            Value::Array(vec![Value::Int(1), Value::Null]),
                            Value::Array(vec![Value::Int(2), Value::Int(3)]),
                        ]),
                    ],
                    vec![
                        Value::Uuid([0; 16]),
                        Value::Bool(false),
                        Value::Date(i32::MAX),
                        Value::Time(86_400_000_000),
                        Value::Interval(Interval {
                            months: 0,
                            days: 0,
                            micros: -1,
                        }),
                        Value::Numeric(Numeric::from_canonical("NaN").unwrap()),
                        Value::Array(Vec::new()),
                    ],
                ],
                updates: Vec::new(),
                deletes: Vec::new(),
            }),
        ),
        (
            "hello_v1",
            Message::Hello(Hello {
                protocol_version: 1,
                client_id: "device-1".into(),
                user: "alice".into(),
                password: "s3cret".into(),
                script_version: "v1".into(),
                last_download_watermark: 0,
                token: String::new(),
                auth_parameters: Vec::new(),
                download_ack: false,
                tables: Default::default(),
            }),
        ),
        (
            "end_upload",
            Message::EndUpload(EndUpload { upload_sequence: 7 }),
        ),
        (
            "download",
            Message::Download(Download {
                table: "orders".into(),
                columns: vec!["id".into(), "rep".into()],
                key_columns: vec!["id".into()],
                upserts: vec![vec![Value::Int(5), "alice".into()]],
                deletes: vec![vec![Value::Int(6)], vec![Value::Int(8)]],
            }),
        ),
        (
            "end_download",
            Message::EndDownload(EndDownload {
                watermark: 1234,
                summary: SyncSummary {
                    rows_uploaded: 5,
                    conflicts: 1,
                    upload_already_applied: false,
                },
            }),
        ),
        (
            "end_download_duplicate_upload",
            Message::EndDownload(EndDownload {
                watermark: 1234,
                summary: SyncSummary {
                    rows_uploaded: 5,
                    conflicts: 0,
                    upload_already_applied: true,
                },
            }),
        ),
        (
            "error",
            Message::Error(WireError::new(
                ErrorCode::AuthenticationFailed,
                "authentication failed for user \"bob\"",
            )),
        ),
        (
            "busy",
            Message::Busy {
                retry_after_ms: 1500,
            },
        ),
        (
            "download_ack",
            Message::DownloadAck(DownloadAck {
                watermark: 1_234_567,
            }),
        ),
        (
            "conflicts",
            Message::Conflicts(Conflicts {
                table: "order_lines".into(),
                key_columns: vec!["order_id".into(), "line".into()],
                keys: vec![
                    vec![Value::Int(1001), Value::Int(1)],
                    vec![Value::Int(1002), Value::Int(3)],
                ],
            }),
        ),
        (
            "value_start",
            Message::ValueStart(ValueStart {
                kind: PieceKind::Blob,
                length: 70_000_000,
                table: "files".into(),
                column: "data".into(),
            }),
        ),
        (
            "value_piece",
            Message::ValuePiece(ValuePiece {
                bytes: vec![0x00, 0xff, 0x10, 0x20],
            }),
        ),
        (
            "hello_v3",
            Message::Hello(Hello {
                protocol_version: 3,
                client_id: "device-7".into(),
                user: "alice".into(),
                password: "s3cret".into(),
                script_version: "v1".into(),
                last_download_watermark: 42,
                token: String::new(),
                auth_parameters: Vec::new(),
                download_ack: false,
                tables: Default::default(),
            }),
        ),
        (
            "hello_v5",
            Message::Hello(Hello {
                protocol_version: 5,
                client_id: "device-7".into(),
                user: "alice".into(),
                password: "s3cret".into(),
                script_version: "v1".into(),
                last_download_watermark: 42,
                token: String::new(),
                auth_parameters: Vec::new(),
                download_ack: false,
                tables: Default::default(),
            }),
        ),
        (
            "error_client_copied",
            Message::Error(WireError::new(
                ErrorCode::ClientCopied,
                "client id \"device-7\": upload 4 was applied as another transfer",
            )),
        ),
        (
            "error_client_restored",
            Message::Error(WireError::new(
                ErrorCode::ClientRestored,
                "client id \"device-7\": upload 3 is below the last applied, 5",
            )),
        ),
        (
            "error_rows_refused",
            Message::Error(WireError {
                refused: vec![
                    RefusedRow {
                        table: "payment".into(),
                        key_columns: vec!["payment_id".into()],
                        key: vec![Value::Int(17)],
                        code: ErrorCode::Script as u16,
                        reason: "no partition of relation \"payment\" found for row".into(),
                    },
                    RefusedRow {
                        table: "todo".into(),
                        key_columns: Vec::new(),
                        key: Vec::new(),
                        code: ErrorCode::Schema as u16,
                        reason: "table \"todo\" is not synchronized by script version \"v1\""
                            .into(),
                    },
                ],
                ..WireError::new(ErrorCode::RowsRefused, "2 rows of the upload were refused")
            }),
        ),
        (
            "upload_resume_new_transfer",
            Message::UploadResume(UploadResume {
                transfer_id: "3f2a9c1e0b7d4e58".into(),
                offset: 0,
            }),
        ),
        (
            "upload_resume_at_offset",
            Message::UploadResume(UploadResume {
                transfer_id: "3f2a9c1e0b7d4e58".into(),
                offset: 1_048_583,
            }),
        ),
        (
            "upload_held_question",
            Message::UploadHeld(UploadHeld {
                transfer_id: "3f2a9c1e0b7d4e58".into(),
                length: 0,
                sha256: Vec::new(),
            }),
        ),
        (
            "upload_held_answer",
            Message::UploadHeld(UploadHeld {
                transfer_id: "3f2a9c1e0b7d4e58".into(),
                length: 1_048_583,
                sha256: (0u8..32).collect(),
            }),
        ),
        (
            "download_resume_at_offset",
            Message::DownloadResume(DownloadResume {
                transfer_id: "3f2a9c1e0b7d4e58".into(),
                offset: 65_543,
            }),
        ),
        (
            "download_held_answer",
            Message::DownloadHeld(DownloadHeld {
                transfer_id: "3f2a9c1e0b7d4e58".into(),
                length: 1_048_583,
                sha256: (0u8..32).collect(),
            }),
        ),
        (
            "key_ranges_from_client",
            Message::KeyRanges(KeyRanges {
                ranges: vec![KeyRange {
                    table: "customer".into(),
                    start: 1_001,
                    end: 2_001,
                    next: 1_734,
                }],
            }),
        ),
        (
            "key_ranges_from_server",
            Message::KeyRanges(KeyRanges {
                ranges: vec![
                    KeyRange {
                        table: "customer".into(),
                        start: 2_001,
                        end: 3_001,
                        next: 2_001,
                    },
                    KeyRange {
                        table: "rental".into(),
                        start: 4_294_967_296,
                        end: 4_294_968_296,
                        next: 4_294_967_296,
                    },
                ],
            }),
        ),
        (
            "session_token",
            Message::SessionToken(SessionToken {
                token: "rss1.eyJhbGciOiJIUzI1NiJ9.e30.c2ln".into(),
                expires_in_seconds: 43_200,
            }),
        ),
    ]
}

/// Messages sent with values in pieces, each with the sender's `message_bytes_max`.
fn vectors_in_pieces() -> Vec<(&'static str, usize, Message)> {
    vec![
        (
            "download_values_in_pieces",
            32,
            Message::Download(Download {
                table: "files".into(),
                columns: vec!["id".into(), "name".into(), "data".into()],
                key_columns: vec!["id".into()],
                upserts: vec![vec![
                    Value::Int(9),
                    "after ✓".into(),
                    Value::Blob((0..40).collect()),
                ]],
                deletes: Vec::new(),
            }),
        ),
        (
            "upload_update_in_pieces",
            16,
            Message::Upload(TableUpload {
                table: "files".into(),
                columns: vec!["id".into(), "data".into()],
                key_columns: vec!["id".into()],
                updates: vec![RowUpdate {
                    old: vec![Value::Int(3), Value::Blob(vec![0xaa; 20])],
                    new: vec![Value::Int(3), Value::Blob(vec![0xbb; 20])],
                }],
                ..TableUpload::default()
            }),
        ),
    ]
}

#[test]
fn golden_vectors_match_the_committed_file() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors.json");
    let single = vectors().into_iter().map(|(name, message)| Vector {
        name: name.to_string(),
        frame_hex: Some(hex::encode(encode_frame(&message))),
        message,
        message_bytes_max: None,
        frames_hex: None,
    });
    let in_pieces = vectors_in_pieces()
        .into_iter()
        .map(|(name, message_bytes_max, message)| Vector {
            name: name.to_string(),
            frame_hex: None,
            message_bytes_max: Some(message_bytes_max),
            frames_hex: Some(
                message_frames(message.clone(), message_bytes_max)
                    .map(hex::encode)
                    .collect(),
            ),
            message,
        });
    let generated: Vec<Vector> = single.chain(in_pieces).collect();
    if std::env::var_os("ROWSYNC_WRITE_VECTORS").is_some() {
        let text = serde_json::to_string_pretty(&generated).unwrap() + "\n";
        std::fs::write(path, text).unwrap();
    }
    let committed: Vec<Vector> =
        serde_json::from_str(&std::fs::read_to_string(path).expect("tests/vectors.json exists"))
            .expect("tests/vectors.json parses");
    assert_eq!(committed.len(), generated.len(), "vector count");
    for (committed, generated) in committed.iter().zip(&generated) {
        assert_eq!(committed, generated, "vector {} changed", committed.name);
        match (&committed.frame_hex, &committed.frames_hex) {
            (Some(frame_hex), None) => check_single(&committed.message, frame_hex),
            (None, Some(frames_hex)) => check_in_pieces(committed, frames_hex),
            _ => panic!(
                "vector {} has neither frame_hex nor frames_hex",
                committed.name
            ),
        }
    }
}

/// Both directions, from the file alone, as another implementation would check.
fn check_single(message: &Message, frame_hex: &str) {
    let frame = hex::decode(frame_hex).unwrap();
    assert_eq!(hex::encode(encode_frame(message)), frame_hex);
    assert_eq!(
        &decode_message(&frame[FRAME_HEADER_BYTES..]).unwrap(),
        message
    );
    if matches!(message, Message::ValueStart(_) | Message::ValuePiece(_)) {
        return; // a frame decoder takes these into the value they carry
    }
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
    decoder.feed(&frame);
    assert_eq!(decoder.next_message().unwrap().as_ref(), Some(message));
    assert_eq!(decoder.buffered_bytes(), 0);
}

/// The sender's frames, and a frame decoder given all of them yields the one message.
fn check_in_pieces(vector: &Vector, frames_hex: &[String]) {
    let message_bytes_max = vector.message_bytes_max.expect("message_bytes_max");
    let encoded: Vec<String> = message_frames(vector.message.clone(), message_bytes_max)
        .map(hex::encode)
        .collect();
    assert_eq!(encoded, frames_hex, "vector {}", vector.name);
    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
    let mut messages = Vec::new();
    for frame in frames_hex {
        decoder.feed(&hex::decode(frame).unwrap());
        messages.extend(decoder.next_message().unwrap());
    }
    assert_eq!(
        messages,
        vec![vector.message.clone()],
        "vector {}",
        vector.name
    );
    assert_eq!(decoder.buffered_bytes(), 0);
}

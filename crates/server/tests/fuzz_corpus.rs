//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/*`) through the fuzz targets'
//! bodies (`rowsync_server::fuzzing`) on the stable toolchain, with the allocator that
//! counts the heap installed, so every invariant the fuzzers checked is checked in CI.
//! The fuzzers themselves run by hand with cargo-fuzz (see docs/operations.md, "Fuzzing").

// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#![allow(clippy::too_many_lines)]

use std::path::{Path, PathBuf};

use rowsync_protocol::*;
use rowsync_server::fuzzing::{CountingAllocator, TARGETS};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus")
}

fn corpus_files(target: &str) -> Vec<PathBuf> {
    let dir = corpus_dir().join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_file_keeps_its_targets_invariants() {
    let mut replayed = 0;
    for (target, body) in TARGETS {
        let files = corpus_files(target);
        assert!(!files.is_empty(), "no corpus for {target}");
        for file in files {
            let data = std::fs::read(&file).unwrap();
            let outcome = std::panic::catch_unwind(|| body(&data));
            assert!(outcome.is_ok(), "{target}: {} failed", file.display());
            replayed += 1;
        }
    }
    eprintln!("replayed {replayed} corpus files");
}

// --- seeds --------------------------------------------------------------------------

fn hello(download_ack: bool) -> Message {
    Message::Hello(Hello {
        protocol_version: 2, // raw frames: a v2 client, its upload right after the hello
        client_id: "c1".into(),
        user: "alice".into(),
        password: "secret".into(),
        script_version: "v1".into(),
        last_download_watermark: 7,
        token: String::new(),
        auth_parameters: vec!["p".into()],
        download_ack,
        tables: Default::default(),
    })
}

fn every_value() -> Vec<Value> {
    vec![
        Value::Null,
        Value::Int(-3),
        Value::Double(1.5),
        Value::Decimal("12.340".parse().unwrap()),
        Value::Text("héllo".into()),
        Value::Blob(vec![0, 1, 2]),
        Value::Timestamp(1_700_000_000_000_000),
    ]
}

fn upload(table: &str) -> Message {
    let columns: Vec<String> = (0..7).map(|n| format!("c{n}")).collect();
    Message::Upload(TableUpload {
        table: table.into(),
        key_columns: vec!["c1".into()],
        inserts: vec![every_value()],
        updates: vec![RowUpdate {
            old: every_value(),
            new: every_value(),
        }],
        deletes: vec![vec![Value::Int(4)]],
        columns,
    })
}

fn messages() -> Vec<Message> {
    vec![
        hello(false),
        upload("orders"),
        Message::EndUpload(EndUpload { upload_sequence: 1 }),
        Message::Download(Download {
            table: "orders".into(),
            columns: vec!["id".into(), "v".into()],
            key_columns: vec!["id".into()],
            upserts: vec![vec![Value::Int(1), Value::Text("x".into())]],
            deletes: vec![vec![Value::Int(2)]],
        }),
        Message::EndDownload(EndDownload {
            watermark: 9,
            summary: SyncSummary {
                rows_uploaded: 1,
                conflicts: 0,
                upload_already_applied: false,
            },
        }),
        Message::Error(WireError::new(ErrorCode::Protocol, "bad")),
        Message::Busy {
            retry_after_ms: 100,
        },
        Message::DownloadAck(DownloadAck { watermark: 9 }),
    ]
}

fn frames(messages: &[Message]) -> Vec<u8> {
    messages.iter().flat_map(encode_frame).collect()
}

fn sync_frames() -> Vec<u8> {
    frames(&[
        hello(false),
        upload("orders"),
        upload("items"),
        upload("orders"),
        Message::EndUpload(EndUpload { upload_sequence: 1 }),
    ])
}

/// The stream as sent with a compression (and its preamble), or plain without one.
fn wire(compression: Option<Compression>, plain: &[u8]) -> Vec<u8> {
    match compression {
        None => plain.to_vec(),
        Some(compression) => {
            let mut bytes = Preamble { compression }.encode().to_vec();
            bytes.extend(compress_all(compression, plain).unwrap());
            bytes
        }
    }
}

fn with_control(control: &[u8], rest: &[u8]) -> Vec<u8> {
    let mut input = control.to_vec();
    input.extend_from_slice(rest);
    input
}

/// Issue 32, item 1, the figures: the heap a checking decoder with the server's default
/// limits holds after `count` values in pieces of `length` bytes that no row takes (or
/// when it refuses them). Run by hand: `cargo test -p rowsync-server --test fuzz_corpus
/// -- --ignored --nocapture values_in_pieces_held`.
#[test]
#[ignore = "prints figures; run by hand"]
fn values_in_pieces_held() {
    let live = rowsync_server::fuzzing::live_bytes;
    for (length, count) in [(0u64, 1_000_000usize), (1, 1_000_000)] {
        let mut frame = encode_frame(&Message::ValueStart(ValueStart {
            kind: PieceKind::Blob,
            length,
            table: "orders".into(),
            column: "c1".into(),
        }));
        if length > 0 {
            frame.extend(encode_frame(&Message::ValuePiece(ValuePiece {
                bytes: vec![b'a'; length as usize],
            })));
        }
        let before = live();
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT)
            .with_value_limits(VALUE_BYTES_MAX_DEFAULT, 512 * 1024 * 1024);
        let mut outcome = format!("{count} taken");
        let mut peak = 0;
        for n in 0..count {
            decoder.feed(&frame);
            if let Err(error) = decoder.next_message_checked() {
                outcome = format!("refused after {n}: {error}");
                break;
            }
            peak = peak.max(live().saturating_sub(before));
        }
        eprintln!(
            "{count} values of {length} bytes in pieces ({} wire bytes each): {} bytes held at \
             most; {outcome}",
            frame.len(),
            peak
        );
    }
}

/// Writes the seed inputs the fuzzers started from (`fuzz/corpus/<target>/seed-*`):
/// valid streams of every message, compression and exchange. Run by hand:
/// `cargo test -p rowsync-server --test fuzz_corpus -- --ignored write_seeds`.
#[test]
#[ignore = "writes the seed corpus; run by hand"]
fn write_seeds() {
    let mut seeds: Vec<(&str, String, Vec<u8>)> = Vec::new();
    for (n, message) in messages().iter().enumerate() {
        seeds.push(("message", format!("seed-{n}"), encode_message(message)));
    }
    let all = frames(&messages());
    seeds.push((
        "frame_decoder",
        "seed-all".into(),
        with_control(&[0x10, 0, 7], &all),
    ));
    seeds.push((
        "frame_decoder",
        "seed-small".into(),
        with_control(&[0, 40, 0], &all),
    ));
    // Streams of valid frames fed many times over (issue 32, item 1): empty and tiny
    // values in pieces that no row takes, and whole syncs.
    let value_start = |length: u64| {
        encode_frame(&Message::ValueStart(ValueStart {
            kind: PieceKind::Blob,
            length,
            table: "orders".into(),
            column: "c1".into(),
        }))
    };
    let piece = encode_frame(&Message::ValuePiece(ValuePiece {
        bytes: b"a".to_vec(),
    }));
    seeds.push((
        "frame_stream",
        "seed-empty-values".into(),
        with_control(&[0, 0x30, 0xff, 0xff], &value_start(0)),
    ));
    seeds.push((
        "frame_stream",
        "seed-small-values".into(),
        with_control(&[0, 0x30, 0xff, 0xff], &[value_start(1), piece].concat()),
    ));
    seeds.push((
        "frame_stream",
        "seed-sync".into(),
        with_control(&[0x10, 0, 0, 100], &sync_frames()),
    ));
    let compressions = [
        ("plain", None),
        ("none", Some(Compression::None)),
        ("zlib", Some(Compression::Zlib)),
        ("zstd", Some(Compression::Zstd)),
    ];
    for (name, compression) in compressions {
        let stream = wire(compression, &sync_frames());
        seeds.push((
            "inbound",
            format!("seed-{name}"),
            with_control(&[0xff, 0xff, 3, 13], &stream),
        ));
        seeds.push((
            "inbound",
            format!("seed-{name}-limit"),
            with_control(&[0, 200, 0, 0], &stream),
        ));
        seeds.push((
            "upload_stream",
            format!("seed-{name}"),
            with_control(&[0x10, 0, 0x10, 0, 1, 11], &stream),
        ));
        let ack = wire(
            compression,
            &frames(&[
                hello(true),
                Message::DownloadAck(DownloadAck { watermark: 3 }),
            ]),
        );
        seeds.push((
            "upload_stream",
            format!("seed-{name}-ack"),
            with_control(&[0x10, 0, 0x10, 0, 0, 0], &ack),
        ));
    }
    for (target, compression) in [
        ("inflate_zlib", Compression::Zlib),
        ("inflate_zstd", Compression::Zstd),
    ] {
        let compressed = compress_all(compression, &sync_frames()).unwrap();
        seeds.push((
            target,
            "seed-frames".into(),
            with_control(&[0xff, 0xff, 2, 17], &compressed),
        ));
        seeds.push((
            target,
            "seed-limit".into(),
            with_control(&[0, 10, 0, 0], &compressed),
        ));
        let zeros = compress_all(compression, &vec![0u8; 1 << 20]).unwrap();
        seeds.push((
            target,
            "seed-bomb".into(),
            with_control(&[0x10, 0, 1, 0], &zeros),
        ));
    }
    for (target, name, data) in seeds {
        let dir = corpus_dir().join(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), data).unwrap();
    }
}

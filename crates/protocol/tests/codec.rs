//! Round trips and refusals of the codec and the frame decoder.

use proptest::prelude::*;
use rowsync_protocol::*;

fn value_strategy() -> impl Strategy<Value = Value> + Clone {
    prop_oneof![
        Just(Value::Null),
        any::<i64>().prop_map(Value::Int),
        any::<f64>()
            .prop_filter("NaN never equals itself", |d| !d.is_nan())
            .prop_map(Value::Double),
        (any::<i128>(), 0u8..=DECIMAL_SCALE_MAX)
            .prop_map(|(mantissa, scale)| Value::Decimal(Decimal::new(mantissa, scale).unwrap())),
        ".{0,20}".prop_map(Value::Text),
        proptest::collection::vec(any::<u8>(), 0..20).prop_map(Value::Blob),
        any::<i64>().prop_map(Value::Timestamp),
        any::<bool>().prop_map(Value::Bool),
        any::<[u8; 16]>().prop_map(Value::Uuid),
        any::<i32>().prop_map(Value::Date),
        (0..=86_400_000_000i64).prop_map(Value::Time),
        (any::<i32>(), any::<i32>(), any::<i64>()).prop_map(|(months, days, micros)| {
            Value::Interval(Interval {
                months,
                days,
                micros,
            })
        }),
        "-?[1-9][0-9]{39,60}\\.[0-9]{0,3}[1-9]"
            .prop_map(|text| { Value::Numeric(Numeric::from_canonical(&text).unwrap()) }),
        proptest::collection::vec(any::<i64>().prop_map(Value::Int), 0..4).prop_map(Value::Array),
    ]
}

fn upload_strategy() -> impl Strategy<Value = Message> {
    (1usize..5, 0usize..4, 0usize..4, 0usize..4).prop_flat_map(
        |(width, inserts, updates, deletes)| {
            let row = proptest::collection::vec(value_strategy(), width);
            (
                proptest::collection::vec(row.clone(), inserts),
                proptest::collection::vec((row.clone(), row), updates),
                proptest::collection::vec(proptest::collection::vec(value_strategy(), 1), deletes),
            )
                .prop_map(move |(inserts, updates, deletes)| {
                    Message::Upload(TableUpload {
                        table: "t".into(),
                        columns: (0..width).map(|i| format!("c{i}")).collect(),
                        key_columns: vec!["c0".into()],
                        inserts,
                        updates: updates
                            .into_iter()
                            .map(|(old, new)| RowUpdate { old, new })
                            .collect(),
                        deletes,
                    })
                })
        },
    )
}

proptest! {
    #[test]
    fn any_upload_round_trips(message in upload_strategy()) {
        let body = encode_message(&message);
        prop_assert_eq!(decode_message(&body).unwrap(), message);
    }

    #[test]
    fn every_strict_prefix_of_a_body_is_refused(message in upload_strategy()) {
        let body = encode_message(&message);
        for cut in 0..body.len() {
            prop_assert!(decode_message(&body[..cut]).is_err(), "prefix of {} bytes decoded", cut);
        }
    }

    #[test]
    fn checking_a_message_keeps_its_shape_and_no_rows(message in upload_strategy()) {
        let body = encode_message(&message);
        let Message::Upload(mut expected) = message else { unreachable!() };
        expected.inserts.clear();
        expected.updates.clear();
        expected.deletes.clear();
        prop_assert_eq!(check_message(&body).unwrap(), Message::Upload(expected));
    }

    #[test]
    fn checking_refuses_exactly_what_decoding_refuses(
        message in upload_strategy(),
        position in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut body = encode_message(&message);
        let at = position.index(body.len());
        body[at] = byte;
        prop_assert_eq!(check_message(&body).err(), decode_message(&body).err());
        for cut in 0..body.len() {
            prop_assert_eq!(check_message(&body[..cut]).err(), decode_message(&body[..cut]).err());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        prop_assert_eq!(check_message(&bytes).err(), decode_message(&bytes).err());
        let mut decoder = FrameDecoder::new(1024);
        decoder.feed(&bytes);
        while let Ok(Some(_)) = decoder.next_message() {}
    }

    #[test]
    fn frames_split_at_any_point_decode_the_same(message in upload_strategy(), split in 0usize..64) {
        let frame = encode_frame(&message);
        let split = split.min(frame.len());
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
        decoder.feed(&frame[..split]);
        let early = decoder.next_message().unwrap();
        prop_assert!(early.is_none() || split == frame.len());
        decoder.feed(&frame[split..]);
        let message_out = early.or_else(|| decoder.next_message().unwrap());
        prop_assert_eq!(message_out, Some(message));
    }
}

#[test]
fn numeric_30_6_round_trips_exactly() {
    for text in [
        "999999999999999999999999.999999",
        "-123456789012345678901234.567891",
        "0.000001",
    ] {
        let message = Message::Download(Download {
            table: "t".into(),
            columns: vec!["amount".into()],
            key_columns: vec!["amount".into()],
            upserts: vec![vec![Value::Decimal(text.parse().unwrap())]],
            deletes: vec![],
        });
        let Message::Download(back) = decode_message(&encode_message(&message)).unwrap() else {
            panic!("wrong message type");
        };
        let Value::Decimal(decimal) = &back.upserts[0][0] else {
            panic!("not a decimal")
        };
        assert_eq!(decimal.to_string(), text);
    }
}

#[test]
fn oversized_frame_is_refused_from_its_header_alone() {
    let mut decoder = FrameDecoder::new(1024);
    decoder.feed(&(1025u32).to_be_bytes());
    assert_eq!(
        decoder.next_message(),
        Err(DecodeError::FrameTooLarge {
            length_bytes: 1025,
            limit_bytes: 1024
        })
    );
}

#[test]
fn stream_ending_mid_frame_names_the_shortfall() {
    let frame = encode_frame(&Message::EndUpload(EndUpload { upload_sequence: 1 }));
    let mut decoder = FrameDecoder::new(1024);
    decoder.feed(&frame[..6]);
    assert_eq!(decoder.next_message(), Ok(None));
    assert_eq!(
        decoder.finish(),
        Err(DecodeError::EndedMidFrame {
            received_bytes: 6,
            expected_bytes: frame.len()
        })
    );
}

#[test]
fn malformed_bodies_get_named_errors() {
    assert_eq!(
        decode_message(&[0x42]),
        Err(DecodeError::UnknownMessageType(0x42))
    );
    assert_eq!(decode_message(&[]), Err(DecodeError::EmptyFrame));
    let mut end_upload = encode_message(&Message::EndUpload(EndUpload { upload_sequence: 1 }));
    end_upload.push(0);
    assert_eq!(
        decode_message(&end_upload),
        Err(DecodeError::TrailingBytes {
            message: "end_upload",
            trailing: 1
        })
    );
    // An upload claiming four billion inserts in a few bytes is refused before allocating.
    let mut upload = encode_message(&Message::Upload(TableUpload {
        table: "t".into(),
        columns: vec!["a".into()],
        key_columns: vec!["a".into()],
        ..TableUpload::default()
    }));
    let inserts_offset = upload.len() - 12;
    upload[inserts_offset..inserts_offset + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(matches!(
        decode_message(&upload),
        Err(DecodeError::CountTooLarge { what: "insert", .. })
    ));
    // A value with an unknown tag.
    let mut download = encode_message(&Message::Download(Download {
        table: "t".into(),
        columns: vec!["a".into()],
        key_columns: vec!["a".into()],
        upserts: vec![vec![Value::Null]],
        deletes: vec![],
    }));
    let tag_offset = download.len() - 5;
    download[tag_offset] = 0x99;
    assert_eq!(
        decode_message(&download),
        Err(DecodeError::UnknownValueTag {
            tag: 0x99,
            offset: tag_offset
        })
    );
}

#[test]
fn flags_have_one_encoding() {
    let mut body = encode_message(&Message::EndDownload(EndDownload {
        watermark: 1,
        summary: SyncSummary {
            rows_uploaded: 0,
            conflicts: 0,
            upload_already_applied: true,
        },
    }));
    let flag_offset = body.len() - 1;
    body[flag_offset] = 2;
    assert_eq!(
        decode_message(&body),
        Err(DecodeError::InvalidFlag {
            what: "upload already applied",
            value: 2,
            offset: flag_offset
        })
    );
}

/// A download of one value, encoded, with the offset of that value's tag.
fn one_value_body(value: Value) -> (Vec<u8>, usize) {
    let body = encode_message(&Message::Download(Download {
        table: "t".into(),
        columns: vec!["a".into()],
        key_columns: vec!["a".into()],
        upserts: vec![vec![value.clone()]],
        deletes: vec![],
    }));
    let offset = body.len() - 4 - value.encoded_len();
    (body, offset)
}

#[test]
fn v2_values_have_one_encoding_and_bounded_nesting() {
    let (mut body, offset) = one_value_body(Value::Bool(true));
    body[offset + 1] = 2;
    assert!(matches!(
        decode_message(&body),
        Err(DecodeError::InvalidFlag {
            what: "boolean value",
            value: 2,
            ..
        })
    ));
    let (mut body, offset) = one_value_body(Value::Time(0));
    body[offset + 1..offset + 9].copy_from_slice(&86_400_000_001i64.to_be_bytes());
    assert!(matches!(
        decode_message(&body),
        Err(DecodeError::InvalidValue {
            what: "time value",
            ..
        })
    ));
    // A numeric that a decimal holds must travel as a decimal.
    let (mut body, offset) = one_value_body(Value::Text("12.5".into()));
    body[offset] = 0x0C;
    let error = decode_message(&body).unwrap_err().to_string();
    assert!(
        error.contains("fits a decimal, which must carry it"),
        "{error}"
    );
    let mut nested = Value::Int(1);
    for _ in 0..6 {
        nested = Value::Array(vec![nested]);
    }
    let (body, _) = one_value_body(nested.clone());
    assert!(decode_message(&body).is_ok());
    let (body, _) = one_value_body(Value::Array(vec![nested]));
    let error = decode_message(&body).unwrap_err().to_string();
    assert!(error.contains("more than 6 levels of arrays"), "{error}");
    assert_eq!(check_message(&body).unwrap_err().to_string(), error);
}

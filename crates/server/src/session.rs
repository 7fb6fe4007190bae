//! The server side of one sync's upload as a state machine: client messages in,
//! the hello, a complete upload (or a refusal) out. No I/O. It keeps each table's
//! columns to check that chunks agree, never the rows: those stay in the server's
//! spool until a worker takes them ([`MergedTables`] assembles them then).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use rowsync_protocol::{
    ErrorCode, Hello, KeyRanges, Message, RefusedRow, TableUpload, WireError,
    DOWNLOAD_RESUME_SINCE_VERSION, KEY_RANGES_SINCE_VERSION, PROTOCOL_VERSION,
    PROTOCOL_VERSION_MIN, REFUSED_ROWS_SINCE_VERSION, RESUME_SINCE_VERSION,
};

/// The end of a checked upload.
#[derive(Debug)]
pub struct ReceivedUpload {
    pub hello: Hello,
    pub upload_sequence: u64,
}

/// A table's shape as its first chunk gave it (kept by table name).
#[derive(Debug)]
struct TableSeen {
    columns: Vec<String>,
    key_columns: Vec<String>,
}

#[derive(Debug)]
pub enum Step {
    Continue,
    /// The hello is in (and checked): authenticate before reading on.
    Hello(Hello),
    Complete(ReceivedUpload),
    /// Protocol v3: the upload is this transfer, going on from `offset` of its stream
    /// (the bytes before it come from what the server holds of the transfer).
    Resume {
        transfer_id: String,
        offset: u64,
    },
    /// Protocol v3: instead of an upload, the client asks what the server holds of a
    /// cut transfer.
    HeldQuery {
        hello: Hello,
        transfer_id: String,
    },
    /// Protocol v4: instead of an upload, the client asks for the rest of a cut download
    /// of this transfer, from `offset` of its stream.
    DownloadResume {
        hello: Hello,
        transfer_id: String,
        offset: u64,
    },
    /// Protocol v4: a download's receipt as a session of its own (HTTP, where it cannot
    /// follow the download): the first frame is `download_resume`, no hello. The
    /// transfer id (random, 128 bits) is all it proves, and all it can do is release
    /// that transfer's download.
    Receipt {
        transfer_id: String,
        offset: u64,
    },
    /// A download acknowledgement instead of an upload (the hello asked for it).
    Acknowledge {
        hello: Hello,
        watermark: i64,
    },
    /// With [`ServerSession::check_tables`]: a chunk names a table the tables given so
    /// far do not hold (the first chunk of any table, before any were given). The chunk
    /// waits until [`ServerSession::resolve_table`] says whether the version synchronizes
    /// it; no other message may be handled meanwhile.
    UnknownTable(String),
}

/// The tables a script version synchronizes, as the reader of an upload knows them.
#[derive(Debug, Default)]
pub struct VersionTables {
    /// Whether the version exists at all.
    pub version_exists: bool,
    pub tables: HashSet<String>,
    /// When the version does not exist: the versions that do (none before `rowsync
    /// init`), for the refusal.
    pub other_versions: Vec<String>,
}

/// What an authenticated client is told about a script version that does not exist,
/// given the versions that do.
pub(crate) fn unknown_version_message(version: &str, versions: &[String]) -> String {
    if versions.is_empty() {
        return format!(
            "the server synchronizes no table yet: run `rowsync init` (or `rowsync rules \
             apply`) on its database (script version {version:?} does not exist)"
        );
    }
    format!(
        "script version {version:?} does not exist; the server has {}",
        versions.join(", ")
    )
}

#[derive(Debug)]
enum State {
    AwaitingHello,
    /// Protocol v3: which transfer the upload is (or a question about a held one).
    AwaitingTransfer {
        hello: Hello,
    },
    Uploading {
        hello: Hello,
        tables: HashMap<String, TableSeen>,
        /// A chunk naming a table not known to be synchronized, until resolved.
        waiting: Option<TableUpload>,
    },
    AwaitingAcknowledgement {
        hello: Hello,
    },
    Done,
}

#[derive(Debug)]
pub struct ServerSession {
    state: State,
    upload_bytes: usize,
    upload_bytes_max: usize,
    /// Tables seen before that the chunks' lookups examined, over the whole upload: a
    /// measure of the bookkeeping's cost (one per chunk when it is linear).
    tables_examined: u64,
    /// Whether each new table is checked against the version's tables as it arrives.
    check_tables: bool,
    /// The version's tables as last given (none given yet: every new table is unknown).
    known: Option<Arc<VersionTables>>,
}

impl ServerSession {
    pub fn new(upload_bytes_max: usize) -> ServerSession {
        ServerSession {
            state: State::AwaitingHello,
            upload_bytes: 0,
            upload_bytes_max,
            tables_examined: 0,
            check_tables: false,
            known: None,
        }
    }

    /// Checks each table of the upload as its first chunk arrives: a table not among
    /// the version's tables stops the upload with [`Step::UnknownTable`].
    pub fn check_tables(&mut self) {
        self.check_tables = true;
    }

    /// Resolves the chunk of a [`Step::UnknownTable`] with the version's tables (`None`:
    /// no newer list than the last one given). A table they do not hold refuses the
    /// upload, naming it.
    pub fn resolve_table(&mut self, tables: Option<Arc<VersionTables>>) -> Result<(), WireError> {
        if tables.is_some() {
            self.known = tables;
        }
        let State::Uploading {
            hello,
            tables,
            waiting,
        } = &mut self.state
        else {
            return Ok(());
        };
        let Some(upload) = waiting.take() else {
            return Ok(());
        };
        let known = self.known.as_deref();
        if known.is_some_and(|known| known.tables.contains(&upload.table)) {
            return check_chunk(tables, &upload, &mut self.tables_examined);
        }
        let mut error = not_synchronized(&upload.table, &hello.script_version, known);
        if hello.protocol_version >= REFUSED_ROWS_SINCE_VERSION
            && error.error_code() == Some(ErrorCode::Schema)
        {
            error = refused_table(&upload.table, error);
        }
        self.state = State::Done;
        Err(error)
    }

    /// Tables seen before that the chunks' lookups examined so far.
    pub fn tables_examined(&self) -> u64 {
        self.tables_examined
    }

    /// Counts frames received that hand out no message (the pieces of a value).
    pub fn count(&mut self, frame_bytes: usize) -> Result<(), WireError> {
        self.upload_bytes = self.upload_bytes.saturating_add(frame_bytes);
        if self.upload_bytes > self.upload_bytes_max {
            self.state = State::Done;
            return Err(WireError::new(
                ErrorCode::UploadTooLarge,
                format!(
                    "the upload exceeds the server's limit of {} bytes",
                    self.upload_bytes_max
                ),
            ));
        }
        Ok(())
    }

    /// Feeds one decoded message and its encoded size in bytes (with the pieces of the
    /// values it holds, when they came in the same read).
    pub fn handle(&mut self, message: Message, frame_bytes: usize) -> Result<Step, WireError> {
        self.count(frame_bytes)?;
        let state = std::mem::replace(&mut self.state, State::Done);
        let (next, step) = match (state, message) {
            (State::AwaitingHello, Message::Hello(hello)) => after_hello(hello)?,
            (State::AwaitingHello, Message::DownloadResume(receipt)) => (
                State::Done,
                Step::Receipt {
                    transfer_id: receipt.transfer_id,
                    offset: receipt.offset,
                },
            ),
            (State::AwaitingTransfer { hello }, message) => transfer_named(hello, message)?,
            (State::AwaitingAcknowledgement { hello }, Message::DownloadAck(ack)) => (
                State::Done,
                Step::Acknowledge {
                    hello,
                    watermark: ack.watermark,
                },
            ),
            (
                State::Uploading {
                    hello,
                    tables,
                    waiting: None,
                },
                message,
            ) => return self.upload_message(hello, tables, message),
            (state, message) => return Err(unexpected(&state, &message)),
        };
        self.state = next;
        Ok(step)
    }

    /// A message of the upload itself: a table's chunk, key ranges asked, or its end.
    fn upload_message(
        &mut self,
        hello: Hello,
        mut tables: HashMap<String, TableSeen>,
        message: Message,
    ) -> Result<Step, WireError> {
        match message {
            Message::Upload(upload) => {
                if self.check_tables
                    && !tables.contains_key(&upload.table)
                    && !self.is_known(&upload.table)
                {
                    let step = Step::UnknownTable(upload.table.clone());
                    return self.continue_with(hello, tables, Some(upload), step);
                }
                check_chunk(&mut tables, &upload, &mut self.tables_examined)?;
                self.continue_with(hello, tables, None, Step::Continue)
            }
            Message::KeyRanges(key_ranges)
                if hello.protocol_version >= KEY_RANGES_SINCE_VERSION =>
            {
                check_key_ranges(&key_ranges)?;
                self.continue_with(hello, tables, None, Step::Continue)
            }
            Message::EndUpload(end) => Ok(Step::Complete(ReceivedUpload {
                hello,
                upload_sequence: end.upload_sequence,
            })),
            message => {
                let state = State::Uploading {
                    hello,
                    tables,
                    waiting: None,
                };
                Err(unexpected(&state, &message))
            }
        }
    }

    fn is_known(&self, table: &str) -> bool {
        self.known
            .as_deref()
            .is_some_and(|known| known.tables.contains(table))
    }

    fn continue_with(
        &mut self,
        hello: Hello,
        tables: HashMap<String, TableSeen>,
        waiting: Option<TableUpload>,
        step: Step,
    ) -> Result<Step, WireError> {
        self.state = State::Uploading {
            hello,
            tables,
            waiting,
        };
        Ok(step)
    }
}

/// The state a hello leads to: awaiting the acknowledgement it announces, the transfer
/// it names (protocol v3), or the upload.
fn after_hello(hello: Hello) -> Result<(State, Step), WireError> {
    check_hello(&hello)?;
    let step = Step::Hello(hello.clone());
    let next = if hello.download_ack {
        State::AwaitingAcknowledgement { hello }
    } else if hello.protocol_version >= RESUME_SINCE_VERSION {
        State::AwaitingTransfer { hello }
    } else {
        State::Uploading {
            hello,
            tables: HashMap::new(),
            waiting: None,
        }
    };
    Ok((next, step))
}

/// Protocol v3: the transfer the upload resumes, or a question about a held upload or
/// (v4) download.
fn transfer_named(hello: Hello, message: Message) -> Result<(State, Step), WireError> {
    match message {
        Message::UploadResume(resume) => Ok((
            State::Uploading {
                hello,
                tables: HashMap::new(),
                waiting: None,
            },
            Step::Resume {
                transfer_id: resume.transfer_id,
                offset: resume.offset,
            },
        )),
        Message::UploadHeld(held) => Ok((
            State::Done,
            Step::HeldQuery {
                hello,
                transfer_id: held.transfer_id,
            },
        )),
        Message::DownloadResume(resume)
            if hello.protocol_version >= DOWNLOAD_RESUME_SINCE_VERSION =>
        {
            Ok((
                State::Done,
                Step::DownloadResume {
                    hello,
                    transfer_id: resume.transfer_id,
                    offset: resume.offset,
                },
            ))
        }
        message => Err(unexpected(&State::AwaitingTransfer { hello }, &message)),
    }
}

/// The refusal of a message the session does not expect in `state`.
fn unexpected(state: &State, message: &Message) -> WireError {
    let expected = match state {
        State::AwaitingHello => "hello",
        State::AwaitingTransfer { .. } => "upload_resume or upload_held",
        State::Uploading {
            waiting: Some(_), ..
        } => "nothing before the unknown table is resolved",
        State::Uploading { hello, .. } if hello.protocol_version >= KEY_RANGES_SINCE_VERSION => {
            "upload, key_ranges or end_upload"
        }
        State::Uploading { .. } => "upload or end_upload",
        State::AwaitingAcknowledgement { .. } => "download_ack",
        State::Done => "nothing",
    };
    WireError::new(
        ErrorCode::Protocol,
        format!(
            "expected {expected}, received {}",
            message.message_type().name()
        ),
    )
}

/// The refusal of a table the script version does not synchronize (code 7, as the
/// worker's own check), or of a version that does not exist.
fn not_synchronized(table: &str, version: &str, known: Option<&VersionTables>) -> WireError {
    if let Some(known) = known.filter(|known| !known.version_exists) {
        return WireError::new(
            ErrorCode::UnknownScriptVersion,
            unknown_version_message(version, &known.other_versions),
        );
    }
    WireError::new(
        ErrorCode::Schema,
        format!("table {table:?} is not synchronized by script version {version:?}"),
    )
}

/// Protocol v6: a table the version does not synchronize, as the rows it refuses: every
/// change of the table, which the client sets aside before it sends the rest again.
fn refused_table(table: &str, error: WireError) -> WireError {
    let refused = RefusedRow {
        table: table.to_string(),
        key_columns: Vec::new(),
        key: Vec::new(),
        code: error.code,
        reason: error.message.clone(),
    };
    WireError {
        refused: vec![refused],
        ..WireError::new(
            ErrorCode::RowsRefused,
            format!("{} (nothing was applied)", error.message),
        )
    }
}

/// Refuses a hello of another protocol version, or with an empty client id, script
/// version, or user (the user may be empty when a token names it).
fn check_hello(hello: &Hello) -> Result<(), WireError> {
    if !(PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&hello.protocol_version) {
        return Err(WireError::new(
            ErrorCode::UnsupportedProtocolVersion,
            format!(
                "protocol version {} is not supported; this server speaks versions \
                 {PROTOCOL_VERSION_MIN} to {PROTOCOL_VERSION}",
                hello.protocol_version
            ),
        ));
    }
    for (field, value) in [
        ("client id", &hello.client_id),
        ("user", &hello.user),
        ("script version", &hello.script_version),
    ] {
        // With a token, the user comes from the token.
        let required = field != "user" || hello.token.is_empty();
        if required && value.is_empty() {
            return Err(WireError::new(
                ErrorCode::Protocol,
                format!("the hello has an empty {field}"),
            ));
        }
    }
    Ok(())
}

fn chunks_disagree(table: &str) -> WireError {
    WireError::new(
        ErrorCode::Protocol,
        format!("upload chunks of table {table:?} disagree on their columns"),
    )
}

/// Records a chunk's table, or checks it continues the table as first seen: one hash
/// lookup per chunk, so an upload naming many tables costs linear time.
fn check_chunk(
    tables: &mut HashMap<String, TableSeen>,
    upload: &TableUpload,
    examined: &mut u64,
) -> Result<(), WireError> {
    match tables.get(&upload.table) {
        None => {
            tables.insert(
                upload.table.clone(),
                TableSeen {
                    columns: upload.columns.clone(),
                    key_columns: upload.key_columns.clone(),
                },
            );
            Ok(())
        }
        Some(seen) => {
            *examined += 1;
            if seen.columns == upload.columns && seen.key_columns == upload.key_columns {
                Ok(())
            } else {
                Err(chunks_disagree(&upload.table))
            }
        }
    }
}

/// An upload's chunks merged by table, in the order the tables first appeared; each
/// chunk finds its table in one hash lookup.
#[derive(Debug, Default)]
pub struct MergedTables {
    tables: Vec<TableUpload>,
    positions: HashMap<String, usize>,
}

impl MergedTables {
    /// Appends an upload chunk to the table it continues, or starts a new table.
    pub fn merge(&mut self, upload: TableUpload) -> Result<(), WireError> {
        let Some(&position) = self.positions.get(&upload.table) else {
            self.positions
                .insert(upload.table.clone(), self.tables.len());
            self.tables.push(upload);
            return Ok(());
        };
        let existing = &mut self.tables[position];
        if existing.columns != upload.columns || existing.key_columns != upload.key_columns {
            return Err(chunks_disagree(&upload.table));
        }
        existing.inserts.extend(upload.inserts);
        existing.updates.extend(upload.updates);
        existing.deletes.extend(upload.deletes);
        Ok(())
    }

    pub fn into_tables(self) -> Vec<TableUpload> {
        self.tables
    }
}

/// A client's key ranges (protocol v7), refused as [`KeyRanges::refusal`] says.
fn check_key_ranges(key_ranges: &KeyRanges) -> Result<(), WireError> {
    match key_ranges.refusal() {
        Some(reason) => Err(WireError::new(ErrorCode::Protocol, reason)),
        None => Ok(()),
    }
}
#[cfg(test)]
// A test reads as one scenario top to bottom; the 70-line limit is for the product.
#[allow(clippy::too_many_lines)]
mod tests {
    use super::*;
    use rowsync_protocol::{EndUpload, UploadHeld, UploadResume, Value};

    /// A version 2 hello: its upload follows at once.
    fn hello() -> Message {
        Message::Hello(Hello {
            protocol_version: 2,
            client_id: "c".into(),
            user: "u".into(),
            password: "p".into(),
            script_version: "v1".into(),
            last_download_watermark: 0,
            token: String::new(),
            auth_parameters: Vec::new(),
            download_ack: false,
            tables: Default::default(),
        })
    }

    fn chunk(id: i64) -> Message {
        Message::Upload(TableUpload {
            table: "t".into(),
            columns: vec!["id".into()],
            key_columns: vec!["id".into()],
            inserts: vec![vec![Value::Int(id)]],
            ..TableUpload::default()
        })
    }

    #[test]
    fn checks_chunks_of_one_table_and_merge_assembles_them() {
        let mut session = ServerSession::new(1 << 20);
        assert!(matches!(
            session.handle(hello(), 10).unwrap(),
            Step::Hello(_)
        ));
        session.handle(chunk(1), 10).unwrap();
        session.handle(chunk(2), 10).unwrap();
        let Step::Complete(upload) = session
            .handle(Message::EndUpload(EndUpload { upload_sequence: 3 }), 9)
            .unwrap()
        else {
            panic!("expected the upload to complete");
        };
        assert_eq!(upload.upload_sequence, 3);
        let mut merged = MergedTables::default();
        for id in [1, 2] {
            let Message::Upload(upload) = chunk(id) else {
                unreachable!()
            };
            merged.merge(upload).unwrap();
        }
        let tables = merged.into_tables();
        assert_eq!(tables.len(), 1);
        assert_eq!(
            tables[0].inserts,
            vec![vec![Value::Int(1)], vec![Value::Int(2)]]
        );
        // A chunk naming other columns for the same table is refused while reading.
        let mut session = ServerSession::new(1 << 20);
        session.handle(hello(), 10).unwrap();
        session.handle(chunk(1), 10).unwrap();
        let Message::Upload(mut other) = chunk(2) else {
            unreachable!()
        };
        other.columns = vec!["other".into()];
        let error = session.handle(Message::Upload(other), 10).unwrap_err();
        assert!(error.message.contains("disagree"), "{}", error.message);
    }

    /// Issue 15, finding 4: an upload naming 100,000 distinct tables took 62 s of CPU
    /// in the session's bookkeeping (each chunk searched every table seen before).
    #[test]
    fn table_bookkeeping_is_linear_in_the_tables_named() {
        let tables = 100_000u64;
        let mut session = ServerSession::new(usize::MAX);
        session.handle(hello(), 10).unwrap();
        for n in 0..tables {
            let Message::Upload(mut upload) = chunk(1) else {
                unreachable!()
            };
            upload.table = format!("t{n}");
            session.handle(Message::Upload(upload), 10).unwrap();
        }
        // A second chunk of each of the first hundred tables.
        for n in 0..100 {
            let Message::Upload(mut upload) = chunk(2) else {
                unreachable!()
            };
            upload.table = format!("t{n}");
            session.handle(Message::Upload(upload), 10).unwrap();
        }
        assert!(
            session.tables_examined() <= tables + 100,
            "{} tables examined for {} chunks",
            session.tables_examined(),
            tables + 100
        );
    }

    #[test]
    fn checked_tables_wait_for_the_versions_list_and_unknown_ones_are_refused() {
        let mut session = ServerSession::new(1 << 20);
        session.check_tables();
        session.handle(hello(), 10).unwrap();
        let Step::UnknownTable(table) = session.handle(chunk(1), 10).unwrap() else {
            panic!("the first table waits for the version's tables");
        };
        assert_eq!(table, "t");
        // Nothing else is taken while it waits.
        let error = session.handle(chunk(2), 10).unwrap_err();
        assert!(
            error.message.contains("unknown table is resolved"),
            "{}",
            error.message
        );

        let known = |tables: &[&str]| {
            Some(Arc::new(VersionTables {
                version_exists: true,
                tables: tables.iter().map(|table| table.to_string()).collect(),
                other_versions: Vec::new(),
            }))
        };
        let mut session = ServerSession::new(1 << 20);
        session.check_tables();
        session.handle(hello(), 10).unwrap();
        session.handle(chunk(1), 10).unwrap();
        session.resolve_table(known(&["t"])).unwrap();
        assert!(matches!(
            session.handle(chunk(2), 10).unwrap(),
            Step::Continue
        ));
        let Message::Upload(mut other) = chunk(3) else {
            unreachable!()
        };
        other.table = "u".into();
        let Step::UnknownTable(_) = session.handle(Message::Upload(other), 10).unwrap() else {
            panic!("a table the list lacks waits");
        };
        let error = session.resolve_table(None).unwrap_err();
        assert_eq!(error.error_code(), Some(ErrorCode::Schema));
        assert!(
            error
                .message
                .contains("table \"u\" is not synchronized by script version \"v1\""),
            "{}",
            error.message
        );
        let end = Message::EndUpload(EndUpload { upload_sequence: 1 });
        assert!(session.handle(end, 9).is_err(), "refused for good");

        let mut session = ServerSession::new(1 << 20);
        session.check_tables();
        session.handle(hello(), 10).unwrap();
        session.handle(chunk(1), 10).unwrap();
        let missing = Arc::new(VersionTables::default());
        let error = session.resolve_table(Some(missing)).unwrap_err();
        assert_eq!(error.error_code(), Some(ErrorCode::UnknownScriptVersion));
        assert!(
            error
                .message
                .contains("the server synchronizes no table yet: run `rowsync init`"),
            "before init: {}",
            error.message
        );

        let mut session = ServerSession::new(1 << 20);
        session.check_tables();
        session.handle(hello(), 10).unwrap();
        session.handle(chunk(1), 10).unwrap();
        let others = Arc::new(VersionTables {
            other_versions: vec!["v2".into(), "v3".into()],
            ..VersionTables::default()
        });
        let error = session.resolve_table(Some(others)).unwrap_err();
        assert!(
            error
                .message
                .ends_with("does not exist; the server has v2, v3"),
            "{}",
            error.message
        );
    }

    #[test]
    fn accepts_versions_1_to_8_and_refuses_others_by_name() {
        for version in [1, 2, 3, 4, 5, 6, 7, 8] {
            let Message::Hello(mut hello) = hello() else {
                unreachable!()
            };
            hello.protocol_version = version;
            let mut session = ServerSession::new(1 << 20);
            assert!(matches!(
                session.handle(Message::Hello(hello), 10).unwrap(),
                Step::Hello(_)
            ));
        }
        for version in [0, PROTOCOL_VERSION + 1] {
            let Message::Hello(mut hello) = hello() else {
                unreachable!()
            };
            hello.protocol_version = version;
            let error = ServerSession::new(1 << 20)
                .handle(Message::Hello(hello), 10)
                .unwrap_err();
            assert_eq!(
                error.error_code(),
                Some(ErrorCode::UnsupportedProtocolVersion)
            );
            assert_eq!(
                error.message,
                format!(
                    "protocol version {version} is not supported; this server speaks versions 1 to {PROTOCOL_VERSION}"
                )
            );
        }
    }

    #[test]
    fn a_v7_upload_may_name_its_key_ranges_before_its_end() {
        let key_ranges = |start: i64, end: i64, next: i64| {
            Message::KeyRanges(KeyRanges {
                ranges: vec![rowsync_protocol::KeyRange {
                    table: "t".into(),
                    start,
                    end,
                    next,
                }],
            })
        };
        let session_of = |version: u16| {
            let Message::Hello(mut hello) = hello() else {
                unreachable!()
            };
            hello.protocol_version = version;
            let mut session = ServerSession::new(1 << 20);
            session.handle(Message::Hello(hello), 10).unwrap();
            if version >= RESUME_SINCE_VERSION {
                let resume = UploadResume {
                    transfer_id: "t".into(),
                    offset: 0,
                };
                session.handle(Message::UploadResume(resume), 10).unwrap();
            }
            session
        };
        let mut session = session_of(7);
        session.handle(chunk(1), 10).unwrap();
        assert!(matches!(
            session.handle(key_ranges(10, 20, 20), 10).unwrap(),
            Step::Continue
        ));
        assert!(matches!(
            session
                .handle(Message::EndUpload(EndUpload { upload_sequence: 1 }), 10)
                .unwrap(),
            Step::Complete(_)
        ));
        for malformed in [
            key_ranges(10, 20, 21),
            key_ranges(10, 10, 10),
            key_ranges(10, 20, 9),
        ] {
            let error = session_of(7).handle(malformed, 10).unwrap_err();
            assert!(error.message.contains("is not a range"), "{error}");
        }
        let error = session_of(6)
            .handle(key_ranges(10, 20, 10), 10)
            .unwrap_err();
        assert!(error.message.contains("received key_ranges"), "{error}");
    }

    #[test]
    fn refuses_out_of_order_messages_and_oversized_uploads() {
        let mut session = ServerSession::new(1 << 20);
        let error = session.handle(chunk(1), 10).unwrap_err();
        assert_eq!(error.error_code(), Some(ErrorCode::Protocol));
        assert!(
            error.message.contains("expected hello, received upload"),
            "{}",
            error.message
        );

        let mut session = ServerSession::new(25);
        session.handle(hello(), 10).unwrap();
        session.handle(chunk(1), 10).unwrap();
        let error = session.handle(chunk(2), 10).unwrap_err();
        assert_eq!(error.error_code(), Some(ErrorCode::UploadTooLarge));
    }

    fn hello_v3() -> Message {
        let Message::Hello(mut hello) = hello() else {
            unreachable!()
        };
        hello.protocol_version = PROTOCOL_VERSION;
        Message::Hello(hello)
    }

    #[test]
    fn a_v3_upload_names_its_transfer_first_or_asks_about_a_held_one() {
        let mut session = ServerSession::new(1 << 20);
        session.handle(hello_v3(), 10).unwrap();
        let error = session.handle(chunk(1), 10).unwrap_err();
        assert!(
            error
                .message
                .contains("expected upload_resume or upload_held, received upload"),
            "{}",
            error.message
        );

        let mut session = ServerSession::new(1 << 20);
        session.handle(hello_v3(), 10).unwrap();
        let resume = Message::UploadResume(UploadResume {
            transfer_id: "t".into(),
            offset: 7,
        });
        assert!(matches!(
            session.handle(resume.clone(), 10).unwrap(),
            Step::Resume { ref transfer_id, offset: 7 } if transfer_id == "t"
        ));
        session.handle(chunk(1), 10).unwrap();
        let error = session.handle(resume, 10).unwrap_err();
        assert!(error
            .message
            .contains("expected upload, key_ranges or end_upload"));

        let mut session = ServerSession::new(1 << 20);
        session.handle(hello_v3(), 10).unwrap();
        let question = Message::UploadHeld(UploadHeld {
            transfer_id: "t".into(),
            length: 0,
            sha256: Vec::new(),
        });
        assert!(matches!(
            session.handle(question, 10).unwrap(),
            Step::HeldQuery { ref transfer_id, .. } if transfer_id == "t"
        ));

        // A version 2 upload knows nothing of transfers.
        let mut session = ServerSession::new(1 << 20);
        session.handle(hello(), 10).unwrap();
        let error = session
            .handle(
                Message::UploadResume(UploadResume {
                    transfer_id: "t".into(),
                    offset: 0,
                }),
                10,
            )
            .unwrap_err();
        assert!(error.message.contains("received upload_resume"));
    }
}

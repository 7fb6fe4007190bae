//! The server side of one sync's upload as a state machine: client messages in,
//! the hello, a complete upload (or a refusal) out. No I/O. It keeps each table's
//! columns to check that chunks agree, never the rows: those stay in the server's
//! spool until a worker takes them ([`MergedTables`] assembles them then).

use std::collections::HashMap;

use rowsync_protocol::{ErrorCode, Hello, Message, TableUpload, WireError, PROTOCOL_VERSION};

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
    /// A download acknowledgement instead of an upload (the hello asked for it).
    Acknowledge {
        hello: Hello,
        watermark: i64,
    },
}

#[derive(Debug)]
enum State {
    AwaitingHello,
    Uploading {
        hello: Hello,
        tables: HashMap<String, TableSeen>,
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
}

impl ServerSession {
    pub fn new(upload_bytes_max: usize) -> ServerSession {
        ServerSession {
            state: State::AwaitingHello,
            upload_bytes: 0,
            upload_bytes_max,
            tables_examined: 0,
        }
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
            (State::AwaitingHello, Message::Hello(hello)) => {
                check_hello(&hello)?;
                let step = Step::Hello(hello.clone());
                if hello.download_ack {
                    (State::AwaitingAcknowledgement { hello }, step)
                } else {
                    (
                        State::Uploading {
                            hello,
                            tables: HashMap::new(),
                        },
                        step,
                    )
                }
            }
            (State::AwaitingAcknowledgement { hello }, Message::DownloadAck(ack)) => (
                State::Done,
                Step::Acknowledge {
                    hello,
                    watermark: ack.watermark,
                },
            ),
            (State::Uploading { hello, mut tables }, Message::Upload(upload)) => {
                check_chunk(&mut tables, &upload, &mut self.tables_examined)?;
                (State::Uploading { hello, tables }, Step::Continue)
            }
            (State::Uploading { hello, .. }, Message::EndUpload(end)) => (
                State::Done,
                Step::Complete(ReceivedUpload {
                    hello,
                    upload_sequence: end.upload_sequence,
                }),
            ),
            (state, message) => {
                let expected = match state {
                    State::AwaitingHello => "hello",
                    State::Uploading { .. } => "upload or end_upload",
                    State::AwaitingAcknowledgement { .. } => "download_ack",
                    State::Done => "nothing",
                };
                return Err(WireError::new(
                    ErrorCode::Protocol,
                    format!(
                        "expected {expected}, received {}",
                        message.message_type().name()
                    ),
                ));
            }
        };
        self.state = next;
        Ok(step)
    }
}

/// Refuses a hello of another protocol version, or with an empty client id, script
/// version, or user (the user may be empty when a token names it).
fn check_hello(hello: &Hello) -> Result<(), WireError> {
    if hello.protocol_version != PROTOCOL_VERSION {
        return Err(WireError::new(
            ErrorCode::UnsupportedProtocolVersion,
            format!(
                "protocol version {} is not supported; this server speaks version {PROTOCOL_VERSION}",
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

#[cfg(test)]
mod tests {
    use super::*;
    use rowsync_protocol::{EndUpload, Value};

    fn hello() -> Message {
        Message::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client_id: "c".into(),
            user: "u".into(),
            password: "p".into(),
            script_version: "v1".into(),
            last_download_watermark: 0,
            token: String::new(),
            auth_parameters: Vec::new(),
            download_ack: false,
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
}

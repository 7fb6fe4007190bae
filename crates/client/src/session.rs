//! The client side of one sync as a state machine: server messages in, events out.
//! No I/O: the transport feeds it decoded messages.

use rowsync_protocol::{
    Conflicts, Download, EndDownload, KeyRange, Message, SessionToken, UploadHeld,
};

use crate::ClientError;

#[derive(Debug, Default)]
pub struct ClientSession {
    downloads: Vec<Download>,
    conflicts: Vec<Conflicts>,
    /// A download message came: conflicting keys may no longer be named.
    download_started: bool,
    /// Key ranges the server handed out (protocol v7), kept until the end.
    key_ranges: Vec<KeyRange>,
    /// A session token the server handed out (protocol v8), kept until the end.
    session_token: Option<SessionToken>,
    finished: bool,
}

/// A whole download, received and checked, not yet applied.
#[derive(Debug, Clone)]
pub struct CompletedSync {
    pub downloads: Vec<Download>,
    /// The keys the server did not apply as uploaded, by table (protocol v2).
    pub conflicts: Vec<Conflicts>,
    /// Key ranges handed to this client (protocol v7), kept with the download.
    pub key_ranges: Vec<KeyRange>,
    /// A session token for the next syncs (protocol v8).
    pub session_token: Option<SessionToken>,
    pub end: EndDownload,
}

#[derive(Debug)]
pub enum SessionEvent {
    /// More messages are expected.
    Continue,
    Complete(CompletedSync),
    Busy {
        retry_after_ms: u32,
    },
    /// The server recorded a download acknowledgement.
    Acknowledged {
        watermark: i64,
    },
    /// What the server holds of a cut transfer (protocol v3).
    Held(UploadHeld),
}

impl ClientSession {
    pub fn new() -> ClientSession {
        ClientSession::default()
    }

    /// Takes one server message, keeping downloads until the end: the whole download
    /// comes with [`SessionEvent::Complete`].
    pub fn handle(&mut self, message: Message) -> Result<SessionEvent, ClientError> {
        match self.receive(message)? {
            Received::Download(download) => {
                self.downloads.push(download);
                Ok(SessionEvent::Continue)
            }
            Received::Conflicts(conflicts) => {
                self.conflicts.push(conflicts);
                Ok(SessionEvent::Continue)
            }
            Received::Event(SessionEvent::Complete(mut completed)) => {
                completed.downloads = std::mem::take(&mut self.downloads);
                completed.conflicts = std::mem::take(&mut self.conflicts);
                Ok(SessionEvent::Complete(completed))
            }
            Received::Event(event) => Ok(event),
        }
    }

    /// Takes one server message, handing each checked download out as it comes:
    /// [`SessionEvent::Complete`] then carries no downloads.
    pub fn receive(&mut self, message: Message) -> Result<Received, ClientError> {
        if self.finished {
            return Err(ClientError::Protocol(format!(
                "{} message after the sync ended",
                message.message_type().name()
            )));
        }
        let event = match message {
            Message::Download(download) => {
                check_download(&download)?;
                self.download_started = true;
                return Ok(Received::Download(download));
            }
            Message::Conflicts(conflicts) => {
                self.check_conflicts(&conflicts)?;
                return Ok(Received::Conflicts(conflicts));
            }
            Message::KeyRanges(handed) => {
                if let Some(reason) = handed.refusal() {
                    return Err(ClientError::Protocol(reason));
                }
                self.key_ranges.extend(handed.ranges);
                return Ok(Received::Event(SessionEvent::Continue));
            }
            Message::SessionToken(session_token) => {
                self.session_token = Some(session_token);
                return Ok(Received::Event(SessionEvent::Continue));
            }
            Message::EndDownload(end) => SessionEvent::Complete(CompletedSync {
                downloads: Vec::new(),
                conflicts: Vec::new(),
                key_ranges: std::mem::take(&mut self.key_ranges),
                session_token: self.session_token.take(),
                end,
            }),
            Message::Busy { retry_after_ms } => SessionEvent::Busy { retry_after_ms },
            Message::DownloadAck(ack) => SessionEvent::Acknowledged {
                watermark: ack.watermark,
            },
            Message::UploadHeld(held) => SessionEvent::Held(held),
            Message::Error(error) => {
                self.finished = true;
                return Err(ClientError::Server(error));
            }
            other => {
                return Err(ClientError::Protocol(format!(
                    "a server never sends {} messages",
                    other.message_type().name()
                )))
            }
        };
        self.finished = true;
        Ok(Received::Event(event))
    }

    /// Conflicting keys come before the first download message and name their key.
    fn check_conflicts(&self, conflicts: &Conflicts) -> Result<(), ClientError> {
        if self.download_started {
            return Err(ClientError::Protocol(format!(
                "conflicting keys of table {:?} came after the download began",
                conflicts.table
            )));
        }
        if conflicts.key_columns.is_empty() {
            return Err(ClientError::Protocol(format!(
                "conflicting keys of table {:?} name no key columns",
                conflicts.table
            )));
        }
        Ok(())
    }
}

/// One server message as [`ClientSession::receive`] hands it out.
#[derive(Debug)]
pub enum Received {
    /// Rows to apply now.
    Download(Download),
    /// Keys of the upload the server did not apply as sent.
    Conflicts(Conflicts),
    /// The session ended (or, never, [`SessionEvent::Continue`]).
    Event(SessionEvent),
}

fn check_download(download: &Download) -> Result<(), ClientError> {
    if download.key_columns.is_empty() {
        return Err(ClientError::Protocol(format!(
            "download of table {:?} names no key columns",
            download.table
        )));
    }
    if !download.upserts.is_empty() {
        for key in &download.key_columns {
            if !download.columns.contains(key) {
                return Err(ClientError::Protocol(format!(
                    "download of table {:?} lacks key column {key:?}",
                    download.table
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rowsync_protocol::{EndUpload, ErrorCode, SyncSummary, Value, WireError};

    fn download(table: &str) -> Message {
        Message::Download(Download {
            table: table.into(),
            columns: vec!["id".into()],
            key_columns: vec!["id".into()],
            upserts: vec![vec![1.into()]],
            deletes: vec![],
        })
    }

    #[test]
    fn collects_downloads_until_the_end() {
        let mut session = ClientSession::new();
        assert!(matches!(
            session.handle(download("a")).unwrap(),
            SessionEvent::Continue
        ));
        assert!(matches!(
            session.handle(download("b")).unwrap(),
            SessionEvent::Continue
        ));
        let end = EndDownload {
            watermark: 9,
            summary: SyncSummary::default(),
        };
        let SessionEvent::Complete(done) = session.handle(Message::EndDownload(end)).unwrap()
        else {
            panic!("expected completion");
        };
        assert_eq!(done.downloads.len(), 2);
        assert_eq!(done.end.watermark, 9);
        assert!(
            session.handle(download("c")).is_err(),
            "nothing may follow the end"
        );
    }

    fn conflicts(table: &str, key_columns: Vec<String>) -> Message {
        Message::Conflicts(Conflicts {
            table: table.into(),
            key_columns,
            keys: vec![vec![7.into()]],
        })
    }

    #[test]
    fn conflicting_keys_come_before_the_download_and_name_their_key() {
        let mut session = ClientSession::new();
        session.handle(conflicts("a", vec!["id".into()])).unwrap();
        session.handle(download("a")).unwrap();
        let late = session
            .handle(conflicts("b", vec!["id".into()]))
            .unwrap_err();
        assert!(
            late.to_string().contains("after the download began"),
            "{late}"
        );
        let mut session = ClientSession::new();
        let keyless = session.handle(conflicts("a", Vec::new())).unwrap_err();
        assert!(keyless.to_string().contains("no key columns"), "{keyless}");
        let mut session = ClientSession::new();
        session.handle(conflicts("a", vec!["id".into()])).unwrap();
        let end = EndDownload {
            watermark: 3,
            summary: SyncSummary::default(),
        };
        let SessionEvent::Complete(done) = session.handle(Message::EndDownload(end)).unwrap()
        else {
            panic!("expected completion");
        };
        assert_eq!(done.conflicts.len(), 1);
        assert_eq!(done.conflicts[0].keys, vec![vec![Value::Int(7)]]);
    }

    #[test]
    fn refuses_client_messages_and_reports_server_errors() {
        let mut session = ClientSession::new();
        let error = session
            .handle(Message::EndUpload(EndUpload { upload_sequence: 1 }))
            .unwrap_err();
        assert!(
            error.to_string().contains("never sends end_upload"),
            "{error}"
        );
        let mut session = ClientSession::new();
        let refusal = WireError::new(ErrorCode::AuthenticationFailed, "no");
        assert!(matches!(
            session.handle(Message::Error(refusal)),
            Err(ClientError::Server(_))
        ));
    }
}

//! Values in pieces (protocol v2): a text or blob value too large for one frame is sent
//! before the message of its row, as a `value_start` announcing its kind and length and
//! `value_piece` messages carrying its bytes; the row holds the tag `in_pieces` where the
//! value belongs. [`message_frames`] sends a message so; the [`crate::FrameDecoder`]
//! puts the values back (or, only checking, counts them) with [`Pieces`].

use std::collections::VecDeque;

use crate::codec::{encode_body, values_mut, Marks, Rows};
use crate::message::{Message, MessageType, PieceKind, ValueStart};
use crate::whole::{Whole, WholeValues};
use crate::{encode_frame, DecodeError, Row, Value, FRAME_HEADER_BYTES};

/// The default largest value a receiver takes in pieces (the server's
/// `value_bytes_max` and the client's default): 64 MiB.
pub const VALUE_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;

/// The default most bytes of values in pieces a receiver holds for one row before the
/// row's message arrives: 256 MiB (a few large values, or an update's two images).
pub const ROW_PIECES_BYTES_MAX_DEFAULT: u64 = 256 * 1024 * 1024;

/// What each value in pieces costs against its row's limit besides its bytes and the
/// lengths of its table and column names: the memory a whole value held for its row
/// takes at the least, so that many small (or empty) values reach the limit too.
pub const VALUE_IN_PIECES_COST_BYTES: u64 = 128;

/// The most values in pieces one row may wait for: an update's two images of the most
/// columns a message can name (a count of two bytes).
pub const VALUES_IN_PIECES_PER_ROW_MAX: usize = 2 * u16::MAX as usize;

/// A value whose pieces are arriving.
#[derive(Debug)]
struct Incoming {
    table: String,
    column: String,
    kind: PieceKind,
    length: u64,
    received: u64,
    /// The bytes so far when decoding (empty when checking).
    bytes: Vec<u8>,
    /// Text checked piece by piece.
    utf8: Utf8Check,
    /// Whether the bytes are kept (decoding) or only checked.
    keep: bool,
}

/// The receiving side of values in pieces, within one frame stream.
#[derive(Debug)]
pub(crate) struct Pieces {
    /// False for a peer of protocol version 1, which sends no value in pieces.
    allowed: bool,
    value_bytes_max: u64,
    row_bytes_max: u64,
    incoming: Option<Incoming>,
    pub(crate) whole: WholeValues,
    /// What the row's values so far (whole and incoming) cost: their announced bytes,
    /// names and [`VALUE_IN_PIECES_COST_BYTES`] each.
    row_bytes: u64,
    /// The row's values in pieces so far.
    row_values: usize,
}

impl Pieces {
    pub(crate) fn new(value_bytes_max: u64, row_bytes_max: u64) -> Pieces {
        Pieces {
            allowed: true,
            value_bytes_max,
            row_bytes_max,
            incoming: None,
            whole: WholeValues::default(),
            row_bytes: 0,
            row_values: 0,
        }
    }

    /// From now on, refuses values in pieces (the peer speaks protocol version 1).
    pub(crate) fn refuse(&mut self) {
        self.allowed = false;
    }

    /// Takes a `value_start` or `value_piece` body; false for any other message.
    pub(crate) fn take_frame(&mut self, body: &[u8], rows: Rows) -> Result<bool, DecodeError> {
        let first = body.first().copied();
        if !self.allowed
            && (first == Some(MessageType::ValueStart as u8)
                || first == Some(MessageType::ValuePiece as u8))
        {
            return Err(DecodeError::PiecesRefused);
        }
        match first {
            Some(byte) if byte == MessageType::ValueStart as u8 => {
                let Message::ValueStart(start) = crate::codec::decode(body, rows, None)? else {
                    unreachable!("a value_start body decodes as one");
                };
                self.start(start, rows)?;
                Ok(true)
            }
            Some(byte) if byte == MessageType::ValuePiece as u8 => {
                self.piece(piece_bytes(body)?)?;
                Ok(true)
            }
            // Any other message while a value is incomplete is refused before decoding it.
            other => {
                if let Some(message_type) = other.and_then(MessageType::from_u8) {
                    self.check_between_values(message_type.name())?;
                }
                Ok(false)
            }
        }
    }

    fn start(&mut self, start: ValueStart, rows: Rows) -> Result<(), DecodeError> {
        self.check_between_values("value_start")?;
        if start.length > self.value_bytes_max {
            return Err(DecodeError::ValueTooLarge {
                table: start.table,
                column: start.column,
                length: start.length,
                limit: self.value_bytes_max,
            });
        }
        if start.length == 0 {
            return Err(DecodeError::EmptyValueInPieces {
                table: start.table,
                column: start.column,
            });
        }
        self.row_values += 1;
        if self.row_values > VALUES_IN_PIECES_PER_ROW_MAX {
            return Err(DecodeError::ValuesInPiecesTooMany {
                limit: VALUES_IN_PIECES_PER_ROW_MAX,
            });
        }
        // What holding the whole value costs: its bytes, its names and a fixed amount.
        let names = (start.table.len() + start.column.len()) as u64;
        self.row_bytes = self
            .row_bytes
            .saturating_add(start.length + names + VALUE_IN_PIECES_COST_BYTES);
        if self.row_bytes > self.row_bytes_max {
            return Err(DecodeError::RowPiecesTooLarge {
                bytes: self.row_bytes,
                limit: self.row_bytes_max,
            });
        }
        self.incoming = Some(Incoming {
            table: start.table,
            column: start.column,
            kind: start.kind,
            length: start.length,
            received: 0,
            // Grown as the pieces arrive: an announcement alone allocates nothing.
            bytes: Vec::new(),
            utf8: Utf8Check::default(),
            keep: rows == Rows::Keep,
        });
        // Keeping or checking is decided by the value_start.
        self.complete_if_whole()
    }

    fn piece(&mut self, bytes: &[u8]) -> Result<(), DecodeError> {
        let incoming = self
            .incoming
            .as_mut()
            .ok_or(DecodeError::PieceWithoutStart)?;
        let received = incoming.received + bytes.len() as u64;
        if received > incoming.length {
            return Err(DecodeError::PieceOverrun {
                received,
                length: incoming.length,
            });
        }
        incoming.received = received;
        // Text is checked piece by piece whether kept or not, so decoding refuses bad
        // UTF-8 at the same piece as checking does.
        if incoming.kind == PieceKind::Text {
            incoming.utf8.feed(bytes).map_err(|()| text_not_utf8())?;
        }
        if incoming.keep {
            incoming.bytes.extend_from_slice(bytes);
        }
        self.complete_if_whole()
    }

    /// Moves the incoming value to the whole ones once all its bytes are in.
    fn complete_if_whole(&mut self) -> Result<(), DecodeError> {
        let Some(incoming) = self
            .incoming
            .take_if(|incoming| incoming.received == incoming.length)
        else {
            return Ok(());
        };
        if !incoming.utf8.is_complete() {
            return Err(text_not_utf8());
        }
        let value = if incoming.keep {
            Some(match incoming.kind {
                PieceKind::Blob => Value::Blob(incoming.bytes),
                PieceKind::Text => {
                    Value::Text(String::from_utf8(incoming.bytes).map_err(|_| text_not_utf8())?)
                }
            })
        } else {
            None
        };
        self.whole.values.push_back(Whole {
            table: incoming.table,
            column: incoming.column,
            value,
        });
        Ok(())
    }

    /// Before a `value_start` or any other message: no value may be half received.
    fn check_between_values(&self, message: &'static str) -> Result<(), DecodeError> {
        match &self.incoming {
            Some(incoming) => Err(DecodeError::ValueIncomplete {
                message,
                received: incoming.received,
                length: incoming.length,
            }),
            None => Ok(()),
        }
    }

    /// Called after decoding any other message: no value may be half received, and the
    /// message must have taken every whole one.
    pub(crate) fn after_message(&mut self, message: MessageType) -> Result<(), DecodeError> {
        self.check_between_values(message.name())?;
        self.row_bytes = 0;
        self.row_values = 0;
        let unused = self.whole.clear();
        if unused > 0 {
            return Err(DecodeError::InPiecesUnused {
                count: unused,
                message: message.name(),
            });
        }
        Ok(())
    }
}

fn text_not_utf8() -> DecodeError {
    DecodeError::InvalidUtf8 {
        what: "text value in pieces",
        offset: 0,
    }
}

/// The bytes of a `value_piece` body, borrowed (a piece is not copied to be checked).
fn piece_bytes(body: &[u8]) -> Result<&[u8], DecodeError> {
    let header = body.get(1..5).ok_or_else(|| DecodeError::Truncated {
        what: "value piece",
        offset: 1,
        needed: 5 - body.len(),
    })?;
    let length = u32::from_be_bytes(header.try_into().expect("four bytes")) as usize;
    let bytes = &body[5..];
    if bytes.len() < length {
        return Err(DecodeError::Truncated {
            what: "value piece",
            offset: 5,
            needed: length - bytes.len(),
        });
    }
    if bytes.len() > length {
        return Err(DecodeError::TrailingBytes {
            message: MessageType::ValuePiece.name(),
            trailing: bytes.len() - length,
        });
    }
    Ok(bytes)
}

/// UTF-8 checked piece by piece: a character split between pieces is carried over.
#[derive(Debug, Default)]
struct Utf8Check {
    carry: Vec<u8>,
}

impl Utf8Check {
    fn feed(&mut self, mut bytes: &[u8]) -> Result<(), ()> {
        if !self.carry.is_empty() {
            let width = match self.carry[0] {
                0xC0..=0xDF => 2,
                0xE0..=0xEF => 3,
                _ => 4,
            };
            let taken = (width - self.carry.len()).min(bytes.len());
            self.carry.extend_from_slice(&bytes[..taken]);
            bytes = &bytes[taken..];
            if self.carry.len() < width {
                return Ok(());
            }
            std::str::from_utf8(&self.carry).map_err(|_| ())?;
            self.carry.clear();
        }
        match std::str::from_utf8(bytes) {
            Ok(_) => Ok(()),
            // Cut inside a character: the rest comes with the next piece.
            Err(error) if error.error_len().is_none() => {
                self.carry = bytes[error.valid_up_to()..].to_vec();
                Ok(())
            }
            Err(_) => Err(()),
        }
    }

    fn is_complete(&self) -> bool {
        self.carry.is_empty()
    }
}

/// The frames that carry one message, produced one at a time: for a single-row upload or
/// download whose rows take more than `message_bytes_max` bytes, each text or blob value
/// of more than `message_bytes_max / 16` bytes first travels in pieces of at most
/// `message_bytes_max` bytes (a `value_start`, then its `value_piece`s), then the message
/// with those values as `in_pieces`; any other message is its one frame. Each value's
/// memory is freed once its last piece is out.
pub fn message_frames(mut message: Message, message_bytes_max: usize) -> Frames {
    let mut values = VecDeque::new();
    let mut ordinals = Vec::new();
    let table = match &message {
        Message::Upload(upload) => upload.table.clone(),
        Message::Download(download) => download.table.clone(),
        _ => String::new(),
    };
    if single_row_bytes(&message).is_some_and(|bytes| bytes > message_bytes_max) {
        let inline_bytes_max = message_bytes_max / 16;
        for (ordinal, (column, value)) in values_mut(&mut message).into_iter().enumerate() {
            let (kind, bytes) = match value {
                Value::Text(text) if text.len() > inline_bytes_max => {
                    (PieceKind::Text, std::mem::take(text).into_bytes())
                }
                Value::Blob(bytes) if bytes.len() > inline_bytes_max => {
                    (PieceKind::Blob, std::mem::take(bytes))
                }
                _ => continue,
            };
            ordinals.push(ordinal);
            values.push_back(Outgoing {
                kind,
                bytes,
                column: column.to_owned(),
            });
        }
    }
    Frames {
        table,
        values,
        offset: None,
        piece_bytes: message_bytes_max.max(1),
        message: Some(message),
        ordinals,
    }
}

/// A value to send in pieces.
struct Outgoing {
    kind: PieceKind,
    bytes: Vec<u8>,
    column: String,
}

/// The bytes of a message's rows, when it is an upload or a download of exactly one row.
fn single_row_bytes(message: &Message) -> Option<usize> {
    let row_bytes = |row: &Row| 2 + row.iter().map(Value::encoded_len).sum::<usize>();
    match message {
        Message::Upload(upload) => {
            let rows = upload.inserts.len() + upload.updates.len() + upload.deletes.len();
            let bytes = upload
                .inserts
                .iter()
                .chain(&upload.deletes)
                .map(row_bytes)
                .sum::<usize>()
                + upload
                    .updates
                    .iter()
                    .map(|update| row_bytes(&update.old) + row_bytes(&update.new))
                    .sum::<usize>();
            (rows == 1).then_some(bytes)
        }
        Message::Download(download) => {
            let rows = download.upserts.len() + download.deletes.len();
            let bytes = download
                .upserts
                .iter()
                .chain(&download.deletes)
                .map(row_bytes)
                .sum();
            (rows == 1).then_some(bytes)
        }
        _ => None,
    }
}

/// The frames of one message, see [`message_frames`].
pub struct Frames {
    /// The table of the message's row.
    table: String,
    /// Values still to send in pieces, in order.
    values: VecDeque<Outgoing>,
    /// Bytes of the first value sent so far; `None` before its `value_start`.
    offset: Option<usize>,
    piece_bytes: usize,
    message: Option<Message>,
    ordinals: Vec<usize>,
}

impl Frames {
    /// Whether the message travels with values in pieces.
    pub fn in_pieces(&self) -> bool {
        !self.ordinals.is_empty()
    }
}

impl Iterator for Frames {
    type Item = Vec<u8>;

    fn next(&mut self) -> Option<Vec<u8>> {
        let Some(Outgoing {
            kind,
            bytes,
            column,
        }) = self.values.front()
        else {
            let message = self.message.take()?;
            if self.ordinals.is_empty() {
                return Some(encode_frame(&message));
            }
            return Some(frame_of(encode_body(
                &message,
                &mut Marks::new(&self.ordinals),
            )));
        };
        let Some(offset) = self.offset else {
            self.offset = Some(0);
            return Some(encode_frame(&Message::ValueStart(ValueStart {
                kind: *kind,
                length: bytes.len() as u64,
                table: self.table.clone(),
                column: column.clone(),
            })));
        };
        let end = (offset + self.piece_bytes).min(bytes.len());
        let piece = &bytes[offset..end];
        let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + 5 + piece.len());
        frame.extend_from_slice(&(5 + piece.len() as u32).to_be_bytes());
        frame.push(MessageType::ValuePiece as u8);
        frame.extend_from_slice(&(piece.len() as u32).to_be_bytes());
        frame.extend_from_slice(piece);
        if end == bytes.len() {
            self.values.pop_front();
            self.offset = None;
        } else {
            self.offset = Some(end);
        }
        Some(frame)
    }
}

/// A body with its length prefix.
fn frame_of(body: Vec<u8>) -> Vec<u8> {
    let length = u32::try_from(body.len()).expect("message bodies are far below 4 GiB");
    let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(&body);
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_split_anywhere_between_pieces_is_accepted_and_bad_bytes_refused() {
        let text = "a✓é😀z".as_bytes();
        for cut in 0..=text.len() {
            for second in cut..=text.len() {
                let mut check = Utf8Check::default();
                check.feed(&text[..cut]).unwrap();
                check.feed(&text[cut..second]).unwrap();
                check.feed(&text[second..]).unwrap();
                assert!(check.is_complete(), "cut at {cut} and {second}");
            }
        }
        let mut check = Utf8Check::default();
        assert!(check.feed(&[0xE2, 0x9C]).is_ok());
        assert!(!check.is_complete());
        assert!(check.feed(&[0x41]).is_err());
        assert!(Utf8Check::default().feed(&[0xFF]).is_err());
    }
}

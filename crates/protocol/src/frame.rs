//! Framing: each message body is preceded by its length as a big-endian u32.

use crate::codec::{decode, Rows};
use crate::pieces::{Pieces, ROW_PIECES_BYTES_MAX_DEFAULT, VALUE_BYTES_MAX_DEFAULT};
use crate::{encode_message, DecodeError, Message};

/// Bytes of the length prefix.
pub const FRAME_HEADER_BYTES: usize = 4;

/// Default limit on one frame's body. Large uploads and downloads are split into many
/// messages, so no single frame needs to be big.
pub const FRAME_BYTES_MAX_DEFAULT: usize = 4 * 1024 * 1024;

/// Encodes a message with its length prefix.
pub fn encode_frame(message: &Message) -> Vec<u8> {
    let body = encode_message(message);
    let length = u32::try_from(body.len()).expect("message bodies are far below 4 GiB");
    let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + body.len());
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Incremental frame decoder: feed it bytes as they arrive, take messages out.
///
/// An oversized frame is refused as soon as its length prefix is seen, before any of
/// its body is buffered, so the buffer never holds more than one frame plus one read.
///
/// Values in pieces (protocol v2) are put back into the row that holds them: the
/// `value_start` and `value_piece` frames are taken here and never handed out. A value
/// announced longer than the value limit is refused at its `value_start`, and the values
/// in pieces of one row together may not pass the row limit, so the decoder holds at most
/// one row's values besides one frame.
#[derive(Debug)]
pub struct FrameDecoder {
    buffer: Vec<u8>,
    start: usize,
    frame_bytes_max: usize,
    pieces: Pieces,
}

impl FrameDecoder {
    /// A decoder with the default value limits ([`VALUE_BYTES_MAX_DEFAULT`],
    /// [`ROW_PIECES_BYTES_MAX_DEFAULT`]).
    pub fn new(frame_bytes_max: usize) -> FrameDecoder {
        FrameDecoder {
            buffer: Vec::new(),
            start: 0,
            frame_bytes_max,
            pieces: Pieces::new(VALUE_BYTES_MAX_DEFAULT, ROW_PIECES_BYTES_MAX_DEFAULT),
        }
    }

    /// Sets the largest value taken in pieces and the most bytes of values in pieces
    /// held for one row.
    pub fn with_value_limits(mut self, value_bytes_max: u64, row_bytes_max: u64) -> FrameDecoder {
        self.pieces = Pieces::new(value_bytes_max, row_bytes_max);
        self
    }

    /// From now on, refuses `value_start` and `value_piece` frames: the peer's hello said
    /// protocol version 1, which has no values in pieces.
    pub fn refuse_pieces(&mut self) {
        self.pieces.refuse();
    }

    pub fn feed(&mut self, bytes: &[u8]) {
        if self.start > 0 && self.start == self.buffer.len() {
            self.buffer.clear();
            self.start = 0;
        } else if self.start > self.frame_bytes_max {
            self.buffer.drain(..self.start);
            self.start = 0;
        }
        self.buffer.extend_from_slice(bytes);
    }

    /// Bytes received that do not yet form a whole frame.
    pub fn buffered_bytes(&self) -> usize {
        self.buffer.len() - self.start
    }

    /// Bytes still missing before the next frame is whole: the rest of its header, or
    /// of its body once the header is in (0 when a whole frame is buffered). A reader
    /// that inflates no more than this never buffers more than one frame.
    pub fn bytes_needed(&self) -> usize {
        let buffered = self.buffered_bytes();
        match self.peek_length() {
            None => FRAME_HEADER_BYTES - buffered,
            Some(length) => (FRAME_HEADER_BYTES + length).saturating_sub(buffered),
        }
    }

    /// The next complete message, `None` if more bytes are needed.
    pub fn next_message(&mut self) -> Result<Option<Message>, DecodeError> {
        self.next(Rows::Keep, true)
    }

    /// [`Self::next_message`] for a stream whose every frame has already passed
    /// [`Self::next_message_checked`] (a server decoding the spool of an upload it
    /// checked as it arrived): not checked a second time.
    pub fn next_message_prechecked(&mut self) -> Result<Option<Message>, DecodeError> {
        self.next(Rows::Keep, false)
    }

    /// The next complete message checked as [`crate::check_message`] does: every row
    /// checked, none kept (values in pieces checked, UTF-8 included, and counted only).
    pub fn next_message_checked(&mut self) -> Result<Option<Message>, DecodeError> {
        self.next(Rows::CheckOnly, false)
    }

    /// `check_first`: check a kept message whole before decoding it.
    fn next(&mut self, rows: Rows, check_first: bool) -> Result<Option<Message>, DecodeError> {
        loop {
            let Some(body) = self.next_body()? else {
                return Ok(None);
            };
            let body = &self.buffer[body];
            if self.pieces.take_frame(body, rows)? {
                continue;
            }
            if rows == Rows::Keep && check_first {
                // Checked whole first, as `decode_message` does, so no count sizes a
                // vector before it is known to be true.
                decode(body, Rows::CheckOnly, Some(&mut self.pieces.whole))?;
                self.pieces.whole.rewind();
            }
            let message = decode(body, rows, Some(&mut self.pieces.whole))?;
            self.pieces.after_message(message.message_type())?;
            return Ok(Some(message));
        }
    }

    fn next_body(&mut self) -> Result<Option<std::ops::Range<usize>>, DecodeError> {
        let Some(length) = self.next_frame_length()? else {
            return Ok(None);
        };
        let available = self.buffered_bytes() - FRAME_HEADER_BYTES;
        if available < length {
            return Ok(None);
        }
        let body_start = self.start + FRAME_HEADER_BYTES;
        self.start = body_start + length;
        Ok(Some(body_start..body_start + length))
    }

    /// Call when the stream has ended: an error if it ended inside a frame.
    pub fn finish(&self) -> Result<(), DecodeError> {
        let buffered = self.buffered_bytes();
        if buffered == 0 {
            return Ok(());
        }
        let expected_bytes = match self.peek_length() {
            Some(length) => FRAME_HEADER_BYTES + length,
            None => FRAME_HEADER_BYTES,
        };
        Err(DecodeError::EndedMidFrame {
            received_bytes: buffered,
            expected_bytes,
        })
    }

    fn peek_length(&self) -> Option<usize> {
        let header = self
            .buffer
            .get(self.start..self.start + FRAME_HEADER_BYTES)?;
        Some(u32::from_be_bytes(header.try_into().expect("four bytes")) as usize)
    }

    fn next_frame_length(&self) -> Result<Option<usize>, DecodeError> {
        let Some(length) = self.peek_length() else {
            return Ok(None);
        };
        if length > self.frame_bytes_max {
            return Err(DecodeError::FrameTooLarge {
                length_bytes: length,
                limit_bytes: self.frame_bytes_max,
            });
        }
        if length == 0 {
            return Err(DecodeError::EmptyFrame);
        }
        Ok(Some(length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EndUpload;

    #[test]
    fn bytes_needed_is_the_rest_of_the_header_then_of_the_body() {
        let frame = encode_frame(&Message::EndUpload(EndUpload { upload_sequence: 7 }));
        let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
        assert_eq!(decoder.bytes_needed(), FRAME_HEADER_BYTES);
        decoder.feed(&frame[..1]);
        assert_eq!(decoder.bytes_needed(), FRAME_HEADER_BYTES - 1);
        decoder.feed(&frame[1..FRAME_HEADER_BYTES]);
        assert_eq!(decoder.bytes_needed(), frame.len() - FRAME_HEADER_BYTES);
        decoder.feed(&frame[FRAME_HEADER_BYTES..]);
        assert_eq!(decoder.bytes_needed(), 0);
        assert!(decoder.next_message().unwrap().is_some());
        assert_eq!(decoder.bytes_needed(), FRAME_HEADER_BYTES);
    }
}

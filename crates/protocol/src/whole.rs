//! Values received whole in pieces (protocol v2), waiting for the message whose row
//! holds them: what the frame decoder's [`crate::pieces::Pieces`] fills and the message
//! decoder (`codec`) takes from, and whether a decoding keeps rows or only checks them.
//! Beneath both, so that `pieces`, which encodes and decodes through `codec`, is the
//! only one of the two importing the other.

use std::collections::VecDeque;

use crate::Value;

/// Whether decoding keeps the rows it reads or only checks them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Rows {
    Keep,
    CheckOnly,
}

/// A value received whole in pieces, with the table and column it was announced for.
#[derive(Debug)]
pub(crate) struct Whole {
    pub(crate) table: String,
    pub(crate) column: String,
    /// The value when decoding; `None` when only checking.
    pub(crate) value: Option<Value>,
}

/// Values received whole in pieces, waiting for the message that holds them; taken in
/// order, and taken again after [`WholeValues::rewind`] (a message is checked whole
/// before it is decoded, and its values then taken once more).
#[derive(Debug, Default)]
pub(crate) struct WholeValues {
    pub(crate) values: VecDeque<Whole>,
    /// The next value to take.
    next: usize,
}

impl WholeValues {
    /// The next whole value (without its bytes when only checking), `None` if there is
    /// none left.
    pub(crate) fn take(&mut self, rows: Rows) -> Option<Whole> {
        let whole = self.values.get_mut(self.next)?;
        self.next += 1;
        Some(Whole {
            table: whole.table.clone(),
            column: whole.column.clone(),
            value: match rows {
                Rows::Keep => whole.value.take(),
                Rows::CheckOnly => None,
            },
        })
    }

    /// Takes the values from the first again.
    pub(crate) fn rewind(&mut self) {
        self.next = 0;
    }

    /// Forgets every value; returns how many were never taken.
    pub(crate) fn clear(&mut self) -> usize {
        let unused = self.values.len() - self.next;
        self.values.clear();
        self.next = 0;
        unused
    }
}

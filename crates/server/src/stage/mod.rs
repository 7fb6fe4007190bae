//! The stages of one sync after the network stage, each a module: [`stream`] (read,
//! decompress, check, authenticate: a checked upload in a spool, no worker yet),
//! [`database`] (a worker: decode, the transaction, the download spooled) and
//! [`download`] (the spooled download sent after the worker is released, and the reply
//! to a download acknowledgement). `crate::sync` runs them in order.

pub(crate) mod database;
pub(crate) mod download;
pub(crate) mod stream;

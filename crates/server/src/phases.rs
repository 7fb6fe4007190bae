//! The phases of one sync and how it ended: the names the Prometheus metrics
//! (`metrics`) and the live monitor (`monitor`) both count by. Beneath both, so that
//! `metrics`, which holds the monitor, is the only one of the two importing the other.

use std::fmt;

use prometheus_client::encoding::EncodeLabelValue;

/// The phases of one sync, in order.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Phase {
    /// Accept to the hello decoded.
    connect,
    /// Checking the credentials.
    authenticate,
    /// The rest of the upload received.
    upload_received,
    /// Waiting for a database worker.
    worker_wait,
    /// The upload applied (scripts and conflicts).
    upload_applied,
    /// The download read and spooled, and the transaction committed.
    download_fetched,
    /// The download sent to the client.
    download_sent,
}

pub const PHASES: [Phase; 7] = [
    Phase::connect,
    Phase::authenticate,
    Phase::upload_received,
    Phase::worker_wait,
    Phase::upload_applied,
    Phase::download_fetched,
    Phase::download_sent,
];

impl fmt::Display for Phase {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, formatter)
    }
}

/// How a sync ended.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    ok,
    /// Refused with an error (bad input, authentication, script error, a timeout
    /// while receiving, ...).
    refused,
    /// The connection broke, or the client stopped reading, without an answer.
    failed,
    /// Answered busy at the connection limit.
    busy,
}

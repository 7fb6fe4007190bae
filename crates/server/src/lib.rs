//! The rowsync server, staged as in MobiLink:
//!
//! 1. network stage ([`server`]): accept under a connection limit; above it, answer
//!    *busy* with a retry-after computed from the load (`shared`), and close.
//! 2. stream stage (`stage::stream` + [`session`]): the hello, then authentication
//!    ([`auth`], on connections of its own), then the rest of the upload, checked
//!    message by message and kept encoded in a spool bounded by the shared [`cache`]; no
//!    worker yet.
//! 3. database stage (`stage::database`, on the [`pool`] sized by the [`controller`]):
//!    take a worker, decode the upload, run the sync's transaction, release it.
//! 4. download stage (`stage::download`): the download, spooled while the worker read
//!    it, is sent after the worker is released.
//!
//! `sync` runs one sync through stages 2-4; every phase is timed into [`metrics`],
//! served by [`admin`]. The byte stream of a sync travels over TCP, TLS ([`tls`]), or
//! HTTP(S) ([`http`]); every transport feeds the same stages.

pub mod admin;
pub mod allocator;
pub mod auth;
mod background;
pub mod cache;
mod config;
mod connection_end;
pub mod controller;
pub mod decoders;
mod download_frames;
mod failure;
pub mod fuzzing;
mod held;
pub mod http;
pub mod jwks;
pub mod metrics;
pub mod monitor;
mod pending;
mod phases;
pub mod pool;
mod receipt;
pub mod record;
mod reply;
pub mod server;
pub mod session;
pub mod session_token;
mod shared;
mod spool;
mod stage;
mod sync;
mod throttle;
pub mod tls;
mod tls_accept;
pub mod token;
pub mod upload_stream;
mod version_tables;

pub use config::{
    ServerConfig, CLIENT_IDS_PER_USER_MAX_DEFAULT, MALLOC_MMAP_THRESHOLD_BYTES_DEFAULT,
    SHARED_DOWNLOAD_CACHE_BYTES_MAX_DEFAULT,
};
pub use server::{
    serve, serve_endpoints, serve_endpoints_with_metrics, Endpoint, ServerError, Transport,
};
pub use token::TokenConfig;

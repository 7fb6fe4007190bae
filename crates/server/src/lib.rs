//! The rowsync server, staged as in MobiLink:
//!
//! 1. network stage ([`server`]): accept under a connection limit; above it, answer
//!    *busy* with a retry-after hint and close.
//! 2. stream stage ([`server`] + [`session`]): read and decode the whole upload into
//!    memory, bounded by `upload_bytes_max`; no database work yet.
//! 3. database stage ([`pool`]): authenticate, then take one of `workers` pooled
//!    connections, run the sync's transaction, release it.
//! 4. the download is encoded and sent after the worker is released.
//!
//! The byte stream of a sync travels over TCP, TLS ([`tls`]), or HTTP(S) ([`http`]);
//! every transport feeds the same stages.

pub mod admin;
pub mod auth;
pub mod cache;
mod config;
pub mod controller;
mod download;
pub mod http;
pub mod metrics;
pub mod pool;
pub mod server;
pub mod session;
mod sync;
pub mod tls;
mod tls_accept;
pub mod token;

pub use config::ServerConfig;
pub use server::{
    serve, serve_endpoints, serve_endpoints_with_metrics, Endpoint, ServerError, Transport,
};
pub use token::TokenConfig;

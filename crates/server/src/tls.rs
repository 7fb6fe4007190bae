//! TLS for the TCP and HTTPS transports (rustls with the ring provider, TLS 1.2 and 1.3
//! only). Test certificates are made by `rowsync cert` (`rowsync_cli::cert`), not here:
//! the server only loads them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

/// The only protocol versions rowsync speaks.
pub static PROTOCOL_VERSIONS: &[&rustls::SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// ALPN names: HTTPS offers HTTP/2 and HTTP/1.1; a raw TLS connection carries the
/// rowsync byte stream itself.
pub const ALPN_HTTP: [&[u8]; 2] = [b"h2", b"http/1.1"];
pub const ALPN_ROWSYNC: &[u8] = b"rowsync";

#[derive(Debug, Error)]
pub enum TlsError {
    #[error("reading {what} from {path}: {message}")]
    Pem {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
    #[error("{path} holds no {what}")]
    Empty { what: &'static str, path: PathBuf },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(String),
}

/// What a TLS listener needs: its certificate chain and key, and (to require client
/// certificates) the CA that signs them.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert_chain: PathBuf,
    pub private_key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem_error = |error: rustls_pki_types::pem::Error| TlsError::Pem {
        what: "certificates",
        path: path.to_path_buf(),
        message: error.to_string(),
    };
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(pem_error)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_error)?;
    if certificates.is_empty() {
        return Err(TlsError::Empty {
            what: "PEM certificate",
            path: path.to_path_buf(),
        });
    }
    Ok(certificates)
}

pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|error| TlsError::Pem {
        what: "a private key",
        path: path.to_path_buf(),
        message: error.to_string(),
    })
}

/// A rustls server configuration: TLS 1.2 and 1.3, the given ALPN names, client
/// certificates required when `files.client_ca` is set.
pub fn server_config(
    files: &TlsFiles,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let provider = crypto_provider();
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(PROTOCOL_VERSIONS)?;
    let builder = match &files.client_ca {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in load_certificates(path)? {
                roots.add(certificate)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|error| TlsError::Verifier(error.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_single_cert(
        load_certificates(&files.cert_chain)?,
        load_private_key(&files.private_key)?,
    )?;
    config.alpn_protocols = alpn.iter().map(|name| name.to_vec()).collect();
    Ok(Arc::new(config))
}

//! TLS for the TCP and HTTPS transports (rustls with the ring provider, TLS 1.2 and 1.3
//! only), and the generation of a test certificate authority and certificates
//! (`rowsync cert`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
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
    #[error("certificate generation: {0}")]
    Generate(String),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
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

/// The key algorithm of generated certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// ECDSA on P-256 with SHA-256 (the default: small and fast).
    EcdsaP256,
    /// RSA 2048 with SHA-256.
    Rsa2048,
}

/// A certificate and its key, in PEM.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A certificate authority that can sign server and client certificates.
pub struct TestAuthority {
    key: KeyPair,
    certificate: rcgen::Certificate,
    kind: KeyKind,
}

fn generate_error(error: impl std::fmt::Display) -> TlsError {
    TlsError::Generate(error.to_string())
}

fn key_pair(kind: KeyKind) -> Result<KeyPair, TlsError> {
    match kind {
        KeyKind::EcdsaP256 => {
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(generate_error)
        }
        KeyKind::Rsa2048 => {
            // ring signs with RSA keys but cannot make them: the rsa crate does.
            use rsa::pkcs8::EncodePrivateKey;
            let key =
                rsa::RsaPrivateKey::new(&mut rand::thread_rng(), 2048).map_err(generate_error)?;
            let pem = key
                .to_pkcs8_pem(rsa::pkcs8::LineEnding::LF)
                .map_err(generate_error)?;
            KeyPair::from_pem_and_sign_algo(&pem, &rcgen::PKCS_RSA_SHA256).map_err(generate_error)
        }
    }
}

impl TestAuthority {
    pub fn new(kind: KeyKind, name: &str) -> Result<TestAuthority, TlsError> {
        let key = key_pair(kind)?;
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate_error)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let certificate = params.self_signed(&key).map_err(generate_error)?;
        Ok(TestAuthority {
            key,
            certificate,
            kind,
        })
    }

    pub fn cert_pem(&self) -> String {
        self.certificate.pem()
    }

    /// A server certificate for `names` (host names or IP addresses).
    pub fn issue_server(&self, names: &[String]) -> Result<Issued, TlsError> {
        self.issue(names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate whose common name is `name`.
    pub fn issue_client(&self, name: &str) -> Result<Issued, TlsError> {
        self.issue(&[name.to_string()], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, names: &[String], usage: ExtendedKeyUsagePurpose) -> Result<Issued, TlsError> {
        let key = key_pair(self.kind)?;
        let mut params = CertificateParams::new(names.to_vec()).map_err(generate_error)?;
        if let Some(first) = names.first() {
            params.distinguished_name.push(DnType::CommonName, first);
        }
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let certificate = params
            .signed_by(&key, &self.certificate, &self.key)
            .map_err(generate_error)?;
        Ok(Issued {
            cert_pem: certificate.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Files written by [`write_test_pki`].
#[derive(Debug, Clone)]
pub struct PkiFiles {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

/// Writes a new CA (`ca.pem`), a server certificate for `names` (`server.pem`,
/// `server-key.pem`) and a client certificate (`client.pem`, `client-key.pem`) into
/// `dir`. Private keys are written readable by their owner only.
pub fn write_test_pki(dir: &Path, names: &[String], kind: KeyKind) -> Result<PkiFiles, TlsError> {
    let authority = TestAuthority::new(kind, "rowsync test CA")?;
    let server = authority.issue_server(names)?;
    let client = authority.issue_client("rowsync client")?;
    let files = PkiFiles {
        ca_cert: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server-key.pem"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client-key.pem"),
    };
    let write = |path: &Path, text: &str, private: bool| -> Result<(), TlsError> {
        let failed = |source| TlsError::Write {
            path: path.to_path_buf(),
            source,
        };
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        if private {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        #[cfg(not(unix))]
        let _ = private;
        let mut file = options.open(path).map_err(failed)?;
        std::io::Write::write_all(&mut file, text.as_bytes()).map_err(failed)
    };
    write(&files.ca_cert, &authority.cert_pem(), false)?;
    write(&files.server_cert, &server.cert_pem, false)?;
    write(&files.server_key, &server.key_pem, true)?;
    write(&files.client_cert, &client.cert_pem, false)?;
    write(&files.client_key, &client.key_pem, true)?;
    Ok(files)
}

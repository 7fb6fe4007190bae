//! Test certificates: a certificate authority that signs server and client certificates,
//! written as PEM files by `rowsync cert` and made by the bench and the TLS tests. The
//! server only loads certificates (`rowsync_server::tls`); making them (rcgen, and the
//! rsa crate for RSA keys) lives here so the server library does not link either.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CertError {
    #[error("certificate generation: {0}")]
    Generate(String),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
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

fn generate_error(error: impl std::fmt::Display) -> CertError {
    CertError::Generate(error.to_string())
}

fn key_pair(kind: KeyKind) -> Result<KeyPair, CertError> {
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
    pub fn new(kind: KeyKind, name: &str) -> Result<TestAuthority, CertError> {
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
    pub fn issue_server(&self, names: &[String]) -> Result<Issued, CertError> {
        self.issue(names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate whose common name is `name`.
    pub fn issue_client(&self, name: &str) -> Result<Issued, CertError> {
        self.issue(&[name.to_string()], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(&self, names: &[String], usage: ExtendedKeyUsagePurpose) -> Result<Issued, CertError> {
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
pub fn write_test_pki(dir: &Path, names: &[String], kind: KeyKind) -> Result<PkiFiles, CertError> {
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
    let write = |path: &Path, text: &str, private: bool| -> Result<(), CertError> {
        let failed = |source| CertError::Write {
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

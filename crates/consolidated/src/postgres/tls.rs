//! TLS to PostgreSQL with rustls, as libpq's `sslmode` and `sslrootcert` say:
//! `disable` (plain), `prefer` (the default: TLS when the server offers it, not
//! verified), `require` (TLS, not verified, unless `sslrootcert` names a CA: then as
//! `verify-ca`), `verify-ca` (the certificate chains to a trusted CA) and `verify-full`
//! (also names the host). Trusted CAs: the PEM file `sslrootcert` names, or the Mozilla
//! roots (`sslrootcert=system`, or none given).

use std::str::FromStr;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::config::SslMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::url_query::take_parameters;
use crate::DbError;

/// How the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Encrypted, not verified (libpq's `prefer` and `require`).
    None,
    /// Chains to a trusted CA, whatever host it names.
    Ca,
    /// Chains to a trusted CA and names the host connected to.
    Full,
}

/// A URL's connection settings and the TLS connector its `sslmode` asks for.
pub fn connection_settings(
    url: &str,
) -> Result<(tokio_postgres::Config, MakeRustlsConnect), DbError> {
    let (rest, sslmode, rootcert) = take_tls_parameters(url);
    let mut config = tokio_postgres::Config::from_str(&rest)
        .map_err(|error| DbError::Invalid(format!("the PostgreSQL URL does not parse: {error}")))?;
    let (mode, check) = match sslmode.as_deref() {
        None | Some("prefer") => (SslMode::Prefer, Check::None),
        Some("disable") => (SslMode::Disable, Check::None),
        Some("require") if rootcert.is_some() => (SslMode::Require, Check::Ca),
        Some("require") => (SslMode::Require, Check::None),
        Some("verify-ca") => (SslMode::Require, Check::Ca),
        Some("verify-full") => (SslMode::Require, Check::Full),
        Some(other) => {
            return Err(DbError::Invalid(format!(
                "sslmode={other} is not a mode rowsync knows: use disable, prefer, require, \
                 verify-ca or verify-full"
            )))
        }
    };
    config.ssl_mode(mode);
    let connector = MakeRustlsConnect::new(client_config(check, rootcert.as_deref())?);
    Ok((config, connector))
}

/// The URL without `sslmode` and `sslrootcert` (which tokio-postgres either does not
/// know or knows only in part), and their values.
fn take_tls_parameters(url: &str) -> (String, Option<String>, Option<String>) {
    let (rest, found) = take_parameters(url, &["sslmode", "sslrootcert"]);
    let [sslmode, rootcert]: [Option<String>; 2] = found.try_into().expect("two names");
    (rest, sslmode, rootcert)
}

fn client_config(check: Check, rootcert: Option<&str>) -> Result<rustls::ClientConfig, DbError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|error| DbError::Invalid(format!("TLS to PostgreSQL: {error}")))?;
    let verifier: Arc<dyn ServerCertVerifier> = match check {
        Check::None => Arc::new(Unverified(provider)),
        Check::Ca | Check::Full => {
            let webpki = WebPkiServerVerifier::builder_with_provider(
                Arc::new(trusted_roots(rootcert)?),
                provider,
            )
            .build()
            .map_err(|error| DbError::Invalid(format!("TLS to PostgreSQL: {error}")))?;
            match check {
                Check::Ca => Arc::new(AnyName(webpki)),
                _ => webpki,
            }
        }
    };
    Ok(builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth())
}

fn trusted_roots(rootcert: Option<&str>) -> Result<RootCertStore, DbError> {
    let mut roots = RootCertStore::empty();
    let path = match rootcert {
        None | Some("system") => {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            return Ok(roots);
        }
        Some(path) => path,
    };
    let refusal = |why: String| {
        DbError::Invalid(format!(
            "sslrootcert={path}: {why}; name a PEM file of the CA that signed the server's \
             certificate, or sslrootcert=system for the public CAs"
        ))
    };
    let certificates = CertificateDer::pem_file_iter(path)
        .and_then(|certificates| certificates.collect::<Result<Vec<_>, _>>())
        .map_err(|error| refusal(error.to_string()))?;
    if certificates.is_empty() {
        return Err(refusal("the file holds no PEM certificate".into()));
    }
    for certificate in certificates {
        roots
            .add(certificate)
            .map_err(|error| refusal(error.to_string()))?;
    }
    Ok(roots)
}

/// libpq's `verify-ca`: the chain is checked, the host name is not.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified =
            self.0
                .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now);
        match verified {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, signature)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, signature)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// libpq's `prefer` and `require` without `sslrootcert`: encrypted against a passive
/// listener, not against one in the middle (the handshake's signatures are checked,
/// the certificate is not).
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        verify_tls12_signature(message, cert, signature, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.0.signature_verification_algorithms;
        verify_tls13_signature(message, cert, signature, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_parameters_leave_the_url_and_the_rest_stays() {
        let (rest, mode, root) = take_tls_parameters(
            "postgres://u:p@db:5432/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
        );
        assert_eq!(rest, "postgres://u:p@db:5432/app?application_name=x");
        assert_eq!(mode.as_deref(), Some("verify-full"));
        assert_eq!(root.as_deref(), Some("/etc/ca.pem"));
        let (rest, mode, root) = take_tls_parameters("postgres://db/app");
        assert_eq!(
            (rest.as_str(), mode, root),
            ("postgres://db/app", None, None)
        );
    }

    #[test]
    fn an_unknown_sslmode_is_refused_naming_the_modes() {
        let Err(error) = connection_settings("postgres://db/app?sslmode=allow") else {
            panic!("sslmode=allow was taken");
        };
        assert!(error.to_string().contains("verify-full"), "{error}");
    }
}

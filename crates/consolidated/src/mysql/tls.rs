//! TLS to MariaDB and MySQL with rustls, as the `mysql` client's options say:
//! `ssl-mode` DISABLED (the default here, as before), REQUIRED (encrypted, not
//! verified), VERIFY_CA (the certificate chains to a trusted CA) or VERIFY_IDENTITY
//! (also names the host); `ssl-ca` a PEM file of trusted CAs (else the Mozilla roots).
//! Both are taken out of the URL before mysql_async reads the rest (which also knows
//! `require_ssl`, `verify_ca` and `verify_identity`).

use std::path::PathBuf;

use mysql_async::SslOpts;

use crate::url_query::take_parameters;
use crate::DbError;

/// The URL without `ssl-mode` and `ssl-ca` (also spelled `ssl_mode`, `ssl_ca`), and the
/// TLS they ask for (`None`: as the rest of the URL says).
pub fn take_ssl_options(url: &str) -> Result<(String, Option<SslOpts>), DbError> {
    let names = ["ssl-mode", "ssl_mode", "ssl-ca", "ssl_ca"];
    let (rest, found) = take_parameters(url, &names);
    let [mode, mode_underscored, ca, ca_underscored]: [Option<String>; 4] =
        found.try_into().expect("four names");
    let mode = mode
        .or(mode_underscored)
        .map(|mode| mode.to_ascii_uppercase());
    let ca = ca.or(ca_underscored).map(PathBuf::from);
    let verified = |domain: bool| {
        let roots = ca.clone().map(|path| vec![path.into()]).unwrap_or_default();
        SslOpts::default()
            .with_root_certs(roots)
            .with_danger_skip_domain_validation(!domain)
    };
    let ssl = match mode.as_deref() {
        None if ca.is_some() => Some(verified(true)),
        None | Some("DISABLED") => None,
        Some("REQUIRED") => Some(SslOpts::default().with_danger_accept_invalid_certs(true)),
        Some("VERIFY_CA") => Some(verified(false)),
        Some("VERIFY_IDENTITY") => Some(verified(true)),
        Some(other) => {
            return Err(DbError::Invalid(format!(
                "ssl-mode={other} is not a mode rowsync knows: use DISABLED, REQUIRED, \
                 VERIFY_CA or VERIFY_IDENTITY"
            )))
        }
    };
    Ok((rest, ssl))
}

/// A failed connection, with the fix when TLS is, or may be, why (`tls`: the URL asked
/// for TLS). MariaDB with `require_secure_transport` refuses a plain login as it
/// refuses a wrong password.
pub fn connect_failure(error: mysql_async::Error, tls: bool) -> DbError {
    let text = error.to_string();
    if !tls && text.contains("Access denied") {
        return DbError::Invalid(format!(
            "connecting to MariaDB: {text}; check the user and password, and if the server \
             takes only TLS connections (require_secure_transport), add ssl-mode=REQUIRED \
             (or VERIFY_IDENTITY with ssl-ca) to the URL"
        ));
    }
    if text.contains("insecure transport") {
        return DbError::Invalid(format!(
            "connecting to MariaDB: {text}; the server takes only TLS connections: add \
             ssl-mode=REQUIRED (or VERIFY_IDENTITY with ssl-ca) to the URL"
        ));
    }
    if text.contains("certificate") || text.contains("TLS") {
        return DbError::Invalid(format!(
            "connecting to MariaDB over TLS: {text}; check ssl-mode (REQUIRED, VERIFY_CA, \
             VERIFY_IDENTITY) and ssl-ca (the CA that signed the server's certificate)"
        ));
    }
    super::error::db(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssl_options_leave_the_url() {
        let (rest, ssl) =
            take_ssl_options("mysql://u@db/app?ssl-mode=verify_ca&ssl-ca=%2Fca.pem&x=1").unwrap();
        assert_eq!(rest, "mysql://u@db/app?x=1");
        let ssl = ssl.unwrap();
        assert!(ssl.skip_domain_validation() && !ssl.accept_invalid_certs());
        let (rest, ssl) = take_ssl_options("mysql://u@db/app").unwrap();
        assert_eq!((rest.as_str(), ssl.is_none()), ("mysql://u@db/app", true));
        assert!(take_ssl_options("mysql://db/a?ssl-mode=PREFERRED").is_err());
    }
}

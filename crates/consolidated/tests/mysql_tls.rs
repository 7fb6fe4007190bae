//! TLS to MariaDB (issue "rowsync as a production service"): a throwaway server with
//! `require_secure_transport` and a certificate for `localhost` from the test's own CA.
//! The product's connection path reaches it as `ssl-mode` and `ssl-ca` say, and
//! refuses, naming the fix, a plain connection and a certificate that must not verify.

use mysql_async::prelude::Queryable;
use rowsync_consolidated::mysql::MysqlConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};
use rowsync_testkit::{MysqlServer, TlsFiles};

fn ca(name: &str) -> (rcgen::Certificate, rcgen::KeyPair) {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let key = rcgen::KeyPair::generate().unwrap();
    (params.self_signed(&key).unwrap(), key)
}

async fn reach(url: &str) -> Result<(), String> {
    let backend = MysqlConsolidated::new(url).map_err(|error| error.to_string())?;
    let mut connection = backend.connect().await.map_err(|error| error.to_string())?;
    connection
        .install_system_tables()
        .await
        .map_err(|error| error.to_string())?;
    connection.ping().await.map_err(|error| error.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_mariadb_is_reached_as_ssl_mode_says() {
    let (ca_certificate, ca_key) = ca("rowsync test CA");
    let (other_ca, _) = ca("another CA");
    let server_key = rcgen::KeyPair::generate().unwrap();
    // Named by its address only: by the name localhost it does not verify.
    let mut server_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    server_params.subject_alt_names = vec![rcgen::SanType::IpAddress(
        std::net::Ipv4Addr::LOCALHOST.into(),
    )];
    let server_certificate = server_params
        .signed_by(&server_key, &ca_certificate, &ca_key)
        .unwrap();
    let server = MysqlServer::start_tls_only(&TlsFiles {
        certificate_pem: &server_certificate.pem(),
        key_pem: &server_key.serialize_pem(),
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    let other_ca_file = dir.path().join("other-ca.pem");
    std::fs::write(&ca_file, ca_certificate.pem()).unwrap();
    std::fs::write(&other_ca_file, other_ca.pem()).unwrap();
    let required = format!("{}?ssl-mode=REQUIRED", server.url("mysql"));
    let mut admin = mysql_async::Conn::from_url(
        &required
            .replace("ssl-mode", "require_ssl")
            .replace("REQUIRED", "true&verify_ca=false"),
    )
    .await
    .unwrap();
    admin.query_drop("CREATE DATABASE tls_app").await.unwrap();

    let by_ip = server.url("tls_app");
    let by_name = by_ip.replace("127.0.0.1", "localhost") + "?prefer_socket=false";

    let plain = reach(&by_ip).await.unwrap_err();
    assert!(plain.contains("ssl-mode=REQUIRED"), "{plain}");
    reach(&format!("{by_ip}?ssl-mode=REQUIRED")).await.unwrap();
    let ca = ca_file.display();
    reach(&format!("{by_ip}?ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"))
        .await
        .unwrap();
    let wrong_name = reach(&format!("{by_name}&ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}"))
        .await
        .unwrap_err();
    assert!(
        wrong_name.contains("ssl-ca"),
        "localhost is not the certificate's name: {wrong_name}"
    );
    let other = other_ca_file.display();
    let untrusted = reach(&format!("{by_ip}?ssl-mode=VERIFY_CA&ssl-ca={other}"))
        .await
        .unwrap_err();
    assert!(untrusted.contains("ssl-ca"), "{untrusted}");
}

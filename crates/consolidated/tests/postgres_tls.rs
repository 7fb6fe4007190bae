//! TLS to PostgreSQL (issue "rowsync as a production service"): a throwaway cluster that
//! takes only TLS (`hostssl` alone in pg_hba.conf), with a certificate for `localhost`
//! signed by a CA of the test's own. The product's connection path (the backend's
//! `connect`) reaches it as `sslmode` and `sslrootcert` say, and refuses, naming the
//! fix, a certificate that must not verify and a plain connection.

use rowsync_consolidated::postgres::PostgresConsolidated;
use rowsync_consolidated::{Consolidated, ConsolidatedConnection};
use rowsync_testkit::{PgCluster, TlsFiles};

struct Pki {
    ca_pem: String,
    other_ca_pem: String,
    certificate_pem: String,
    key_pem: String,
}

fn pki() -> Pki {
    let ca = |name: &str| {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        (certificate, key)
    };
    let (ca_certificate, ca_key) = ca("rowsync test CA");
    let (other_ca, _) = ca("another CA");
    let server_key = rcgen::KeyPair::generate().unwrap();
    let server = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&server_key, &ca_certificate, &ca_key)
        .unwrap();
    Pki {
        ca_pem: ca_certificate.pem(),
        other_ca_pem: other_ca.pem(),
        certificate_pem: server.pem(),
        key_pem: server_key.serialize_pem(),
    }
}

async fn reach(url: &str) -> Result<(), String> {
    let backend = PostgresConsolidated::new(url);
    let mut connection = backend.connect().await.map_err(|error| error.to_string())?;
    connection
        .install_system_tables()
        .await
        .map_err(|error| error.to_string())?;
    connection.ping().await.map_err(|error| error.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_only_postgres_is_reached_as_sslmode_says() {
    let pki = pki();
    let cluster = PgCluster::start_tls_only(&TlsFiles {
        certificate_pem: &pki.certificate_pem,
        key_pem: &pki.key_pem,
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    let other_ca = dir.path().join("other-ca.pem");
    std::fs::write(&ca, &pki.ca_pem).unwrap();
    std::fs::write(&other_ca, &pki.other_ca_pem).unwrap();
    let by_ip = cluster.url("postgres");
    let by_name = by_ip.replace("127.0.0.1", "localhost");
    let with = |url: &str, parameters: String| format!("{url}?{parameters}");

    let plain = reach(&with(&by_ip, "sslmode=disable".into()))
        .await
        .unwrap_err();
    assert!(plain.contains("sslmode=require"), "{plain}");
    reach(&with(&by_ip, "sslmode=require".into()))
        .await
        .unwrap();
    reach(&by_ip)
        .await
        .expect("prefer, the default, takes the TLS offered");
    let verified = format!("sslmode=verify-full&sslrootcert={}", ca.display());
    reach(&with(&by_name, verified.clone())).await.unwrap();

    let wrong_name = reach(&with(&by_ip, verified)).await.unwrap_err();
    assert!(wrong_name.contains("sslrootcert"), "{wrong_name}");
    let chain_only = format!("sslmode=verify-ca&sslrootcert={}", ca.display());
    reach(&with(&by_ip, chain_only))
        .await
        .expect("verify-ca checks no name");
    let untrusted = format!("sslmode=verify-ca&sslrootcert={}", other_ca.display());
    let refused = reach(&with(&by_name, untrusted)).await.unwrap_err();
    assert!(refused.contains("certificate"), "{refused}");
    let public_roots = reach(&with(&by_name, "sslmode=verify-full".into())).await;
    assert!(public_roots.is_err(), "a private CA is no public root");
}

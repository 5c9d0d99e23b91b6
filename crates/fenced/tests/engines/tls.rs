//! TLS on every engine that has it: PostgreSQL, MariaDB, Redis and etcd,
//! each started by the test kit with a server certificate from a CA of
//! the test's own. A client that trusts that CA takes a lock over TLS with
//! the server's name checked; one that trusts another CA is refused with
//! an error that says why, at connect.

#![cfg(feature = "tls")]

use fenced::{Client, ErrorKind};
use fenced_testkit::servers::etcd::EtcdCluster;
use fenced_testkit::servers::mariadb::MariaDb;
use fenced_testkit::servers::postgres::PgServer;
use fenced_testkit::servers::redis::RedisServer;
use fenced_testkit::tls::TestCerts;
use fenced_testkit::unique;

/// Takes and releases a lock through `url`; the client, still open, for
/// the caller to look at the server with.
async fn lock_over(url: &str) -> Client {
    let c = Client::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    let g = c.mutex(&unique("tls")).unwrap().acquire().await.unwrap();
    assert!(g.fencing_token() > 0);
    assert!(g.release().await.unwrap());
    c
}

/// Connecting through `url`, whose CA did not sign the server's
/// certificate, fails at connect and names the certificate as the cause.
async fn refused(url: &str) {
    let e = Client::connect(url)
        .await
        .err()
        .unwrap_or_else(|| panic!("{url} trusted a server its CA did not sign"));
    let msg = e.to_string().to_lowercase();
    assert!(
        msg.contains("certificate") && msg.contains("unknownissuer"),
        "the error names the untrusted certificate: {e}"
    );
    assert_eq!(
        msg.matches("unknownissuer").count(),
        1,
        "the cause is said once: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_checks_the_server_certificate() {
    let (certs, other) = (
        TestCerts::new("fenced test CA"),
        TestCerts::new("another CA"),
    );
    let server = PgServer::start_tls(&certs);
    let url = |ca: &TestCerts| {
        format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            server.url(),
            ca.ca.display()
        )
    };
    let c = lock_over(&url(&certs)).await;
    // The server sees fenced's connections encrypted.
    let encrypted = server.sql(
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE s.ssl AND a.pid <> pg_backend_pid() AND a.backend_type = 'client backend'",
    );
    assert!(encrypted.parse::<u32>().unwrap() >= 1, "{encrypted}");
    c.close().await;
    refused(&url(&other)).await;
    // Both lock modes take the same URL options.
    lock_over(&format!("{}&mode=advisory", url(&certs)))
        .await
        .close()
        .await;
    refused(&format!("{}&mode=advisory", url(&other))).await;
}

/// `verify-full` checks the server's name, not only its CA: a certificate
/// the right CA signed for another host is refused, which `verify-ca`
/// accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_full_verification_checks_the_server_name() {
    let certs = TestCerts::for_names("fenced test CA", &["db.elsewhere.example"]);
    let server = PgServer::start_tls(&certs);
    let url = |mode: &str| {
        format!(
            "{}?sslmode={mode}&sslrootcert={}",
            server.url(),
            certs.ca.display()
        )
    };
    lock_over(&url("verify-ca")).await.close().await;
    let e = Client::connect(&url("verify-full"))
        .await
        .expect_err("a certificate for another name");
    assert!(
        e.to_string().contains("not valid for name"),
        "the error names the name mismatch: {e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_over_tls_checks_the_server_certificate() {
    let (certs, other) = (
        TestCerts::new("fenced test CA"),
        TestCerts::new("another CA"),
    );
    let server = MariaDb::start_tls(&certs);
    let url = |ca: &TestCerts| {
        format!(
            "{}?ssl-mode=VERIFY_IDENTITY&ssl-ca={}",
            server.url(),
            ca.ca.display()
        )
    };
    lock_over(&url(&certs)).await.close().await;
    refused(&url(&other)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_checks_the_server_certificate() {
    let (certs, other) = (
        TestCerts::new("fenced test CA"),
        TestCerts::new("another CA"),
    );
    let server = RedisServer::start_tls(&certs);
    // The TLS port speaks nothing else: the lock went over TLS.
    let url = |ca: &TestCerts| format!("{}?ca={}", server.tls_url(), ca.ca.display());
    lock_over(&url(&certs)).await.close().await;
    refused(&url(&other)).await;
    // Without `ca=`, the webpki roots, which did not sign it either.
    refused(&server.tls_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_over_tls_checks_the_server_certificate() {
    let (certs, other) = (
        TestCerts::new("fenced test CA"),
        TestCerts::new("another CA"),
    );
    let cluster = EtcdCluster::start_tls(&certs);
    let url = |ca: &TestCerts| format!("{}?ca={}", cluster.tls_url(), ca.ca.display());
    lock_over(&url(&certs)).await.close().await;
    refused(&url(&other)).await;
}

/// A CA file that is missing or holds no certificate, or one given to a
/// URL without TLS, is bad input, said before anything connects.
#[tokio::test]
async fn a_bad_ca_option_is_refused_before_connecting() {
    let certs = TestCerts::new("fenced test CA");
    let not_pem = certs.dir().join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    let missing = certs.dir().join("missing.pem");
    let ca = certs.ca.display();
    // Port 1: nothing listens, so only the URL can be what is refused.
    for (url, says) in [
        (
            format!("rediss://127.0.0.1:1?ca={}", missing.display()),
            "cannot read",
        ),
        (
            format!("rediss://127.0.0.1:1?ca={}", not_pem.display()),
            "no PEM certificate",
        ),
        (format!("redis://127.0.0.1:1?ca={ca}"), "rediss://"),
        (format!("etcd://127.0.0.1:1?ca={ca}"), "etcds://"),
        // A CA the driver would not check against, with a mode that does
        // not verify: refused rather than silently unchecked.
        (
            format!("postgres://u@127.0.0.1:1/db?sslmode=require&sslrootcert={ca}"),
            "sslmode=verify-ca",
        ),
        (
            format!("postgres://u@127.0.0.1:1/db?sslrootcert={ca}"),
            "verify-full",
        ),
        (
            format!("mysql://u@127.0.0.1:1/db?ssl-mode=REQUIRED&ssl-ca={ca}"),
            "VERIFY_IDENTITY",
        ),
    ] {
        let e = Client::connect(&url).await.expect_err(&url);
        assert_eq!(e.kind(), ErrorKind::InvalidInput, "{url}: {e}");
        assert!(e.to_string().contains(says), "{url}: {e}");
    }
}

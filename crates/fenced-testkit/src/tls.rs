//! Certificates for the TLS tests: a certificate authority of the test's
//! own, and a server certificate it signs for `127.0.0.1` and `localhost`,
//! written as PEM files into a temp dir for the servers and the clients
//! to read. Made with `rcgen` (ECDSA P-256, signed with ring).

use std::path::{Path, PathBuf};

/// A test CA and one server certificate it signed, as PEM files.
pub struct TestCerts {
    /// The CA's certificate: what a client trusts.
    pub ca: PathBuf,
    /// The server's certificate, signed by the CA, for `127.0.0.1` and
    /// `localhost`.
    pub cert: PathBuf,
    /// The server certificate's private key (PKCS#8), mode `0600`.
    pub key: PathBuf,
    dir: tempfile::TempDir,
}

impl TestCerts {
    /// A fresh CA (named `name`, for messages) and a server certificate
    /// for `127.0.0.1` and `localhost`.
    pub fn new(name: &str) -> TestCerts {
        TestCerts::for_names(name, &["127.0.0.1", "localhost"])
    }

    /// A fresh CA and a server certificate for `names` alone (host names
    /// or IP addresses): with names the server is not reached at, a client
    /// that checks the name refuses it.
    pub fn for_names(name: &str, names: &[&str]) -> TestCerts {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let dir = tempfile::Builder::new()
            .prefix("fenced-tls")
            .tempdir()
            .expect("a temp dir for certificates");
        let ca_key = KeyPair::generate().expect("a CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, name);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).expect("a self-signed CA");
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().expect("a server key");
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let common = names
            .first()
            .cloned()
            .unwrap_or_else(|| "server".to_owned());
        let mut leaf = CertificateParams::new(names).expect("server certificate parameters");
        leaf.distinguished_name.push(DnType::CommonName, common);
        let cert = leaf.signed_by(&key, &issuer).expect("a server certificate");
        let write = |file: &str, pem: String, mode: u32| {
            use std::os::unix::fs::PermissionsExt;
            let path = dir.path().join(file);
            std::fs::write(&path, pem).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .expect("chmod a certificate file");
            path
        };
        TestCerts {
            ca: write("ca.pem", ca_cert.pem(), 0o644),
            cert: write("server.pem", cert.pem(), 0o644),
            key: write("server.key", key.serialize_pem(), 0o600),
            dir,
        }
    }

    /// The directory the files are in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

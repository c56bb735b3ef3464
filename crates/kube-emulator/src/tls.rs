//! A throw-away certificate authority and a server certificate for
//! `127.0.0.1` / `localhost`, so clients can verify the emulator's TLS the
//! way they verify an EKS endpoint against the cluster CA from
//! `eks:DescribeCluster`.

use std::net::IpAddr;
use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::Error;

/// The CA and the rustls configuration serving a certificate it signed.
pub struct ServerTls {
    /// The CA certificate (PEM) clients trust.
    pub ca_pem: String,
    /// The server side: the certificate the CA signed, HTTP/1.1 by ALPN.
    pub config: Arc<ServerConfig>,
}

fn tls_error(e: impl std::fmt::Display) -> Error {
    Error::Tls(e.to_string())
}

/// Makes a fresh CA and a server certificate whose SANs are `127.0.0.1`,
/// `localhost` and any `extra_ips`.
pub fn generate(extra_ips: &[IpAddr]) -> Result<ServerTls, Error> {
    let ca_key = KeyPair::generate().map_err(tls_error)?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = rcgen::DistinguishedName::new();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kube-emulator-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(tls_error)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate().map_err(tls_error)?;
    let mut names = vec!["127.0.0.1".to_owned(), "localhost".to_owned()];
    for ip in extra_ips {
        if !ip.is_unspecified() && !names.contains(&ip.to_string()) {
            names.push(ip.to_string());
        }
    }
    let mut params = CertificateParams::new(names).map_err(tls_error)?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::from([0, 0, 0, 0, 0, 0, 0, 1])));
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, "kube-apiserver");
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let server_cert = params.signed_by(&server_key, &issuer).map_err(tls_error)?;

    let chain = vec![CertificateDer::from(server_cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(tls_error)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(ServerTls {
        ca_pem: ca_cert.pem(),
        config: Arc::new(config),
    })
}

/// A rustls client configuration (aws-lc-rs, default protocol versions) trusting only
/// the CA certificate(s) in `ca_pem`: what a client of this emulator verifies its
/// certificate with.
pub fn client_config(ca_pem: &str) -> Result<Arc<rustls::ClientConfig>, Error> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.map_err(tls_error)?).map_err(tls_error)?;
    }
    if roots.is_empty() {
        return Err(Error::Tls("no CA certificate in the PEM".into()));
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
